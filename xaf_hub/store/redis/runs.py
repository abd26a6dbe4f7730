"""The rounds' memory of last runs in Redis, shared by the HA patrol daemons
(docs/architecture.md §8).

A save writes only what changed, and only while this daemon holds the lease; a damaged field is
a ``StateFileError`` and the hash is never overwritten for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import redis

from xaf_hub.errors import StateFileError
from xaf_hub.store.fence import Fence
from xaf_hub.store.patrol_state import RunMemory, SeenRun, parse_seen, seen_json
from xaf_hub.store.redis.client import RETENTION_MS, as_text, describe, fenced_write, redis_errors

__all__ = ["RedisRunMemory"]


def _field(instance: str, session: str) -> str:
    return json.dumps([instance, session], ensure_ascii=False)


class RedisRunMemory(RunMemory):
    """``RunMemory`` kept in one Redis hash; saves write only what changed."""

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        entries: dict[tuple[str, str], SeenRun],
        fence: Fence | None = None,
    ) -> None:
        super().__init__(Path(key), entries)
        self.client = client
        self.key = key
        self.fence = fence
        self.server = describe(client)
        self.where = f"redis {self.server} key {key}"

    @classmethod
    def open(cls, client: redis.Redis, prefix: str, fence: Fence | None = None) -> RedisRunMemory:
        """The memory in Redis (empty when there is none); StateFileError when damaged."""
        memory = cls(client, f"{prefix}:last_runs", {}, fence)
        with redis_errors(memory.server):
            raw = client.hgetall(memory.key)
        what = f"patrol last-runs memory {memory.where}: field"
        for name, value in raw.items():
            field = as_text(name)
            try:
                pair = json.loads(field)
                doc = json.loads(as_text(value))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise StateFileError(f"{what} {field[:80]!r}: not JSON ({exc})") from None
            if not (
                isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
            ):
                raise StateFileError(f"{what} {field[:80]!r}: not an [instance, session] pair")
            seen = parse_seen(doc)
            if isinstance(seen, str):
                raise StateFileError(f"{what} {field}: {seen}")
            memory._entries[(pair[0], pair[1])] = seen
        return memory

    def _write(self) -> None:
        dirty = {
            _field(*key): json.dumps(seen_json(self._entries[key]), ensure_ascii=False)
            for key in self._dirty
        }
        gone = [_field(*key) for key in self._gone]
        what = f"patrol last-runs memory {self.where}"
        with fenced_write(self.client, self.fence, what, "it was not saved") as pipe:
            if dirty:
                pipe.hset(self.key, mapping=dirty)
            if gone:
                pipe.hdel(self.key, *gone)
            # A session no round saw for RETENTION_MS goes with the whole hash only if nothing
            # wrote it since: each save pushes the expiry out again.
            pipe.pexpire(self.key, RETENTION_MS)
