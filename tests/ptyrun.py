"""Run a command with its stdout on a pseudo-terminal of a given size (Linux/macOS only)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from collections.abc import Sequence


def run_on_pty(
    argv: Sequence[str],
    *,
    columns: int = 80,
    rows: int = 24,
    env: dict[str, str] | None = None,
    stderr_on_pty: bool = False,
    timeout: float = 120.0,
) -> tuple[int, str, str]:
    """Run ``argv`` with stdout (and stderr when asked) on a ``columns``-wide pty.

    Returns (exit code, what the terminal received, stderr when it went to a pipe)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave if stderr_on_pty else subprocess.PIPE,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                proc.kill()
                raise TimeoutError(f"{argv} did not finish within {timeout}s")
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                # Drain what is left, then stop.
                while select.select([master], [], [], 0.05)[0]:
                    try:
                        data = os.read(master, 65536)
                    except OSError:
                        data = b""
                    if not data:
                        break
                    chunks.append(data)
                break
        err = proc.stderr.read().decode() if proc.stderr else ""
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
        if proc.stderr:
            proc.stderr.close()
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    return code, text, err
