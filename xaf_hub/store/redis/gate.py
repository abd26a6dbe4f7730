"""The dispatch gate on Redis, shared by every host that points at one server.

Chosen by ``lock.backend: "redis"``; the rules are those of docs/architecture.md §5, where its
keys are listed too.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

import redis
from redis.exceptions import LockError, RedisError
from redis.lock import Lock

from xaf_hub.config.load import LockConfig
from xaf_hub.errors import LockBusy, LockLostError
from xaf_hub.store.fence import Fence
from xaf_hub.store.gate import Gate, Reservation, parse_reservation, pid_alive
from xaf_hub.store.redis.client import as_text, describe, reason, redis_errors

__all__ = ["LOCK_LEASE_SECONDS", "RedisGate"]


# The lock's lease: how long a crashed holder blocks the instance. The holder renews it every
# third of this while it works, so a long create/prompt never outlives its lock.
LOCK_LEASE_SECONDS = 10.0

# Delete a reservation only if nobody rewrote it since it was judged dead (attach may have
# restarted its timer in between), and drop its token from the index in the same step.
_DELETE_IF_UNCHANGED = """
local current = redis.call('GET', KEYS[1])
if current == false or current == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[2], ARGV[2])
  return 1
end
return 0
"""


# Write one reservation and index it; when a lock token is given, only while the lock key still
# holds it (a holder whose lease ran out, or whose keys were flushed, writes nothing); when
# fenced (ARGV[5] = '1'), only while the patrol lease key KEYS[4] holds the token ARGV[6].
_WRITE_IF_OWNER = """
if ARGV[5] == '1' and redis.call('GET', KEYS[4]) ~= ARGV[6] then
  return -1
end
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[3], ARGV[4])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
"""


class RedisGate(Gate):
    """The dispatch gate on Redis: one lock and one reservation set for every host.

    Same interface and liveness rules as the file ``Gate``: a reservation dies when Redis
    expires its key (``slot_ttl_seconds``), when its session is not running after
    ``slot_grace_seconds``, or when its process is gone and it was made on this host.
    """

    def __init__(
        self,
        cfg: LockConfig,
        client: redis.Redis,
        *,
        host: str | None = None,
        clock: Callable[[], float] | None = None,
        alive: Callable[[int], bool] = pid_alive,
        lease_seconds: float = LOCK_LEASE_SECONDS,
        fence: Fence | None = None,
    ) -> None:
        super().__init__(cfg, host=host, clock=clock or self.server_time, alive=alive)
        self.client = client
        self.prefix = cfg.redis_prefix
        self.lease_seconds = lease_seconds
        self.fence = fence
        self.where = describe(client)
        self._delete_if_unchanged = client.register_script(_DELETE_IF_UNCHANGED)
        self._write_if_owner = client.register_script(_WRITE_IF_OWNER)
        self._locks: dict[str, Lock] = {}
        self._lost: set[str] = set()  # lost locks the caller was told about (no second warning)
        self._fenced: set[str] = set()  # instances a write was refused for: patrol lease gone

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def index_key(self, instance: str) -> str:
        """The set of ``instance``'s reservation tokens."""
        return self._key("slots", instance)

    def slot_key(self, instance: str, token: str) -> str:
        """One reservation's key."""
        return self._key("slot", instance, token)

    def server_time(self) -> float:
        """The Redis server's clock in seconds: one clock for every host."""
        with redis_errors(self.where):
            seconds, micros = self.client.time()
        return float(seconds) + micros / 1_000_000

    # -- the lock ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, instance: str) -> Iterator[None]:
        """Hold the instance's dispatch lock, or raise BusyError after lock_timeout_seconds."""
        timeout = self.cfg.lock_timeout_seconds
        # thread_local=False: the watchdog thread renews with the token this thread acquired.
        lk = Lock(
            self.client,
            self._key("lock", instance),
            timeout=self.lease_seconds,
            sleep=0.05,
            blocking_timeout=max(timeout, 0.0),
            thread_local=False,
        )
        with redis_errors(self.where):
            acquired = lk.acquire()
        if not acquired:
            raise LockBusy(
                f"could not obtain the dispatch lock for {instance} (redis {self.where}) within "
                f"{timeout:g}s; another xaf-hub process holds it - retry in a few seconds"
            )
        stop = threading.Event()
        watchdog = threading.Thread(
            target=self._renew, args=(lk, stop), name=f"xaf-hub lock {instance}", daemon=True
        )
        watchdog.start()
        self._locks[instance] = lk
        self._held.add(instance)
        self._lost.discard(instance)
        try:
            yield
        finally:
            self._held.discard(instance)
            self._locks.pop(instance, None)
            stop.set()
            watchdog.join()
            try:
                lk.release()
            except LockError:
                if instance not in self._lost:
                    self.warnings.append(
                        f"the dispatch lock for {instance} was lost before it was released: "
                        f"its {self.lease_seconds:g}s lease in redis {self.where} ran out (this "
                        "process was paused, or could not reach redis) or redis lost its keys "
                        "(FLUSHALL, a restart)"
                    )
            except RedisError:
                pass  # the lease frees it within lease_seconds

    def _token_of(self, instance: str) -> str:
        """The held lock's token for ``instance`` ("" when this gate holds no lock there)."""
        lk = self._locks.get(instance)
        token = getattr(lk.local, "token", None) if lk is not None else None
        return "" if token is None else as_text(token)

    def owns_lock(self, instance: str) -> bool:
        """Ask Redis whether the lock key still holds this process's token (one GET).

        False once the lease ran out and someone else took the lock, or the key vanished
        (FLUSHALL, a restart without persistence). Raises UnreachableError when Redis cannot
        be asked; the caller then cannot rely on the lock either.
        """
        token = self._token_of(instance)
        if not token:
            return False
        keys = [self._key("lock", instance)]
        if self.fence is not None:
            keys.append(self.fence.key)  # a daemon that lost the patrol lease owns nothing
        with redis_errors(self.where):
            current = self.client.mget(keys)
        owned = current[0] is not None and as_text(current[0]) == token
        if owned and self.fence is not None:
            owned = current[1] is not None and as_text(current[1]) == self.fence.token
            if not owned:
                self.warnings.append(str(self._fence_lost(instance)))
                return False
        if not owned:
            self._lost.add(instance)
        return owned

    def fenced_out(self, instance: str) -> bool:
        """True once a check or write for ``instance`` found the patrol lease gone."""
        return instance in self._fenced

    def _fence_lost(self, instance: str) -> LockLostError:
        assert self.fence is not None
        self._fenced.add(instance)
        return self.fence.lost(f"{instance} (redis {self.where})", "nothing is sent")

    def holds(self, res: Reservation) -> bool:
        """True when the reservation's key is still in Redis."""
        with redis_errors(self.where):
            return bool(self.client.exists(res.key))

    def _renew(self, lk: Lock, stop: threading.Event) -> None:
        """Push the lease out every third of it until ``stop``; a lost lock ends the loop."""
        while not stop.wait(self.lease_seconds / 3):
            try:
                lk.reacquire()
            except LockError:
                return  # no longer ours; release() reports it
            except RedisError:
                continue  # a blip: two more tries before the lease runs out

    # -- reservations -----------------------------------------------------------------------

    def _decode(self, raw: str, key: str, instance: str, now: float) -> Reservation:
        try:
            return parse_reservation(json.loads(raw), None, key)
        except (ValueError, KeyError, TypeError, AttributeError):
            # Unreadable content counts as held until Redis expires the key.
            return Reservation(None, instance, -1, "?", now, key=key)

    def live_reservations(
        self,
        instance: str,
        running_ids: set[str] | None = None,
        observed_at: float | None = None,
    ) -> list[Reservation]:
        """Live reservations of ``instance``; dead ones are deleted on the way."""
        index = self.index_key(instance)
        with redis_errors(self.where):
            now = self.clock()
            tokens = sorted(as_text(t) for t in self.client.smembers(index))
            if not tokens:
                return []
            keys = [self.slot_key(instance, t) for t in tokens]
            values = self.client.mget(keys)
            live: list[Reservation] = []
            expired: list[str] = []
            for token, key, raw in zip(tokens, keys, values, strict=True):
                if raw is None:
                    expired.append(token)  # Redis expired it (or it was released)
                    continue
                res = self._decode(as_text(raw), key, instance, now)
                if self.is_live(res, running_ids, now, observed_at):
                    live.append(res)
                else:
                    self._delete_if_unchanged(keys=[key, index], args=[raw, token])
            if expired:
                self.client.srem(index, *expired)
        return live

    def _store(self, res: Reservation, *, guarded: bool = True) -> None:
        """Store ``res`` (PX slot_ttl_seconds: Redis expires it) and index it.

        While this gate holds the instance's lock and ``guarded``, the write happens only if
        the lock is still ours, in one script; otherwise LockLostError, nothing written.
        """
        ttl_ms = max(1, int(self.cfg.slot_ttl_seconds * 1000))
        token = self._token_of(res.instance) if guarded else ""
        lock_key = self._key("lock", res.instance)
        fenced = guarded and self.fence is not None
        fence = self.fence if fenced and self.fence is not None else Fence(lock_key, "")
        with redis_errors(self.where):
            # Every key expires within ttl of its last write, so the index outlives them all.
            keys = [lock_key, res.key, self.index_key(res.instance), fence.key]
            flag, body = "1" if fenced else "0", json.dumps(res.to_json())
            args: list[str | int] = [token, body, ttl_ms, _token(res), flag, fence.token]
            done = self._write_if_owner(keys=keys, args=args)
        if done == -1:
            raise self._fence_lost(res.instance)
        if not done:
            self._lost.add(res.instance)
            raise LockLostError(
                f"{res.instance}: the dispatch lock (redis {self.where}) stopped being this "
                "process's before its reservation could be written"
            )

    def _place(self, res: Reservation, token: str) -> Reservation:
        return replace(res, key=self.slot_key(res.instance, token))

    def release(self, res: Reservation) -> None:
        """Give the slot back at once (failure paths); if Redis is away, the TTL frees it."""
        try:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(res.key)
                pipe.srem(self.index_key(res.instance), _token(res))
                pipe.execute()
        except RedisError as exc:
            # Raising here would hide the failure that made the caller release.
            self.warnings.append(
                f"could not release the reservation on {res.instance} "
                f"({reason(exc, self.where)}); it lapses within "
                f"{self.cfg.slot_ttl_seconds:g}s"
            )


def _token(res: Reservation) -> str:
    return res.key.rsplit(":", 1)[1]
