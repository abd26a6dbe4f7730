"""The one send path (ops.send.send_work) step by step, with a fake client and a spying gate.

Order that keeps the limit: lock -> fresh read -> lock still ours? -> re-count -> reserve ->
create -> attach ("sent") -> record -> lock still ours? -> prompt -> "accepted" -> unlock.
A failure that certainly kept the prompt from the server releases the reservation; one that
may have let it through keeps it counting. Steers take the lock too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.ops.send_support import ROOT, FakeClient, SpyGate, audit_results, record, slot_files
from xaf_hub.config.load import Config, parse_config
from xaf_hub.errors import (
    ApiError,
    BusyError,
    HubError,
    LockLostError,
    NotProjectSession,
    RunsAgain,
    UnreachableError,
)
from xaf_hub.fleet.client import ServerSession
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.planner import Plan, plan_create, plan_reuse
from xaf_hub.ops.send import SendResult, held, send_work
from xaf_hub.store.gate import PROMPT_ACCEPTED, PROMPT_SENT, FileGate
from xaf_hub.store.statefile import file_lock


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    doc = {
        "project": {"name": "demo"},
        "state_dir": str(tmp_path / "state"),
        "instances": [
            {"name": "a", "url": "http://127.0.0.1:9", "roots": [ROOT], "concurrency_limit": 2}
        ],
    }
    return parse_config(doc, path=tmp_path / "config.json", env={})


def send(
    cfg: Config,
    plan: Plan,
    client: FakeClient,
    gate: SpyGate,
    log: list[str],
    steer: bool = True,
    still_wanted: Callable[[], str] | None = None,
) -> SendResult:
    ops = OpsContext(cfg)
    return asyncio.run(
        send_work(
            ops,
            plan,
            "do it",
            "p/m",
            client,  # type: ignore[arg-type]
            gate,
            before_prompt=lambda sid, _room: log.append(f"record {sid}"),
            steer=steer,
            still_wanted=still_wanted,
        )
    )


def test_new_session_goes_through_every_step_in_order(cfg: Config, tmp_path: Path) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1"], {"s1"}), SpyGate(cfg.state_dir, cfg, log)
    result = send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    new = result.session_id
    assert log == ["lock", "read", "owned", "reserve", f"create {new}", f"attach {new}",
                   f"record {new}", "owned", f"prompt {new}", "owned", "accepted", "unlock"]
    assert (result.action, result.instance, result.model) == ("create", "a", "p/m")
    # The reservation keeps counting after the send until the server shows the run.
    assert len(slot_files(cfg)) == 1
    assert audit_results(cfg) == ["create"]


def test_a_session_the_server_places_outside_the_roots_is_deleted_before_any_prompt(
    cfg: Config,
) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    client.placed[ROOT + "/link"] = "/srv/elsewhere"  # a link out of the root, followed
    plan = plan_create(cfg.instances[0], ROOT + "/link", "t", via="test")
    with pytest.raises(NotProjectSession, match="in /srv/elsewhere, outside its project roots"):
        send(cfg, plan, client, gate, log)
    assert log == ["lock", "read", "owned", "reserve", "create ses_new0", "delete ses_new0",
                   "release", "unlock"]
    assert client.sessions == {} and slot_files(cfg) == [] and audit_results(cfg) == ["failed"]

    log.clear()
    client.fail_delete = UnreachableError("a", "timed out")
    with pytest.raises(NotProjectSession, match="it stays, empty .delete failed: a: unreachable"):
        send(cfg, plan, client, gate, log)
    assert "prompt" not in " ".join(log) and slot_files(cfg) == []

    log.clear()  # --force: the person said so
    result = send(cfg, dataclasses.replace(plan, forced=True), client, gate, log)
    assert (result.action, result.directory) == ("create", "/srv/elsewhere")
    assert f"prompt {result.session_id}" in log


def test_waiting_for_the_lock_leaves_the_event_loop_running(cfg: Config) -> None:
    """While another process holds the instance's lock, the send waits and other tasks run:
    here the other task is what lets the holder go."""
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    taken, free = threading.Event(), threading.Event()

    def hold() -> None:
        with FileGate(cfg.state_dir, cfg.lock).lock("a"):
            taken.set()
            free.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(60)

    async def tick() -> None:
        for _ in range(5):
            await asyncio.sleep(0)
            log.append("tick")
        free.set()

    async def both() -> SendResult:
        plan = plan_create(cfg.instances[0], ROOT, "t", via="test")
        sent = asyncio.ensure_future(send_work(
            OpsContext(cfg), plan, "do it", "p/m", client, gate  # type: ignore[arg-type]
        ))
        await asyncio.sleep(0)  # the send starts waiting for the lock first
        await tick()
        return await sent

    try:
        result = asyncio.run(both())
    finally:
        free.set()
        holder.join()
    assert result.action == "create"
    assert log[:6] == ["tick"] * 5 + ["lock"]


def test_a_waiter_cancelled_before_it_gets_the_lock_holds_nothing(
    cfg: Config, tmp_path: Path
) -> None:
    gate = FileGate(tmp_path, dataclasses.replace(cfg.lock, lock_timeout_seconds=30))
    holder = FileGate(tmp_path, dataclasses.replace(cfg.lock, lock_timeout_seconds=0.2))

    async def cancel_a_waiter() -> BaseException:
        with holder.lock("lan-a"):
            waiter = asyncio.ensure_future(held(gate, "lan-a").__aenter__())
            await asyncio.sleep(0)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError) as cancelled:
                await waiter
        return cancelled.value  # kept: its traceback must not be what frees the lock

    kept = asyncio.run(cancel_a_waiter())  # the loop's end waits for the waiting thread
    assert isinstance(kept, asyncio.CancelledError)
    with holder.lock("lan-a"):  # the late taker gave the lock back at once
        pass


@pytest.mark.parametrize("case", ["create", "steer", "refused", "lost", "full"])
def test_no_gate_call_runs_on_the_event_loop(cfg: Config, case: str) -> None:
    """Every lock, clock, count and reservation call of a send runs in a worker thread (a file
    lock polls, a Redis call waits on the network), on every way through it."""
    log: list[str] = []
    client, gate = FakeClient(log, ["s1"], {"s1"}), SpyGate(cfg.state_dir, cfg, log)
    plan = steer_plan(cfg, "s1") if case == "steer" else plan_create(
        cfg.instances[0], ROOT, "t", via="test"
    )
    if case == "refused":
        client.fail_prompt = ApiError("a", 400, "bad request")
    gate.ownership = [True, False] if case == "lost" else []
    if case == "full":
        gate.reserve("a")
    gate.on_loop.clear()
    with contextlib.nullcontext() if case in ("create", "steer") else pytest.raises(HubError):
        send(cfg, plan, client, gate, log)
    assert gate.on_loop == []
    assert ("release" in log) == (case in ("refused", "lost"))  # the failure paths ran


def test_a_held_audit_lock_leaves_the_event_loop_running(cfg: Config) -> None:
    """The audit line of a send waits for the audit log's lock, which another process holds,
    while the loop's other tasks run: here the task that lets the holder go."""
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    taken, free = threading.Event(), threading.Event()

    def hold() -> None:
        with file_lock(cfg.state_dir / "audit.log.lock", 0, what="audit log lock"):
            taken.set()
            free.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(60)

    async def probe() -> int:
        """Tick until the prompt went out, then five more times, and let the holder go."""
        ticks = 0
        while ticks < 5:
            await asyncio.sleep(0.01)
            ticks += any(step.startswith("prompt") for step in log)
        free.set()
        return ticks

    async def both() -> tuple[SendResult, int]:
        plan = plan_create(cfg.instances[0], ROOT, "t", via="test")
        ticked = asyncio.ensure_future(probe())
        result = await send_work(
            OpsContext(cfg), plan, "do it", "p/m", client, gate  # type: ignore[arg-type]
        )
        return result, await ticked

    try:
        result, ticks = asyncio.run(both())
    finally:
        free.set()
        holder.join()
    assert ticks == 5
    assert result.warnings == ()  # the line waited for the lock and was written
    assert audit_results(cfg) == ["create"]


def test_at_the_limit_nothing_is_reserved_created_or_sent(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1", "s2"], {"s1", "s2"}), SpyGate(cfg.state_dir, cfg, log)
    with pytest.raises(BusyError, match="2 running \\+ 0 reserved of 2"):
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert log == ["lock", "read", "owned", "unlock"]
    assert slot_files(cfg) == []
    assert audit_results(cfg) == ["failed"]


def test_a_live_reservation_counts_against_the_limit(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1"], {"s1"}), SpyGate(cfg.state_dir, cfg, log)
    gate.reserve("a")  # another dispatch between its decision and its prompt
    log.clear()
    with pytest.raises(BusyError, match="1 running \\+ 1 reserved of 2"):
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert "create" not in " ".join(log)


def test_idle_session_that_started_meanwhile_is_steered_without_a_slot(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1", "s2"], {"s1", "s2"}), SpyGate(cfg.state_dir, cfg, log)
    plan = plan_reuse(cfg.instances[0], record("s1"), via="test")  # planned while idle
    result = send(cfg, plan, client, gate, log)
    assert (result.action, result.steered_instead) == ("steer", True)
    assert log == ["lock", "read", "owned", "reserve s1", "record s1", "owned", "prompt s1",
                   "owned", "accepted", "unlock"]
    # Tied to a running session, the reservation adds nothing to the count.
    assert gate.pending("a", {"s1", "s2"}) == []


def test_a_heal_or_resume_never_steers_a_session_that_runs_again(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1"], {"s1"}), SpyGate(cfg.state_dir, cfg, log)
    plan = plan_reuse(cfg.instances[0], record("s1"), via="heal")  # judged stopped
    with pytest.raises(RunsAgain, match="session s1 on a runs again"):
        send(cfg, plan, client, gate, log, steer=False)
    assert log == ["lock", "read", "owned", "unlock"]  # nothing reserved, recorded or sent
    assert slot_files(cfg) == [] and audit_results(cfg) == ["failed"]


def test_a_heal_or_resume_asks_under_the_lock_whether_a_person_stopped_it(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1"], set()), SpyGate(cfg.state_dir, cfg, log)
    plan = plan_reuse(cfg.instances[0], record("s1"), via="resume")  # judged interrupted

    def asked() -> str:
        log.append("asked")
        return "interrupted by alice@box at 12:00 since it was judged; nothing was sent"

    with pytest.raises(RunsAgain, match="session s1 on a: interrupted by alice@box"):
        send(cfg, plan, client, gate, log, steer=False, still_wanted=asked)
    assert log == ["lock", "read", "owned", "asked", "unlock"]  # nothing reserved or sent
    assert slot_files(cfg) == [] and audit_results(cfg) == ["failed"]
    log.clear()
    result = send(cfg, plan, client, gate, log, steer=False, still_wanted=lambda: "")
    assert result.action == "reuse" and "prompt s1" in log


@pytest.mark.parametrize(
    "failure",
    [ApiError("a", 400, "bad request"), UnreachableError("a", "connection refused")],
)
def test_a_failed_prompt_releases_the_reservation(cfg: Config, failure: Exception) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    client.fail_prompt = failure
    with pytest.raises(type(failure)):
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert log[-2:] == ["release", "unlock"]
    assert slot_files(cfg) == []
    assert audit_results(cfg) == ["failed"]


def test_a_failed_create_sends_nothing_and_releases(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    client.fail_create = UnreachableError("a", "no answer within 3s")
    with pytest.raises(UnreachableError):
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert not any(step.startswith(("prompt", "record")) for step in log)
    assert log[-2:] == ["release", "unlock"]


def test_gate_warnings_come_back_with_the_result(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    gate.warnings.append("the dispatch lock for a lapsed before it was released")
    result = send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert result.warnings == ("the dispatch lock for a lapsed before it was released",)
    assert gate.warnings == []  # handed over, not left for the next caller


# -- steers take the lock ----------------------------------------------------------------------


def steer_plan(cfg: Config, sid: str) -> Plan:
    return Plan("steer", cfg.instances[0], record(sid, "busy"), ROOT, sid, via="test")


def test_steer_of_a_running_session_is_locked_and_takes_no_slot(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1", "s2"], {"s1", "s2"}), SpyGate(cfg.state_dir, cfg, log)
    result = send(cfg, steer_plan(cfg, "s1"), client, gate, log)  # on a full instance
    assert (result.action, result.had_stopped) == ("steer", False)
    assert log == ["lock", "read", "owned", "reserve s1", "record s1", "owned", "prompt s1",
                   "owned", "accepted", "unlock"]
    [res] = gate.live_reservations("a", {"s1", "s2"})
    assert (res.session_id, res.prompt) == ("s1", PROMPT_ACCEPTED)
    assert gate.pending("a", {"s1", "s2"}) == []  # counted once, as the running session
    # Had the run ended as the prompt landed and the new run not shown yet, it would count.
    assert len(gate.pending("a", {"s2"})) == 1


def test_steer_of_a_session_that_stopped_is_refused_at_the_limit(cfg: Config) -> None:
    log: list[str] = []
    # Planned while s1 ran; under the lock the server shows s1 idle and s2, s3 running.
    client = FakeClient(log, ["s1", "s2", "s3"], {"s2", "s3"})
    gate = SpyGate(cfg.state_dir, cfg, log)
    with pytest.raises(BusyError, match="session s1 had stopped") as err:
        send(cfg, steer_plan(cfg, "s1"), client, gate, log)
    assert err.value.exit_code == 3
    assert log == ["lock", "read", "owned", "unlock"]  # nothing reserved, recorded or sent
    assert slot_files(cfg) == []


def test_steer_of_a_session_that_stopped_goes_through_the_gate(cfg: Config) -> None:
    from xaf_hub.cli.commands.dispatch import _sent_line

    log: list[str] = []
    client, gate = FakeClient(log, ["s1", "s2"], {"s2"}), SpyGate(cfg.state_dir, cfg, log)
    plan = steer_plan(cfg, "s1")
    result = send(cfg, plan, client, gate, log)
    assert (result.action, result.had_stopped) == ("reuse", True)
    assert log == ["lock", "read", "owned", "reserve", "attach s1", "record s1", "owned",
                   "prompt s1", "owned", "accepted", "unlock"]
    assert _sent_line(plan, result).startswith("started idle session s1 (it had stopped) on a")
    assert result.to_json()["had_stopped"] is True
    plain = send(cfg, steer_plan(cfg, "s1"), client, gate, log)  # s1 runs now
    assert _sent_line(plan, plain).startswith("steered running session s1 on a")


# -- uncertain delivery ------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_prompt_that_may_have_arrived_keeps_its_slot_until_the_run_shows(cfg: Config) -> None:
    log: list[str] = []
    clock = Clock()
    # alive=False: the sending process is gone; that must not free a prompt that went out.
    client = FakeClient(log, ["s1"], {"s1"})
    gate = SpyGate(cfg.state_dir, cfg, log, clock=clock, alive=lambda pid: False)
    client.fail_prompt = UnreachableError("a", "no answer within 3s", maybe_delivered=True)
    with pytest.raises(UnreachableError, match="slot stays reserved") as err:
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert err.value.maybe_delivered
    assert "release" not in log
    [res] = gate.live_reservations("a", {"s1"})
    assert res.prompt == PROMPT_SENT and res.session_id.startswith("ses_new")
    clock.t += cfg.lock.slot_grace_seconds + 30  # well past the grace, inside the TTL
    client.fail_prompt = None
    log.clear()
    with pytest.raises(BusyError, match="1 running \\+ 1 reserved of 2"):
        send(cfg, plan_create(cfg.instances[0], ROOT, "u", via="test"), client, gate, log)
    # The late prompt lands: the run counts once, as itself.
    client.busy.add(res.session_id)
    assert gate.pending("a", {"s1", res.session_id}) == []
    clock.t = res.created + cfg.lock.slot_ttl_seconds + 1
    assert gate.live_reservations("a", {"s1"}) == []  # the TTL ends it in any case


def test_a_prompt_that_was_answered_lives_by_the_server_not_the_process(cfg: Config) -> None:
    log: list[str] = []
    clock = Clock()
    client = FakeClient(log, [], set())
    gate = SpyGate(cfg.state_dir, cfg, log, clock=clock, alive=lambda pid: False)
    result = send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    [res] = gate.live_reservations("a", set())  # process gone, run not shown yet: counts
    assert (res.session_id, res.prompt) == (result.session_id, PROMPT_ACCEPTED)
    clock.t += cfg.lock.slot_grace_seconds + 1
    assert gate.live_reservations("a", {result.session_id}) != []  # running: kept
    assert gate.live_reservations("a", set()) == []  # not running after the grace: gone


# -- a lock lost on the way --------------------------------------------------------------------


def test_lock_lost_before_counting_sends_nothing(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    gate.ownership = [False]
    with pytest.raises(LockLostError, match="lost before its load was counted") as err:
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert err.value.exit_code == 3
    assert "may have been exceeded" not in str(err.value)
    assert log == ["lock", "read", "lost", "unlock"]
    assert slot_files(cfg) == []


def test_lock_lost_before_sending_releases_and_names_the_session(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    gate.ownership = [True, False]
    with pytest.raises(LockLostError, match="lost before sending") as err:
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    new = next(step.split()[1] for step in log if step.startswith("create"))
    assert f"nothing was sent to session {new}" in str(err.value)
    assert "may have been exceeded" not in str(err.value)
    assert not any(step.startswith("prompt") for step in log)
    assert log[-3:] == ["lost", "release", "unlock"]
    assert slot_files(cfg) == []


@pytest.mark.parametrize("kept", [True, False])
def test_lock_lost_while_the_prompt_travelled_is_reported(cfg: Config, kept: bool) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    gate.ownership = [True, True, False]
    if not kept:  # the lock's server lost the reservation too (FLUSHALL, restart)
        real = client.prompt_async

        async def prompt_and_flush(session_id: str, text: str, model: str | None) -> None:
            await real(session_id, text, model)
            for path in slot_files(cfg):
                path.unlink()

        client.prompt_async = prompt_and_flush  # type: ignore[method-assign]
    result = send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    [warning] = result.warnings
    assert result.session_id in warning
    assert ("may have been exceeded" in warning) is (not kept)
    assert ("the limit held" in warning) is kept
    assert len(slot_files(cfg)) == 1  # the run counts (put back when it was lost)


def test_a_stale_reading_never_frees_a_reservation_made_after_it(cfg: Config) -> None:
    log: list[str] = []
    clock = Clock()
    client = FakeClient(log, ["s1"], {"s1"})
    gate = SpyGate(cfg.state_dir, cfg, log, clock=clock)
    other = FileGate(cfg.state_dir, cfg.lock, host="h2", clock=clock)
    real = client.list_sessions

    async def slow_read() -> list[ServerSession]:
        sessions = await real()  # the reading is taken here ...
        # ... then this process stalls; another host starts "s9" (not in this reading).
        clock.t += 1
        other.accepted(other.attach(other.reserve("a"), "s9", PROMPT_SENT))
        clock.t += cfg.lock.slot_grace_seconds + 20
        return sessions

    client.list_sessions = slow_read  # type: ignore[method-assign]
    with pytest.raises(BusyError, match="1 running \\+ 1 reserved of 2"):
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert len(slot_files(cfg)) == 1  # the other host's reservation is still there


def test_take_back_drops_the_row_of_a_dispatch_refused_before_sending(cfg: Config) -> None:
    from xaf_hub.ops.dispatch import take_back

    ops = OpsContext(cfg)
    pool = ops.backlog()
    rec = pool.record_manual_dispatch("do it", "ses_x", "a", None, ops.now())
    heard: list[str] = []
    take_back(ops, rec, LockLostError("a: lost before sending"), heard.append)
    assert heard == [] and pool.load().tasks == []


def test_a_lock_that_cannot_be_asked_about_after_sending_claims_nothing(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    answers = iter([True, True])

    def owns_lock(instance: str) -> bool:
        for owned in answers:
            return owned
        raise UnreachableError("redis", "127.0.0.1:6379/0: timed out")

    gate.owns_lock = owns_lock  # type: ignore[method-assign]
    result = send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    [warning] = result.warnings
    assert "could not confirm the dispatch lock after sending" in warning
    assert "limit held" not in warning and "exceeded" not in warning
    assert len(slot_files(cfg)) == 1
