"""Follow every instance live over its event stream; reconnect, keep the heartbeat, rescan.

``FleetFollower`` keeps one stream per instance (global, per directory, or polling), rescans after
every (re)connect so nothing is missed, reports an instance down and up, and bounds each stream's
cost; ``fleet.live_view`` publishes what it knows (docs/live.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import httpx

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.backoff import Backoff
from xaf_hub.core.outcomes import run_outcome
from xaf_hub.core.runstate import outcome_of
from xaf_hub.errors import HubError, UnreachableError
from xaf_hub.fleet.client import OpencodeClient, ServerSession, explain
from xaf_hub.fleet.events import Board, FleetEvent, Frame, now_ms
from xaf_hub.fleet.live_view import LiveInstance, LiveView
from xaf_hub.fleet.mailbox import Bad, Behind, Closed, Mailbox
from xaf_hub.fleet.scan import (
    InstanceScan,
    TransportFactory,
    build_record,
    make_client,
    scan_instance,
)
from xaf_hub.fleet.stream import Budget, Streams

Mode = Literal["global", "directory", "polling"]

HEARTBEAT_DEADLINE = 25.0  # 2.5 heartbeats of opencode 1.18
PROBE_SECONDS = 4.0
POLL_SECONDS = 10.0
RESCAN_SECONDS = 300.0  # per-directory streams: look for new project directories this often
BACKOFF: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
MAX_DIRECTORY_STREAMS = 64
_SHORT_LIVED = 5.0  # seconds: a connection that ended sooner is retried with back-off
# Unreadable frames in a row before the stream is opened again (a reconnect rescans).
MAX_BAD_FRAMES = 20
BUDGET_COOLDOWN = 300.0  # an instance over its budget is polled this long, then streamed again
PROBE_BUDGET_SECONDS = 1.0  # doctor watches a stream that opened this long against its budget


@dataclass
class FollowState:
    """How one instance is followed right now (for `doctor`, `serve` and tests)."""

    mode: str = ""  # global | directory | polling ("" before the first connect)
    up: bool = False
    reason: str = ""
    streams: int = 0
    connects: int = 0
    reported_down: bool = False
    bad_frames: int = 0  # frames dropped because reading them failed (since the start)
    long_lines: int = 0  # lines over MAX_FRAME_BYTES skipped unread (since the start)
    over_budget: int = 0  # times the stream went over its budget and the instance was polled


class FleetFollower:
    """Follow ``instances`` until ``stop()``; every change goes to ``emit``."""

    def __init__(
        self,
        cfg: Config,
        instances: Sequence[InstanceConfig] | None = None,
        *,
        emit: Callable[[FleetEvent], None],
        transport_factory: TransportFactory | None = None,
        outcomes: bool = True,
        steps: bool = False,
        heartbeat_deadline: float = HEARTBEAT_DEADLINE,
        probe_seconds: float = PROBE_SECONDS,
        poll_seconds: float = POLL_SECONDS,
        backoff: Sequence[float] = BACKOFF,
        force_polling: bool = False,
        budget: Callable[[], Budget] = Budget,
        budget_cooldown: float = BUDGET_COOLDOWN,
        publish: Callable[[list[LiveInstance]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.instances = list(cfg.instances if instances is None else instances)
        self.emit = emit
        self.transport_factory = transport_factory
        self.outcomes = outcomes
        self.heartbeat_deadline = heartbeat_deadline
        self.probe_seconds = probe_seconds
        self.poll_seconds = poll_seconds
        self.backoff = Backoff(steps=tuple(backoff) or (1.0,))
        self.force_polling = force_polling
        self.budget = budget
        self.budget_cooldown = budget_cooldown
        self.state: dict[str, FollowState] = {i.name: FollowState() for i in self.instances}
        # ``steps``: report each step a project session finished with a cost (``spent``).
        self.boards: dict[str, Board] = {i.name: Board(i, steps) for i in self.instances}
        self._modes: dict[str, Mode] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._wakers: set[Mailbox] = set()
        # Instances over their stream budget: polled until this time (monotonic), and why.
        self._throttled: dict[str, tuple[float, str]] = {}
        # What it knows now; ``publish`` gets it after a change (the live board).
        self.live = LiveView(self.instances, self.state, self.boards, publish)
        self.thread: Any = None  # the thread ``run_in_thread`` runs it on

    # ------------------------------------------------------------------------- control

    async def run(self) -> None:
        """Follow every instance until ``stop()`` is called (or this task is cancelled).

        A cancel (Ctrl+C) also stops the follower the cooperative way: every loop checks
        ``stopping()`` and every queue wait is woken, so a per-instance task that misses
        the cancel still ends at once.
        """
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks = [asyncio.ensure_future(self._follow(i)) for i in self.instances]
        if not tasks:
            return  # nothing to follow (asyncio.wait refuses an empty set)
        publisher = None
        if self.live.publish is not None:
            publisher = asyncio.ensure_future(self.live.publisher(self._pause, self.stopping))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:  # stopped, one follower crashed, or cancelled: end them all
            self._halt()
            await aio.cancel_and_wait(*tasks)
            if publisher is not None:
                await aio.cancel_and_wait(publisher)
                await self.live.publish_last()
        for task in done:
            task.result()  # a follower's own bug is raised, not lost

    def stop(self) -> None:
        """Ask the follower to end (safe from any thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._halt)

    def close(self, timeout: float = 10.0) -> None:
        """Stop, and wait (at most ``timeout`` s) until its thread ended: the last board,
        which says nothing is current any more, is written before a stopping process exits
        (its thread is a daemon thread, killed at exit)."""
        self.stop()
        if self.thread is not None:
            self.thread.join(timeout)

    def _halt(self) -> None:
        if self._stop is not None:
            self._stop.set()
        for q in self._wakers:
            q.close("stop", urgent=True)

    def stopping(self) -> bool:
        """True once ``stop()`` was called."""
        return self._stop is not None and self._stop.is_set()

    async def _pause(self, seconds: float) -> None:
        assert self._stop is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    def _client(self, inst: InstanceConfig) -> OpencodeClient:
        return make_client(self.cfg, inst, self.transport_factory)

    # ------------------------------------------------------------------------- per instance

    async def _follow(self, inst: InstanceConfig) -> None:
        st = self.state[inst.name]
        attempt = 0
        while not self.stopping():
            began = time.monotonic()
            connected, reason = await self._connection(inst)
            self.live.lost(inst.name)
            if self.stopping():
                break
            st.up = False
            st.reason = reason
            # It was up: try again at once; down only when that fails. A stream that keeps
            # ending right after it opened (a proxy?) is retried with back-off.
            if connected and time.monotonic() - began >= _SHORT_LIVED:
                attempt = 0
                continue
            if not connected and not st.reported_down:
                st.reported_down = True
                self.emit(FleetEvent("down", inst.name, detail=reason, at_ms=now_ms()))
            attempt += 1
            await self._pause(self.backoff.delay(attempt))

    async def _connection(self, inst: InstanceConfig) -> tuple[bool, str]:
        """One connection's life: (whether it got as far as following, why it ended).

        Whatever ends it ends this instance's connection only: a failure of the follower's
        own (a server's answer it could not read, a bug) is a reason like any other, and the
        instance is connected again with back-off while every other instance goes on.
        """
        try:
            async with self._client(inst) as client:
                return await self._connected(client, inst)
        except UnreachableError as exc:
            return False, exc.reason
        except HubError as exc:
            return False, str(exc).removeprefix(f"{inst.name}: ")
        except httpx.HTTPError as exc:
            return False, explain(exc, self.cfg.connect_timeout, self.cfg.read_timeout)[1]
        except Exception as exc:  # noqa: BLE001 - one instance's failure never ends the others
            return False, f"follower error: {type(exc).__name__}: {exc}"[:300]

    async def _connected(self, client: OpencodeClient, inst: InstanceConfig) -> tuple[bool, str]:
        await client.detect()
        mode = self._modes.get(inst.name)
        last_line = [time.monotonic()]

        def seen() -> None:
            last_line[0] = time.monotonic()
            self.live.heard(inst.name)

        streams = Streams(client, seen, self.budget())
        self._wakers.add(streams.queue)
        try:
            throttled = self._throttled.get(inst.name)
            if throttled is not None and mode is not None:
                if time.monotonic() < throttled[0]:
                    return await self._follow_open(client, inst, streams, "polling", last_line)
                del self._throttled[inst.name]
            if mode is None:
                mode = await self._choose(client, inst, streams)
                self._modes[inst.name] = mode
            elif not await self._reopen(client, inst, streams, mode):
                return False, "the event stream did not open"
            return await self._follow_open(client, inst, streams, mode, last_line)
        finally:
            self._wakers.discard(streams.queue)
            await streams.close()

    async def _choose(self, client: OpencodeClient, inst: InstanceConfig, streams: Streams) -> Mode:
        """Find the stream this instance offers, leaving it open."""
        if self.force_polling or client.dialect == "v2":
            return "polling"
        # A release known to keep runs per directory (1.2 to 1.14) gives no answer there.
        if client.release.behaviour != "server-wide" and await streams.open(
            "/global/event", "", self.probe_seconds
        ):
            return "global"
        return "directory" if await self._open_directories(client, inst, streams) else "polling"

    async def _reopen(
        self, client: OpencodeClient, inst: InstanceConfig, streams: Streams, mode: Mode
    ) -> bool:
        # The stream is known to work here: a server just restarted may take longer to answer.
        if mode == "global":
            return await streams.open("/global/event", "", self.heartbeat_deadline)
        if mode == "directory":
            return await self._open_directories(client, inst, streams)
        return True

    async def _open_directories(
        self, client: OpencodeClient, inst: InstanceConfig, streams: Streams
    ) -> bool:
        board = self.boards[inst.name]
        found = {s.directory for s in await client.list_sessions() if board.is_project(s.directory)}
        if inst.default_directory:
            found.add(inst.default_directory)
        wanted = sorted(found - streams.directories)
        if len(streams.directories) + len(wanted) > MAX_DIRECTORY_STREAMS:
            return False
        if not wanted and not streams.directories:
            wanted = [""]  # the server's own directory: proves streams work at all
        patience = self.heartbeat_deadline if self._modes.get(inst.name) else self.probe_seconds
        results = await aio.gather(*(streams.open("/event", d, patience) for d in wanted))
        return all(results)

    async def _follow_open(
        self,
        client: OpencodeClient,
        inst: InstanceConfig,
        streams: Streams,
        mode: Mode,
        last_line: list[float],
    ) -> tuple[bool, str]:
        st = self.state[inst.name]
        board = self.boards[inst.name]
        first = st.connects == 0  # the first view only seeds the board: no changes yet
        scan = await scan_instance(client, inst)
        if not scan.reachable:
            return False, scan.reason
        changes = self._reconcile(inst, board, scan, "rescan")
        throttled = self._throttled.get(inst.name)
        was_polled = st.mode == "polling" and st.connects > 0
        st.mode, st.up, st.reason = mode, True, throttled[1] if throttled else ""
        st.streams = len(streams.tasks)
        st.connects += 1
        if st.reported_down:
            st.reported_down = False
            self.emit(FleetEvent("up", inst.name, detail=mode, at_ms=now_ms()))
        if first or (mode != "polling" and was_polled):  # or back from its budget's pause
            self.emit(FleetEvent("ready", inst.name, detail=mode, at_ms=now_ms()))
        if mode == "polling" and first:
            why = "neither /global/event nor /event?directory= answered"
            if self.force_polling or client.dialect == "v2":
                why = "polling asked for" if self.force_polling else "v2 API: no event stream known"
            self.emit(FleetEvent("polling", inst.name, detail=why, at_ms=now_ms()))
        if not first:
            await self._send(client, changes)
        if mode == "polling":
            return await self._poll(client, inst, board, throttled[0] if throttled else None)
        rescanned = time.monotonic()
        bad_in_a_row = 0
        while True:
            if not len(streams.queue):
                self.live.behind_ms.pop(inst.name, None)  # all it sent so far is on the board
            silent = time.monotonic() - last_line[0]
            wait = max(0.5, self.heartbeat_deadline - silent)
            if mode == "directory":
                wait = min(wait, max(0.5, RESCAN_SECONDS - (time.monotonic() - rescanned)))
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
                # arrives with an item, and the follower would then never end.
                async with asyncio.timeout(wait):
                    item = await streams.queue.get()
                self.live.behind_ms.setdefault(inst.name, now_ms())
            except TimeoutError:
                if self.stopping():
                    return True, "stop"
                if time.monotonic() - last_line[0] >= self.heartbeat_deadline:
                    if streams.heartbeats:
                        return True, f"no heartbeat for {self.heartbeat_deadline:g} s"
                    # An older release sends no heartbeat: a quiet stream may be alive, or
                    # dead behind a proxy that keeps it open. A rescan tells what it missed.
                    if reason := await self._rescan(client, inst, board):
                        return True, reason
                    last_line[0] = time.monotonic()
                if mode == "directory" and time.monotonic() - rescanned >= RESCAN_SECONDS:
                    rescanned = time.monotonic()
                    if not await self._open_directories(client, inst, streams):
                        return True, "a new directory's event stream did not open"
                    if reason := await self._rescan(client, inst, board):
                        return True, reason
                continue
            if isinstance(item, Closed):
                if item.over_budget:
                    st.over_budget += 1
                    self._throttled[inst.name] = (
                        time.monotonic() + self.budget_cooldown, item.reason
                    )
                    st.mode, st.reason = "polling", item.reason
                    self.emit(FleetEvent("polling", inst.name, detail=item.reason, at_ms=now_ms()))
                return True, item.reason
            if isinstance(item, Behind):
                if reason := await self._rescan(client, inst, board):
                    return True, reason
                continue
            if not isinstance(item, Bad):
                try:
                    changes = await self._apply(client, inst, board, item)
                except (HubError, httpx.HTTPError):
                    raise  # the connection's own trouble: reconnect
                except Exception:  # noqa: BLE001 - a frame we cannot read is dropped, not raised
                    item = Bad(1, 0)
                else:
                    bad_in_a_row = 0
                    self.live.changed = True
                    await self._send(client, changes)
                    continue
            st.bad_frames += item.count
            st.long_lines += item.long_lines
            bad_in_a_row += item.count
            if bad_in_a_row >= MAX_BAD_FRAMES:
                return True, f"{bad_in_a_row} unreadable frames in a row"

    async def _poll(
        self, client: OpencodeClient, inst: InstanceConfig, board: Board, until: float | None = None
    ) -> tuple[bool, str]:
        """Rescan every ``poll_seconds`` (until ``until``, then the stream is tried again)."""
        while True:
            pause = self.poll_seconds
            if until is not None:
                pause = min(pause, max(0.0, until - time.monotonic()))
            await self._pause(pause)
            if self.stopping():
                return True, "stop"
            if until is not None and time.monotonic() >= until:
                return True, "its event stream is tried again"
            if reason := await self._rescan(client, inst, board, "poll"):
                return True, reason

    async def _apply(
        self, client: OpencodeClient, inst: InstanceConfig, board: Board, frame: Frame
    ) -> list[FleetEvent]:
        changes = board.apply(frame)
        for sid, _hint in list(board.missing):
            try:
                s = await client.get_session(sid)
            except (HubError, ValueError, TypeError, httpx.InvalidURL):
                board.ignore(sid)  # gone, unreadable, or an id no request can carry
                continue
            changes += board.learn(build_record(inst, board.placed(s), None, True))
            changes += board.apply(frame)
        return changes

    def _reconcile(
        self, inst: InstanceConfig, board: Board, scan: InstanceScan, source: str
    ) -> list[FleetEvent]:
        """Replace the board's view with a full scan's (kept for the live view too)."""
        self.live.rescanned(inst.name, scan)
        return board.reconcile(scan.sessions, source, scan.sandboxes)

    async def _rescan(
        self, client: OpencodeClient, inst: InstanceConfig, board: Board, source: str = "rescan"
    ) -> str:
        """Scan the instance again and report what changed; why not when it did not answer."""
        scan = await scan_instance(client, inst)
        if not scan.reachable:
            return scan.reason
        await self._send(client, self._reconcile(inst, board, scan, source))
        return ""

    # ------------------------------------------------------------------------- live view

    def placed(self, instance: str, s: ServerSession) -> ServerSession:
        """``s`` (on ``instance``) with its worktree's checkout, as the stream and the rescans
        told it (``Board.placed``)."""
        board = self.boards.get(instance)
        return board.placed(s) if board is not None else s

    def live_view(self) -> list[LiveInstance]:
        """Every instance as known now (call it on the follower's own loop)."""
        return self.live.view()

    def view_now(self, timeout: float = 2.0) -> list[LiveInstance]:
        """``live_view()`` for another thread: built on the follower's own loop, where the
        views change (``serve`` answers a page from it); [] when the follower does not run or
        does not answer within ``timeout`` seconds."""
        loop = self._loop
        if loop is None or loop.is_closed() or self.stopping():
            return []

        async def build() -> list[LiveInstance]:
            return self.live_view()

        job = build()
        try:
            future = asyncio.run_coroutine_threadsafe(job, loop)
        except RuntimeError:  # the loop closed meanwhile
            job.close()
            return []
        try:
            return future.result(timeout)
        except Exception:  # noqa: BLE001 - timed out, cancelled, or the loop stopped: no view
            future.cancel()
            return []

    async def _send(self, client: OpencodeClient, changes: list[FleetEvent]) -> None:
        for ev in changes:
            if ev.kind == "stopped" and self.outcomes and ev.session is not None:
                try:
                    read = outcome_of(await client.messages(ev.session.id, limit=3))
                except Exception:  # noqa: BLE001 - an unreadable outcome is not read, not fatal
                    read = None
                if read is not None:
                    outcome = run_outcome(read, running=False)
                    ev = replace(ev, outcome=outcome or "",
                                 session=replace(ev.session, outcome=read))
            self.emit(ev)


async def probe_mode(
    cfg: Config, inst: InstanceConfig, transport_factory: TransportFactory | None = None
) -> tuple[str, str, str]:
    """Which stream a follower would use for ``inst``: (mode, version, why it is polled).

    Mode and version are "" when the instance is unreachable. A stream that opens is
    watched ``PROBE_BUDGET_SECONDS`` more: over its budget in that time, the instance would be
    polled, and the third item says why ("" otherwise).
    """
    follower = FleetFollower(cfg, [inst], emit=lambda ev: None, transport_factory=transport_factory)
    async with follower._client(inst) as client:
        try:
            await client.detect()
        except HubError:
            return "", "", ""
        streams = Streams(client, lambda: None, Budget(window=PROBE_BUDGET_SECONDS))
        why = ""
        try:
            mode = await follower._choose(client, inst, streams)
            if mode != "polling":
                why = await _over_budget(streams.queue, PROBE_BUDGET_SECONDS)
        except HubError:
            mode = "polling"
        finally:
            await streams.close()
        return ("polling" if why else mode), client.version, why


async def _over_budget(box: Mailbox, seconds: float) -> str:
    """The reason a stream went over its budget within ``seconds``, else ""."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                item = await box.get()
                if isinstance(item, Closed):
                    return item.reason if item.over_budget else ""
    return ""


def run_in_thread(follower: FleetFollower, name: str = "xaf-hub-follower") -> Any:
    """Run ``follower`` on its own event loop in a daemon thread; returns the thread."""
    thread = threading.Thread(target=lambda: aio.run(follower.run()), name=name, daemon=True)
    follower.thread = thread
    thread.start()
    return thread


