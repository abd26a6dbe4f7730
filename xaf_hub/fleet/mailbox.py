"""Frames on their way from a connection's stream readers to the follower, bounded and coalesced.

A frame replaces the waiting frame that stands for the same state (a session's info, its run
going idle or not, one message) and goes to the back; past ``MAX_PENDING_FRAMES`` or
``MAX_PENDING_BYTES`` everything waiting is dropped for one ``Behind``: the follower rescans
the instance instead. Frames no reader could read are counted (``Bad``); the end of a stream
(``Closed``) comes after what it sent, a stop or a stream over its budget before it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

from xaf_hub.fleet.events import Frame
from xaf_hub.fleet.wire import message_of

# What may wait for the consumer before the rest is dropped for a rescan.
MAX_PENDING_FRAMES = 1024
MAX_PENDING_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Closed:
    """The stream ended, and why (``over_budget``: it sent more than its budget allows)."""

    reason: str
    over_budget: bool = False


@dataclass(frozen=True)
class Behind:
    """Frames were dropped because the consumer fell behind: rescan instead."""


@dataclass(frozen=True)
class Bad:
    """Frames the reader could not read (too large to read, or not JSON it can use)."""

    count: int
    long_lines: int


Item = Frame | Closed | Behind | Bad


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
        return ("message", message_of(props.get("info")).id or str(sid))
    return (frame.type, str(sid))


class Mailbox:
    """What the readers of one connection hand the consumer, by the rules above (a frame's
    key: ``_coalesce_key``)."""

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
        self._closed: Closed | None = None
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
        """The stream ended (the first reason wins); ``urgent`` (a stop) skips what still waits."""
        if self._closed is None:
            self._closed = Closed(reason, over_budget)
        self._urgent = self._urgent or urgent or over_budget
        self._ready.set()

    def __len__(self) -> int:
        return len(self._pending)

    def _waiting(self) -> bool:
        return bool(self._pending or self._bad or self._behind)

    async def get(self) -> Item:
        """The next thing to handle."""
        while True:
            if self._closed is not None and (self._urgent or not self._waiting()):
                return self._closed
            if self._bad:
                item = Bad(self._bad, self._long)
                self._bad = self._long = 0
                return item
            if self._behind:
                self._behind = False
                return Behind()
            if self._pending:
                _, (frame, size) = self._pending.popitem(last=False)
                self._bytes -= size
                return frame
            self._ready.clear()
            await self._ready.wait()
