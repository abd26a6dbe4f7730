"""The patrol daemon's reactions to the fleet's events, between its rounds.

A ``LiveReactor`` acts on the one session (or instance) an event of the follower
(``fleet.follow.FleetFollower``) names, with the rounds' own job functions, so nothing here
decides differently from a round: heal, resume once, fill a freed slot or newly arrived work,
and (``CeilingWatch``, in a thread of its own) stop a run past its ceiling. Reactions run in
batches under the daemon's lock and ``cycle.lock``, never beside a round, and not while paused;
the timed round stays the safety net. The order and the locks: docs/architecture.md §8.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from xaf_hub.config.load import InstanceConfig
from xaf_hub.config.watch import ConfigState
from xaf_hub.core import aio
from xaf_hub.core.clock import to_ms
from xaf_hub.core.records import SessionRecord
from xaf_hub.core.runstate import classify
from xaf_hub.errors import BusyError, HubError
from xaf_hub.fleet.events import FleetEvent
from xaf_hub.fleet.follow import FleetFollower, run_in_thread
from xaf_hub.fleet.scan import build_record
from xaf_hub.fleet.wire import ServerSession
from xaf_hub.notify.patrol import queue_round
from xaf_hub.notify.record import RoundLog
from xaf_hub.ops.ceiling import root_of
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.decisions import load_decisions
from xaf_hub.ops.heal import heal_candidate
from xaf_hub.ops.live_board import publish
from xaf_hub.ops.queue import queue_length
from xaf_hub.ops.waiting import list_waiting
from xaf_hub.patrol.context import Cycle, cycle_lock, owner_view, pool_discipline, project_views
from xaf_hub.patrol.jobs.check_agents import STEP as CHECK
from xaf_hub.patrol.jobs.check_agents import answer_by_policy, resume_one
from xaf_hub.patrol.jobs.fill_slots import fill_every_project
from xaf_hub.patrol.jobs.fix_free_limit import STEP as HEAL
from xaf_hub.patrol.jobs.fix_free_limit import heal_item
from xaf_hub.patrol.jobs.run_ceiling import STEP as CEILING
from xaf_hub.patrol.jobs.run_ceiling import check_run, guarded
from xaf_hub.patrol.settle import dispatch_age
from xaf_hub.store.patrol_state import pause_info
from xaf_hub.store.tasks import Task

FILL = "fill_slots"
_SESSION_KINDS = frozenset({"retry", "stopped", "error"})
_FREES_A_SLOT = frozenset({"stopped", "gone"})
_COSTS = frozenset({"started", "spent"})  # what makes the ceiling judge a run now
LOCKED_RETRY_SECONDS = 5.0
# A running session under a run ceiling is read again this often while it runs.
CEILING_POLL_SECONDS = 3.0
REFILL_MARGIN_SECONDS = 0.5  # after a reservation can lapse, before the fill looks again
_REFILL = ("", "fill")  # the key of a fill due later among the sessions to look at
# A request a run waits on, to answer by policy: (instance, _ASKED + session id) in the queue.
_ASKED = "asked:"
_UNSEEN = object()  # the pool not looked at yet


@dataclass
class _Work:
    """What is waiting to be done: sessions to look at (with when), and whether to fill."""

    sessions: dict[tuple[str, str], float] = field(default_factory=dict)
    fill: bool = False
    fill_tries: int = 0  # fills in a row that found the freed slot still reserved
    fill_wait: float | None = None  # seconds until a reservation can lapse: fill again then

    def empty(self) -> bool:
        return not self.sessions and not self.fill


def _judged_in(pctx: OpsContext, tasks: Sequence[Task]) -> float | None:
    """Seconds until the youngest dispatched task is old enough to be settled
    (``patrol.just_dispatched_seconds``); None when none is that young."""
    young, now = timedelta(seconds=pctx.cfg.patrol.just_dispatched_seconds), pctx.now()
    ages = [dispatch_age(t, now) for t in tasks if t.status == "dispatched"]
    left = [(young - age).total_seconds() for age in ages if age is not None and age < young]
    return min(left) + REFILL_MARGIN_SECONDS if left else None


class LiveReactor:
    """Turns events into reactions, one batch at a time, in its own thread."""

    def __init__(
        self, pctx: OpsContext, skip: Iterable[str], busy: threading.Lock,
        out: Callable[[str], None], *, settle_seconds: float = 1.0,
        notices: Callable[[], None] = lambda: None,
    ) -> None:
        self.pctx = pctx
        self.skip = frozenset(skip)
        self.busy = busy
        self.out = out
        self.settle_seconds = settle_seconds
        self.notices = notices  # wakes the sender once a reaction queued its notices
        # A session read by id with its worktree's checkout (the follower's ``placed``).
        self.placed: Callable[[str, ServerSession], ServerSession] = lambda _instance, s: s
        self.ceiling = None if CEILING in self.skip else CeilingWatch(
            pctx, out, notices, lambda i, s: self.placed(i, s))
        self._work = _Work()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="xaf-hub-live", daemon=True)
        self._pool_seen: object = _UNSEEN  # the pool's stamp at the last look

    def start(self, before: LiveReactor | None = None) -> None:
        """Start reacting, with a fill first: free slots need not wait for the first round
        (``before``: a stopped reactor whose waiting work this one takes over)."""
        if before is not None:
            self._work, self._pool_seen = before._work, before._pool_seen
        if FILL not in self.skip:
            with self._cond:
                self._work.fill = True
        if self.ceiling is not None:
            self.ceiling.start()
        self._thread.start()

    def look_at_pool(self) -> None:
        """Fill when the pool was written since the last look and ready work waits in it.
        Paused, it looks at nothing: the first look after a resume sees the pool afresh."""
        pctx = self.pctx
        if FILL in self.skip or self._stopped:
            return
        if pause_info(pctx.patrol_dir) is not None:
            self._pool_seen = _UNSEEN
            return
        pool = pctx.backlog()
        stamp = pool.stamp()
        if stamp == self._pool_seen:
            return
        self._pool_seen = stamp
        if queue_length(pool.load(), pctx.now()):
            with self._cond:
                self._work.fill = True
                self._cond.notify_all()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the running reaction (if any)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self.ceiling is not None:
            self.ceiling.stop(timeout)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def on_event(self, ev: FleetEvent) -> None:
        """Called by the follower for every change (from its thread)."""
        if ev.kind in ("down", "up", "polling"):
            tail = f": {ev.detail}" if ev.detail and ev.kind != "up" else ""
            self.out(self.pctx.redact(stamped(f"live: {ev.instance} {ev.kind}{tail}")))
        if ev.session is not None and ev.kind in _COSTS and self.ceiling is not None:
            self.ceiling.look(ev.session)
        with self._cond:
            policy = self.pctx.cfg.permissions
            answers = bool(policy.rules) or policy.deny_after_minutes is not None
            if ev.session is not None and (
                ev.kind in _SESSION_KINDS or (ev.kind == "asked" and answers)
            ):
                key = (ev.instance, (_ASKED if ev.kind == "asked" else "") + ev.session.id)
                self._work.sessions.setdefault(key, time.monotonic())
            if ev.kind in _FREES_A_SLOT and FILL not in self.skip:
                self._work.fill = True
            self._cond.notify_all()

    # ------------------------------------------------------------------------- the thread

    def _take(self) -> _Work | None:
        """Wait for due work; None once stopped."""
        with self._cond:
            while True:
                if self._stopped:
                    return None
                now = time.monotonic()
                if self._work.fill or any(t <= now for t in self._work.sessions.values()):
                    break
                later = min(self._work.sessions.values(), default=now + 3600.0)
                self._cond.wait(max(0.05, later - now))
        # Let a burst settle (a stop is followed by its idle, its message, the next event).
        time.sleep(self.settle_seconds)
        with self._cond:
            now, left = time.monotonic(), self._work
            self._work = _Work({k: t for k, t in left.sessions.items() if t > now})
            due = {k: t for k, t in left.sessions.items() if t <= now}
            return _Work(due, left.fill, left.fill_tries)

    def _later(self, work: _Work, seconds: float) -> None:
        with self._cond:
            when = time.monotonic() + seconds
            for k in work.sessions:
                self._work.sessions[k] = min(self._work.sessions.get(k, when), when)
            if work.fill:
                # A fill to try again: at its own time when it has one, else with the sessions.
                at = when if work.fill_wait is None else time.monotonic() + work.fill_wait
                self._work.sessions[_REFILL] = min(self._work.sessions.get(_REFILL, at), at)
                self._work.fill_tries = max(self._work.fill_tries, work.fill_tries)

    def _loop(self) -> None:
        while (work := self._take()) is not None:
            try:
                retry = self._run(work)
            except Exception as exc:  # noqa: BLE001 - a bad reaction must not end the daemon
                line = f"live: reaction failed: {type(exc).__name__}: {exc}"
                self.pctx.log(self.pctx.redact(line))
                retry = None
            if retry is not None:
                self._later(retry[0], retry[1])

    def _run(self, work: _Work) -> tuple[_Work, float] | None:
        """One batch under the locks; returns work to try again later, and when."""
        pctx = self.pctx
        with self.busy:
            if self._stopped or pause_info(pctx.patrol_dir) is not None:
                return None  # paused: the patrol does nothing, events included
            try:
                with cycle_lock(pctx):
                    cycle, again = aio.run(self._react(work))
                    _tell(pctx, cycle, self.out, self.notices)
            except BusyError:
                return work, LOCKED_RETRY_SECONDS  # a round (maybe another patrol) is running
        return None if again.empty() else (again, pctx.cfg.patrol.run_start_grace_seconds + 1.0)

    async def _react(self, work: _Work) -> tuple[Cycle, _Work]:
        pctx = self.pctx
        cycle = Cycle(RoundLog(started=pctx.now()))
        again = _Work()
        if work.sessions.pop(_REFILL, None) is not None:
            work.fill = True
        # Requests last, as in a round (check_agents answers them after its other work); each
        # run is judged against its ceiling before a rule answers it (``_asked``).
        for key in sorted(work.sessions, key=lambda k: (k[1].startswith(_ASKED), k)):
            if pctx.stop_requested():
                break
            with contextlib.suppress(HubError):  # one session's error: the next round's
                if key[1].startswith(_ASKED):
                    await self._asked(cycle, key[0], key[1].removeprefix(_ASKED))
                elif await self._session(cycle, *key) == "recheck":
                    again.sessions[key] = 0.0
        if work.fill and not pctx.stop_requested():
            try:
                # Only when the pool has work: a fill scans the whole fleet.
                pool = await aio.blocking(pctx.backlog().load)
                if any(t.status in ("pending", "dispatched") for t in pool.tasks):
                    await fill_every_project(pctx, cycle)
                    # The slot that freed may still be held by a reservation (a run sent
                    # seconds ago): fill again when it can lapse, so queued work does not
                    # wait for the next round. Each reservation lapses by its TTL, so this
                    # ends; a new one comes with its own send. A task kept as just dispatched
                    # (its run may have ended already, its events gone) is judged then too.
                    waits = [w for w in (self._refill_in(pctx), _judged_in(pctx, pool.tasks))
                             if w is not None]
                    if waits:
                        again.fill, again.fill_tries = True, work.fill_tries + 1
                        again.fill_wait = min(waits)
            except HubError as exc:
                cycle.log.error(pctx, FILL, str(exc))
        cycle.log.finished = pctx.now()
        return cycle, again

    @staticmethod
    def _refill_in(pctx: OpsContext) -> float | None:
        """Seconds until the first live reservation can lapse, while ready pool work waits;
        None when no work waits or no reservation holds a slot."""
        if not queue_length(pctx.backlog().load(), pctx.now()):
            return None
        gate, lock = pctx.gate(), pctx.cfg.lock
        now = gate.clock()
        made = [r.created for i in pctx.cfg.instances for r in gate.live_reservations(i.name)]
        # Its grace, if still ahead (a session not running by then frees it); else its TTL,
        # which ends every reservation.
        grace, ttl = lock.slot_grace_seconds, lock.slot_ttl_seconds
        lapses = [at + grace if at + grace > now else at + ttl for at in made]
        return max(min(lapses) - now, 0.0) + REFILL_MARGIN_SECONDS if lapses else None

    async def _asked(self, cycle: Cycle, instance: str, sid: str) -> None:
        """Answer by policy the request a session's run just began to wait on (the round
        answers the same way: ``check_agents.answer_by_policy``)."""

        pctx = self.pctx
        if self.ceiling is not None:  # money first, as in a round: a run past it gets no answer
            root, _ = await self.ceiling.judge(cycle, instance, sid, set())
            if (instance, root.id) in cycle.log.touched:
                return
        waiters = await list_waiting(pctx, instance)
        mine = [p for p in waiters.requests if p.session.id == sid]
        await answer_by_policy(pctx, cycle, mine, to_ms(pctx.now()))

    async def _session(self, cycle: Cycle, instance: str, sid: str) -> str:
        """React to one session; "recheck" when it should be looked at again shortly."""
        pctx = self.pctx
        inst = pctx.cfg.instance(instance)  # no longer configured: a HubError, as if unread
        async with pctx.client(inst) as client:
            s = self.placed(instance, await client.get_session(sid))
            status = (await client.status(s.directory)).get(sid) if s.directory else None
        pctx, inst = owner_view(pctx, instance, inst.owner(s.directory, s.checkout))
        if not s.directory or not inst.rules.owns(s.directory, s.checkout) or s.parent_id:
            return ""
        rec = build_record(inst, s, status, True)
        run = (await cycle.last_runs(pctx, [(inst, rec)])).get((inst.name, rec.id))
        state = pctx.model_state()
        people = await aio.blocking(load_decisions, pctx)
        cand = heal_candidate(rec, run) if HEAL not in self.skip else None
        if cand is not None:
            if not await aio.blocking(state.was_healed, cand.key):
                await heal_item(pctx, cycle, inst, rec, run, cand, state, people,
                                lambda: pool_discipline(pctx, cycle.log, HEAL))
            return ""
        if CHECK in self.skip or rec.running:
            return ""
        now_ms = to_ms(pctx.now())
        if classify(rec, run, now_ms, pctx.cfg.patrol.stale_minutes)[0] != "interrupted":
            return ""
        decision = people.for_session(inst.name, rec.id, run.created_ms if run else None)
        if decision is not None:  # a person stopped or steered it: theirs, not the patrol's
            cycle.log.add(pctx, CHECK, "person", "skipped", rec, detail=decision.text,
                          why=decision.kind)
            return ""
        override = await aio.blocking(pool_discipline, pctx, cycle.log, CHECK)
        why = await resume_one(pctx, cycle, inst, rec, run, override, state, now_ms)
        return "recheck" if why == "starting" else ""


def stamped(line: str) -> str:
    """A line of the daemon's output, led by the local time."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}"


def _tell(
    pctx: OpsContext, cycle: Cycle, out: Callable[[str], None], notices: Callable[[], None]
) -> None:
    """Say what a reaction did in one line of the daemon's output, and queue its notices: they
    reach the chat now, not at the round; queued only, the sender posts them once the locks
    are released, so no receiver holds a heal."""
    done = [a for a in cycle.log.actions if a.result == "ok"]
    if done:
        words = ", ".join(f"{a.kind} {a.instance}/{a.session or a.task}" for a in done)
        out(stamped(f"live: {words}"))
    if cycle.log.actions and queue_round(pctx, cycle.log, live=True):
        notices()


class CeilingWatch:
    """Judges runs against their ceiling as their sessions report steps, in its own thread.

    ``look`` names a session (a root or a sub-agent's) on an instance with a run ceiling; the
    thread judges the run it belongs to at once, without the reactor's settling pause, and
    again every ``CEILING_POLL_SECONDS`` while any session of that run works. What the event
    told of the session (its folder, its parent) spares asking the server again. It judges on
    every daemon, standby included: a run is stopped while no daemon holds the lease (Redis
    away, a takeover under way), and a run another daemon stopped already is left alone.
    """

    def __init__(
        self, pctx: OpsContext, out: Callable[[str], None], notices: Callable[[], None],
        placed: Callable[[str, ServerSession], ServerSession] = lambda _i, s: s,
    ) -> None:
        self.pctx = pctx
        self.out = out
        self.notices = notices
        self.placed = placed  # a session read by id with its worktree's checkout (LiveReactor)
        # (instance, session) -> when (monotonic), and the session as the event told it
        self._due: dict[tuple[str, str], tuple[float, SessionRecord]] = {}
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="xaf-hub-ceiling", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def look(self, rec: SessionRecord, after: float = 0.0) -> None:
        """Judge the run of ``rec`` in ``after`` seconds (sooner if already due sooner);
        nothing on an instance without a ceiling."""
        with contextlib.suppress(HubError):  # not read: as if no ceiling
            if self._watched(rec) is None:
                return
            with self._cond:
                key, when = (rec.instance, rec.id), time.monotonic() + after
                self._due[key] = (min(self._due.get(key, (when, rec))[0], when), rec)
                self._cond.notify_all()

    def _take(self) -> list[SessionRecord] | None:
        """The looks due now; None once stopped."""
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                due = [k for k, (t, _) in self._due.items() if t <= now]
                if due:
                    return [self._due.pop(k)[1] for k in due]
                later = min((t for t, _ in self._due.values()), default=now + 3600.0)
                self._cond.wait(max(0.05, later - now))
            return None

    def _loop(self) -> None:
        while (due := self._take()) is not None:
            pctx = self.pctx
            if pause_info(pctx.patrol_dir) is not None:
                continue  # paused: the patrol does nothing, events included
            try:
                cycle, again = aio.run(self._judge_all(due))
                _tell(pctx, cycle, self.out, self.notices)
            except Exception as exc:  # noqa: BLE001 - a bad look must not end the daemon
                pctx.log(pctx.redact(f"live: ceiling failed: {type(exc).__name__}: {exc}"))
                continue
            for root in again:
                self.look(root, CEILING_POLL_SECONDS)

    async def _judge_all(self, due: list[SessionRecord]) -> tuple[Cycle, list[SessionRecord]]:
        cycle = Cycle(RoundLog(started=self.pctx.now()))
        again: list[SessionRecord] = []
        judged: set[tuple[str, str]] = set()
        for rec in due:
            if self._stopped:  # not the lease: a standby stops a run too, an abort is idempotent
                break
            with contextlib.suppress(HubError):
                root, runs = await self.judge(cycle, rec.instance, rec.id, judged, rec)
                if runs:
                    again.append(root)
        cycle.log.finished = self.pctx.now()
        return cycle, again

    async def judge(
        self, cycle: Cycle, instance: str, sid: str, judged: set[tuple[str, str]],
        known: SessionRecord | None = None,
    ) -> tuple[SessionRecord, bool]:
        """Judge the run ``sid`` belongs to, once per batch (``judged``): (its root, whether
        some session of it still works). ``known``: the session as an event told it."""
        root = known or SessionRecord(instance, sid, "", "", project=True)
        if self._watched(root) is None:
            return root, False
        inst = self.pctx.cfg.instance(instance)
        async with self.pctx.client(inst) as client:
            if known is None or known.parent_id:
                top = self.placed(instance, await root_of(client, await client.get_session(sid)))
                root = build_record(inst, top, None, inst.claims(top.directory, top.checkout))
            seen = self._watched(root)
            if (instance, root.id) in judged or not root.project or seen is None:
                return root, False
            judged.add((instance, root.id))
            return root, await check_run(seen[0], cycle, seen[1], root, client, "patrol.live")

    def _watched(self, rec: SessionRecord) -> tuple[OpsContext, InstanceConfig] | None:
        """Where the run of ``rec`` is judged (``owner_view``: serving several projects, its own
        project's ceiling), or None when no ceiling watches it; a session of no project (or of
        a folder not known yet) is watched when any project's ceiling could hold it."""
        owner = rec.owner or self.pctx.cfg.instance(rec.instance).owner(rec.directory)
        pctx, inst = owner_view(self.pctx, rec.instance, owner)
        views = [pctx] if pctx.cfg.chosen else [pctx, *project_views(pctx)]
        return (pctx, inst) if any(guarded(v, v.cfg.instance(inst.name)) for v in views) else None


def start_live(
    pctx: OpsContext, skip: Iterable[str], busy: threading.Lock, out: Callable[[str], None],
    notices: Callable[[], None] = lambda: None, before: LiveReactor | None = None,
    state: Callable[[], ConfigState | None] = lambda: None,
) -> tuple[FleetFollower, LiveReactor]:
    """Follow the fleet and react to it, until ``stop_live``; ``notices`` wakes the sender;
    ``before``: the stopped reactor of the previous config, whose waiting work goes on;
    ``state``: the daemon's config state, said on its live board."""
    reactor = LiveReactor(pctx, skip, busy, out, notices=notices)
    cfg = pctx.cfg
    follower = FleetFollower(
        cfg, emit=reactor.on_event, transport_factory=pctx.transport_factory,
        outcomes=False, steps=reactor.ceiling is not None,
        publish=lambda view: publish(cfg, view, "patrol", pctx.stores, state()),
    )
    reactor.placed = follower.placed
    reactor.start(before)
    run_in_thread(follower, "xaf-hub-patrol-follower")
    return follower, reactor


def stop_live(live: tuple[FleetFollower, LiveReactor]) -> None:
    """Stop following (its last board written), then let the running reaction finish."""
    follower, reactor = live
    follower.close()
    reactor.stop()


__all__ = ["LiveReactor", "stamped", "start_live", "stop_live"]

