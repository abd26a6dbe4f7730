"""`xaf-hub serve` as a real process for the browser tests, and running a blocking call off the
event loop; shared by the served-page browser modules."""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx

from tests.fleet import Hub

T = TypeVar("T")


def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn`` in a worker thread and return its result.

    Playwright's sync API keeps an asyncio loop running in the test's thread, and the CLI
    scans with asyncio.run, which refuses to start inside a running loop.
    """
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


class Served:
    """`xaf-hub serve` as a real process: its URL, its stderr lines, a clean stop."""

    def __init__(self, hub: Hub, *args: str, extra_env: dict[str, str] | None = None) -> None:
        self.proc = hub.popen("serve", "--port", "0", *args, extra_env=extra_env)
        self.err: list[str] = []
        lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        out, err = self.proc.stdout, self.proc.stderr

        def read_out() -> None:
            for line in out:
                lines.put(line)

        self.readers = [
            threading.Thread(target=read_out, daemon=True),
            threading.Thread(target=lambda: self.err.extend(err), daemon=True),
        ]
        for reader in self.readers:
            reader.start()
        try:
            self.url = lines.get(timeout=60).strip()
        except queue.Empty:
            self.kill()
            raise AssertionError(f"serve printed no URL: {''.join(self.err)}") from None
        assert self.url.startswith("http://127.0.0.1:") and self.url.endswith("/")

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path.lstrip("/"), timeout=60, **kwargs)

    def stop(self) -> int:
        """SIGTERM, then the exit code (killed after a generous wait)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close()

    def _close(self) -> None:
        # The readers end at EOF, which follows the exit; then the pipes can be closed.
        for reader in self.readers:
            reader.join(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def log(self) -> str:
        """Everything the server wrote to stderr (complete once it has stopped)."""
        return "".join(self.err)
