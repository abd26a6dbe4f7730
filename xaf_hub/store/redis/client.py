"""The one Redis client of the hub's shared stores, and what every Redis store says on failure.

Every Redis store (``gate``, ``model_state``, ``pool``, ``lease``, ``interrupts``, ``seen``,
``runs`` beside this module) takes a client from ``connect`` and wraps its calls in
``redis_errors``: a Redis failure becomes ``UnreachableError("redis", reason)`` (exit 2), and the
reason names the server (``describe``), never a password. Only ``store.backends`` (and
``doctor``'s ``probe``) import this folder, so the default file stores never load ``redis``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError, WatchError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from xaf_hub.config.credentials import REDIS_PASSWORD_ENV
from xaf_hub.config.load import LockConfig
from xaf_hub.errors import BusyError, ConfigError, UnreachableError
from xaf_hub.store.fence import Fence

__all__ = ["as_text", "busy", "connect", "describe", "probe", "reason", "redis_errors", "transact"]

T = TypeVar("T")

CONNECT_TIMEOUT_SECONDS = 5.0
SOCKET_TIMEOUT_SECONDS = 10.0
# How long a shared memory (interrupts, last runs) outlives its last write.
RETENTION_MS = 14 * 24 * 3600 * 1000


def connect(cfg: LockConfig) -> redis.Redis:
    """A client for ``lock.redis_url`` with the password from the env; connects on first use."""
    try:
        # One quick retry covers a dropped idle connection; a dead server fails in seconds.
        return redis.Redis.from_url(
            cfg.redis_url,
            password=cfg.redis_password,
            decode_responses=True,
            socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
            retry=Retry(NoBackoff(), 1),
        )
    except ValueError as exc:  # e.g. ?socket_timeout=abc in the URL
        raise ConfigError(f"lock.redis_url: {exc}") from None


def describe(client: redis.Redis) -> str:
    """host:port/db (or the socket path) of a client, for messages."""
    kw = client.connection_pool.connection_kwargs
    if kw.get("path"):
        return f"{kw['path']}/{kw.get('db', 0)}"
    return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


def probe(cfg: LockConfig) -> str:
    """Ping ``lock.redis_url``; return "redis <version> at <where>" or raise UnreachableError."""
    client = connect(cfg)
    where = describe(client)
    try:
        with redis_errors(where):
            client.ping()
        try:
            version = str(client.info("server").get("redis_version") or "?")
        except RedisError:  # an ACL may forbid INFO (@dangerous) to a user the gate works for
            version = "?"
    finally:
        client.close()
    return f"redis {version} at {where}"


def reason(exc: RedisError, where: str) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = text.lower()
    if isinstance(exc, AuthenticationError) or any(
        w in text for w in ("NOAUTH", "WRONGPASS", "without any password")
    ):
        return f"{where}: authentication failed (check {REDIS_PASSWORD_ENV})"
    if isinstance(exc, RedisTimeoutError) or "timed out" in lowered:
        return f"{where}: timed out"
    if isinstance(exc, RedisConnectionError):
        if "refused" in lowered:
            return f"{where}: connection refused (is redis-server running there?)"
        if "name or service not known" in lowered or "nodename nor servname" in lowered:
            return f"{where}: unknown host"
        return f"{where}: cannot connect ({text})"
    return f"{where}: {text}"


@contextlib.contextmanager
def fenced_write(
    client: redis.Redis, fence: Fence | None, what: str, outcome: str = "nothing was written"
) -> Iterator[Any]:
    """One transaction that writes only while ``fence`` holds the lease (None: always; then
    ``what`` names nothing): the writes queued on the pipeline it yields run at the end of the
    block, or none do (``Fence.lost``)."""
    with redis_errors(describe(client)), client.pipeline(transaction=True) as pipe:
        try:
            if fence is not None:
                fence.check(pipe, what)
                pipe.multi()
            yield pipe
            pipe.execute()
        except WatchError:
            assert fence is not None  # only the lease key is watched
            raise fence.lost(what, outcome) from None


def busy(what: str, where: str, seconds: float) -> BusyError:
    """The refusal of a change to ``what`` that other hubs' writes kept beating for ``seconds``."""
    return BusyError(f"could not update {what} in redis {where}: it kept changing for {seconds:g}s")


def transact(client: redis.Redis, step: Callable[[Any], T], what: str, timeout: float) -> T:
    """``step`` on a WATCH/MULTI pipeline, run again each time another hub wrote first (its
    EXEC raised WatchError), until it goes through; ``busy`` after ``timeout`` seconds."""
    deadline = time.monotonic() + max(timeout, 0.0)
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                return step(pipe)
            except WatchError:
                if time.monotonic() >= deadline:
                    raise busy(what, describe(client), timeout) from None
                pipe.reset()


@contextlib.contextmanager
def redis_errors(where: str) -> Iterator[None]:
    """Turn any Redis failure inside the block into UnreachableError("redis", reason)."""
    try:
        yield
    except RedisError as exc:  # a server that refuses (auth, read-only replica, OOM) too
        raise UnreachableError("redis", reason(exc, where)) from None


def as_text(value: bytes | str) -> str:
    """A reply as text (``decode_responses=True`` gives str; the types allow bytes)."""
    # decode_responses=True hands back str; the client's types also allow bytes.
    return value.decode("utf-8") if isinstance(value, bytes) else value
