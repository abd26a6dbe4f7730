"""Change notices for open overview pages: one fleet follower shared by every viewer.

``ChangeFeed`` follows the fleet (``fleet.follow.FleetFollower``, in its own thread) for as
long as ``serve`` runs, whoever is looking. Each change bumps a version number, runs the
``on_change`` hooks (``serve`` marks its cached scan stale there, so the next page fetch
scans once for everybody) and wakes every open ``/api/events`` stream, which sends it as a
server-sent event::

    event: change
    data: {"version": 7, "event": "stopped", "instance": "lan-b", "session": "ses_...",
           "outcome": "succeeded", "at_ms": 1796...}

A page listens with ``new EventSource("/api/events")`` and ``addEventListener("change", ...)``
and fetches ``/api/snapshot`` again. A viewer that connects (or reconnects) gets a ``hello``
event with the current version first; a comment line every ``keepalive_seconds`` keeps
proxies from closing a quiet stream. Notices never carry titles, directories or secrets:
the page reads those from the snapshot it fetches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import replace
from typing import Any

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core.records import Snapshot
from xaf_hub.fleet.events import FleetEvent, following_words
from xaf_hub.fleet.scan import TransportFactory

KEEPALIVE_SECONDS = 15.0
RETRY_MS = 3000
_BACKLOG = 256


def notice(version: int, ev: FleetEvent) -> dict[str, Any]:
    """The public form of one change: what changed where, never its contents (pure)."""
    return {
        "version": version,
        "event": ev.kind,
        "instance": ev.instance,
        "session": ev.session.id if ev.session is not None else "",
        "outcome": ev.outcome,
        "at_ms": ev.at_ms,
    }


def frame(kind: str, data: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class ChangeFeed:
    """The latest changes, numbered, and the viewers waiting for the next one."""

    def __init__(
        self,
        cfg: Config,
        instances: Sequence[InstanceConfig] | None = None,
        *,
        transport_factory: TransportFactory | None = None,
        keepalive_seconds: float = KEEPALIVE_SECONDS,
    ) -> None:
        self.cfg = cfg
        self.instances = list(cfg.instances if instances is None else instances)
        self.transport_factory = transport_factory
        self.keepalive_seconds = keepalive_seconds
        self.version = 0
        self.viewers = 0
        self.on_change: list[Callable[[FleetEvent], None]] = []
        self._recent: deque[dict[str, Any]] = deque(maxlen=_BACKLOG)
        self._cond = threading.Condition()
        self._closed = False
        self._wakers: list[Callable[[], None]] = []  # one per open stream (``events``)
        self._follower: Any = None
        # Instances followed by polling, and why (an old server, a stream over its budget):
        # the page's server line says it (``annotate``).
        self.following: dict[str, str] = {}

    def start(self) -> None:
        """Start following the fleet (one follower for every viewer)."""
        from xaf_hub.fleet.follow import FleetFollower, run_in_thread
        from xaf_hub.ops.live_board import publish

        cfg = self.cfg
        self._follower = FleetFollower(
            cfg, self.instances, emit=self.publish,
            transport_factory=self.transport_factory, outcomes=False,
            publish=lambda view: publish(cfg, view, "serve"),
        )
        run_in_thread(self._follower, "xaf-hub-serve-follower")

    def close(self) -> None:
        """Stop following and end every open stream."""
        if self._follower is not None:
            self._follower.close()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            wakers = list(self._wakers)
        for wake in wakers:
            wake()

    def publish(self, ev: FleetEvent) -> None:
        """Record one change and wake the viewers (called by the follower)."""
        # "ready" too: the follower starts after the page's scan (with its first viewer), so
        # whatever changed in between shows only in the follower's first view of an instance.
        if ev.kind == "polling":  # before the hooks: the scan they ask for shows it
            self.following[ev.instance] = str(following_words(ev))
        elif ev.kind in ("ready", "up"):
            self.following.pop(ev.instance, None)
        for hook in self.on_change:
            hook(ev)
        with self._cond:
            self.version += 1
            self._recent.append(notice(self.version, ev))
            self._cond.notify_all()
            wakers = list(self._wakers)
        for wake in wakers:  # after the hooks and the number: a woken stream finds both
            wake()

    def annotate(self, snap: Snapshot) -> Snapshot:
        """``snap`` with each polled instance's reason added to its server line (its note)."""
        notes = dict(self.following)
        if not notes:
            return snap
        return replace(snap, instances=tuple(
            replace(i, note=" · ".join(n for n in (i.note, notes[i.name]) if n))
            if i.name in notes else i
            for i in snap.instances
        ))

    def since(self, version: int) -> list[dict[str, Any]]:
        """Notices newer than ``version`` still kept."""
        with self._cond:
            return [n for n in self._recent if n["version"] > version]

    @property
    def closed(self) -> bool:
        """Whether ``close`` ran (every stream has ended or is ending)."""
        return self._closed

    async def events(
        self, seconds: float = math.inf, said: list[str] | None = None
    ) -> AsyncGenerator[bytes, None]:
        """One viewer's stream, for an event loop: notices until the feed closes or ``seconds``
        have passed (the browser then reconnects); why it ended goes to ``said``. A heartbeat
        comment goes out whenever ``keepalive_seconds`` pass without a notice. The follower's
        thread wakes the loop after each notice is numbered (``_wakers``)."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(changed.set)

        with self._cond:
            seen = self.version
            self.viewers += 1
            self._wakers.append(wake)
        end = time.monotonic() + seconds
        why = "viewer went away"  # unless it ends by itself (a cancel, a cut connection)
        try:
            yield f"retry: {RETRY_MS}\n\n".encode() + frame("hello", {"version": seen})
            while True:
                with self._cond:
                    waiting = not self._closed and self.version <= seen
                left = end - time.monotonic()
                if waiting and left > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), min(self.keepalive_seconds, left))
                changed.clear()  # a wake after this finds its notice numbered below
                with self._cond:
                    if self._closed:
                        why = "server stopping"
                        return
                    if time.monotonic() >= end:
                        why = f"stream ended after {seconds:g}s (the page reconnects)"
                        return
                    fresh = [n for n in self._recent if n["version"] > seen]
                    seen = self.version
                yield b"".join(frame("change", n) for n in fresh) if fresh else b": keep-alive\n\n"
        finally:
            with self._cond:
                self.viewers -= 1
                self._wakers.remove(wake)
            if said is not None:
                said.append(why)
