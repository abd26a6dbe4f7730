"""Which notification events some hub already queued, shared through Redis (HA patrol).

Each host keeps its own outbox (``notify/state.json``), and derives a round's events from the
shared stores (heals, pool) since *its* previous round. When the lease moves back to a host
that was active before, that host would derive again events the other host already queued.
With the lease, an event is queued only by the hub that first sets
``<lock.redis_prefix>:notify:seen:<event id>`` (SET NX, forgotten after 14 days, as the outbox
forgets its own ``seen``): one chat message per event for the whole fleet of hubs.

Only ``backends.Stores.event_claimer`` imports this module, so the file backends never load redis.
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
