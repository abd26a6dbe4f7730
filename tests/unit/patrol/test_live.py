"""The patrol daemon's live reactions, without servers: which events become work, and that a
reaction never runs while paused, beside another cycle, or twice for one burst.

Healing, resuming and filling themselves are the round's job functions (tests/unit/
test_patrol_jobs.py) and run against real servers in tests/e2e/test_live.py.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from xaf_hub.config.load import load_config
from xaf_hub.core.records import SessionRecord
from xaf_hub.fleet.events import FleetEvent
from xaf_hub.notify.record import RoundLog
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.context import Cycle
from xaf_hub.patrol.live import (
    _REFILL,
    LOCKED_RETRY_SECONDS,
    REFILL_MARGIN_SECONDS,
    LiveReactor,
    _Work,
)
from xaf_hub.store.backends import Stores
from xaf_hub.store.patrol_state import set_paused
from xaf_hub.store.statefile import file_lock


class Recording(LiveReactor):
    """Records the batches it would react to instead of talking to servers."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.batches: list[_Work] = []

    async def _react(self, work: _Work) -> tuple[Cycle, _Work]:
        self.batches.append(work)
        return Cycle(RoundLog(started=datetime.now(UTC))), _Work()


def _reactor(tmp_path: Path, out: list[str], skip: tuple[str, ...] = ()) -> Recording:
    doc = {"instances": [{"name": "a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}]}
    (tmp_path / "config.json").write_text(json.dumps(doc), "utf-8")
    cfg = load_config(str(tmp_path / "config.json"),
                      env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    return Recording(OpsContext(cfg), skip, threading.Lock(), out.append, settle_seconds=0)


def _ev(kind: str, sid: str = "ses_1") -> FleetEvent:
    rec = SessionRecord("a", sid, "t", "/srv/p/app", project=True)
    return FleetEvent(kind, "a", rec)  # type: ignore[arg-type]


def test_events_become_work_once_per_session(tmp_path: Path) -> None:
    out: list[str] = []
    r = _reactor(tmp_path, out)
    for kind in ("new", "started", "retry", "error", "stopped", "stopped"):
        r.on_event(_ev(kind))
    r.on_event(_ev("gone", "ses_2"))
    r.on_event(FleetEvent("down", "a", detail="connection refused"))
    work = r._take()
    assert work is not None
    assert list(work.sessions) == [("a", "ses_1")] and work.fill
    assert r._work.empty()
    assert [ln.split(" ", 2)[2] for ln in out] == ["live: a down: connection refused"]


def test_no_fill_when_the_patrol_skips_it(tmp_path: Path) -> None:
    r = _reactor(tmp_path, [], skip=("fill_slots",))
    r.on_event(_ev("gone"))
    assert r._work.empty()


def test_a_paused_patrol_reacts_to_nothing(tmp_path: Path) -> None:
    r = _reactor(tmp_path, [])
    set_paused(r.pctx.patrol_dir, "tester", datetime.now(UTC))
    assert r._run(_Work({("a", "ses_1"): 0.0}, True)) is None
    assert r.batches == []


def test_a_held_cycle_lock_makes_the_batch_wait(tmp_path: Path) -> None:
    r = _reactor(tmp_path, [])
    work = _Work({("a", "ses_1"): 0.0}, False)
    r.pctx.patrol_dir.mkdir(parents=True)
    with file_lock(r.pctx.patrol_dir / "cycle.lock", 1):
        assert r._run(work) == (work, LOCKED_RETRY_SECONDS)
    assert r.batches == []
    assert r._run(work) is None and r.batches == [work]
    # Held by the daemon's own round (same process): the reaction waits for it.
    r.busy.acquire()
    done = threading.Event()
    t = threading.Thread(target=lambda: (r._run(work), done.set()))
    t.start()
    assert not done.wait(0.3)
    r.busy.release()
    assert done.wait(10)
    t.join()
    assert len(r.batches) == 2


def test_a_request_becomes_work_only_with_a_policy_and_a_rule_answers_it(tmp_path: Path) -> None:
    import asyncio
    from dataclasses import replace

    import httpx

    from tests.unit.ops.waiting_support import fleet_with_both
    from xaf_hub.config.load import PermissionRule, PermissionsConfig

    r = _reactor(tmp_path, [])
    r.on_event(_ev("asked", "ses_perm"))
    assert r._work.empty()  # no rule, no timeout: a person answers
    server = fleet_with_both()
    server.permissions[0].update(patterns=["git status"], metadata={"command": "git status"})
    policy = PermissionsConfig((PermissionRule("bash", "git status*", "allow"),))
    pctx = OpsContext(replace(r.pctx.cfg, permissions=policy), env={},
                      transport_factory=lambda _: httpx.MockTransport(server.route))
    live = LiveReactor(pctx, (), threading.Lock(), [].append, settle_seconds=0)
    live.on_event(_ev("asked", "ses_perm"))
    work = live._take()
    assert work is not None and list(work.sessions) == [("a", "asked:ses_perm")]
    cycle, again = asyncio.run(live._react(work))
    assert server.replies == [("/permission/per_aaa1/reply", {"reply": "once"})]
    assert [(a.kind, a.result, a.session) for a in cycle.log.actions] == [
        ("answer", "ok", "ses_perm")
    ]
    assert again.empty()


def test_the_daemon_fills_at_once_when_it_starts(tmp_path: Path) -> None:
    """Free slots and pending work at start: the fill runs now, not at the first round."""
    r = _reactor(tmp_path, [])
    r.start()
    try:
        deadline = time.monotonic() + 10
        while not r.batches and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [b.fill for b in r.batches] == [True]
    finally:
        r.stop()
    skipping = _reactor(tmp_path, [], skip=("fill_slots",))
    skipping.start()
    time.sleep(0.3)
    skipping.stop()
    assert skipping.batches == []


@pytest.mark.parametrize("backend", ["file", "redis"])
def test_work_that_arrives_in_the_pool_is_filled_unless_paused(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """Any writer (here another store object: another process, or host on Redis) adding ready
    work makes the next look ask for a fill; a look that finds nothing new, or no ready work,
    asks nothing; paused, nothing is looked at, and the first look after the resume sees the
    pool afresh."""
    from dataclasses import replace

    from xaf_hub.config.load import LockConfig, PoolConfig
    from xaf_hub.store.patrol_state import clear_paused
    from xaf_hub.store.tasks import Task

    r = _reactor(tmp_path, [])
    if backend == "redis":
        server = request.getfixturevalue("redis_server")
        lock = LockConfig(backend="redis", redis_url=server.url, redis_prefix=server.prefix(),
                          redis_password=server.password)
        cfg = replace(r.pctx.cfg, lock=lock, pool=PoolConfig(backend="redis"))
        r = Recording(OpsContext(cfg), (), threading.Lock(), [].append, settle_seconds=0)
    writer = Stores(r.pctx.cfg).pool()
    r.look_at_pool()
    assert not r._work.fill  # an empty pool
    writer.add(Task(id="T1", title="one", depends_on=("T0",)))
    r.look_at_pool()
    assert not r._work.fill  # written, but nothing ready: T0 is not done
    writer.add(Task(id="T2", title="two"))
    r.look_at_pool()
    assert r._work.fill
    r._work.fill = False
    r.look_at_pool()
    assert not r._work.fill  # nothing new since
    set_paused(r.pctx.patrol_dir, "tester", datetime.now(UTC))
    writer.add(Task(id="T3", title="three"))
    r.look_at_pool()
    assert not r._work.fill
    clear_paused(r.pctx.patrol_dir)
    r.look_at_pool()
    assert r._work.fill
    (tmp_path / "skip").mkdir()
    skipping = _reactor(tmp_path / "skip", [], skip=("fill_slots",))
    Stores(skipping.pctx.cfg).pool().add(Task(id="T4", title="four"))
    skipping.look_at_pool()
    assert skipping._work.empty()


def _with_pool_and_slot(tmp_path: Path, grace: float) -> Recording:
    doc = {
        "instances": [{"name": "a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}],
        "lock": {"slot_grace_seconds": grace, "slot_ttl_seconds": 60},
    }
    tmp_path.mkdir()
    (tmp_path / "config.json").write_text(json.dumps(doc), "utf-8")
    cfg = load_config(str(tmp_path / "config.json"),
                      env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    return Recording(OpsContext(cfg), (), threading.Lock(), [].append, settle_seconds=0)


def test_a_reserved_slot_is_filled_again_when_its_reservation_can_lapse(tmp_path: Path) -> None:
    """However many tries it takes: the next fill is timed by the reservations themselves (the
    grace when still ahead, else the TTL), and there is none without waiting work or a
    reservation."""
    from xaf_hub.store.tasks import Task

    r = _with_pool_and_slot(tmp_path / "grace", 5)
    assert r._refill_in(r.pctx) is None  # no work waits
    r.pctx.backlog().add(Task(id="T1", title="queued"))
    assert r._refill_in(r.pctx) is None  # no reservation holds a slot
    r.pctx.gate().reserve("a")
    wait = r._refill_in(r.pctx)
    assert wait is not None and 5.0 < wait <= 5.0 + REFILL_MARGIN_SECONDS
    # The grace already over (0 s): only the TTL can end it now.
    late = _with_pool_and_slot(tmp_path / "ttl", 0)
    late.pctx.backlog().add(Task(id="T1", title="queued"))
    late.pctx.gate().reserve("a")
    wait = late._refill_in(late.pctx)
    assert wait is not None and 59.0 < wait <= 60.0 + REFILL_MARGIN_SECONDS
    # The fill is due at its own time, not with a session's 61 s recheck; no cap on tries.
    late._later(_Work({("a", "ses_1"): 0.0}, True, 50, fill_wait=2.0), 61.0)
    due = late._work.sessions
    assert due[_REFILL] - time.monotonic() <= 2.0 < due[("a", "ses_1")] - time.monotonic()


def test_a_task_kept_as_just_dispatched_is_filled_again_once_it_can_be_judged(
    tmp_path: Path,
) -> None:
    """A run resumed seconds after its dispatch may end before the task is old enough to be
    settled, and its events are spent: the reaction fills again when the youngest dispatched
    task can be judged, so the task is settled before the next round."""
    from xaf_hub.core.clock import format_instant
    from xaf_hub.patrol.live import _judged_in
    from xaf_hub.store.tasks import Task

    r = _reactor(tmp_path, [])
    now = r.pctx.now()
    young = r.pctx.cfg.patrol.just_dispatched_seconds

    def sent(tid: str, ago: float) -> Task:
        at = format_instant(now - timedelta(seconds=ago))
        return Task(id=tid, title=tid, status="dispatched", session_id="ses_1",
                    dispatched_to="a", dispatched_at=at)

    assert _judged_in(r.pctx, [Task(id="P", title="pending"), sent("OLD", young + 5)]) is None
    wait = _judged_in(r.pctx, [sent("OLD", young + 5), sent("NEW", 3), sent("NEWER", 2)])
    assert wait is not None and young - 3 - 1 < wait <= young - 3 + REFILL_MARGIN_SECONDS


class _FakeClient:
    """What ``_session`` asks of one instance: the session and its run state."""

    def __init__(self, state: dict[str, object]) -> None:
        self.state = state

    async def __aenter__(self) -> _FakeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def get_session(self, sid: str) -> object:
        from xaf_hub.fleet.wire import ServerSession

        return ServerSession(sid, "t", "/srv/p/app", 1, 1, None, "", "m/a")

    async def status(self, directory: str) -> dict[str, object]:
        return {"ses_1": self.state}


def _with_ceiling(r: LiveReactor, **kw: object) -> LiveReactor:
    from dataclasses import replace

    from xaf_hub.config.load import BudgetConfig

    pctx = OpsContext(replace(r.pctx.cfg, budget=BudgetConfig(run_usd=1.0)), env={}, **kw)  # type: ignore[arg-type]
    return LiveReactor(pctx, (), threading.Lock(), lambda line: None, settle_seconds=0)


def test_a_step_or_a_start_is_judged_at_once_and_again_while_the_run_works(
    tmp_path: Path,
) -> None:
    """On an instance with a run ceiling, a session that started or finished a priced step (a
    root's or a sub-agent's) is due for the ceiling now, not at the next poll; a poll already
    due later is brought forward; other events, and instances without a ceiling, are not."""
    plain = _reactor(tmp_path, [])
    assert plain.ceiling is not None
    plain.on_event(_ev("spent"))
    assert plain.ceiling._due == {}  # no ceiling here
    live = _with_ceiling(plain)
    assert live.ceiling is not None
    live.ceiling.look(_ev("started", "ses_root").session, 60.0)  # type: ignore[arg-type]
    before = time.monotonic()  # ^ the poll of a run at work
    for kind, sid in (("spent", "ses_kid"), ("started", "ses_root"), ("stopped", "ses_x"),
                      ("retry", "ses_y"), ("new", "ses_z")):
        live.on_event(_ev(kind, sid))
    due = live.ceiling._due
    assert set(due) == {("a", "ses_kid"), ("a", "ses_root")}
    assert all(before <= when <= time.monotonic() for when, _ in due.values())
    assert sorted(r.id for r in live.ceiling._take() or []) == ["ses_kid", "ses_root"]
    skipping = LiveReactor(live.pctx, ("run_ceiling",), threading.Lock(), lambda line: None)
    assert skipping.ceiling is None


@pytest.mark.parametrize("entry", ["round", "daemon"])
def test_a_run_whose_sub_agents_work_on_is_stopped_with_them(tmp_path: Path, entry: str) -> None:
    """The root is free and idle; a priced sub-agent works on in the background and the run
    passed its ceiling: the round (run_ceiling) and the daemon (a step of the grandchild,
    judged as its root's run) stop the root and every sub-agent, and the run is not watched
    on."""
    import asyncio

    from tests.unit.ops.ceiling_support import APP, Family, context, priced_run
    from xaf_hub.patrol import live
    from xaf_hub.patrol.jobs.run_ceiling import run_ceiling_job

    server = Family()
    priced_run(server)
    pctx = context(tmp_path, server)
    watch = live.CeilingWatch(pctx, lambda line: None, lambda: None)

    def judge() -> Cycle:
        cycle = Cycle(RoundLog(started=datetime.now(UTC)))
        if entry == "round":
            asyncio.run(run_ceiling_job(pctx, cycle))
            return cycle
        # A step of each sub-agent, as the stream told them: judged once, as the root's run.
        steps = [SessionRecord("a", sid, "t", APP, project=True, parent_id=parent)
                 for sid, parent in (("ses_grandkid", "ses_kid"), ("ses_kid", "ses_root"))]
        cycle, again = asyncio.run(watch._judge_all(steps))
        assert again == []  # stopped: nothing of it to watch on
        return cycle

    cycle = judge()
    assert [(a.kind, a.session, a.result) for a in cycle.log.actions] == [
        ("ceiling", "ses_root", "ok")
    ]
    assert "aborted with 3 sub-agent sessions" in cycle.log.actions[0].detail
    assert {"ses_root", "ses_kid", "ses_grandkid"} <= set(server.aborts)
    assert not any(n.busy for n in server.nodes.values())
    # Stopped, still over its ceiling, nothing of it at work: not stopped a second time.
    aborts = len(server.aborts)
    assert judge().log.actions == [] and len(server.aborts) == aborts


def test_a_run_under_a_ceiling_is_still_healed_when_it_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ceiling's watch does not take the place of the heal: a rate-limited retry on an
    instance with a run ceiling is healed live, and its run watched by the ceiling."""
    import asyncio

    from xaf_hub.patrol import live

    healed: list[str] = []

    async def heal_item(pctx: object, cycle: object, inst: object, rec: SessionRecord,
                        *rest: object) -> None:
        healed.append(rec.id)

    async def last_runs(self: Cycle, *args: object, **kw: object) -> dict[object, object]:
        return {}

    monkeypatch.setattr(live, "heal_item", heal_item)
    monkeypatch.setattr(Cycle, "last_runs", last_runs)
    retry = {"type": "retry", "attempt": 2, "message": "Rate limit exceeded", "next": 0}
    monkeypatch.setattr(OpsContext, "client", lambda self, inst: _FakeClient(retry))
    reactor = _with_ceiling(_reactor(tmp_path, []))
    for kind in ("started", "retry"):
        reactor.on_event(_ev(kind))
    assert reactor.ceiling is not None and set(reactor.ceiling._due) == {("a", "ses_1")}
    assert list(reactor._work.sessions) == [("a", "ses_1")]
    cycle = Cycle(RoundLog(started=datetime.now(UTC)))
    assert asyncio.run(reactor._session(cycle, "a", "ses_1")) == ""
    assert healed == ["ses_1"]


def test_a_run_stopped_past_its_ceiling_is_not_then_answered_by_policy(tmp_path: Path) -> None:
    """Before a rule answers a run's request live, the run is judged against its ceiling (as
    run_ceiling comes before check_agents in a round); a run it stops gets no answer."""
    import asyncio

    import httpx

    from tests.unit.ops.waiting_support import fleet_with_both
    from xaf_hub.config.load import PermissionRule, PermissionsConfig
    from xaf_hub.patrol.live import CeilingWatch

    r = _reactor(tmp_path, [])
    server = fleet_with_both()
    server.permissions[0].update(patterns=["git status"], metadata={"command": "git status"})
    policy = PermissionsConfig((PermissionRule("bash", "git status*", "allow"),))
    pctx = OpsContext(replace(r.pctx.cfg, permissions=policy), env={},
                      transport_factory=lambda _: httpx.MockTransport(server.route))
    judged: list[str] = []

    class Stopping(CeilingWatch):
        async def judge(
            self, cycle: Cycle, instance: str, sid: str, seen: set[tuple[str, str]],
            known: SessionRecord | None = None,
        ) -> tuple[SessionRecord, bool]:
            judged.append(sid)
            cycle.log.touched.add((instance, "ses_root"))  # what check_run does when it stops
            return SessionRecord(instance, "ses_root", "", ""), False

    live = LiveReactor(pctx, (), threading.Lock(), lambda line: None, settle_seconds=0)
    live.ceiling = Stopping(pctx, lambda line: None, lambda: None)
    cycle, _ = asyncio.run(live._react(_Work({("a", "asked:ses_perm"): 0.0})))
    assert judged == ["ses_perm"]
    assert server.replies == [] and cycle.log.actions == []


def test_a_standby_daemon_stops_a_run_past_its_ceiling(tmp_path: Path) -> None:
    """No daemon holds the lease (Redis restarting, a takeover under way): the watch of a
    daemon on standby still stops a run past its ceiling as its steps come."""
    import asyncio

    from tests.unit.ops.ceiling_support import APP, Family, context, priced_run
    from xaf_hub.patrol import live

    server = Family()
    priced_run(server, root_busy=True)
    standby = context(tmp_path, server).but(stop_requested=lambda: True)
    watch = live.CeilingWatch(standby, lambda line: None, lambda: None)
    step = SessionRecord("a", "ses_root", "t", APP, project=True)
    cycle, again = asyncio.run(watch._judge_all([step]))
    assert [(a.kind, a.session, a.result) for a in cycle.log.actions] == [
        ("ceiling", "ses_root", "ok")
    ]
    assert again == [] and not any(n.busy for n in server.nodes.values())


@pytest.mark.parametrize(("overall", "own", "parent", "stopped"), [
    (0.01, 10.0, "", False),  # the overall ceiling is not this project's
    (None, 0.05, "ses_root", True),  # the project's own, none overall; a sub-agent's step
])
def test_serving_several_projects_a_run_is_judged_at_its_projects_ceiling(
    tmp_path: Path, overall: float | None, own: float, parent: str, stopped: bool
) -> None:
    """The daemon of two projects (none chosen) judges a run (it cost $0.06) against the run
    ceiling of the project whose folder holds it."""
    import asyncio

    from tests.unit.ops.ceiling_support import APP, Family, priced_run
    from xaf_hub.patrol import live

    server = Family()
    priced_run(server, root_busy=True)
    doc: dict[str, object] = {
        "instances": [{"name": "a", "url": "http://127.0.0.1:9"}], "models": {"timezone": "UTC"},
        "projects": {"q": {"roots": {"a": ["/srv/q"]}},
                     "p": {"roots": {"a": ["/srv/p"]}, "budget_run_usd": own}},
    }
    if overall is not None:
        doc["budget"] = {"run_usd": overall}
    (tmp_path / "config.json").write_text(json.dumps(doc), "utf-8")
    cfg = load_config(str(tmp_path / "config.json"),
                      env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    watch = live.CeilingWatch(OpsContext(cfg, env={}, transport_factory=server.transport),
                              lambda line: None, lambda: None)
    step = SessionRecord("a", "ses_kid" if parent else "ses_root", "t", APP, project=True,
                         parent_id=parent)
    watch.look(step)
    assert list(watch._due) == [("a", step.id)]
    cycle, _ = asyncio.run(watch._judge_all([step]))
    assert [(a.kind, a.session, a.result) for a in cycle.log.actions] == (
        [("ceiling", "ses_root", "ok")] if stopped else [])
