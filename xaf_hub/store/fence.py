"""A fencing token: the patrol lease a store write must still hold (HA patrol on Redis).

A daemon that holds the patrol lease hands its ``Fence`` to the Redis stores; each write they
make (a reservation, a pool update) checks in the same script or transaction that the lease
key still holds this token, so a daemon that lost the lease (paused, partitioned, slow) writes
nothing. An empty token never matches: a standby's stores refuse every fenced write.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fence:
    """The lease key and the token its holder wrote there."""

    key: str
    token: str
