"""What a follower knows of each instance now, and its publication (the live board, §5.1).

Per instance: the last full scan, when its stream was last heard with nothing of it left
unread (or its last rescan), and since when the follower has had frames of it waiting. The
view is handed to ``publish`` (``ops.live_board.publish``) at most every ``PUBLISH_SECONDS``
after a change and every ``REPUBLISH_SECONDS`` while nothing changes, so readers see it lives.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.fleet.events import Board, now_ms
from xaf_hub.fleet.instance_scan import InstanceScan

if TYPE_CHECKING:
    from xaf_hub.fleet.follow import FollowState

PUBLISH_SECONDS = 0.5  # the live board is written at most this often after a change
REPUBLISH_SECONDS = 5.0  # and this often while nothing changes, so readers see it is alive


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


@dataclass(eq=False, repr=False)  # no repr: its config holds passwords
class LiveView:
    """The follower's view of ``instances`` (its ``state`` and ``boards``), kept current by the
    follower's calls, built on the follower's own loop."""

    instances: Sequence[InstanceConfig]
    state: dict[str, FollowState]
    boards: dict[str, Board]
    publish: Callable[[list[LiveInstance]], None] | None = None
    scans: dict[str, InstanceScan] = field(default_factory=dict)  # each one's last full scan
    heard_ms: dict[str, int] = field(default_factory=dict)  # its stream's last line, or rescan
    # Since when the consumer has had frames of it left to read (absent: caught up).
    behind_ms: dict[str, int] = field(default_factory=dict)
    changed: bool = True

    def heard(self, name: str) -> None:
        """A line of the instance's stream arrived."""
        self.heard_ms[name] = now_ms()

    def rescanned(self, name: str, scan: InstanceScan) -> None:
        """A full scan replaced what was known of the instance."""
        self.scans[name] = scan
        self.heard(name)
        self.changed = True

    def lost(self, name: str) -> None:
        """The instance's connection ended: its view is not kept current until it is back."""
        self.heard_ms.pop(name, None)
        self.changed = True

    def view(self) -> list[LiveInstance]:
        """Every instance as known now (call it on the follower's own loop)."""
        view = []
        for inst in self.instances:
            scan = self.scans.get(inst.name)
            if scan is None:
                continue  # never scanned yet: nothing to say
            st = self.state[inst.name]
            heard = self.heard_ms.get(inst.name, 0)
            behind = self.behind_ms.get(inst.name)
            live = st.up and st.mode in ("global", "polling") and heard > 0
            confirmed = (heard if behind is None else min(heard, behind)) if live else 0
            board = self.boards[inst.name]
            # Outside the project: as the last rescan saw them (``rescanned`` gave the board
            # this scan's), with what frames told since, those deleted since gone.
            sessions = list(board.foreign.values()) + list(board.sessions.values())
            view.append(LiveInstance(replace(scan, sessions=sessions), st.mode, confirmed))
        return view

    async def publisher(
        self, pause: Callable[[float], Awaitable[None]], stopping: Callable[[], bool]
    ) -> None:
        """Hand the view to ``publish`` after changes, and now and then regardless."""
        assert self.publish is not None
        publish = self.publish
        last = 0.0
        while not stopping():
            await pause(PUBLISH_SECONDS)
            if not self.changed and time.monotonic() - last < REPUBLISH_SECONDS:
                continue
            self.changed = False
            last = time.monotonic()
            view = self.view()  # built here, on the loop that changes the boards
            try:
                # A cancel waits for the write: none lands after publish_last's.
                await aio.blocking(publish, view)
            except Exception:  # noqa: BLE001 - a board not written is stale, never fatal
                self.changed = True

    async def publish_last(self) -> None:
        """The publisher was cancelled (and its write ended): write the board once more, saying
        nothing is current."""
        self.heard_ms.clear()  # stopped: nothing is kept current any more
        assert self.publish is not None
        self.changed = False
        with contextlib.suppress(Exception):
            await aio.blocking(self.publish, self.view())
