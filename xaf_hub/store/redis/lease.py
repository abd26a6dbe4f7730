"""The HA patrol's lease in Redis: one active daemon among the hubs, the others on standby.

``held`` is false once the lease time passed without a renewal, whatever Redis says; ``fence``
is what the Redis stores check on every write. Redis errors become UnreachableError. Keys:
docs/architecture.md §8.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime
from typing import Any

import redis

from xaf_hub.store.fence import Fence
from xaf_hub.store.redis.client import as_text, describe, redis_errors

__all__ = ["PatrolLease", "known_daemons", "lease_token"]

# Daemons that have not beaten for this long drop out of the status listing.
FORGET_AFTER_SECONDS = 24 * 3600

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Take the lease if free; on success swap the last holder's token for ours and return it
# ('' when no daemon ever held it): one script, so two takers never both see one predecessor.
_TAKE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local before = redis.call('GET', KEYS[2])
  redis.call('SET', KEYS[2], ARGV[1])
  return before or ''
end
return false
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def lease_key(prefix: str) -> str:
    """The lease key under ``prefix``."""
    return f"{prefix}:patrol:lease"


def daemons_key(prefix: str) -> str:
    """The hash of known daemons under ``prefix``."""
    return f"{prefix}:patrol:daemons"


def member_of(token: str) -> str:
    """``<host>|<pid>`` of a lease token: which daemon holds it."""
    return token.rsplit("|", 1)[0]


def host_of(token: str) -> str:
    """The host name of a lease token."""
    return token.rsplit("|", 2)[0]


class PatrolLease:
    """One daemon's side of the lease: acquire or renew, release, and its fence."""

    def __init__(self, client: redis.Redis, prefix: str, host: str, lease_seconds: float) -> None:
        self.client = client
        self.prefix = prefix
        self.key = lease_key(prefix)
        self.daemons = daemons_key(prefix)
        self.host = host
        self.member = f"{host}|{os.getpid()}"
        self.lease_seconds = lease_seconds
        self.where = describe(client)
        self.token = ""
        self._until = 0.0  # monotonic time until which the lease is surely ours
        self._mutex = threading.Lock()  # the renewing thread and a round may both ask
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._take = client.register_script(_TAKE)
        self._taken_from: str | None = None  # the predecessor's token at the last take

    @property
    def held(self) -> bool:
        """True while this daemon holds the lease and its time has not run out locally."""
        return bool(self.token) and time.monotonic() < self._until

    def fence(self) -> Fence:
        """The fence for this moment: the token while held, else one that never matches."""
        return Fence(self.key, self.token if self.held else "")

    def acquire(self) -> bool:
        """Renew the lease if ours, else take it if free; True when this daemon holds it."""
        ms = max(1, int(self.lease_seconds * 1000))
        with self._mutex:
            start = time.monotonic()  # before asking: the lease runs from no later than this
            try:
                with redis_errors(self.where):
                    if self.token and self._renew(keys=[self.key], args=[self.token, ms]):
                        self._until = start + self.lease_seconds
                        return True
                    token = f"{self.member}|{os.urandom(4).hex()}"
                    # The second key names the last daemon that took the lease.
                    holder = f"{self.prefix}:patrol:holder"
                    before = self._take(keys=[self.key, holder], args=[token, ms])
                    if before is not None:
                        self.token, self._until = token, start + self.lease_seconds
                        self._taken_from = as_text(before)
                        return True
            except BaseException:
                self.token, self._until = "", 0.0  # cannot tell: not ours from now on
                raise
            self.token, self._until = "", 0.0
            return False

    def takeover(self) -> str | None:
        """The host this daemon took the lease from, once, after a take; else None.

        None also for a first start (nobody held it before), a take-back by this daemon and a
        restart on the same host: only a move between hosts is a failover.
        """
        with self._mutex:
            before, self._taken_from = self._taken_from, None
        if not before or not self.token or member_of(before) == self.member:
            return None
        host = host_of(before)
        return host if host != self.host else None

    def release(self) -> None:
        """Give the lease up now (a clean stop), if it is still ours."""
        with self._mutex:
            token, self.token, self._until = self.token, "", 0.0
            if token:
                with redis_errors(self.where):
                    self._release(keys=[self.key], args=[token])

    def holder(self) -> str | None:
        """The host holding the lease now, or None."""
        token = lease_token(self.client, self.prefix)
        return None if token is None else host_of(token)

    def beat(self, role: str, now: datetime) -> None:
        """Record this daemon's role and heartbeat for ``patrol status``."""
        entry = dict(member=self.member, host=self.host, pid=os.getpid(), role=role)
        entry.update(heartbeat=now.isoformat(timespec="seconds"))
        entry["heartbeat_ms"] = int(now.timestamp() * 1000)
        with redis_errors(self.where):
            self.client.hset(self.daemons, self.member, json.dumps(entry))


def lease_token(client: redis.Redis, prefix: str) -> str | None:
    """The lease key's token, or None when no daemon holds the lease."""
    with redis_errors(describe(client)):
        token = client.get(lease_key(prefix))
    return None if token is None else as_text(token)


def known_daemons(client: redis.Redis, prefix: str, now_ms: int) -> list[dict[str, Any]]:
    """Every daemon that beat within a day (host, pid, role, heartbeat), oldest forgotten."""
    key = daemons_key(prefix)
    with redis_errors(describe(client)):
        raw = client.hgetall(key)
        out: list[dict[str, Any]] = []
        stale: list[str] = []
        for member, value in sorted(raw.items()):
            try:
                entry = json.loads(as_text(value))
                age_ms = now_ms - int(entry["heartbeat_ms"])
            except (ValueError, KeyError, TypeError):
                continue  # unreadable: not shown, and left for whoever wrote it
            if age_ms > FORGET_AFTER_SECONDS * 1000:
                stale.append(as_text(member))
                continue
            out.append(entry)
        if stale:
            client.hdel(key, *stale)
    return out
