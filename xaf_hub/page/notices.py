"""Change notices for open overview pages: one fleet follower shared by every viewer.

``ChangeFeed`` numbers each change, runs the ``on_change`` hooks and wakes every open
``/api/events`` stream; a viewer gets a ``hello`` with the current version first. Notices never
carry titles, directories or secrets (docs/live.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Literal

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.config.watch import ConfigState
from xaf_hub.core.outcomes import Run
from xaf_hub.core.records import SessionRecord, Snapshot
from xaf_hub.fleet.events import FleetEvent, following_words
from xaf_hub.fleet.follow import FleetFollower, run_in_thread
from xaf_hub.fleet.live_view import LiveInstance
from xaf_hub.fleet.scan import InstanceScan, TransportFactory
from xaf_hub.ops.live_board import merged, publish, take
from xaf_hub.store.backends import Stores

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


@dataclass(eq=False)
class ChangeFeed:
    """The latest changes, numbered, and the viewers waiting for the next one."""

    cfg: Config
    _: KW_ONLY
    transport_factory: TransportFactory | None = None
    keepalive_seconds: float = KEEPALIVE_SECONDS
    # How serve stands with its config, said on its live board.
    state: Callable[[], ConfigState | None] = lambda: None
    version: int = field(default=0, init=False)
    viewers: int = field(default=0, init=False)
    on_change: list[Callable[[FleetEvent], None]] = field(default_factory=list, init=False)
    closed: bool = field(default=False, init=False)  # every stream has ended or is ending
    # Instances followed by polling, and why (an old server, a stream over its budget): the
    # page's server line says it (``annotate``).
    following: dict[str, str] = field(default_factory=dict, init=False)
    _recent: deque[dict[str, Any]] = field(
        default_factory=lambda: deque(maxlen=_BACKLOG), init=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _wakers: list[Callable[[], None]] = field(default_factory=list, init=False)  # ``events``
    _follower: Any = field(default=None, init=False)
    _stores: Any = field(default=None, init=False)

    def start(self) -> None:
        """Start following the fleet (one follower for every viewer); ``use`` starts anew."""
        if self._stores is None:  # Redis's copy of the board for the other hosts, if any
            self._stores = Stores(self.cfg)
        cfg = self.cfg
        self._follower = FleetFollower(
            cfg, emit=self.publish,
            transport_factory=self.transport_factory, outcomes=False,
            publish=lambda view: publish(cfg, view, "serve", self._stores, self.state()),
        )
        run_in_thread(self._follower, "xaf-hub-serve-follower")

    def use(self, cfg: Config) -> None:
        """Follow the fleet ``cfg`` names from now on: the follower is started anew (its
        instances announce themselves, so the pages fetch themselves again)."""
        old = self._follower
        if old is not None:
            old.close()  # its last board written before the new follower's first
        self.cfg = cfg
        self.following.clear()
        if self._stores is not None:
            self._stores.cfg = cfg
        if old is not None:
            self.start()

    def live_view(self) -> list[LiveInstance]:
        """What the follower knows of each instance now ([] before it started)."""
        return self._follower.view_now() if self._follower is not None else []

    def close(self) -> None:
        """Stop following and end every open stream."""
        for part in (self._follower, self._stores):
            if part is not None:
                part.close()
        with self._lock:
            self.closed = True
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
        with self._lock:
            self.version += 1
            self._recent.append(notice(self.version, ev))
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

        with self._lock:
            seen = self.version
            self.viewers += 1
            self._wakers.append(wake)
        end = time.monotonic() + seconds
        why = "viewer went away"  # unless it ends by itself (a cancel, a cut connection)
        try:
            yield f"retry: {RETRY_MS}\n\n".encode() + frame("hello", {"version": seen})
            while True:
                with self._lock:
                    waiting = not self.closed and self.version <= seen
                left = end - time.monotonic()
                if waiting and left > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), min(self.keepalive_seconds, left))
                changed.clear()  # a wake after this finds its notice numbered below
                with self._lock:
                    if self.closed:
                        why = "server stopping"
                        return
                    if time.monotonic() >= end:
                        why = f"stream ended after {seconds:g}s (the page reconnects)"
                        return
                    fresh = [n for n in self._recent if n["version"] > seen]
                    seen = self.version
                yield b"".join(frame("change", n) for n in fresh) if fresh else b": keep-alive\n\n"
        finally:
            with self._lock:
                self.viewers -= 1
                self._wakers.remove(wake)
            if said is not None:
                said.append(why)


Read = Run | Literal[""]  # a session's last run as its messages say; "" not read


@dataclass(eq=False)
class LiveFleet:
    """What ``serve`` shows: each instance from the follower where its view is fresh
    (``ops.live_board.take``), the others scanned; idle sessions' last results are kept until a
    notice about the session (``forget``). Called by ``SnapshotCache``, one call at a time.
    """

    cfg: Config  # what it shows, swapped whole by ``use``
    _: KW_ONLY
    scan: Callable[[list[InstanceConfig]], list[InstanceScan]]
    outcomes: Callable[[list[InstanceScan]], object]
    feed: ChangeFeed | None = field(default=None, init=False)
    scanned: int = field(default=0, init=False)  # instance scans made (for tests and the bench)
    taken: int = field(default=0, init=False)  # instance views taken from the follower
    # (instance, session) -> (updated, outcome)
    _known: dict[tuple[str, str], tuple[int, Read]] = field(default_factory=dict, init=False)

    def use(self, cfg: Config) -> None:
        """Show the instances ``cfg`` names from now on (the next call)."""
        self.cfg = cfg

    def follow(self, feed: ChangeFeed) -> None:
        """Take live views from ``feed`` from now on, and forget what its notices change."""
        feed.on_change.insert(0, self.forget)  # before the cache is marked stale
        self.feed = feed

    def forget(self, ev: FleetEvent) -> None:
        """A notice about a session: its last result is read again when next shown."""
        if ev.session is not None:
            self._known.pop((ev.instance, ev.session.id), None)

    def __call__(self) -> Snapshot:

        cfg = self.cfg
        instances = list(cfg.instances)
        view: list[LiveInstance] = self.feed.live_view() if self.feed is not None else []
        board = take(cfg, instances, view)
        rest = [i for i in instances if i.name not in board.scans]
        scanned = self.scan(rest) if rest else []
        self.scanned += len(rest)
        self.taken += len(board.scans)
        snap, scans = merged(instances, board, scanned)
        for sc in scans:
            sc.sessions = [self._recall(s) for s in sc.sessions]
        answered = [sc for sc in scans if sc.reachable]
        unread = [sc for sc in answered if any(_unread(s) for s in sc.sessions)]
        if unread:  # only the instances with a result to read are asked at all
            self.outcomes(unread)
        shown = {sc.inst.name for sc in answered}
        kept = {k: v for k, v in self._known.items() if k[0] not in shown}  # gone sessions go
        for sc in answered:
            for s in sc.sessions:
                if s.project and not s.running and s.outcome not in ("", "running"):
                    kept[(s.instance, s.id)] = (s.updated, s.outcome)
        self._known = kept
        return merged(instances, board, scans, snap.generated_at)[0]

    def _recall(self, s: SessionRecord) -> SessionRecord:
        known = self._known.get((s.instance, s.id))
        if not _unread(s) or known is None or known[0] != s.updated:
            return s
        return replace(s, outcome=known[1])


def _unread(s: SessionRecord) -> bool:
    """An idle project session whose last result the snapshot does not carry yet."""
    return s.project and not s.running and not s.outcome
