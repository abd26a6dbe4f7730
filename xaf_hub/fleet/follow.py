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
  instead. When the instance answers again it is reported up, after its rescan. Only a
  ``data:`` line is life: a stream of ``: keep-alive`` comments, or a line trickling in a
  byte at a time, goes stale like a silent one.
* **Bounded cost per stream.** A line is read in chunks and held only up to
  ``MAX_FRAME_BYTES``; a longer one is skipped to its end, never held whole (only its first
  ``_PREFIX_BYTES`` are kept, to tell its type). Frames wait for the consumer in a
  ``_Mailbox`` that keeps the newest state per session (bounded in frames and bytes); when it
  overflows, what it held is dropped and the instance is rescanned instead. A stream that
  sends more than ``BUDGET_FRAMES_PER_S`` frames or ``BUDGET_BYTES_PER_S`` bytes a second
  (over ``BUDGET_WINDOW`` seconds) is closed and its instance polled for ``BUDGET_COOLDOWN``
  seconds, with the reason in the ``polling`` event every live view shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import httpx

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.backoff import Backoff
from xaf_hub.errors import HubError, UnreachableError
from xaf_hub.fleet.client import OpencodeClient, describe_error
from xaf_hub.fleet.events import Board, FleetEvent, Frame, parse_frame
from xaf_hub.fleet.scan import (
    InstanceScan,
    TransportFactory,
    build_record,
    make_client,
    scan_instance,
)

Mode = Literal["global", "directory", "polling"]

HEARTBEAT_DEADLINE = 25.0  # 2.5 heartbeats of opencode 1.18
PROBE_SECONDS = 4.0
PUBLISH_SECONDS = 0.5  # the live board is written at most this often after a change
REPUBLISH_SECONDS = 5.0  # and this often while nothing changes, so readers see it is alive
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

# The longest line held and the largest frame read. The frames the hub reads (session.*,
# server.*, message.updated) measured at most 707 bytes on opencode 1.18.33; the largest real
# frames are message.part.updated (and its "sync" twin), which carry a tool call's whole input:
# 1,000,747 bytes for a 1 MB file written by the model (bench/frame_sizes.py), unbounded in
# principle. The hub never reads those, so a longer line is skipped to its end unheld.
MAX_FRAME_BYTES = 1024 * 1024
_PREFIX_BYTES = 4096  # what is kept of a skipped line: enough to see its event type
# Per-stream budget, averaged over a window: a busy 1.18 server streaming ten runs at once
# sends a few hundred message.part.delta frames a second (~400 bytes each).
BUDGET_FRAMES_PER_S = 2000
BUDGET_BYTES_PER_S = 8 * 1024 * 1024
BUDGET_WINDOW = 10.0
BUDGET_COOLDOWN = 300.0  # an instance over its budget is polled this long, then streamed again
# What may wait for the consumer before the rest is dropped for a rescan.
MAX_PENDING_FRAMES = 1024
MAX_PENDING_BYTES = 8 * 1024 * 1024


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
    overflows: int = 0  # times the consumer fell behind and a rescan replaced the frames
    over_budget: int = 0  # times the stream went over its budget and the instance was polled


@dataclass(frozen=True)
class LiveInstance:
    """One instance as the follower knows it now, for the live board (``ops.live_board``).

    ``scan`` carries the last full scan's facts (version, release, what could not be read)
    with the sessions as they are now: the project's from the event stream, the others as the
    last rescan saw them. ``confirmed_at_ms`` is when the view was last proven current (a line
    from the stream with nothing left unread, or a rescan); 0 when it is not being kept
    current (down, reconnecting, or followed per directory, where new directories join only at
    the five-minute rescan)."""

    scan: InstanceScan
    mode: str
    confirmed_at_ms: int


@dataclass(frozen=True)
class _Closed:
    reason: str
    over_budget: bool = False


@dataclass(frozen=True)
class _Behind:
    """Frames were dropped because the consumer fell behind: rescan instead."""


@dataclass(frozen=True)
class _Bad:
    """Frames the reader could not read (too large to read, or not JSON it can use)."""

    count: int
    long_lines: int


_Item = Frame | _Closed | _Behind | _Bad


class OverBudget(Exception):
    """A stream sent more than its budget allows."""


class Budget:
    """Frames and bytes one connection's streams sent in the current window.

    ``add`` raises ``OverBudget`` (with the reason in words) as soon as a window holds more
    than its share; the window starts again every ``window`` seconds.
    """

    def __init__(
        self,
        frames_per_s: float = BUDGET_FRAMES_PER_S,
        bytes_per_s: float = BUDGET_BYTES_PER_S,
        window: float = BUDGET_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.frames_per_s = frames_per_s
        self.bytes_per_s = bytes_per_s
        self.window = window
        self._clock = clock
        self._start = clock()
        self.frames = 0
        self.bytes = 0

    def add(self, frames: int, nbytes: int) -> None:
        """Count what arrived; raise ``OverBudget`` when the window's share is exceeded."""
        now = self._clock()
        if now - self._start >= self.window:
            self._start, self.frames, self.bytes = now, 0, 0
        self.frames += frames
        self.bytes += nbytes
        if self.frames > self.frames_per_s * self.window:
            raise OverBudget(f"event stream over its budget ({self.frames} frames in under "
                             f"{self.window:g} s; at most {self.frames_per_s:g}/s)")
        if self.bytes > self.bytes_per_s * self.window:
            mb = self.bytes / 1024 / 1024
            raise OverBudget(f"event stream over its budget ({mb:.0f} MB in under "
                             f"{self.window:g} s; at most "
                             f"{self.bytes_per_s / 1024 / 1024:g} MB/s)")


def _coalesce_key(frame: Frame) -> tuple[str, str]:
    """Frames with the same key stand for the same state: only the newest is kept."""
    props = frame.properties
    sid = props.get("sessionID")
    if frame.type in ("session.created", "session.updated"):
        info = props.get("info")
        sid = info.get("id") if isinstance(info, dict) else sid
        return ("info", str(sid))
    if frame.type == "session.idle":
        return ("run:idle", str(sid))
    if frame.type == "session.status":
        status = props.get("status")
        word = status.get("type") if isinstance(status, dict) else None
        # Idle and not idle are kept apart, so a start and a stop both still show.
        return ("run:idle" if word == "idle" else "run:busy", str(sid))
    if frame.type == "message.updated":
        # Per message: a step's last update is kept when the next step's first one follows.
        info = props.get("info")
        return ("message", str(info.get("id") if isinstance(info, dict) else sid))
    return (frame.type, str(sid))


class _Mailbox:
    """What the readers of one connection hand the consumer, bounded and coalesced.

    A frame replaces the waiting frame of the same key (``_coalesce_key``) and goes to the
    back; past ``max_frames`` or ``max_bytes`` everything waiting is dropped for one
    ``_Behind`` (the consumer rescans). The end of a stream comes after what it sent; a stop,
    or a stream over its budget, comes before anything still waiting.
    """

    def __init__(
        self, max_frames: int = MAX_PENDING_FRAMES, max_bytes: int = MAX_PENDING_BYTES
    ) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._pending: OrderedDict[tuple[str, str], tuple[Frame, int]] = OrderedDict()
        self._bytes = 0
        self._behind = False
        self._bad = 0
        self._long = 0
        self._closed: _Closed | None = None
        self._urgent = False
        self._ready = asyncio.Event()

    def put(self, frame: Frame, size: int) -> None:
        """Hand over one frame (never waits)."""
        key = _coalesce_key(frame)
        old = self._pending.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        if len(self._pending) >= self.max_frames or self._bytes + size > self.max_bytes:
            self._pending.clear()
            self._bytes = 0
            self._behind = True
        else:
            self._pending[key] = (frame, size)
            self._bytes += size
        self._ready.set()

    def bad(self, long_line: bool = False) -> None:
        """Count one frame that could not be read."""
        self._bad += 1
        self._long += long_line
        self._ready.set()

    def close(self, reason: str, over_budget: bool = False, urgent: bool = False) -> None:
        """The stream ended (the first reason wins); ``urgent`` skips what still waits."""
        if self._closed is None:
            self._closed = _Closed(reason, over_budget)
        self._urgent = self._urgent or urgent or over_budget
        self._ready.set()

    def put_nowait(self, item: _Closed) -> None:
        """A stop (``FleetFollower._halt``): handed over before anything else."""
        self.close(item.reason, urgent=True)

    def __len__(self) -> int:
        return len(self._pending)

    def _waiting(self) -> bool:
        return bool(self._pending or self._bad or self._behind)

    async def get(self) -> _Item:
        """The next thing to handle."""
        while True:
            if self._closed is not None and (self._urgent or not self._waiting()):
                return self._closed
            if self._bad:
                item = _Bad(self._bad, self._long)
                self._bad = self._long = 0
                return item
            if self._behind:
                self._behind = False
                return _Behind()
            if self._pending:
                _, (frame, size) = self._pending.popitem(last=False)
                self._bytes -= size
                return frame
            self._ready.clear()
            await self._ready.wait()


async def read_lines(
    chunks: AsyncIterator[bytes], count: Callable[[int], None], limit: int = MAX_FRAME_BYTES
) -> AsyncIterator[tuple[bytes, bool]]:
    """The lines of a byte stream as (line, whole); ``count`` sees every chunk's size first.

    A line longer than ``limit`` is not held: once it passes the limit the rest of it is
    skipped up to its newline, and it comes out as (its first ``_PREFIX_BYTES``, False). A
    line cut off by the end of the stream is dropped.
    """
    buf = bytearray()
    skipping = False
    async for chunk in chunks:
        count(len(chunk))
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl
            if not skipping:
                buf += memoryview(chunk)[start:end]
                if len(buf) > limit:
                    del buf[_PREFIX_BYTES:]
                    skipping = True
            if nl < 0:
                break
            line = bytes(buf[:-1] if buf.endswith(b"\r") else buf)
            yield line, not skipping
            buf.clear()
            skipping = False
            start = nl + 1


class _Streams:
    """The reader tasks of one connection, feeding one queue."""

    def __init__(
        self, client: OpencodeClient, on_line: Callable[[], None], budget: Budget | None = None
    ) -> None:
        self.client = client
        self.queue = _Mailbox()
        self.tasks: list[asyncio.Task[None]] = []
        self.directories: set[str] = set()
        self.heartbeats = False
        self.budget = budget or Budget()
        self._on_line = on_line  # called for every data line: the stream's sign of life

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
                budget = self.budget

                def count(nbytes: int) -> None:
                    budget.add(0, nbytes)

                async for raw, whole in read_lines(resp.aiter_bytes(), count):
                    if not raw.startswith(b"data:"):
                        continue  # comments, blank lines, event:/id:/retry: are not life
                    budget.add(1, 0)
                    self._on_line()
                    if not whole:
                        if b'"session.' in raw or b'"server.' in raw:
                            self.queue.bad(long_line=True)  # one the hub reads, too large
                        continue
                    frame = parse_frame(raw.decode("utf-8", "replace"), directory)
                    if frame is None:
                        continue
                    if not framed:
                        framed.append(True)
                    opened.set()
                    if frame.type == "server.heartbeat":
                        self.heartbeats = True
                        continue
                    self.queue.put(frame, len(raw))
            if opened.is_set():
                self.queue.close("the event stream ended")
        except OverBudget as exc:
            self.queue.close(str(exc), over_budget=True)
        except httpx.HTTPError as exc:
            if opened.is_set():
                reason = describe_error(exc, client.connect_timeout, client.read_timeout)
                self.queue.close(f"event stream: {reason}")
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
        steps: bool = False,
        heartbeat_deadline: float = HEARTBEAT_DEADLINE,
        probe_seconds: float = PROBE_SECONDS,
        poll_seconds: float = POLL_SECONDS,
        rescan_seconds: float = RESCAN_SECONDS,
        backoff: Sequence[float] = BACKOFF,
        force_polling: bool = False,
        budget: Callable[[], Budget] = Budget,
        budget_cooldown: float = BUDGET_COOLDOWN,
        publish: Callable[[list[LiveInstance]], None] | None = None,
        publish_seconds: float = PUBLISH_SECONDS,
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
        self._wakers: set[_Mailbox] = set()
        # Instances over their stream budget: polled until this time (monotonic), and why.
        self._throttled: dict[str, tuple[float, str]] = {}
        # The live board: ``publish`` gets ``live_view()`` after a change (at most every
        # ``publish_seconds``) and every REPUBLISH_SECONDS while nothing changes (its age).
        self.publish = publish
        self.publish_seconds = publish_seconds
        self.scans: dict[str, InstanceScan] = {}  # the last full scan of each instance
        self._heard_ms: dict[str, int] = {}  # the last line of its stream, or its last rescan
        # Since when the consumer has had frames of it left to read (absent: caught up).
        self._behind_ms: dict[str, int] = {}
        self._changed = True
        self._writing: asyncio.Future[None] | None = None  # the board write under way
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
        publisher = asyncio.ensure_future(self._publisher()) if self.publish else None
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:  # stopped, one follower crashed, or cancelled: end them all
            self._halt()
            await aio.cancel_and_wait(*tasks)
            if publisher is not None:
                await aio.cancel_and_wait(publisher)
                # A write still under way in its thread would land after the last one below
                # and bring back a board that says "current" (the cancel does not stop it).
                if self._writing is not None:
                    with contextlib.suppress(BaseException):
                        await asyncio.wait([self._writing])
                self._heard_ms.clear()  # stopped: nothing is kept current any more
                with contextlib.suppress(Exception):
                    self._publish_now()
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
            self._heard_ms.pop(inst.name, None)  # not kept current until it is back
            self._changed = True
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
                    attempt += 1
                    await self._pause(self.backoff.delay(attempt))
                continue
            if not st.reported_down:
                st.reported_down = True
                self.emit(FleetEvent("down", inst.name, detail=reason, at_ms=_ms()))
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
            return False, describe_error(exc, self.cfg.connect_timeout, self.cfg.read_timeout)
        except Exception as exc:  # noqa: BLE001 - one instance's failure never ends the others
            return False, f"follower error: {type(exc).__name__}: {exc}"[:300]

    async def _connected(self, client: OpencodeClient, inst: InstanceConfig) -> tuple[bool, str]:
        await client.detect()
        mode = self._modes.get(inst.name)
        last_line = [time.monotonic()]

        def seen() -> None:
            last_line[0] = time.monotonic()
            self._heard_ms[inst.name] = _ms()

        streams = _Streams(client, seen, self.budget())
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
        changes = self._reconcile(inst, board, scan, "rescan")
        throttled = self._throttled.get(inst.name)
        was_polled = st.mode == "polling" and st.connects > 0
        st.mode, st.up, st.reason = mode, True, throttled[1] if throttled else ""
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
        elif mode != "polling" and was_polled and not first:  # back from its budget's pause
            self.emit(FleetEvent("ready", inst.name, detail=mode, at_ms=_ms()))
        if not first:
            await self._send(client, changes)
        if mode == "polling":
            return await self._poll(client, inst, board, throttled[0] if throttled else None)
        rescanned = time.monotonic()
        bad_in_a_row = 0
        while True:
            if not len(streams.queue):
                self._behind_ms.pop(inst.name, None)  # all it sent so far is on the board
            silent = time.monotonic() - last_line[0]
            wait = max(0.5, self.heartbeat_deadline - silent)
            if mode == "directory":
                wait = min(wait, max(0.5, self.rescan_seconds - (time.monotonic() - rescanned)))
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
                # arrives with an item, and the follower would then never end.
                async with asyncio.timeout(wait):
                    item = await streams.queue.get()
                self._behind_ms.setdefault(inst.name, _ms())
            except TimeoutError:
                if self.stopping():
                    return True, "stop"
                if time.monotonic() - last_line[0] >= self.heartbeat_deadline:
                    if streams.heartbeats:
                        return True, f"no heartbeat for {self.heartbeat_deadline:g} s"
                    # An older release sends no heartbeat: a quiet stream may be alive, or
                    # dead behind a proxy that keeps it open. A rescan tells what it missed.
                    scan = await scan_instance(client, inst)
                    if not scan.reachable:
                        return True, scan.reason
                    await self._send(client, self._reconcile(inst, board, scan, "rescan"))
                    last_line[0] = time.monotonic()
                if mode == "directory" and time.monotonic() - rescanned >= self.rescan_seconds:
                    rescanned = time.monotonic()
                    if not await self._open_directories(client, inst, streams):
                        return True, "a new directory's event stream did not open"
                    scan = await scan_instance(client, inst)
                    if not scan.reachable:
                        return True, scan.reason
                    await self._send(client, self._reconcile(inst, board, scan, "rescan"))
                continue
            if isinstance(item, _Closed):
                if item.over_budget:
                    st.over_budget += 1
                    self._throttled[inst.name] = (
                        time.monotonic() + self.budget_cooldown, item.reason
                    )
                    st.mode, st.reason = "polling", item.reason
                    self.emit(FleetEvent("polling", inst.name, detail=item.reason, at_ms=_ms()))
                return True, item.reason
            if isinstance(item, _Bad):
                st.bad_frames += item.count
                st.long_lines += item.long_lines
                bad_in_a_row += item.count
                if bad_in_a_row >= MAX_BAD_FRAMES:
                    return True, f"{bad_in_a_row} unreadable frames in a row"
                continue
            if isinstance(item, _Behind):
                st.overflows += 1
                scan = await scan_instance(client, inst)
                if not scan.reachable:
                    return True, scan.reason
                await self._send(client, self._reconcile(inst, board, scan, "rescan"))
                continue
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
            self._changed = True
            await self._send(client, changes)

    def _why_polling(self, client: OpencodeClient) -> str:
        if self.force_polling:
            return "polling asked for"
        if client.dialect == "v2":
            return "v2 API: no event stream known"
        return "neither /global/event nor /event?directory= answered"

    async def _poll(
        self, client: OpencodeClient, inst: InstanceConfig, board: Board,
        until: float | None = None,
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
            scan = await scan_instance(client, inst)
            if not scan.reachable:
                return True, scan.reason
            await self._send(client, self._reconcile(inst, board, scan, "poll"))

    async def _apply(
        self, client: OpencodeClient, inst: InstanceConfig, board: Board, frame: Frame
    ) -> list[FleetEvent]:
        changes = board.apply(frame)
        for sid, _hint in list(board.missing):
            try:
                s = await client.get_session(sid)
            except HubError:
                board.ignore(sid)  # gone already, or unreadable: a rescan will tell
                continue
            except (ValueError, TypeError, httpx.InvalidURL):
                board.ignore(sid)  # an id no request can carry: never ours to follow
                continue
            changes += board.learn(build_record(inst, s, None, True))
            changes += board.apply(frame)
        return changes

    def _reconcile(
        self, inst: InstanceConfig, board: Board, scan: InstanceScan, source: str
    ) -> list[FleetEvent]:
        """Replace the board's view with a full scan's (kept for the live board too)."""
        self.scans[inst.name] = scan
        self._heard_ms[inst.name] = _ms()
        self._changed = True
        return board.reconcile(scan.sessions, source, scan.sandboxes)

    # ------------------------------------------------------------------------- live board

    def live_view(self) -> list[LiveInstance]:
        """Every instance as known now (call it on the follower's own loop)."""
        view = []
        for inst in self.instances:
            scan = self.scans.get(inst.name)
            if scan is None:
                continue  # never scanned yet: nothing to say
            st = self.state[inst.name]
            heard = self._heard_ms.get(inst.name, 0)
            behind = self._behind_ms.get(inst.name)
            live = st.up and st.mode in ("global", "polling") and heard > 0
            confirmed = (heard if behind is None else min(heard, behind)) if live else 0
            board = self.boards[inst.name]
            # Outside the project: as the last rescan saw them (``_reconcile`` gave the board
            # this scan's), with what frames told since, those deleted since gone.
            sessions = list(board.foreign.values()) + list(board.sessions.values())
            view.append(LiveInstance(replace(scan, sessions=sessions), st.mode, confirmed))
        return view

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

    def _publish_now(self) -> None:
        assert self.publish is not None
        self._changed = False
        self.publish(self.live_view())

    async def _publisher(self) -> None:
        """Hand the live view to ``publish`` after changes, and now and then regardless."""
        assert self.publish is not None
        publish = self.publish
        last = 0.0
        while not self.stopping():
            await self._pause(self.publish_seconds)
            if not self._changed and time.monotonic() - last < REPUBLISH_SECONDS:
                continue
            self._changed = False
            last = time.monotonic()
            view = self.live_view()  # built here, on the loop that changes the boards
            self._writing = asyncio.ensure_future(asyncio.to_thread(publish, view))
            try:
                await asyncio.shield(self._writing)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a board not written is stale, never fatal
                self._changed = True

    async def _send(self, client: OpencodeClient, changes: list[FleetEvent]) -> None:
        from xaf_hub.core.outcomes import run_outcome
        from xaf_hub.core.runstate import outcome_of

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


def _ms() -> int:
    return int(time.time() * 1000)


async def probe_mode(
    cfg: Config,
    inst: InstanceConfig,
    transport_factory: TransportFactory | None = None,
    probe_seconds: float = PROBE_SECONDS,
    budget_seconds: float = 1.0,
) -> tuple[str, str, str]:
    """Which stream a follower would use for ``inst``: (mode, version, why it is polled).

    Mode and version are "" when the instance is unreachable. A stream that opens is
    watched ``budget_seconds`` more: over its budget in that time, the instance would be
    polled, and the third item says why ("" otherwise).
    """
    follower = FleetFollower(
        cfg, [inst], emit=lambda ev: None, transport_factory=transport_factory,
        probe_seconds=probe_seconds,
    )
    async with follower._client(inst) as client:
        try:
            await client.detect()
        except HubError:
            return "", "", ""
        streams = _Streams(client, lambda: None, Budget(window=budget_seconds))
        why = ""
        try:
            mode = await follower._choose(client, inst, streams)
            if mode != "polling":
                why = await _over_budget(streams.queue, budget_seconds)
        except HubError:
            mode = "polling"
        finally:
            await streams.close()
        return ("polling" if why else mode), client.version, why


async def _over_budget(box: _Mailbox, seconds: float) -> str:
    """The reason a stream went over its budget within ``seconds``, else ""."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                item = await box.get()
                if isinstance(item, _Closed):
                    return item.reason if item.over_budget else ""
    return ""


def run_in_thread(follower: FleetFollower, name: str = "xaf-hub-follower") -> Any:
    """Run ``follower`` on its own event loop in a daemon thread; returns the thread."""
    import threading


    thread = threading.Thread(target=lambda: aio.run(follower.run()), name=name, daemon=True)
    follower.thread = thread
    thread.start()
    return thread


