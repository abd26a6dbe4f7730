"""The stores the config names: files on this host, or Redis shared by every host.

``lock.backend`` chooses the gate, ``pool.backend`` the task pool. Apart from both backends so
neither imports the other; Redis is imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from xaf_hub.config.load import Config
from xaf_hub.store.backlog import Backlog, TaskPool, _utc_now
from xaf_hub.store.fence import Fence
from xaf_hub.store.gate import Gate

if TYPE_CHECKING:
    from xaf_hub.store.redis_backend import RedisGate


def make_gate(cfg: Config, fence: Fence | None = None) -> Gate | RedisGate:
    """The gate ``lock.backend`` asks for: slot files here, or Redis shared by every host.

    ``fence`` (an HA patrol daemon's lease) guards the Redis gate's reservations; files hold on
    one host, where no second daemon competes.
    """
    if cfg.lock.backend == "redis":
        from xaf_hub.store.redis_backend import RedisGate, connect

        return RedisGate(cfg.lock, connect(cfg.lock), fence=fence)
    return Gate(cfg.lock_dir, cfg.lock)


def make_pool(
    cfg: Config, clock: Callable[[], datetime] | None = None, fence: Fence | None = None
) -> TaskPool:
    """The task pool ``pool.backend`` asks for: the file here, or one Redis key for every hub."""
    timeout = cfg.lock.lock_timeout_seconds
    now = clock or _utc_now
    if cfg.pool.backend == "redis":
        from xaf_hub.store.redis_backend import connect
        from xaf_hub.store.redis_pool import RedisBacklog

        return RedisBacklog(
            connect(cfg.lock), cfg.lock.redis_prefix, timeout, clock=now, fence=fence
        )
    return Backlog(cfg.backlog_path, timeout, clock=now)
