"""The task pool in Redis, one key per task, every write atomic and fenced by the HA lease.

Keys, scripts and migration: docs/architecture.md §9, "The task pool on Redis". Redis errors
become ``UnreachableError`` before anything is sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final, TypeVar

import redis

from xaf_hub.errors import StateFileError
from xaf_hub.store.fence import Fence
from xaf_hub.store.pool import TaskPool, utc_now
from xaf_hub.store.redis.client import as_text, busy, describe, redis_errors, transact
from xaf_hub.store.tasks import BacklogData, Task

__all__ = ["RedisBacklog"]

_T = TypeVar("_T")

# Script answers.
_WRITTEN: Final = 1  # 0: the row (or the pool) changed since it was read
_NOT_HOLDER: Final = -1
_UNMIGRATED: Final = 2

# Compare and set one row. KEYS: the row, order, writes, the old document, the lease.
# ARGV: the row as read ('' = absent), the row to write ('' = remove), its id, fenced '1'/'0',
# the fence token.
_EDIT = """
if redis.call('EXISTS', KEYS[4]) == 1 then return 2 end
if ARGV[4] == '1' and redis.call('GET', KEYS[5]) ~= ARGV[5] then return -1 end
local cur = redis.call('GET', KEYS[1])
if cur == false then cur = '' end
if cur ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[2])
  if cur == '' then
    local last = redis.call('ZREVRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    local place = 0
    if last[2] then place = tonumber(last[2]) + 1 end
    redis.call('ZADD', KEYS[2], place, ARGV[3])
  end
end
redis.call('INCR', KEYS[3])
return 1
"""

# Everything at one instant. KEYS: order, meta, writes, the old document. ARGV: the row key
# prefix. Answer: writes, meta ('' = absent), 1 if the old document exists, then id, row pairs.
_READ_ALL = """
local out = {redis.call('GET', KEYS[3]) or '0', redis.call('GET', KEYS[2]) or '',
             redis.call('EXISTS', KEYS[4])}
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('GET', ARGV[1] .. id) or ''
end
return out
"""

# Write what a whole-pool rule changed, if nothing was written since it read. KEYS: order,
# meta, writes, the old document, the lease. ARGV: writes as read, fenced, token, row key
# prefix, write meta '1'/'0', meta ('' = remove), renumber '1'/'0', then: n, n x (id, row);
# m, m x id removed; with renumber, k, k x id in their new order.
_COMMIT = """
if redis.call('EXISTS', KEYS[4]) == 1 then return 2 end
if ARGV[2] == '1' and redis.call('GET', KEYS[5]) ~= ARGV[3] then return -1 end
if (redis.call('GET', KEYS[3]) or '0') ~= ARGV[1] then return 0 end
local prefix = ARGV[4]
if ARGV[5] == '1' then
  if ARGV[6] == '' then redis.call('DEL', KEYS[2]) else redis.call('SET', KEYS[2], ARGV[6]) end
end
local i = 8
local n = tonumber(ARGV[i])
local last = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local place = 0
if last[2] then place = tonumber(last[2]) + 1 end
for j = 1, n do
  local id, row = ARGV[i + 2 * j - 1], ARGV[i + 2 * j]
  redis.call('SET', prefix .. id, row)
  if ARGV[7] ~= '1' and redis.call('ZSCORE', KEYS[1], id) == false then
    redis.call('ZADD', KEYS[1], place, id)
    place = place + 1
  end
end
i = i + 2 * n + 1
local m = tonumber(ARGV[i])
for j = 1, m do
  redis.call('DEL', prefix .. ARGV[i + j])
  redis.call('ZREM', KEYS[1], ARGV[i + j])
end
if ARGV[7] == '1' then
  i = i + m + 1
  local k = tonumber(ARGV[i])
  redis.call('DEL', KEYS[1])
  for j = 1, k do redis.call('ZADD', KEYS[1], j - 1, ARGV[i + j]) end
end
redis.call('INCR', KEYS[3])
return 1
"""


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _meta(data: BacklogData) -> dict[str, Any]:
    """The document's keys other than its tasks."""
    return {"schema_version": data.schema_version, "discipline": data.discipline, **data.extra}


class RedisBacklog(TaskPool):
    """The task pool in Redis: a key per task, each change a compare-and-set script."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        lock_timeout: float = 20,
        *,
        clock: Callable[[], datetime] = utc_now,
        fence: Fence | None = None,
    ) -> None:
        self.client = client
        self.fence = fence
        self.key = f"{prefix}:pool"
        self.order_key = f"{self.key}:order"
        self.meta_key = f"{self.key}:meta"
        self.writes_key = f"{self.key}:writes"
        self.backup_key = f"{self.key}:v1"
        self.task_prefix = f"{self.key}:task:"
        self.server = describe(client)
        self.where = f"redis {self.server} key {self.key}"
        self.lock_timeout = lock_timeout
        self._clock = clock
        self._edit = client.register_script(_EDIT)
        self._read_all = client.register_script(_READ_ALL)
        self._commit = client.register_script(_COMMIT)

    # -- reading ---------------------------------------------------------------------------

    def _at(self, key: str) -> str:
        return f"redis {self.server} key {key}"

    def _json(self, raw: str, key: str) -> Any:
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise StateFileError(
                f"task pool {self._at(key)}: line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None

    def _row(self, raw: str, task_id: str, index: int = 0) -> Task:
        """One stored row; corrupt content raises StateFileError naming its key."""
        key = self.task_prefix + task_id
        task = Task.from_json(self._json(raw, key), path=self._at(key), index=index)
        if task.id != task_id:
            raise StateFileError(
                f"task pool {self._at(key)}: holds task {task.id!r}, not {task_id!r}"
            )
        return task

    def _document(self, meta: str, rows: list[tuple[str, str]]) -> BacklogData:
        doc: dict[str, Any] = {} if not meta else self._json(meta, self.meta_key)
        if not isinstance(doc, dict):
            raise StateFileError(f"task pool {self._at(self.meta_key)}: expected an object")
        # The document's checks (schema version, discipline) without its tasks.
        data = BacklogData.from_json({**doc, "tasks": []}, path=self._at(self.meta_key))
        for index, (task_id, raw) in enumerate(rows):
            if not raw:
                raise StateFileError(
                    f"task pool {self._at(self.order_key)}: lists task {task_id!r}, whose key "
                    f"{self.task_prefix}{task_id} is missing"
                )
            data.tasks.append(self._row(raw, task_id, index))
        return data

    def _snapshot(self) -> tuple[str, str, list[tuple[str, str]]]:
        """(writes, meta, [(id, row)]) at one instant, the old document migrated first."""
        while True:
            got = self._read_all(
                keys=[self.order_key, self.meta_key, self.writes_key, self.key],
                args=[self.task_prefix],
            )
            if int(got[2]):
                self._migrate()
                continue
            pairs = [as_text(v) for v in got[3:]]
            rows = list(zip(pairs[0::2], pairs[1::2], strict=True))
            return as_text(got[0]), as_text(got[1]), rows

    def load(self) -> BacklogData:
        """Read the pool; an absent pool is empty, corrupt content raises StateFileError."""
        with redis_errors(self.server):
            _, meta, rows = self._snapshot()
            return self._document(meta, rows)

    def stamp(self) -> object:
        """``P:writes``, which every write of every host adds one to."""
        with redis_errors(self.server):
            return self.client.get(self.writes_key)

    # -- writing ---------------------------------------------------------------------------

    def _fence_args(self) -> tuple[str, str, str]:
        """(lease key, fenced flag, token) for a script; the old document's key when unfenced."""
        if self.fence is None:
            return self.key, "0", ""
        return self.fence.key, "1", self.fence.token

    def _written(self, answer: int, deadline: float) -> bool:
        """Whether a script's ``answer`` says it wrote; raises when it may not write (the lease
        is gone) or when the pool kept changing until ``deadline``."""
        if answer == _NOT_HOLDER:
            assert self.fence is not None
            raise self.fence.lost(f"task pool {self.where}", "the pool was not changed")
        if answer not in (_WRITTEN, _UNMIGRATED) and time.monotonic() >= deadline:
            raise busy("the task pool", self.server, self.lock_timeout)
        return answer == _WRITTEN

    def edit(self, task_id: str, change: Callable[[Task | None], tuple[Task | None, _T]]) -> _T:
        """Change one row: read it, apply ``change``, compare-and-set it (see the module)."""
        key = self.task_prefix + task_id
        lease, fenced, token = self._fence_args()
        deadline = time.monotonic() + max(self.lock_timeout, 0.0)
        with redis_errors(self.server):
            while True:
                pipe = self.client.pipeline(transaction=False)
                pipe.get(key)
                pipe.exists(self.key)
                raw, unmigrated = pipe.execute()
                if unmigrated:
                    self._migrate()
                    continue
                read = "" if raw is None else as_text(raw)
                current = self._row(read, task_id) if read else None
                new, result = change(current)
                if new is not None and new.id != task_id:
                    raise ValueError(f"edit of task {task_id!r} returned task {new.id!r}")
                if new == current:  # no row before or after, or the same row
                    return result
                row = "" if new is None else _dump(new.to_json())
                keys = [key, self.order_key, self.writes_key, self.key, lease]
                answer = self._edit(keys=keys, args=[read, row, task_id, fenced, token])
                if self._written(answer, deadline):
                    return result

    def update(self, mutate: Callable[[BacklogData], _T]) -> _T:
        """Apply ``mutate`` to the whole pool; write the rows it changed if nobody wrote since.

        ``mutate`` may run more than once (once per conflict); it only changes ``data`` and
        raises, so a re-run is safe. BusyError when the pool kept changing for lock_timeout.
        """
        lease, fenced, token = self._fence_args()
        deadline = time.monotonic() + max(self.lock_timeout, 0.0)
        with redis_errors(self.server):
            while True:
                writes, meta, rows = self._snapshot()
                data = self._document(meta, rows)
                before = data._state()
                old_rows = dict(rows)
                old_tasks = {t.id: t for t in data.tasks}
                result = mutate(data)
                if data._state() == before:
                    return result
                args = self._changes(data, before, old_rows, old_tasks, [i for i, _ in rows])
                answer = self._commit(
                    keys=[self.order_key, self.meta_key, self.writes_key, self.key, lease],
                    args=[writes, fenced, token, self.task_prefix, *args],
                )
                if self._written(answer, deadline):
                    return result

    def _changes(
        self,
        data: BacklogData,
        before: tuple[Any, ...],
        old_rows: dict[str, str],
        old_tasks: dict[str, Task],
        old_order: list[str],
    ) -> list[str]:
        """The commit script's arguments after the meta: rows set, rows removed, the order."""
        seen: set[str] = set()
        sets: list[str] = []
        for task in data.tasks:
            if not task.id.strip() or task.id in seen:
                raise ValueError(f"task pool: id {task.id!r} empty or twice after a change")
            seen.add(task.id)
            if old_tasks.get(task.id) is task:
                continue
            row = _dump(task.to_json())
            if old_rows.get(task.id) != row:
                sets += [task.id, row]
        meta_changed = before[1:] != data._state()[1:]
        meta = "" if _meta(data) == _meta(BacklogData()) else _dump(_meta(data))
        removed = [i for i in old_order if i not in seen]
        kept = [t.id for t in data.tasks if t.id in old_rows]
        survivors = [i for i in old_order if i in seen]
        renumber = kept != survivors or any(t.id in old_rows for t in data.tasks[len(kept) :])
        args = ["1" if meta_changed else "0", meta, "1" if renumber else "0"]
        args += [str(len(sets) // 2), *sets, str(len(removed)), *removed]
        if renumber:
            args += [str(len(data.tasks)), *(t.id for t in data.tasks)]
        return args

    # -- the one-document pool of earlier releases -------------------------------------------

    def _migrate(self) -> None:
        """Move the old one-document pool (``P``) to a key per task, once (see the module)."""

        def step(pipe: Any) -> None:
            pipe.watch(self.key, self.writes_key)
            raw = pipe.get(self.key)
            if raw is None:
                pipe.unwatch()
                return
            doc = self._json(as_text(raw), self.key)
            data = BacklogData.from_json(doc, path=self.where)
            have = {str(i) for i in pipe.zrange(self.order_key, 0, -1)}
            last = pipe.zrevrange(self.order_key, 0, 0, withscores=True)
            place = int(last[0][1]) + 1 if last else 0
            meta_present = bool(pipe.exists(self.meta_key))
            pipe.multi()
            for task in data.tasks:
                if task.id in have:
                    continue  # written in the new layout since: that row stands
                pipe.set(self.task_prefix + task.id, _dump(task.to_json()))
                pipe.zadd(self.order_key, {task.id: place})
                place += 1
            if not meta_present and _meta(data) != _meta(BacklogData()):
                pipe.set(self.meta_key, _dump(_meta(data)))
            pipe.rename(self.key, self.backup_key)
            pipe.incr(self.writes_key)
            pipe.execute()

        transact(self.client, step, "the task pool", self.lock_timeout)
