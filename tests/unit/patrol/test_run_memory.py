"""Rounds that cost what changed: the patrol's memory of last runs (``RunMemory``) on disk, and
whole rounds (``run_once``, the real jobs) over a mock fleet of thousands of sessions where one
session changes: exactly that one is read again and judged anew; decisions that wait on time
(a blackout ending, the resume grace; ``patrol.context.TIME_DECISIONS``) are still taken from
the memory without a read."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.unit.patrol.run_support import (
    E400,
    NOW,
    NOW_MS,
    FakeFleet,
    assistant,
    line_of,
    round_at,
    run,
)
from xaf_hub.config.load import Config, load_config
from xaf_hub.errors import StateFileError
from xaf_hub.ops.context import OpsContext
from xaf_hub.store.patrol_state import RUNS_FILE, RunMemory

E404 = {"name": "APIError", "data": {"message": "model not found", "statusCode": 404}}
E429 = {"name": "APIError", "data": {"message": "Rate limit exceeded", "statusCode": 429}}


# --------------------------------------------------------------------------- the file


def test_memory_round_trip_and_recall_only_while_unchanged(tmp_path: Path) -> None:
    mem = RunMemory.load(tmp_path)
    assert len(mem) == 0 and not (tmp_path / RUNS_FILE).exists()
    failed = run("failed", error=E400, created_ms=5)
    mem.remember("lan-a", "ses_1", 100, "idle", failed)
    mem.remember("lan-a", "ses_2", 200, "retry", run())
    mem.save()
    doc = json.loads((tmp_path / RUNS_FILE).read_text("utf-8"))
    assert doc["schema_version"] == 1 and set(doc["instances"]["lan-a"]) == {"ses_1", "ses_2"}
    again = RunMemory.load(tmp_path)
    assert again.recall("lan-a", "ses_1", 100, "idle") == failed
    assert again.recall("lan-a", "ses_1", 101, "idle") is None  # updated moved
    assert again.recall("lan-a", "ses_1", 100, "busy") is None  # run state moved
    assert again.recall("lan-a", "ses_2", 200, "idle") is None  # was read while retrying
    assert again.recall("lan-b", "ses_1", 100, "idle") is None
    again.remember("lan-b", "ses_9", 300, "idle", run())
    again.forget([("lan-a", "ses_1")])
    again.keep_only([("lan-a", "ses_1")], instances=["lan-b"])  # lan-b was not reached
    again.save()
    assert len(RunMemory.load(tmp_path)) == 1
    assert RunMemory.load(tmp_path).recall("lan-b", "ses_9", 300, "idle") == run()
    assert not list(tmp_path.glob(".*.tmp"))  # no temp file left


def test_unchanged_memory_is_not_rewritten(tmp_path: Path) -> None:
    mem = RunMemory.load(tmp_path)
    mem.remember("lan-a", "ses_1", 100, "idle", run())
    mem.save()
    path = tmp_path / RUNS_FILE
    path.write_text(path.read_text("utf-8") + " ", "utf-8")  # marks the file
    again = RunMemory.load(tmp_path)
    again.remember("lan-a", "ses_1", 100, "idle", run())
    again.keep_only([("lan-a", "ses_1")])
    again.save()
    assert path.read_text("utf-8").endswith(" ")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema_version": 1, "instances": {', "invalid JSON at line 1"),
        ("[]", "top level: not an object"),
        ('{"schema_version": 9, "instances": {}}', "schema_version: 9 is not 1"),
        ('{"schema_version": 1, "instances": []}', "instances: not an object"),
        (
            '{"schema_version": 1, "instances": {"a": {"ses_1": {"updated": "x"}}}}',
            "instances.a.ses_1: updated is not an integer",
        ),
        (
            '{"schema_version": 1, "instances": {"a": {"ses_1": {"updated": 1, '
            '"run_state": "idle", "run": {"outcome": "succeeded", "message_id": "m", '
            '"model": "", "error": "boom", "created_ms": 0}}}}}',
            "instances.a.ses_1: run.error is neither null nor an object",
        ),
        (
            '{"schema_version": 1, "instances": {"a": {"ses_1": {"updated": 1, '
            '"run_state": "waiting", "run": {}}}}}',
            "run_state 'waiting' is not one of busy, retry, idle",
        ),
    ],
)
def test_a_damaged_memory_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / RUNS_FILE).write_text(content, "utf-8")
    with pytest.raises(StateFileError) as info:
        RunMemory.load(tmp_path)
    assert str(tmp_path / RUNS_FILE) in str(info.value) and message in str(info.value)


# --------------------------------------------------------------------------- whole rounds


def make_cfg(tmp_path: Path, names: list[str], models: dict[str, Any] | None = None) -> Config:
    doc = {
        "instances": [
            {"name": n, "url": f"http://127.0.0.1:{9 + i}", "roots": ["/srv/p"]}
            for i, n in enumerate(names)
        ],
        "concurrency_limit": 2,
        "models": models or {"default_dispatch_model": "fake/fake-model"},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    return load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)


def test_one_changed_session_among_thousands_is_read_and_judged_again(tmp_path: Path) -> None:
    names = ["lan-a", "lan-b", "lan-c"]
    cfg = make_cfg(tmp_path, names)
    fleet = FakeFleet(1000)
    for inst in names:
        for i in range(fleet.per_instance):
            updated = NOW_MS - 3_600_000 + i * 1000
            fleet.add(inst, f"ses_{inst[-1]}{i:04d}", updated, assistant(f"msg_{i}", updated))
    total = 3 * fleet.per_instance

    first, reads = round_at(cfg, fleet, NOW)
    assert first.code == 0, first.cycle and first.cycle.log.errors
    assert reads == total and first.cycle is not None and len(first.cycle.log.sessions) == total
    lists = fleet.lists
    second, reads = round_at(cfg, fleet, NOW + timedelta(minutes=10))
    assert second.code == 0 and reads == 0
    assert fleet.lists - lists == 3  # one scan for the three jobs (nothing acted): as `status`
    assert second.cycle is not None and second.cycle.recalled == total
    assert [(s.session, s.state) for s in second.cycle.log.sessions] == [
        (s.session, s.state) for s in first.cycle.log.sessions
    ]

    # One session among 3000 ends a new run with an error: only it is read, and it is judged
    # on what it shows now.
    changed = fleet.sessions["lan-b"]["ses_b0500"]
    assert line_of(second, changed.sid) == ("finished", "")
    changed.updated = NOW_MS + 11 * 60_000
    changed.last = assistant("msg_new", changed.updated - 5000, error=E400)
    third, reads = round_at(cfg, fleet, NOW + timedelta(minutes=20))
    assert third.code == 0 and reads == 1 and fleet.reads[("lan-b", changed.sid)] == 2
    assert line_of(third, changed.sid)[0] == "failed"
    assert "bad request: tool schema" in line_of(third, changed.sid)[1]

    # A session whose run state moved is read again too, though its `updated` did not move.
    mem = RunMemory.load(cfg.state_dir / "patrol")
    other = fleet.sessions["lan-c"]["ses_c0007"]
    mem.remember("lan-c", other.sid, other.updated, "retry", run())
    mem.save()
    del fleet.sessions["lan-a"]["ses_a0001"]  # deleted on the server: forgotten
    fourth, reads = round_at(cfg, fleet, NOW + timedelta(minutes=30))
    assert fourth.code == 0 and reads == 1 and fleet.reads[("lan-c", other.sid)] == 2
    assert len(RunMemory.load(cfg.state_dir / "patrol")) == total - 1

    # An instance unreachable for a round keeps its memory: back, it costs no reads.
    fleet.down.add("lan-c")
    fifth, reads = round_at(cfg, fleet, NOW + timedelta(minutes=40))
    assert reads == 0 and fifth.cycle is not None
    assert [i.reachable for i in fifth.cycle.log.instances] == [True, True, False]
    fleet.down.clear()
    sixth, reads = round_at(cfg, fleet, NOW + timedelta(minutes=50))
    assert sixth.code == 0 and reads == 0
    assert fleet.prompts == []


def test_a_time_decision_is_taken_without_reading_again(tmp_path: Path) -> None:
    # A run that stopped without finishing a moment ago may still be starting: the first
    # round leaves it. Nothing changes on the server; only time passes. The next round does
    # not read it again, yet resumes it once the grace is over.
    cfg = make_cfg(tmp_path, ["lan-a"])
    fleet = FakeFleet(3)
    for i in range(fleet.per_instance):
        fleet.add("lan-a", f"ses_a{i}", NOW_MS - 600_000 + i, assistant(f"m{i}", NOW_MS - 700_000))
    stopped = NOW_MS - 20_000
    fleet.add("lan-a", "ses_stop", stopped, assistant("m_s", stopped - 5000, completed=False))

    first, reads = round_at(cfg, fleet, NOW)
    assert reads == 4 and fleet.prompts == []
    assert first.cycle is not None
    assert any(
        a.session == "ses_stop" and "may still be starting" in a.detail
        for a in first.cycle.log.actions
    )
    second, reads = round_at(cfg, fleet, NOW + timedelta(minutes=2))
    assert reads == 0, fleet.reads
    assert fleet.prompts == [("lan-a", "ses_stop")]
    assert second.cycle is not None
    assert [(a.kind, a.result) for a in second.cycle.log.actions if a.session == "ses_stop"] == [
        ("resume", "ok")
    ]
    # The resumed session was prompted: the memory forgot it, the next round reads it.
    assert (
        RunMemory.load(cfg.state_dir / "patrol").recall("lan-a", "ses_stop", stopped, "idle")
        is None
    )


def test_a_heal_that_waited_for_a_blackout_to_end_is_done_without_reading_again(
    tmp_path: Path,
) -> None:
    # The session's model is gone (404); the next model of its chain is in a family blacked
    # out until 08:00 (another session's rate limit). The first round waits. Nothing changes on
    # the server; at 08:30 a round heals the session from the remembered failure, without
    # reading it again.
    chain = ["fake/missing-model", "opencode/other-model"]
    models = {"chain": chain, "default_dispatch_model": chain[1], "timezone": "UTC"}
    cfg = make_cfg(tmp_path, ["lan-a"], models)
    OpsContext(cfg, clock=lambda: NOW).model_state().mark_blackout("opencode", "429", "t", NOW)
    fleet = FakeFleet(1)
    failed = assistant("m_404", NOW_MS - 90_000, error=E404)
    failed["info"]["modelID"] = "missing-model"
    fleet.add("lan-a", "ses_gone", NOW_MS - 60_000, failed)
    first, reads = round_at(cfg, fleet, NOW)
    assert reads == 1 and fleet.prompts == [] and first.cycle is not None
    assert [(a.kind, a.result) for a in first.cycle.log.actions] == [("heal", "waiting")]
    lists = fleet.lists
    _early, reads = round_at(cfg, fleet, NOW + timedelta(hours=19, minutes=50))  # 07:50
    assert reads == 0 and fleet.prompts == [] and fleet.lists - lists == 1
    lists = fleet.lists
    after, reads = round_at(cfg, fleet, NOW + timedelta(hours=20, minutes=30))  # 08:30
    # The round's scan, the send's re-count under the lock, then one scan again for the jobs
    # after the heal (the heal prompted).
    assert fleet.lists - lists == 3
    # Healed from the memory; the one read is check_agents' after the heal prompted it (a
    # session prompted this round is always read again).
    assert reads == 1 and fleet.prompts == [("lan-a", "ses_gone")]
    assert after.cycle is not None
    healed = [a for a in after.cycle.log.actions if a.kind == "heal"]
    assert [(a.result, a.model) for a in healed] == [("ok", "opencode/other-model")]


def test_a_rate_limit_blacks_its_family_out_once_not_again_from_the_same_failure(
    tmp_path: Path,
) -> None:
    # Every model of the chain is in the family the failure's rate limit blacks out: the round
    # waits for the reset hour. At 08:30 the failure's window is over and the family has had
    # its rest: the round heals the session. Blacking the family out again from the same old
    # failure (as each round after a reset did) made such a heal wait forever, a day at a time.
    chain = ["opencode/first-model", "opencode/other-model"]
    models = {"chain": chain, "default_dispatch_model": chain[1], "timezone": "UTC"}
    cfg = make_cfg(tmp_path, ["lan-a"], models)
    fleet = FakeFleet(1)
    failed = assistant("m_429", NOW_MS - 90_000, error=E429)
    failed["info"].update(providerID="opencode", modelID="first-model")
    fleet.add("lan-a", "ses_rl", NOW_MS - 60_000, failed)
    first, _ = round_at(cfg, fleet, NOW)
    assert first.cycle is not None and fleet.prompts == []
    assert [(a.kind, a.result) for a in first.cycle.log.actions] == [("heal", "waiting")]
    state = OpsContext(cfg, clock=lambda: NOW).model_state()
    assert set(state.active_blackouts(NOW)) == {"opencode"}
    later = NOW + timedelta(hours=20, minutes=30)  # 08:30 the next day
    after, _ = round_at(cfg, fleet, later)
    assert after.cycle is not None and fleet.prompts == [("lan-a", "ses_rl")]
    healed = [a for a in after.cycle.log.actions if a.kind == "heal"]
    assert [(a.result, a.model) for a in healed] == [("ok", "opencode/other-model")]
    assert state.active_blackouts(later) == {}


def test_a_damaged_memory_fails_the_round_loudly_but_still_reads_everything(
    tmp_path: Path,
) -> None:
    cfg = make_cfg(tmp_path, ["lan-a"])
    fleet = FakeFleet(2)
    for i in range(fleet.per_instance):
        fleet.add("lan-a", f"ses_a{i}", NOW_MS - 1000 + i, assistant(f"m{i}", NOW_MS - 2000))
    path = cfg.state_dir / "patrol" / RUNS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"schema_version": 1, "instances": {"lan-a": [', "utf-8")
    result, reads = round_at(cfg, fleet, NOW)
    assert result.code == 1 and reads == 2
    assert result.cycle is not None
    assert any(str(path) in e and "invalid JSON" in e for e in result.cycle.log.errors)
    assert path.read_text("utf-8") == '{"schema_version": 1, "instances": {"lan-a": ['
