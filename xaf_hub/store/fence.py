"""A fencing token: the patrol lease a store write must still hold (HA patrol on Redis).

A daemon that holds the patrol lease hands its ``Fence`` to the Redis stores; each write they
make (a reservation, a pool update) checks in the same script or transaction that the lease
key still holds this token, so a daemon that lost the lease (paused, partitioned, slow) writes
nothing. An empty token never matches: a standby's stores refuse every fenced write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xaf_hub.errors import LockLostError


@dataclass(frozen=True)
class Fence:
    """The lease key and the token its holder wrote there."""

    key: str
    token: str

    def lost(self, what: str, outcome: str = "nothing was written") -> LockLostError:
        """The refusal of a write to ``what`` that found the lease no longer this token's."""
        return LockLostError(
            f"{what}: this patrol daemon no longer holds the patrol lease (key {self.key}); "
            f"another daemon is active, so {outcome}"
        )

    def check(self, pipe: Any, what: str) -> None:
        """In a Redis WATCH transaction, before MULTI: watch the lease key (a change aborts
        the EXEC) and raise ``lost`` unless it holds this token now."""
        pipe.watch(self.key)
        holder = pipe.get(self.key)
        if (holder.decode() if isinstance(holder, bytes) else holder) != self.token:
            pipe.unwatch()
            raise self.lost(what)
