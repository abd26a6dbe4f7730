"""The audit log: one JSON line per write the hub makes (dispatch, interrupt, delete, heal...)."""

from __future__ import annotations

import errno
import getpass
import os
import socket
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from xaf_hub.core.text import dumps_line, redact
from xaf_hub.store.statefile import file_lock


def caller(env: Mapping[str, str]) -> str:
    """Who asked: XAF_HUB_CALLER, else PARENT_AGENT, else ''."""
    return env.get("XAF_HUB_CALLER") or env.get("PARENT_AGENT") or ""


def who(env: Mapping[str, str]) -> dict[str, str]:
    """Who is acting, as the audit line names them: caller, user and host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    return {"caller": caller(env), "user": user, "host": socket.gethostname()}


def append(
    state_dir: Path, *,
    command: str, instance: str = "", session: str = "", result: str = "ok", reason: str = "",
    env: Mapping[str, str] | None = None, extra: Mapping[str, Any] | None = None,
    secrets: Iterable[str] = (),
) -> None:
    """Append one line to ``<state_dir>/audit.log`` (locked, created 0600), whole or not at
    all: OSError when the disk has no room for it.

    The line goes through ``core.text.redact``: no ``secrets`` form and no echoed credential
    (a server's error text quoting our Authorization header) is ever written.
    """

    env = os.environ if env is None else env
    entry: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "who": who(env),
        "command": command,
        "instance": instance,
        "session": session,
        "result": result,
        "reason": reason,
        **(extra or {}),
    }
    path = state_dir / "audit.log"
    line = redact(dumps_line(entry), secrets) + "\n"
    # The lock makes the state folder when there is none yet.
    with file_lock(state_dir / "audit.log.lock", 10.0, what="audit log lock"):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            data = line.encode("utf-8")
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, data)
            except OSError:
                written = -1
            if written != len(data):  # a full disk cuts a write short: take the part back
                os.ftruncate(fd, size)
                raise OSError(errno.ENOSPC, f"no room for a line of {path}")
        finally:
            os.close(fd)
