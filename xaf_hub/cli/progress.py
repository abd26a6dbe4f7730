"""The "still waiting for ..." line a person sees while a scan waits on slow instances.

Only on a terminal (stderr a TTY): after ``delay`` seconds one line names the instances not
answered yet and how long it has been, rewritten in place as they answer, and erased when the
scan ends, so the table that follows starts on a clean line. On a pipe nothing is written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import TextIO

from xaf_hub.cli.termfit import Screen, fit
from xaf_hub.core.text import terminal_safe


class Progress:
    """Tracks which instances are still awaited; ``run`` draws the line until cancelled."""

    def __init__(
        self, stream: TextIO, names: Iterable[str], env: Mapping[str, str], *,
        delay: float = 1.0, interval: float = 0.5,
    ) -> None:
        self.stream = stream
        self.pending = list(dict.fromkeys(names))
        self.delay = delay
        self.interval = interval
        self.started = time.monotonic()
        self.shown = False
        width = Screen.of(stream, env).width  # None: not a terminal
        self.enabled = width is not None
        self.width = width or 80

    def done(self, name: str) -> None:
        """One instance answered (or failed): stop waiting for it."""
        if name in self.pending:
            self.pending.remove(name)

    def line(self) -> str:
        """The text of the line now, fitted to the terminal (one cell to spare)."""

        secs = int(time.monotonic() - self.started)
        names = ", ".join(self.pending)
        text = f"waiting for {len(self.pending)} instance(s) ({secs}s): {names}"
        return fit(terminal_safe(text), max(self.width - 1, 10))

    def draw(self) -> None:
        """Rewrite the line in place."""
        if not self.enabled or not self.pending:
            return
        self.stream.write("\r" + self.line() + "\x1b[K")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        """Erase the line if one was drawn."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False

    async def run(self) -> None:
        """Draw after ``delay``, then every ``interval``, until cancelled; erase at the end."""
        if not self.enabled:
            return
        try:
            await asyncio.sleep(self.delay)
            while self.pending:
                self.draw()
                await asyncio.sleep(self.interval)
        finally:
            self.clear()
