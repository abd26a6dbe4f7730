"""The model state on Redis: blackouts and healed memory shared by every hub (architecture §7).

Chosen by ``models.state_backend: "redis"`` (``store.backends.Stores.model_state``). Keys, under
``lock.redis_prefix`` (``P``)::

    P:model_state               the .model_state.json document; written under WATCH/MULTI
    P:healed:<key>              one healed failure, PX 14 days
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, tzinfo
from typing import Any, TypeVar

import redis

from xaf_hub.core.clock import to_ms
from xaf_hub.store.fence import Fence
from xaf_hub.store.model_state import (
    HEAL_PREFIX,
    HEALED_RETENTION,
    Healed,
    HealedSession,
    ModelState,
    default_state,
    healed_entry,
    healed_list,
)
from xaf_hub.store.redis.client import as_text, describe, fenced_write, redis_errors, transact

__all__ = ["RedisModelState"]

_T = TypeVar("_T")


class RedisModelState(ModelState):
    """The model state on Redis: a blackout seen by one hub holds for every hub.

    Blackouts stay one document, so ``ModelState.mark_blackout`` (the single writer, with its
    "a repeat the same day never pushes the end out" rule) runs unchanged; its
    read-modify-write is a WATCH/MULTI transaction that retries when another hub wrote first.
    Each healed failure is its own key that Redis forgets after 14 days.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        reset_hour: int,
        tz: tzinfo,
        families: Mapping[str, Sequence[str]],
        lock_timeout: float = 20,
        fence: Fence | None = None,
    ) -> None:
        self.client = client
        self.fence = fence
        self.key = f"{prefix}:model_state"
        self.healed_prefix = f"{prefix}:healed:"
        self.where = describe(client)
        self.name = f"model state in redis {self.where} key {self.key}"
        super().__init__(reset_hour, tz, families, lock_timeout)

    def _parse(self, raw: str | None) -> dict[str, Any]:
        if raw is None:
            return default_state()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise self._bad(f"line {exc.lineno} column {exc.colno}", exc.msg) from None
        return self._check(data)

    def _read(self) -> dict[str, Any]:
        with redis_errors(self.where):
            raw = self.client.get(self.key)
        return self._parse(None if raw is None else as_text(raw))

    def _update(self, mutate: Callable[[dict[str, Any]], _T]) -> _T:
        def step(pipe: Any) -> _T:
            pipe.watch(self.key)
            got = pipe.get(self.key)
            raw = None if got is None else as_text(got)
            data = self._parse(raw)
            before = json.dumps(data, sort_keys=True)
            result = mutate(data)
            if raw is not None and json.dumps(data, sort_keys=True) == before:
                pipe.unwatch()
                return result
            if self.fence is not None:
                self.fence.check(pipe, f"model state in redis {self.where}")
            pipe.multi()
            pipe.set(self.key, json.dumps(data, ensure_ascii=False))
            ends = [int(b["until_ms"]) for b in data["blackouts"].values()]
            if ends:
                # Past the last end nothing in it counts any more: let Redis drop it.
                pipe.pexpireat(self.key, max(ends))
            pipe.execute()
            return result

        # Another hub wrote in between: read again and re-apply (same rules).
        with redis_errors(self.where):
            return transact(self.client, step, "the model state", self.lock_timeout)

    def was_healed(self, key: str) -> bool:
        """Return whether the failure identified by ``key`` was already healed (any hub)."""
        with redis_errors(self.where):
            return bool(self.client.exists(self.healed_prefix + key))

    def remember_healed(
        self,
        key: str,
        from_model: str | None,
        to_model: str | None,
        now: datetime,
        *,
        who: HealedSession | None = None,
    ) -> None:
        """Record that ``key`` was healed; Redis forgets it after 14 days."""
        entry = healed_entry(to_ms(now), from_model, to_model, who)
        retention_ms = int(HEALED_RETENTION.total_seconds() * 1000)
        with fenced_write(self.client, self.fence, f"model state in redis {self.where}") as pipe:
            pipe.set(self.healed_prefix + key, json.dumps(entry), px=retention_ms)

    def healed_since(self, since: datetime) -> list[Healed]:
        """The heals (not resumes) recorded at or after ``since`` by any hub, oldest first."""
        items: list[tuple[str, Any]] = []
        with redis_errors(self.where):
            keys = list(self.client.scan_iter(match=self.healed_prefix + HEAL_PREFIX + "*"))
            for name, raw in zip(keys, self.client.mget(keys) if keys else [], strict=True):
                if raw is None:
                    continue  # expired between the scan and the read
                with contextlib.suppress(ValueError, TypeError):
                    text = name.decode() if isinstance(name, bytes) else str(name)
                    items.append((text[len(self.healed_prefix) :], json.loads(raw)))
        return healed_list(items, to_ms(since))
