"""Run patrol cycles: one (``--once``) or on an APScheduler loop, with pause and a cycle lock.

A cycle runs its five jobs in order, recording a step's error and going on; its exit code is the
worst step's. ``patrol/cycle.lock`` keeps two patrols on one machine from running a cycle at
once, ``patrol/paused.json`` pauses durably, and ``RunMemory`` lets a round read only the
sessions that moved. With Redis, daemons on several hosts compete for one lease and only the
holder acts, every write fenced by its token (``OpsContext.fence``). The round, the daemon, the
locks and the lease: docs/architecture.md §8.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

from xaf_hub.config.load import Config
from xaf_hub.config.watch import ConfigState, ConfigWatch
from xaf_hub.core import aio
from xaf_hub.errors import (
    BusyError,
    ExitCode,
    HubError,
    LockLostError,
    StateFileError,
    UnreachableError,
)
from xaf_hub.notify.patrol import Sender, queue_failover, queue_round, send_round
from xaf_hub.notify.record import RoundLog, StepOutcome
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.context import Cycle, Job, cycle_lock, every_project
from xaf_hub.patrol.jobs.check_agents import check_agents
from xaf_hub.patrol.jobs.fill_slots import fill_every_project
from xaf_hub.patrol.jobs.fix_free_limit import fix_free_limit
from xaf_hub.patrol.jobs.run_ceiling import run_ceiling_job
from xaf_hub.patrol.jobs.sync_design import sync_design_tasks
from xaf_hub.patrol.live import stamped, start_live, stop_live
from xaf_hub.patrol.report import write_report
from xaf_hub.store.backends import uses_lease
from xaf_hub.store.gate import host_name
from xaf_hub.store.patrol_state import (
    HEARTBEAT_FILE,
    RunMemory,
    daemon_lock,
    pause_info,
    paused_message,
)
from xaf_hub.store.statefile import write_json_atomic

if TYPE_CHECKING:
    from xaf_hub.store.redis.lease import PatrolLease

# Each step serves every configured project when none is chosen (``every_project``); the
# fill shares the servers' free slots between them (``fill_every_project``).
STEPS: tuple[tuple[str, Job], ...] = (
    ("run_ceiling", every_project(run_ceiling_job)),
    ("fix_free_limit", every_project(fix_free_limit)),
    ("check_agents", every_project(check_agents)),
    ("sync_design_tasks", every_project(sync_design_tasks)),
    ("fill_slots", fill_every_project),
)
STEP_NAMES: tuple[str, ...] = tuple(name for name, _ in STEPS)

# How often the daemon looks whether work arrived in the pool and whether its config changed.
WATCH_SECONDS = 1.0
STOP_POLL_SECONDS = 0.2  # how soon the daemon sees a stop signal that another thread took

async def run_cycle(
    pctx: OpsContext,
    skip: Iterable[str] = (),
    steps: tuple[tuple[str, Job], ...] = STEPS,
    memory: RunMemory | None = None,
) -> Cycle:
    """Run the steps in order; a failing step is recorded and the next one still runs."""
    skipped = set(skip)
    cycle = Cycle(RoundLog(started=pctx.now()), memory=memory)
    for name, job in steps:
        if name in skipped:
            cycle.log.steps.append(StepOutcome(name, "skipped"))
            continue
        if pctx.stop_requested():
            cycle.log.steps.append(StepOutcome(name, "not run", error="stop requested"))
            continue
        t0 = time.monotonic()
        try:
            await job(pctx, cycle)
        except Exception as exc:  # noqa: BLE001 - one step's bug must not stop the others
            code, error = int(ExitCode.INTERNAL), f"internal error: {type(exc).__name__}: {exc}"
            if isinstance(exc, HubError):
                code, error = int(exc.exit_code), str(exc)
            cause = exc.cause if isinstance(exc, UnreachableError) else None
            outcome = StepOutcome(name, "failed", code, pctx.redact(error), time.monotonic() - t0,
                                  cause)
            pctx.log(f"{name}: failed (exit {outcome.code}): {outcome.error}")
        else:
            outcome = StepOutcome(name, "ok", seconds=time.monotonic() - t0)
        cycle.log.steps.append(outcome)
    cycle.log.finished = pctx.now()
    return cycle


@dataclass(frozen=True)
class CycleRun:
    """How a request to run one cycle ended."""

    status: Literal["ran", "paused", "locked", "standby", "no lease"]
    code: int
    message: str
    cycle: Cycle | None = None
    report: Path | None = None


def summary(cycle: Cycle, code: int) -> str:
    """One line about a finished cycle."""
    counts = Counter(a.kind for a in cycle.log.actions if a.result == "ok")
    words = {"heal": "healed", "resume": "resumed", "add": "added", "dispatch": "dispatched",
             "done": "done", "requeue": "requeued"}
    done = ", ".join(f"{label} {counts[kind]}" for kind, label in words.items())
    failed = [s.name for s in cycle.log.steps if s.status == "failed"]
    result = "ok" if code == 0 else f"exit {code}, failed: {', '.join(failed) or 'report'}"
    return f"patrol cycle {result}; {done}; errors {len(cycle.log.errors)}"


def open_lease(pctx: OpsContext) -> PatrolLease | None:
    """The HA lease when the gate or the pool lives in Redis, else None (one host).

    ``patrol.lease_seconds: 0`` turns it off: every daemon runs rounds, and only the pool's
    atomic claims and the gate keep two of them from sending one task twice.
    """

    cfg = pctx.cfg
    if not uses_lease(cfg):
        return None
    # deferred: an optional extra (redis), loaded only when configured, see docs/performance.md
    from xaf_hub.store.redis.lease import PatrolLease

    return PatrolLease(
        pctx.stores.redis(), cfg.lock.redis_prefix, host_name(), cfg.patrol.lease_seconds
    )


def _fenced(pctx: OpsContext, lease: PatrolLease) -> OpsContext:
    """``pctx`` writing under the lease's token, and stopping as soon as the lease is lost."""
    outer = pctx.stop_requested
    return pctx.but(fence=lease.fence, stop_requested=lambda: outer() or not lease.held)


def run_once(
    pctx: OpsContext,
    skip: Iterable[str] = (),
    steps: tuple[tuple[str, Job], ...] = STEPS,
    *,
    lease: PatrolLease | None = None,
    keep_lease: bool = False,
    send: bool = True,
) -> CycleRun:
    """Run one cycle unless paused or another cycle holds the lock; write the report.

    With a ``lease`` (HA on Redis) the cycle runs only while this process holds it, fenced by
    its token; ``keep_lease`` (the daemon) keeps it afterwards, else it is given back.
    The cycle's notices are queued under the lock; with ``send`` they are then sent with the
    lock released (a slow receiver never keeps another patrol out), before the report is
    written so that it says what could not be sent. The daemon passes ``send=False``: its
    ``Sender`` thread sends.
    """
    paused = pause_info(pctx.patrol_dir)
    if paused is not None:
        return CycleRun("paused", 0, paused_message(paused))
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(cycle_lock(pctx))
        except BusyError:
            why = "another patrol cycle is running on this machine; this one skipped"
            return CycleRun("locked", int(ExitCode.BUSY), why)
        if lease is not None:  # held for the round, or why no round runs
            try:
                held = lease.acquire()
                holder = None if held else lease.holder()
            except UnreachableError as exc:
                why = pctx.redact(f"no patrol lease ({exc}); no cycle run, nothing sent")
                return CycleRun("no lease", int(ExitCode.UNREACHABLE), why)
            if not held:
                why = f"standby: the patrol lease is held by {holder or 'another daemon'}"
                return CycleRun("standby", int(ExitCode.BUSY), f"{why}; no cycle run")
            pctx = _fenced(pctx, lease)
            if not keep_lease:  # --once: renewed while the round runs, given back after it
                stack.callback(_give_back, lease)
                stack.enter_context(_renewing(lease))
        memory, problem = _load_memory(pctx)
        cycle = aio.run(run_cycle(pctx, skip, steps, memory))
        problem = problem or _keep_memory(cycle)
        pctx.log(f"last runs: {cycle.reads} read, {cycle.recalled} unchanged since read")
        queue_round(pctx, cycle.log)
    if send:
        send_round(pctx, cycle.log)
    code = ExitCode.worst(s.code for s in cycle.log.steps)  # 0 unless a step failed
    if problem:
        code = ExitCode.worst((code, ExitCode.INTERNAL))
        cycle.log.error(pctx, "", problem)
    report: Path | None = None
    try:
        report = write_report(pctx, cycle.log, code)[1]
    except (OSError, HubError) as exc:
        code = ExitCode.worst((code, ExitCode.INTERNAL))
        cycle.log.error(pctx, "", f"report not written: {exc}")
    return CycleRun("ran", code, summary(cycle, code), cycle, report)


@contextlib.contextmanager
def _renewing(lease: PatrolLease) -> Iterator[None]:
    """Renew ``lease`` every third of it while the block runs (a round may outlast it)."""
    done = threading.Event()

    def renew() -> None:
        while not done.wait(max(0.2, lease.lease_seconds / 3)):
            try:
                if not lease.acquire():
                    return  # taken by another daemon: the fence refuses our writes from now
            except HubError:
                continue  # a blip; the lease runs out locally if it lasts

    thread = threading.Thread(target=renew, name="xaf-hub patrol lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=10)


def _give_back(lease: PatrolLease) -> None:
    with contextlib.suppress(HubError):  # unreachable: the lease lapses on its own
        lease.release()


def _load_memory(pctx: OpsContext) -> tuple[RunMemory | None, str]:
    """The rounds' memory of last runs, or why not (damaged or unreachable: the round reads
    every session)."""
    try:
        return pctx.stores.run_memory(pctx.patrol_dir, pctx.fence()), ""
    except StateFileError as exc:
        return None, (
            f"{exc}; this round read every session and left the memory as it is "
            "(delete it to start a new memory)"
        )
    except HubError as exc:
        return None, f"patrol last-runs memory not read ({exc}); this round read every session"


def _keep_memory(cycle: Cycle) -> str:
    """Save what this round read; "" or why it could not be saved."""
    memory = cycle.memory
    if memory is None:
        return ""
    memory.forget(cycle.log.touched)  # prompted this round: their run is not what was read
    if all(s.status in ("ok", "skipped") for s in cycle.log.steps):
        # A full round asked about every session it may need, on every instance it reached.
        memory.keep_only(cycle.asked, [i.name for i in cycle.log.instances if not i.reachable])
    try:
        memory.save()
    except LockLostError:
        return ""  # the daemon that holds the lease now keeps the memory
    except (OSError, HubError) as exc:
        return f"patrol last-runs memory {memory.where}: not written: {exc}"
    return ""


# ---------------------------------------------------------------------------------------------
# Daemon


def first_run(now: datetime, interval: timedelta, offset_minutes: int) -> datetime:
    """The first run after ``now`` on the grid hour:offset + k·interval (pure)."""
    anchor = now.replace(minute=offset_minutes, second=0, microsecond=0)
    step = interval.total_seconds()
    k = math.floor((now - anchor).total_seconds() / step) + 1
    return anchor + timedelta(seconds=k * step)


def run_daemon(
    pctx: OpsContext,
    skip: Iterable[str],
    interval: timedelta,
    *,
    aligned: bool,
    out: Callable[[str], None],
    live: bool = True,
    watch: ConfigWatch | None = None,
    use: Callable[[Config], None] = lambda cfg: None,
) -> int:
    """Run cycles every ``interval`` until SIGTERM/SIGINT; return the exit code (0).

    ``live``: also react to the fleet's events and pool changes between cycles, under the same
    locks. ``watch``: read the config again when saved and hand it to ``use``. A second daemon on
    the same state folder raises BusyError naming the first one's pid before it starts anything.
    """
    with daemon_lock(pctx.patrol_dir, pctx.now()):
        # deferred: start-up, only the daemon needs APScheduler (see docs/performance.md)
        from apscheduler.schedulers.background import BackgroundScheduler
        from apscheduler.triggers.interval import IntervalTrigger

        stop = threading.Event()
        busy = threading.Lock()
        lease = open_lease(pctx)
        pctx = pctx.but(stop_requested=stop.is_set)
        # A standby (or a holder whose lease ran out) stops and writes nothing.
        if lease is not None:
            pctx = _fenced(pctx, lease)
        skip = tuple(skip)
        folder = pctx.patrol_dir
        following = None

        def state() -> ConfigState | None:
            return None if watch is None else watch.state

        # Notices go out from its thread, never under a lock. It stops with the daemon only, not
        # with the lease: a standby's sender that quit at start would leave a later takeover's
        # notices (the failover first) queued forever; what it sends was queued while active.
        sender = Sender(pctx.but(stop_requested=stop.is_set), out)
        sender.start()
        if live:  # before the first run is timed: starting it may take a moment on a busy box
            following = start_live(pctx, skip, busy, out, sender.wake, state=state)
        now = pctx.now().astimezone(UTC)
        start = now + timedelta(seconds=0.2)  # unaligned: at once
        if aligned:
            start = first_run(now.astimezone(), interval, pctx.cfg.patrol.minute_offset)
        beat: dict[str, Any] = {
            "schema_version": 1,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": now.isoformat(timespec="seconds"),
            "interval_seconds": interval.total_seconds(),
            "ticks": 0,
            "tick_at": "",
            "last": "",
            "stopped_at": "",
            "role": "active" if lease is None else "standby",
        }

        def save_beat(**changes: Any) -> None:
            """Update the heartbeat with ``changes`` and write it."""
            beat.update(changes)
            with contextlib.suppress(OSError):
                write_json_atomic(folder / HEARTBEAT_FILE, beat)

        def tick() -> None:
            with busy:
                # A standby: the lease keeper takes over and calls a round when it can.
                if stop.is_set() or (lease is not None and not lease.held):
                    return
                try:
                    result = run_once(pctx, skip, lease=lease, keep_lease=True, send=False)
                    sender.wake(every=True)
                except Exception as exc:  # noqa: BLE001 - the loop must outlive one bad cycle
                    why = pctx.redact(f"cycle crashed: {type(exc).__name__}: {exc}")
                    result = CycleRun("ran", int(ExitCode.INTERNAL), why)
                at = pctx.now().isoformat(timespec="seconds")
                save_beat(ticks=beat["ticks"] + 1, last=result.status, code=result.code, tick_at=at)
                out(stamped(result.message))

        scheduler = BackgroundScheduler(timezone=UTC)
        trigger = IntervalTrigger(seconds=interval.total_seconds(), start_date=start, timezone=UTC)
        # next_run_time: the first run as computed, even if the scheduler starts after it (a loaded
        # box); without it APScheduler skips to the next grid point, a whole interval later.
        scheduler.add_job(tick, trigger, id="patrol", name="patrol cycle", max_instances=1,
                          coalesce=True, misfire_grace_time=None, next_run_time=start)

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()  # no lock this (the main) thread may hold: it only sleeps, below

        def reconfigure(cfg: Config) -> None:
            """Go on with ``cfg``: the rounds, the sender, and the fleet followed anew."""
            nonlocal pctx, following, interval
            if following is not None:
                stop_live(following)  # its running reaction ends first (it takes ``busy``)
            with busy:
                use(cfg)
                pctx = pctx.but(cfg=cfg)
                sender.pctx = sender.pctx.but(cfg=cfg)  # its own stop probe: the daemon's end
                sender.start()
            if following is not None:
                following = start_live(pctx, skip, busy, out, sender.wake, following[1], state)
            every = timedelta(minutes=cfg.patrol.interval_minutes)
            if aligned and every != interval:  # the rounds' timer, when the config sets it
                interval = every
                with contextlib.suppress(Exception):  # not yet started, or shutting down
                    scheduler.reschedule_job("patrol", trigger=IntervalTrigger(
                        seconds=every.total_seconds(), timezone=UTC,
                        start_date=first_run(datetime.now(UTC).astimezone(), every,
                                             cfg.patrol.minute_offset)))

        def say(line: str) -> None:
            out(pctx.redact(stamped(line)))

        def look() -> None:
            """Every WATCH_SECONDS: the config's files, then the pool (work arrived?)."""
            said = ""  # the last failure logged: a lasting one (Redis away) is said once
            while not stop.wait(WATCH_SECONDS):
                try:
                    if watch is not None and watch.look("the patrol daemon", reconfigure, say):
                        save_beat(config=watch.state.to_json())
                    if following is not None:
                        following[1].look_at_pool()
                    said = ""
                except Exception as exc:  # noqa: BLE001 - the watch must outlive one bad look
                    line = pctx.redact(f"watch: {type(exc).__name__}: {exc}")
                    if line != said:
                        pctx.log(line)
                    said = line

        watcher = threading.Thread(target=look, name="xaf-hub patrol watch", daemon=True)
        watcher.start()
        keeper = None
        if lease is not None:
            args = (pctx, lease, stop, scheduler, save_beat, out, sender)
            keeper = threading.Thread(target=_keep_lease, args=args, name="xaf-hub patrol lease",
                                      daemon=True)
            keeper.start()

        windows = [signal.SIGBREAK] if hasattr(signal, "SIGBREAK") else []  # console Ctrl+Break
        stops = [signal.SIGINT, signal.SIGTERM, *windows]
        previous = {sig: signal.signal(sig, on_signal) for sig in stops}
        save_beat()
        out(
            f"patrol daemon started (pid {os.getpid()}); every {interval.total_seconds():g}s, "
            f"first cycle at {start.astimezone():%Y-%m-%d %H:%M:%S}"
        )
        try:
            if not stop.is_set():
                scheduler.start()
            # Python runs a signal handler in the main thread only, once it runs again: a stop
            # signal that landed in another thread (one starting as it came) is seen at the next
            # wake, where a wait for the next round would hold it back for the whole interval.
            while not stop.is_set():
                time.sleep(STOP_POLL_SECONDS)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            stop.set()
            if scheduler.running:
                scheduler.shutdown(wait=False)
            watcher.join(timeout=60)  # a config change under way finishes before the stop
            if following is not None:
                stop_live(following)
            sender.stop()
        with busy:  # the running cycle finishes its current step, then sees the stop
            pass
        if lease is not None and keeper is not None:
            keeper.join(timeout=10)
            _give_back(lease)  # a clean stop hands over at once, not after the lease
            with contextlib.suppress(HubError):
                lease.beat("stopped", pctx.now())
            beat["role"] = "stopped"
        save_beat(stopped_at=pctx.now().isoformat(timespec="seconds"))
        out("patrol daemon stopped")
        return int(ExitCode.OK)


def _keep_lease(
    pctx: OpsContext,
    lease: PatrolLease,
    stop: threading.Event,
    scheduler: Any,
    save_beat: Callable[..., None],
    out: Callable[[str], None],
    sender: Sender,
) -> None:
    """Take or renew the lease every third of it; on becoming active, run a round now.

    Taking it from a daemon on another host is a failover: one chat notice, queued here (its
    id is the new token, so it is sent once) and sent by ``sender``, outside every lock.
    """
    role = ""
    pause = max(0.2, lease.lease_seconds / 3)
    while True:
        why = ""
        try:
            active = lease.acquire()
            if not active:
                why = f"held by {lease.holder() or 'another daemon'}"
        except UnreachableError as exc:
            active, why = False, pctx.redact(str(exc))
        now_role = "active" if active else "standby"
        if now_role != role:
            role = now_role
            save_beat(role=role)
            out(stamped(f"patrol lease: {role}" + (f" ({why})" if why else "")))
            if active:
                # A new holder starts with a full round instead of waiting for the interval.
                with contextlib.suppress(Exception):  # not yet started, or shutting down
                    scheduler.modify_job("patrol", next_run_time=datetime.now(UTC))
        moved_from = lease.takeover() if active else None  # any take since the last look
        if moved_from is not None:
            out(stamped(f"patrol lease: taken over from {moved_from}"))
            line = queue_failover(pctx, moved_from, lease.host, lease.token)
            if line:
                out(stamped(line))
            sender.wake()
        with contextlib.suppress(HubError):
            lease.beat(role, pctx.now())
        if stop.wait(pause):
            return
