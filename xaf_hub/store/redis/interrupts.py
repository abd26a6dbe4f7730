"""People's interrupts in Redis, so a patrol daemon on any host respects them
(``<lock.redis_prefix>:interrupts``, docs/architecture.md §8).

A field that cannot be read is skipped. Only ``backends`` imports this module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import redis

from xaf_hub.store.redis.client import RETENTION_MS, as_text, describe, fenced_write, redis_errors

__all__ = ["read_interrupts", "record_interrupt"]

Key = tuple[str, str]  # (instance, session)


def _key(prefix: str) -> str:
    return f"{prefix}:interrupts"


def record_interrupt(
    client: redis.Redis,
    prefix: str,
    key: Key,
    at: float,
    who: Mapping[str, str],
    kind: str = "interrupted",
) -> None:
    """Keep that ``who`` stopped ``key`` at ``at`` (epoch seconds; ``kind``: "interrupted" by
    a person, "ceiling" at its run ceiling); the latest wins."""
    field = json.dumps(list(key), ensure_ascii=False)
    value = json.dumps({"at": at, "who": dict(who), "kind": kind}, ensure_ascii=False)
    with fenced_write(client, None, "interrupts") as pipe:
        pipe.hset(_key(prefix), field, value)
        pipe.pexpire(_key(prefix), RETENTION_MS)


def read_interrupts(client: redis.Redis, prefix: str) -> dict[Key, tuple[float, object, str]]:
    """Every kept stop: (instance, session) -> (epoch seconds, who as written, kind; one
    written without a kind is a person's interrupt)."""
    with redis_errors(describe(client)):
        raw = client.hgetall(_key(prefix))
    found: dict[Key, tuple[float, object, str]] = {}
    for name, value in raw.items():
        try:
            pair = json.loads(as_text(name))
            doc = json.loads(as_text(value))
            at = float(doc["at"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            continue
        if not (isinstance(pair, list) and len(pair) == 2):
            continue
        instance, session = str(pair[0]), str(pair[1])
        if at == at and at not in (float("inf"), float("-inf")):  # NaN or infinite: skipped
            found[(instance, session)] = (at, doc.get("who"), str(doc.get("kind") or ""))
    return found
