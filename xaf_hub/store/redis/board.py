"""The live board in Redis, for the other hosts (architecture §5.1).

With the stores in Redis (``backends.shares_decisions``), a follower's board is also written
to ``<lock.redis_prefix>:live_board:<writer>:<host>`` and its summary to
``<lock.redis_prefix>:live_summary:<writer>:<host>`` (each one string, the same JSON as the
files, both set at once and forgotten ``TTL_MS`` after their last write), and a reader on
any host takes these beside the files of its own state folder; each instance's freshest view
wins, judged by the same rules (``ops.live_board``). Only ``backends.Stores`` imports this module.
"""

from __future__ import annotations

import redis

from xaf_hub.store.redis.client import as_text, describe, fenced_write, redis_errors

__all__ = ["boards", "publish"]

# A board is written every 5 s while its writer lives: one not written for a minute is gone.
TTL_MS = 60_000


def publish(
    client: redis.Redis, prefix: str, writer: str, host: str, text: str, summary: str
) -> None:
    """Write one writer's board and its summary of one host, in one transaction
    (UnreachableError when Redis cannot be asked)."""
    with fenced_write(client, None, "live board") as pipe:
        pipe.set(f"{prefix}:live_board:{writer}:{host}", text, px=TTL_MS)
        pipe.set(f"{prefix}:live_summary:{writer}:{host}", summary, px=TTL_MS)


def boards(client: redis.Redis, prefix: str, summary: bool = False) -> list[str]:
    """Every board in Redis, each host's and writer's (``summary``: each one's summary, or its
    whole board when it wrote none: an older hub still running on that host; UnreachableError
    as above)."""
    with redis_errors(describe(client)):
        found = {as_text(k) for k in client.scan_iter(match=f"{prefix}:live_board:*", count=100)}
        if summary:
            summaries = {as_text(k) for k in
                         client.scan_iter(match=f"{prefix}:live_summary:*", count=100)}
            board = f"{prefix}:live_board:"
            found = summaries | {k for k in found
                                 if f"{prefix}:live_summary:{k[len(board):]}" not in summaries}
        keys = sorted(found)
        if not keys:
            return []
        texts = client.mget(keys)
    return [as_text(t) for t in texts if t]
