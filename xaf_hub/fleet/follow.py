"""Follow every instance live over its event stream; reconnect, keep the heartbeat, rescan.

One ``FleetFollower`` keeps, per instance, one streaming connection (httpx, the instance's
basic auth, the same transport seam as every client) and turns what arrives into
``fleet.events.FleetEvent`` records for one callback:

* **Which stream.** ``GET /global/event`` (every directory; opencode 1.18) when it sends its
  first frame within ``probe_seconds``; else ``GET /event?directory=D`` for each project
  directory the instance knows (1.2 and 1.14 give no answer on the global stream), new
  directories joining at the next safety rescan; else (v2 servers, or nothing streams)
  polling every ``poll_seconds``, which ``doctor`` reports. The choice is made once per
  instance, from its version when that says enough, else by probing.
* **Nothing missed.** After every (re)connect the streams are open first, then the instance
  is rescanned in full (``scan.scan_instance``) and compared with the last view: whatever
  changed while the stream was away is reported then, once.
* **Down and up.** A stream that breaks is reconnected at once; only when that fails is the
  instance reported down, then retried with back-off (1, 2, 4 ... 30 s). A stream silent for
  ``heartbeat_deadline`` seconds (opencode sends a heartbeat every 10 s) counts as down; a
  stream that never sent a heartbeat (an older release) is checked with ``/global/health``
  instead. When the instance answers again it is reported up, after its rescan.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import httpx

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core import aio
from xaf_hub.errors import HubError, UnreachableError
from xaf_hub.fleet.client import OpencodeClient, describe_error
from xaf_hub.fleet.events import Board, FleetEvent, Frame, parse_frame
from xaf_hub.fleet.scan import TransportFactory, build_record, make_client, scan_instance

Mode = Literal["global", "directory", "polling"]

HEARTBEAT_DEADLINE = 25.0  # 2.5 heartbeats of opencode 1.18
PROBE_SECONDS = 4.0
POLL_SECONDS = 10.0
RESCAN_SECONDS = 300.0  # per-directory streams: look for new project directories this often
BACKOFF: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
MAX_DIRECTORY_STREAMS = 64
_SHORT_LIVED = 5.0  # seconds: a connection that ended sooner is retried with back-off
# The first release line measured to answer on /global/event.
_GLOBAL_FROM = (1, 15)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


# Unreadable frames in a row before the stream is opened again (a reconnect rescans).
MAX_BAD_FRAMES = 20


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


@dataclass(frozen=True)
class _Closed:
    reason: str


_Item = Frame | _Closed


class _Streams:
    """The reader tasks of one connection, feeding one queue."""

    def __init__(self, client: OpencodeClient, on_line: Callable[[], None]) -> None:
        self.client = client
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []
        self.directories: set[str] = set()
        self.heartbeats = False
        self._on_line = on_line

    async def open(
        self, path: str, directory: str, probe_seconds: float
    ) -> bool:
        """Start one reader; True once its first frame arrived within ``probe_seconds``."""
        opened = asyncio.Event()
        params = {"directory": directory} if directory else None
        framed: list[bool] = []
        task = asyncio.create_task(self._read(path, params, directory, opened, framed))
        self.tasks.append(task)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(probe_seconds):
                await opened.wait()
        if not framed:  # no answer in time, or not a stream
            await aio.cancel_and_wait(task)
            self.tasks.remove(task)
            return False
        if directory:
            self.directories.add(directory)
        return True

    async def _read(
        self,
        path: str,
        params: dict[str, str] | None,
        directory: str,
        opened: asyncio.Event,
        framed: list[bool],
    ) -> None:
        """Read one stream. Before its first frame a failure just ends the task (``open``
        sees it); after that, the end of the stream is queued as ``_Closed``."""
        client = self.client
        try:
            async with client.open_stream(path, params) as resp:
                ctype = resp.headers.get("content-type", "")
                if resp.status_code != 200 or "event-stream" not in ctype:
                    return
                async for line in resp.aiter_lines():
                    self._on_line()
                    frame = parse_frame(line, directory) if line else None
                    if frame is None:
                        continue
                    if not framed:
                        framed.append(True)
                    opened.set()
                    if frame.type == "server.heartbeat":
                        self.heartbeats = True
                        continue
                    await self.queue.put(frame)
            if opened.is_set():
                await self.queue.put(_Closed("the event stream ended"))
        except httpx.HTTPError as exc:
            if opened.is_set():
                reason = describe_error(exc, client.connect_timeout, client.read_timeout)
                await self.queue.put(_Closed(f"event stream: {reason}"))
        finally:
            opened.set()  # wakes ``open`` at once when the stream failed before a frame

    async def close(self) -> None:
        """Stop every reader."""
        tasks, self.tasks = self.tasks, []
        await aio.cancel_and_wait(*tasks)


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
        heartbeat_deadline: float = HEARTBEAT_DEADLINE,
        probe_seconds: float = PROBE_SECONDS,
        poll_seconds: float = POLL_SECONDS,
        rescan_seconds: float = RESCAN_SECONDS,
        backoff: Sequence[float] = BACKOFF,
        force_polling: bool = False,
    ) -> None:
        self.cfg = cfg
        self.instances = list(cfg.instances if instances is None else instances)
        self.emit = emit
        self.transport_factory = transport_factory
        self.outcomes = outcomes
        self.heartbeat_deadline = heartbeat_deadline
        self.probe_seconds = probe_seconds
        self.poll_seconds = poll_seconds
        self.rescan_seconds = rescan_seconds
        self.backoff = tuple(backoff) or (1.0,)
        self.force_polling = force_polling
        self.state: dict[str, FollowState] = {i.name: FollowState() for i in self.instances}
        self.boards: dict[str, Board] = {i.name: Board(i) for i in self.instances}
        self._modes: dict[str, Mode] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._wakers: set[asyncio.Queue[_Item]] = set()

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
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:  # stopped, one follower crashed, or cancelled: end them all
            self._halt()
            await aio.cancel_and_wait(*tasks)
        for task in done:
            task.result()  # a follower's own bug is raised, not lost

    def stop(self) -> None:
        """Ask the follower to end (safe from any thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._halt)

    def _halt(self) -> None:
        if self._stop is not None:
            self._stop.set()
        for q in self._wakers:
            q.put_nowait(_Closed("stop"))

    def stopping(self) -> bool:
        """True once ``stop()`` was called."""
        return self._stop is not None and self._stop.is_set()

    async def _pause(self, seconds: float) -> None:
        assert self._stop is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    def _client(self, inst: InstanceConfig) -> OpencodeClient:
        transport = self.transport_factory(inst) if self.transport_factory else None
        return make_client(self.cfg, inst, transport)

    # ------------------------------------------------------------------------- per instance

    async def _follow(self, inst: InstanceConfig) -> None:
        st = self.state[inst.name]
        attempt = 0
        while not self.stopping():
            began = time.monotonic()
            connected, reason = await self._connection(inst)
            if self.stopping():
                break
            st.up = False
            st.reason = reason
            if connected:
                # It was up: try again at once; down only when that fails. A stream that
                # keeps ending right after it opened (a proxy?) is retried with back-off.
                if time.monotonic() - began >= _SHORT_LIVED:
                    attempt = 0
                else:
                    await self._pause(self.backoff[min(attempt, len(self.backoff) - 1)])
                    attempt += 1
                continue
            if not st.reported_down:
                st.reported_down = True
                self.emit(FleetEvent("down", inst.name, detail=reason, at_ms=_ms()))
            await self._pause(self.backoff[min(attempt, len(self.backoff) - 1)])
            attempt += 1

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
            return False, describe_error(exc, self.cfg.connect_timeout, self.cfg.read_timeout)
        except Exception as exc:  # noqa: BLE001 - one instance's failure never ends the others
            return False, f"follower error: {type(exc).__name__}: {exc}"[:300]

    async def _connected(self, client: OpencodeClient, inst: InstanceConfig) -> tuple[bool, str]:
        await client.detect()
        mode = self._modes.get(inst.name)
        last_line = [time.monotonic()]

        def seen() -> None:
            last_line[0] = time.monotonic()

        streams = _Streams(client, seen)
        self._wakers.add(streams.queue)
        try:
            if mode is None:
                mode = await self._choose(client, inst, streams)
                self._modes[inst.name] = mode
            elif not await self._reopen(client, inst, streams, mode):
                return False, "the event stream did not open"
            return await self._follow_open(client, inst, streams, mode, last_line)
        finally:
            self._wakers.discard(streams.queue)
            await streams.close()

    async def _choose(
        self, client: OpencodeClient, inst: InstanceConfig, streams: _Streams
    ) -> Mode:
        """Find the stream this instance offers, leaving it open."""
        if self.force_polling or client.dialect == "v2":
            return "polling"
        version = _version(client.version)
        if (not version or version[:2] >= _GLOBAL_FROM) and await streams.open(
            "/global/event", "", self.probe_seconds
        ):
            return "global"
        if await self._open_directories(client, inst, streams):
            return "directory"
        return "polling"

    async def _reopen(
        self, client: OpencodeClient, inst: InstanceConfig, streams: _Streams, mode: Mode
    ) -> bool:
        # The stream is known to work here: a server just restarted may take longer to answer.
        if mode == "global":
            return await streams.open("/global/event", "", self.heartbeat_deadline)
        if mode == "directory":
            return await self._open_directories(client, inst, streams)
        return True

    async def _project_directories(self, client: OpencodeClient, inst: InstanceConfig) -> set[str]:
        board = self.boards[inst.name]
        found = {s.directory for s in await client.list_sessions() if board.is_project(s.directory)}
        if inst.default_directory:
            found.add(inst.default_directory)
        return found

    async def _open_directories(
        self, client: OpencodeClient, inst: InstanceConfig, streams: _Streams
    ) -> bool:
        wanted = sorted(await self._project_directories(client, inst) - streams.directories)
        if len(streams.directories) + len(wanted) > MAX_DIRECTORY_STREAMS:
            return False
        if not wanted and not streams.directories:
            wanted = [""]  # the server's own directory: proves streams work at all
        patience = self.heartbeat_deadline if self._modes.get(inst.name) else self.probe_seconds
        results = await aio.gather(
            *(streams.open("/event", d, patience) for d in wanted)
        )
        return all(results)

    async def _follow_open(
        self,
        client: OpencodeClient,
        inst: InstanceConfig,
        streams: _Streams,
        mode: Mode,
        last_line: list[float],
    ) -> tuple[bool, str]:
        st = self.state[inst.name]
        board = self.boards[inst.name]
        first = st.connects == 0  # the first view only seeds the board: no changes yet
        scan = await scan_instance(client, inst)
        if not scan.reachable:
            return False, scan.reason
        changes = board.reconcile(scan.sessions, "rescan")
        st.mode, st.up, st.reason = mode, True, ""
        st.streams = len(streams.tasks)
        st.connects += 1
        if st.reported_down:
            st.reported_down = False
            self.emit(FleetEvent("up", inst.name, detail=mode, at_ms=_ms()))
        if first:
            self.emit(FleetEvent("ready", inst.name, detail=mode, at_ms=_ms()))
        if mode == "polling" and first:
            why = self._why_polling(client)
            self.emit(FleetEvent("polling", inst.name, detail=why, at_ms=_ms()))
        if not first:
            await self._send(client, changes)
        if mode == "polling":
            return await self._poll(client, inst, board)
        rescanned = time.monotonic()
        bad_in_a_row = 0
        while True:
            silent = time.monotonic() - last_line[0]
            wait = max(0.5, self.heartbeat_deadline - silent)
            if mode == "directory":
                wait = min(wait, max(0.5, self.rescan_seconds - (time.monotonic() - rescanned)))
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
                # arrives with an item, and the follower would then never end.
                async with asyncio.timeout(wait):
                    item = await streams.queue.get()
            except TimeoutError:
                if self.stopping():
                    return True, "stop"
                if time.monotonic() - last_line[0] >= self.heartbeat_deadline:
                    if streams.heartbeats:
                        return True, f"no heartbeat for {self.heartbeat_deadline:g} s"
                    await client.detect()  # an older release: silent but alive?
                    last_line[0] = time.monotonic()
                if mode == "directory" and time.monotonic() - rescanned >= self.rescan_seconds:
                    rescanned = time.monotonic()
                    if not await self._open_directories(client, inst, streams):
                        return True, "a new directory's event stream did not open"
                    scan = await scan_instance(client, inst)
                    if not scan.reachable:
                        return True, scan.reason
                    await self._send(client, board.reconcile(scan.sessions, "rescan"))
                continue
            if isinstance(item, _Closed):
                return True, item.reason
            try:
                changes = await self._apply(client, inst, board, item)
            except (HubError, httpx.HTTPError):
                raise  # the connection's own trouble: reconnect
            except Exception:  # noqa: BLE001 - a frame we cannot read is dropped, not raised
                st.bad_frames += 1
                bad_in_a_row += 1
                if bad_in_a_row >= MAX_BAD_FRAMES:
                    return True, f"{bad_in_a_row} unreadable frames in a row"
                continue
            bad_in_a_row = 0
            await self._send(client, changes)

    def _why_polling(self, client: OpencodeClient) -> str:
        if self.force_polling:
            return "polling asked for"
        if client.dialect == "v2":
            return "v2 API: no event stream known"
        return "neither /global/event nor /event?directory= answered"

    async def _poll(
        self, client: OpencodeClient, inst: InstanceConfig, board: Board
    ) -> tuple[bool, str]:
        while True:
            await self._pause(self.poll_seconds)
            if self.stopping():
                return True, "stop"
            scan = await scan_instance(client, inst)
            if not scan.reachable:
                return True, scan.reason
            await self._send(client, board.reconcile(scan.sessions, "poll"))

    async def _apply(
        self, client: OpencodeClient, inst: InstanceConfig, board: Board, frame: Frame
    ) -> list[FleetEvent]:
        changes = board.apply(frame)
        for sid, _hint in list(board.missing):
            try:
                s = await client.get_session(sid)
            except HubError:
                board.outside.add(sid)  # gone already, or unreadable: a rescan will tell
                continue
            except (ValueError, TypeError, httpx.InvalidURL):
                board.outside.add(sid)  # an id no request can carry: never ours to follow
                continue
            changes += board.learn(build_record(inst, s, None, True))
            changes += board.apply(frame)
        return changes

    async def _send(self, client: OpencodeClient, changes: list[FleetEvent]) -> None:
        from xaf_hub.core.runstate import outcome_of

        for ev in changes:
            if ev.kind == "stopped" and self.outcomes and ev.session is not None:
                try:
                    outcome = outcome_of(await client.messages(ev.session.id, limit=3))
                except Exception:  # noqa: BLE001 - an unreadable outcome is unknown, not fatal
                    outcome = "unknown"
                ev = replace(ev, outcome=outcome, session=replace(ev.session, outcome=outcome))
            self.emit(ev)


def _ms() -> int:
    return int(time.time() * 1000)


async def probe_mode(
    cfg: Config,
    inst: InstanceConfig,
    transport_factory: TransportFactory | None = None,
    probe_seconds: float = PROBE_SECONDS,
) -> tuple[str, str]:
    """Which stream a follower would use for ``inst``: (mode, version) ("" when unreachable)."""
    follower = FleetFollower(
        cfg, [inst], emit=lambda ev: None, transport_factory=transport_factory,
        probe_seconds=probe_seconds,
    )
    async with follower._client(inst) as client:
        try:
            await client.detect()
        except HubError:
            return "", ""
        streams = _Streams(client, lambda: None)
        try:
            mode = await follower._choose(client, inst, streams)
        except HubError:
            mode = "polling"
        finally:
            await streams.close()
        return mode, client.version


def run_in_thread(follower: FleetFollower, name: str = "xaf-hub-follower") -> Any:
    """Run ``follower`` on its own event loop in a daemon thread; returns the thread."""
    import threading


    thread = threading.Thread(target=lambda: aio.run(follower.run()), name=name, daemon=True)
    thread.start()
    return thread


