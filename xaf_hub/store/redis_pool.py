"""The task pool in Redis, shared by every hub that points at one server (``pool.backend``).

The pool stays one document, the JSON of ``tasks_backlog.json`` (``store.tasks``), under
``<lock.redis_prefix>:pool``. ``update`` is a WATCH/MULTI transaction: it reads the document,
applies the same rules as the file store (``backlog.TaskPool``) and writes back only if no
other hub wrote in between; otherwise it reads again and re-applies. So a ``claim`` made by two
hubs at once succeeds for one of them; the other sees the row dispatched and sends nothing.

With a ``Fence`` (an HA patrol daemon's lease) a write happens only while the lease key holds
the daemon's token, checked inside the same transaction (the lease key is watched too).

Only ``backends.make_pool`` imports this module, so the file backend never loads ``redis``.
Redis errors become ``UnreachableError("redis", reason)`` (exit 2) before anything is sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

# make_pool imports redis_backend first, which names the extra when redis is missing.
import redis
from redis.exceptions import WatchError

from xaf_hub.errors import BusyError, LockLostError, StateFileError
from xaf_hub.store.backlog import TaskPool, _utc_now
from xaf_hub.store.fence import Fence
from xaf_hub.store.redis_backend import _redis_errors, _text, describe
from xaf_hub.store.tasks import BacklogData

__all__ = ["RedisBacklog"]

_T = TypeVar("_T")


class RedisBacklog(TaskPool):
    """The task pool as one Redis key, changed only in WATCH/MULTI transactions."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        lock_timeout: float = 20,
        *,
        clock: Callable[[], datetime] = _utc_now,
        fence: Fence | None = None,
    ) -> None:
        self.client = client
        self.fence = fence
        self.key = f"{prefix}:pool"
        self.server = describe(client)
        self.where = f"redis {self.server} key {self.key}"
        self.lock_timeout = lock_timeout
        self._clock = clock

    def _parse(self, raw: str | None) -> BacklogData:
        if raw is None:
            return BacklogData()
        try:
            doc: Any = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise StateFileError(
                f"task pool {self.where}: line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None
        return BacklogData.from_json(doc, path=self.where)

    def load(self) -> BacklogData:
        """Read the pool; an absent key is an empty pool, corrupt content raises StateFileError."""
        with _redis_errors(self.server):
            raw = self.client.get(self.key)
        return self._parse(None if raw is None else _text(raw))

    def update(self, mutate: Callable[[BacklogData], _T]) -> _T:
        """Apply ``mutate`` in one transaction; re-read and re-apply when another hub wrote first.

        ``mutate`` may run more than once (once per conflict); it only changes ``data`` and
        raises, so a re-run is safe. BusyError when the pool kept changing for lock_timeout.
        """
        deadline = time.monotonic() + max(self.lock_timeout, 0.0)
        with _redis_errors(self.server), self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    keys = [self.key] if self.fence is None else [self.key, self.fence.key]
                    pipe.watch(*keys)  # type: ignore[no-untyped-call]  # unannotated upstream
                    got = pipe.get(self.key)
                    data = self._parse(None if got is None else _text(got))
                    before = data._state()
                    result = mutate(data)
                    if data._state() == before:
                        pipe.unwatch()
                        return result
                    if self.fence is not None:
                        # Watched: if the lease changes hands before EXEC, the write is dropped
                        # and the next pass finds it is no longer ours.
                        holder = pipe.get(self.fence.key)
                        if holder is None or _text(holder) != self.fence.token:
                            pipe.unwatch()
                            raise LockLostError(
                                f"task pool {self.where}: this patrol daemon no longer holds "
                                f"the patrol lease (key {self.fence.key}); another daemon is "
                                "active, so the pool was not changed"
                            )
                    pipe.multi()
                    pipe.set(self.key, json.dumps(data.to_json(), ensure_ascii=False))
                    pipe.execute()
                    return result
                except WatchError:
                    if time.monotonic() >= deadline:
                        raise BusyError(
                            f"could not update the task pool in redis {self.server}: it kept "
                            f"changing for {self.lock_timeout:g}s"
                        ) from None
                    pipe.reset()
