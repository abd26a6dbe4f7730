"""The soak's fault schedule: one seed, one schedule, so a broken run replays."""

from __future__ import annotations

from collections import Counter

from bench.soak import KINDS, Checks, Fault, render, run_costs, schedule


def test_a_seed_fixes_the_schedule_and_every_kind_takes_its_turn() -> None:
    a, b, other = schedule(53, 600), schedule(53, 600), schedule(54, 600)
    assert [f.line() for f in a] == [f.line() for f in b] != [f.line() for f in other]
    counts = Counter(f.kind for f in a)
    assert set(counts) == set(KINDS)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert all(20 <= f.at < 600 - 15 for f in a)
    assert [f.at for f in a] == sorted(f.at for f in a)


def test_the_report_counts_each_kind_mid_operation_per_operation() -> None:
    faults = [Fault(20, "hang", "", 2, "check", "send,check"), Fault(30, "hang", "", 2, "fill"),
              Fault(40, "landing_kill", "refused", 2, "landing", "landing")]
    text = render(53, 180, faults, Checks(), {})
    assert "3 faults (2 while a send, fill, check or landing was in flight)" in text
    kinds = {ln.split()[1]: " ".join(ln.split()[2:]) for ln in text.splitlines()
             if ln.startswith("  fault ")}
    assert kinds["hang"] == "2 mid-operation 1 (send 1, fill 0, check 1, landing 0)"
    assert kinds["landing_kill"] == "1 mid-operation 1 (send 0, fill 0, check 0, landing 1)"
    assert all(f.aim == "landing" for f in schedule(53, 600) if f.kind == "landing_kill")


def _msg(role: str, mid: str, parent: str = "", cost: float = 0.0) -> dict[str, object]:
    return {"info": {"role": role, "id": mid, "parentID": parent, "cost": cost}}


def test_a_steer_starts_a_run_of_its_own_and_each_run_is_costed_apart() -> None:
    # The first run passes the ceiling at its third step and is stopped; a client's steer then
    # starts another, which answers its own prompt: two runs, neither the session's total.
    msgs = [_msg("user", "u1"), *(_msg("assistant", f"a{i}", "u1", 0.02) for i in range(3)),
            _msg("user", "u2"), *(_msg("assistant", f"b{i}", "u2", 0.02) for i in range(4)),
            _msg("user", "u3")]
    assert [round(c, 2) for c in run_costs(msgs)] == [0.06, 0.08, 0.0]
    # A steer that arrives mid-run: the steps after it answer the steer, the earlier ones not.
    mixed = [_msg("user", "u1"), _msg("assistant", "a0", "u1", 0.02), _msg("user", "u2"),
             _msg("assistant", "a1", "u1", 0.02), _msg("assistant", "b0", "u2", 0.02)]
    assert [round(c, 2) for c in run_costs(mixed)] == [0.04, 0.02]
