"""Which notification events some hub already queued, shared through Redis (HA patrol).

``claimer`` gives a claim that lets exactly one hub queue each event: one chat message
per event for the whole fleet of hubs (docs/architecture.md §8).
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from xaf_hub.store.redis.client import describe, redis_errors

__all__ = ["claimer"]

_SEEN_MS = 14 * 24 * 3600 * 1000


def claimer(client: redis.Redis, prefix: str) -> Callable[[str], bool]:
    """A function that claims an event id for this hub: True once per id for all hubs.

    It raises UnreachableError when Redis cannot be asked (the caller queues nothing then).
    """
    where = describe(client)

    def claim(event_id: str) -> bool:
        with redis_errors(where):
            return bool(client.set(f"{prefix}:notify:seen:{event_id}", "1", nx=True, px=_SEEN_MS))

    return claim
