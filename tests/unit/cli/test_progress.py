"""The "waiting for ..." line: drawn in place on a terminal (a real pty here), erased at the
end, and never written to a pipe."""

from __future__ import annotations

import asyncio
import io
import os
import pty
import select
import sys
import time

import pytest

from xaf_hub.cli.progress import Progress

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")


def _read_until(fd: int, wanted: str, got: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while wanted not in "".join(got):
        assert time.monotonic() < deadline, f"never saw {wanted!r} in {''.join(got)[-300:]!r}"
        if select.select([fd], [], [], 0.05)[0]:
            got.append(os.read(fd, 4096).decode("utf-8", "replace"))


def test_on_a_terminal_the_line_names_who_is_awaited_then_is_erased() -> None:
    master, slave = pty.openpty()
    stream = os.fdopen(slave, "w", encoding="utf-8")
    got: list[str] = []

    async def scenario() -> None:
        p = Progress(stream, ["local-a", "lan-b", "慢-c"], {"COLUMNS": "80"},
                     delay=0.01, interval=0.01)
        ticker = asyncio.create_task(p.run())
        for shown, name in (("waiting for 3 instance(s)", "local-a"),
                            ("waiting for 2 instance(s)", "lan-b"),
                            ("waiting for 1 instance(s)", "慢-c")):
            await asyncio.to_thread(_read_until, master, shown, got)
            p.done(name)
        await ticker  # ends by itself once nobody is awaited

    try:
        asyncio.run(scenario())
        _read_until(master, "\r\x1b[K", got)
        text = "".join(got)
        assert "waiting for 3 instance(s)" in text and "local-a, lan-b, 慢-c" in text
        last = text.rsplit("waiting for", 1)[1]
        assert "1 instance(s)" in last and "慢-c" in last and "lan-b" not in last
        assert "\n" not in text  # rewritten in place, one line
        assert text.endswith("\r\x1b[K")  # erased at the end
    finally:
        stream.close()
        os.close(master)


def test_the_line_fits_the_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    names = [f"instance-with-a-long-name-{i}" for i in range(10)]
    p = Progress(Tty(), names, {"COLUMNS": "40"})
    assert p.enabled and len(p.line()) <= 39 and p.line().endswith("…")


def test_on_a_pipe_nothing_is_written() -> None:
    out = io.StringIO()

    async def scenario() -> None:
        p = Progress(out, ["a", "b"], {}, delay=0.0, interval=0.01)
        ticker = asyncio.create_task(p.run())
        await asyncio.sleep(0.05)
        p.done("a")
        p.draw()
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)

    asyncio.run(scenario())
    assert out.getvalue() == ""


def test_cancelled_while_drawn_still_erases() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()

    async def scenario() -> None:
        p = Progress(out, ["a"], {}, delay=0.0, interval=10)
        ticker = asyncio.create_task(p.run())
        while "waiting" not in out.getvalue():
            await asyncio.sleep(0.01)
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)

    asyncio.run(scenario())
    assert out.getvalue().startswith("\rwaiting for 1 instance(s)")
    assert out.getvalue().endswith("\r\x1b[K")
