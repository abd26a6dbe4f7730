"""The soak's fault schedule: one seed, one schedule, so a broken run replays."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.soak import (
    KINDS,
    Answer,
    Checks,
    Fault,
    Pending,
    call_runs,
    note_listing,
    render,
    run_costs,
    schedule,
    unseen_waits,
)


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


def test_a_request_pending_past_the_grace_must_be_in_each_answer_started_after_it() -> None:
    # per_1 (session ses_1, on lan-b) first seen pending at t+10 s, still pending at t+40 s.
    r = Pending("per_1", "ses_1", "lan-b", first=10.0, last=40.0)

    def answer(start: float, end: float, *listed: str, unknown: str = "") -> Answer:
        return Answer(start, end, frozenset(listed), frozenset({unknown} - {""}))

    cases = [  # (label, answer, troubled windows, judged as seen / unseen / not judged)
        ("missing, started after the grace: a break", answer(13, 15), [], False),
        ("listed by its id", answer(13, 15, "per_1"), [], True),
        ("listed by its session (another request of it shown)", answer(13, 15, "ses_1"), [],
         True),
        ("missing, started before the grace: not judged", answer(11, 15), [], None),
        ("missing, ended after the request was last seen: answered meanwhile, not judged",
         answer(38, 41), [], None),
        ("missing, its server paused during the call: not judged", answer(20, 25),
         [("lan-b", 24.0, 30.0)], None),
        ("missing, its server behind a slow link from before the call: not judged",
         answer(20, 25), [("lan-b", 5.0, 21.0)], None),
        ("missing, still pausing when the soak judges: not judged", answer(20, 25),
         [("lan-b", 22.0, float("inf"))], None),
        ("missing, another server troubled, or this one before the call: a break",
         answer(20, 25), [("lan-c", 19.0, 30.0), ("lan-b", 12.0, 19.5)], False),
        ("missing, the answer said lan-b was unreadable: not judged",
         answer(20, 25, unknown="lan-b"), [], None),
    ]
    for label, a, troubled, expected in cases:
        got = unseen_waits([r], [a], troubled)
        assert [seen for _, _, seen in got] == ([] if expected is None else [expected]), label
    # Every answer after the grace is judged, each pair once.
    two = unseen_waits([r], [answer(13, 15, "per_1"), answer(20, 25)], [])
    assert [(a.start, seen) for _, a, seen in two] == [(13, True), (20, False)]


def test_a_request_listed_while_its_session_is_idle_ends_its_stretch_of_waiting() -> None:
    # opencode keeps listing per_1 after its run ended (ses_1 idle), then a new run of ses_1
    # starts (a steer): the new run does not wait on per_1, so an answer that left per_1 out
    # while ses_1 was idle is not a break; one asked while ses_1 waited throughout still is.
    pending: dict[tuple[str, int], Pending] = {}
    per_1 = [{"id": "per_1", "sessionID": "ses_1"}]
    for at, waits in [(10, True), (12, True), (16, False), (22, False), (30, True), (40, True)]:
        note_listing(pending, "lan-b", per_1, {"per_1"} if waits else set(), at, at + 0.5)
    assert [(k, r.first, r.last, r.ended) for k, r in pending.items()] == [
        (("per_1", 0), 10.5, 12, True), (("per_1", 1), 30.5, 40, False)]

    def judged(start: float, end: float) -> list[bool]:
        a = Answer(start, end, frozenset(), frozenset())
        return [seen for _, _, seen in unseen_waits(list(pending.values()), [a], [])]

    assert judged(18, 20) == []  # ses_1 idle meanwhile: nothing to see
    assert judged(33, 35) == [False]  # busy throughout, and per_1 missing: a break
    # Listed while idle before ever seen busy: not pending.
    fresh: dict[tuple[str, int], Pending] = {}
    note_listing(fresh, "lan-b", per_1, set(), 5, 5.5)
    assert fresh == {}


def test_a_request_is_waited_on_while_its_tool_call_runs() -> None:
    req = {"id": "per_1", "sessionID": "ses_1", "tool": {"callID": "call_1"}}

    def shown(*states: str) -> list[dict[str, Any]]:
        return [{"parts": [{"type": "tool", "callID": "call_1", "state": {"status": s}}]}
                for s in states]

    assert call_runs(shown("running"), req) and call_runs(shown("pending"), req)
    assert not call_runs(shown("error"), req)  # aborted: left over
    assert not call_runs(shown("running", "completed"), req)  # the newest state counts
    assert not call_runs([], req)  # not in the newest messages: an older run's
    assert call_runs([], {"id": "per_2", "sessionID": "ses_1"})  # no call id: cannot tell
