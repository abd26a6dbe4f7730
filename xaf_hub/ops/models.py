"""Which model a piece of work runs on: the fleet's model state, chains and the choice.

Blackouts and healed failures live in one store (a file, or Redis when
``models.state_backend`` asks); ``choose_model`` applies the current blackouts to an
instance's chain. Every send path picks its model here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core.clock import resolve_timezone
from xaf_hub.store.fence import Fence
from xaf_hub.store.model_state import ModelState, family_of, resolve_dispatch_model


def model_state(cfg: Config, fence: Fence | None = None) -> ModelState:
    """The fleet's model state store (blackouts, healed failures): a file, or Redis if asked.

    ``fence`` (an HA patrol daemon's lease) guards the Redis store's writes.
    """
    policy = (
        cfg.models.blackout_reset_hour,
        resolve_timezone(cfg.models.timezone),
        cfg.models.families(),
    )
    if cfg.models.state_backend == "redis":
        from xaf_hub.store.redis_backend import RedisModelState, connect

        return RedisModelState(
            connect(cfg.lock),
            cfg.lock.redis_prefix,
            *policy,
            lock_timeout=cfg.lock.lock_timeout_seconds,
            fence=fence,
        )
    return ModelState(
        cfg.state_dir / ".model_state.json", *policy, lock_timeout=cfg.lock.lock_timeout_seconds
    )


def model_chain(cfg: Config, inst: InstanceConfig) -> tuple[str, ...]:
    """The instance's model chain, else the global one."""
    return inst.models or cfg.models.chain


def choose_model(
    cfg: Config, inst: InstanceConfig, explicit: str | None, now: datetime | None = None
) -> str | None:
    """resolve_dispatch_model for one instance with the current blackouts."""
    now = now or datetime.now(UTC)
    blacked = model_state(cfg).resting(now)
    return resolve_dispatch_model(
        explicit=explicit,
        chain=model_chain(cfg, inst),
        default_model=cfg.models.default_dispatch_model,
        blacked_out=blacked,
        families=cfg.models.families(),
    )


def untried_model(
    cfg: Config,
    inst: InstanceConfig,
    avoid: Sequence[str],
    now: datetime | None = None,
) -> str | None:
    """The first usable model of the instance's chain (then the default) not in ``avoid``.

    A task whose run failed by naming its model (provider 401, model unavailable) moves
    along the chain this way before its failure counts as infrastructure; None when every
    model was tried.
    """
    now = now or datetime.now(UTC)
    blacked = model_state(cfg).resting(now)
    families = cfg.models.families()
    for model in (*model_chain(cfg, inst), cfg.models.default_dispatch_model):
        if model and model not in avoid and not _blacked(model, blacked, families):
            return model
    return None


def _blacked(model: str, blacked: set[str], families: Mapping[str, Sequence[str]]) -> bool:
    family = family_of(model, families)
    return model in blacked or (family is not None and family in blacked)
