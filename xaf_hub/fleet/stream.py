"""Reading one connection's event streams: bytes to frames, at a bounded cost.

A line is read in chunks and held only up to ``MAX_FRAME_BYTES``; a longer one is skipped to
its end, never held whole (only its first ``_PREFIX_BYTES`` are kept, to tell its type). Only
a ``data:`` line is life: a stream of ``: keep-alive`` comments, or a line trickling in a byte
at a time, goes stale like a silent one. A stream that sends more than ``BUDGET_FRAMES_PER_S``
frames or ``BUDGET_BYTES_PER_S`` bytes a second (over ``BUDGET_WINDOW`` seconds) is closed as
over its budget. What the readers read waits for the follower in a ``fleet.mailbox.Mailbox``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx

from xaf_hub.core import aio
from xaf_hub.fleet.client import OpencodeClient, explain
from xaf_hub.fleet.events import parse_frame
from xaf_hub.fleet.mailbox import Mailbox

# The longest line held and the largest frame read. The frames the hub reads (session.*,
# server.*, message.updated) are small; the largest real frames are message.part.updated (and
# its "sync" twin), which carry a tool call's whole input, as large as the file the model writes
# (docs/live.md; bench/frame_sizes.py), unbounded in principle. The hub never reads those, so a
# longer line is skipped to its end unheld.
MAX_FRAME_BYTES = 1024 * 1024
_PREFIX_BYTES = 4096  # what is kept of a skipped line: enough to see its event type
# Per-stream budget, averaged over a window: a busy 1.18 server streaming ten runs at once
# sends a few hundred small message.part.delta frames a second (docs/performance.md).
BUDGET_FRAMES_PER_S = 2000
BUDGET_BYTES_PER_S = 8 * 1024 * 1024
BUDGET_WINDOW = 10.0


class OverBudget(Exception):
    """A stream sent more than its budget allows."""


@dataclass(eq=False)
class Budget:
    """Frames and bytes one connection's streams sent in the current window.

    ``add`` raises ``OverBudget`` (with the reason in words) as soon as a window holds more
    than its share; the window starts again every ``window`` seconds.
    """

    frames_per_s: float = BUDGET_FRAMES_PER_S
    bytes_per_s: float = BUDGET_BYTES_PER_S
    window: float = BUDGET_WINDOW
    clock: Callable[[], float] = time.monotonic
    frames: int = field(default=0, init=False)
    bytes: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._start = self.clock()

    def add(self, frames: int, nbytes: int) -> None:
        """Count what arrived; raise ``OverBudget`` when the window's share is exceeded."""
        now = self.clock()
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


@dataclass(eq=False)
class Streams:
    """The reader tasks of one connection, feeding one queue."""

    client: OpencodeClient
    on_line: Callable[[], None]  # called for every data line: the stream's sign of life
    budget: Budget = field(default_factory=Budget)
    queue: Mailbox = field(default_factory=Mailbox, init=False)
    tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    directories: set[str] = field(default_factory=set, init=False)
    heartbeats: bool = field(default=False, init=False)

    async def open(self, path: str, directory: str, probe_seconds: float) -> bool:
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
        sees it); after that, the end of the stream is queued as ``Closed``."""
        client = self.client
        try:
            async with client.open_stream(path, params) as resp:
                ctype = resp.headers.get("content-type", "")
                if resp.status_code != 200 or "event-stream" not in ctype:
                    return
                budget = self.budget
                async for raw, whole in read_lines(resp.aiter_bytes(), lambda n: budget.add(0, n)):
                    if not raw.startswith(b"data:"):
                        continue  # comments, blank lines, event:/id:/retry: are not life
                    budget.add(1, 0)
                    self.on_line()
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
                reason = explain(exc, client.connect_timeout, client.read_timeout)[1]
                self.queue.close(f"event stream: {reason}")
        finally:
            opened.set()  # wakes ``open`` at once when the stream failed before a frame

    async def close(self) -> None:
        """Stop every reader."""
        tasks, self.tasks = self.tasks, []
        await aio.cancel_and_wait(*tasks)
