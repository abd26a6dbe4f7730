"""The task pool's file store (``tasks_backlog.json``): locked, atomic, never silently reset.

Every change is one locked read-modify-write through ``statefile.update_json``; the file is
rewritten only when the pool really changed. A corrupt file is reported with its position and
never reset. The rules are the interface's (``store.pool.TaskPool``); the record and the file
format are ``store.tasks``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from xaf_hub.store.pool import TaskPool, utc_now
from xaf_hub.store.statefile import read_json, update_json
from xaf_hub.store.tasks import WHAT, BacklogData

_T = TypeVar("_T")


class Backlog(TaskPool):
    """The task pool file: locked, atomic, never silently reset."""

    def __init__(
        self,
        path: Path,
        lock_timeout: float = 20,
        *,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.path = path
        self.where = str(path)
        self.lock_timeout = lock_timeout
        self._clock = clock

    def load(self) -> BacklogData:
        """Read the pool; a missing file is an empty pool, a corrupt one raises StateFileError."""
        return BacklogData.from_json(read_json(self.path, what=WHAT, missing=dict), path=self.path)

    def stamp(self) -> object:
        """The file's identity, time and size (None while absent): each write replaces it."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def update(self, mutate: Callable[[BacklogData], _T]) -> _T:
        """Run ``mutate`` on the pool under the lock; write back only when it changed something."""

        def apply(raw: Any) -> _T:
            data = BacklogData.from_json(raw, path=self.path)
            before = data._state()
            result = mutate(data)
            if data._state() != before:
                # Replace in place: update_json compares this very object to decide on writing.
                raw.clear()
                raw.update(data.to_json())
            return result

        return update_json(
            self.path,
            apply,
            default=lambda: BacklogData().to_json(),
            what=WHAT,
            timeout=self.lock_timeout,
        )
