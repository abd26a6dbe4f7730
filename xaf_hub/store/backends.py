"""The store ``lock.backend`` names: slot files on this host, or Redis shared by every host.

Apart from both backends so neither imports the other; Redis is imported only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xaf_hub.config.load import Config
from xaf_hub.store.gate import Gate

if TYPE_CHECKING:
    from xaf_hub.store.redis_backend import RedisGate


def make_gate(cfg: Config) -> Gate | RedisGate:
    """The gate ``lock.backend`` asks for: slot files here, or Redis shared by every host."""
    if cfg.lock.backend == "redis":
        from xaf_hub.store.redis_backend import RedisGate, connect

        return RedisGate(cfg.lock, connect(cfg.lock))
    return Gate(cfg.lock_dir, cfg.lock)
