"""Atomic, locked JSON state files.

Writers replace a file in one step (temp file in the same folder, fsync, ``os.replace``,
fsync of the folder where the platform allows it), so a crash leaves either the old or the
new content, never half of one. Read-modify-write cycles hold an exclusive lock on a sibling
``.lock`` file so two processes never lose each other's update; under that lock they also
delete the temp files a writer killed mid-write left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from xaf_hub.config.reader import parse_json
from xaf_hub.errors import LockBusy, StateFileError

T = TypeVar("T")


def write_text_atomic(path: Path, text: str, *, private: bool = True) -> None:
    """Replace ``path`` with ``text`` in one step; mode 0600 when ``private``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; exports meant for others get the usual 0644.
        with contextlib.suppress(OSError):
            os.chmod(tmp, 0o600 if private else 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # Flush the folder's entry so the rename survives power loss; Windows cannot open a
    # directory for fsync.
    if os.name == "posix":
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def sweep_temp_files(path: Path) -> None:
    """Delete temp files that killed writers of ``path`` left; call only under its lock."""
    # write_text_atomic's temp names: "." + name + "." + 8 of mkstemp's [a-z0-9_] + ".tmp".
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp$")
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            if pattern.match(entry.name):
                with contextlib.suppress(OSError):
                    entry.unlink()


def write_json_atomic(path: Path, data: Any, *, private: bool = True) -> None:
    """Serialise ``data`` as pretty UTF-8 JSON and replace ``path`` atomically."""
    write_text_atomic(path, json.dumps(data, ensure_ascii=False, indent=2) + "\n", private=private)


def read_json(path: Path, *, what: str, missing: Callable[[], Any] | None = None) -> Any:
    """Parse a JSON state file; a corrupt one raises StateFileError naming file and position,
    an absent one FileNotFoundError, or is ``missing()`` when given."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if missing is None:
            raise
        return missing()
    except OSError as exc:
        raise StateFileError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    return parse_json(raw, lambda problem, _: StateFileError(f"{what} {path}: {problem}"), nul=True)


@contextlib.contextmanager
def file_lock(lock_path: Path, timeout: float, *, what: str = "lock") -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path``, polling up to ``timeout`` s, else LockBusy."""
    # deferred: it pulls in redis when that is installed, see docs/performance.md
    import portalocker

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + max(timeout, 0.0)
    handle = open(lock_path, "a+b")  # noqa: SIM115 - held open for the lock's lifetime
    try:
        while True:
            try:
                portalocker.lock(handle, portalocker.LOCK_EX | portalocker.LOCK_NB)
                break
            except (portalocker.LockException, BlockingIOError, PermissionError):
                if time.monotonic() >= deadline:
                    raise LockBusy(
                        f"could not obtain the {what} ({lock_path}) within {timeout:g}s; "
                        "another xaf-hub process holds it - retry in a few seconds"
                    ) from None
                time.sleep(0.02)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                portalocker.unlock(handle)
    finally:
        handle.close()


def update_json(
    path: Path,
    mutate: Callable[[Any], T],
    *,
    default: Callable[[], Any],
    what: str,
    timeout: float = 20.0,
) -> T:
    """Locked read-modify-write: ``mutate(data)`` edits in place; saved only if it changed."""
    with file_lock(path.with_name(path.name + ".lock"), timeout, what=f"{what} lock"):
        # Every writer of this file holds this lock, so any temp file of it is a dead
        # writer's half-written leftover (SIGKILL mid-write): clear it.
        sweep_temp_files(path)
        data = read_json(path, what=what, missing=default)
        before = json.dumps(data, sort_keys=True, ensure_ascii=False)
        result = mutate(data)
        if json.dumps(data, sort_keys=True, ensure_ascii=False) != before or not path.exists():
            write_json_atomic(path, data)
        return result
