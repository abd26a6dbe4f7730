"""The stores the config names: files on this host, or Redis shared by every host.

``lock.backend`` chooses the gate, ``pool.backend`` the task pool, ``models.state_backend`` the
model state; with the HA lease the rounds'
memory of last runs is in Redis too. Apart from both backends so neither imports the other;
Redis is imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

from xaf_hub.config.load import Config
from xaf_hub.store.backlog import Backlog, TaskPool, _utc_now
from xaf_hub.store.fence import Fence
from xaf_hub.store.gate import FileGate, Gate

if TYPE_CHECKING:
    from xaf_hub.store.model_state import ModelState
    from xaf_hub.store.patrol_state import RunMemory


def make_gate(cfg: Config, fence: Fence | None = None) -> Gate:
    """The gate ``lock.backend`` asks for: slot files here, or Redis shared by every host.

    ``fence`` (an HA patrol daemon's lease) guards the Redis gate's reservations; files hold on
    one host, where no second daemon competes.
    """
    if cfg.lock.backend == "redis":
        from xaf_hub.store.redis.client import connect
        from xaf_hub.store.redis.gate import RedisGate

        return RedisGate(cfg.lock, connect(cfg.lock), fence=fence)
    return FileGate(cfg.lock_dir, cfg.lock)


def make_model_state(cfg: Config, fence: Fence | None = None) -> ModelState:
    """The model state ``models.state_backend`` asks for (blackouts, healed failures): the file
    here, or Redis for every host. ``fence`` (an HA patrol daemon's lease) guards Redis writes.
    """
    from xaf_hub.core.clock import resolve_timezone
    from xaf_hub.store.model_state import FileModelState

    policy = (
        cfg.models.blackout_reset_hour,
        resolve_timezone(cfg.models.timezone),
        cfg.models.families(),
    )
    if cfg.models.state_backend == "redis":
        from xaf_hub.store.redis.client import connect
        from xaf_hub.store.redis.model_state import RedisModelState

        return RedisModelState(
            connect(cfg.lock),
            cfg.lock.redis_prefix,
            *policy,
            lock_timeout=cfg.lock.lock_timeout_seconds,
            fence=fence,
        )
    return FileModelState(
        cfg.state_dir / ".model_state.json", *policy, lock_timeout=cfg.lock.lock_timeout_seconds
    )


def make_pool(
    cfg: Config, clock: Callable[[], datetime] | None = None, fence: Fence | None = None
) -> TaskPool:
    """The task pool ``pool.backend`` asks for: the file here, or Redis keys for every hub."""
    timeout = cfg.lock.lock_timeout_seconds
    now = clock or _utc_now
    if cfg.pool.backend == "redis":
        from xaf_hub.store.redis.client import connect
        from xaf_hub.store.redis.pool import RedisBacklog

        return RedisBacklog(
            connect(cfg.lock), cfg.lock.redis_prefix, timeout, clock=now, fence=fence
        )
    return Backlog(cfg.backlog_path, timeout, clock=now)


def load_run_memory(cfg: Config, folder: Path, fence: Fence | None = None) -> RunMemory:
    """The rounds' memory of last runs: ``folder``'s file, or Redis when daemons share the
    rounds (``uses_lease``: the active daemon may be on another host next round).

    StateFileError when damaged; UnreachableError when Redis cannot be asked.
    """
    if uses_lease(cfg):
        from xaf_hub.store.redis.client import connect
        from xaf_hub.store.redis.runs import RedisRunMemory

        return RedisRunMemory.open(connect(cfg.lock), cfg.lock.redis_prefix, fence)
    from xaf_hub.store.patrol_state import RunMemory  # status and sessions never load it

    return RunMemory.load(folder)


def shares_decisions(cfg: Config) -> bool:
    """Whether people's interrupts are kept in Redis too: with the gate or the pool there,
    a patrol on another host acts on this host's sessions."""
    return "redis" in (cfg.lock.backend, cfg.pool.backend)


def record_shared_interrupt(
    cfg: Config, instance: str, session: str, at: float, who: Mapping[str, str]
) -> None:
    """Keep a person's interrupt where every host's patrol reads it (nothing without Redis).

    UnreachableError when Redis cannot be reached: the audit line on this host still holds.
    """
    if not shares_decisions(cfg):
        return
    from xaf_hub.store.redis.client import connect
    from xaf_hub.store.redis.interrupts import record_interrupt

    client = connect(cfg.lock)
    try:
        record_interrupt(client, cfg.lock.redis_prefix, (instance, session), at, who)
    finally:
        client.close()


def shared_interrupts(cfg: Config) -> dict[tuple[str, str], tuple[float, object]]:
    """People's interrupts made on any host ({} without Redis); UnreachableError when Redis
    cannot be asked (the caller must not act as if there were none)."""
    if not shares_decisions(cfg):
        return {}
    from xaf_hub.store.redis.client import connect
    from xaf_hub.store.redis.interrupts import read_interrupts

    client = connect(cfg.lock)
    try:
        return read_interrupts(client, cfg.lock.redis_prefix)
    finally:
        client.close()


def event_claimer(cfg: Config) -> Callable[[str], bool] | None:
    """With the HA lease, a function that lets one hub only queue each notification event
    (``store.redis.seen``); None when one host runs the patrol (its outbox is enough)."""
    if not uses_lease(cfg):
        return None
    from xaf_hub.store.redis.client import connect
    from xaf_hub.store.redis.seen import claimer

    return claimer(connect(cfg.lock), cfg.lock.redis_prefix)


class DaemonRow(TypedDict):
    """One known patrol daemon as ``patrol status`` and the page show it."""

    host: object
    pid: object
    role: str  # "active", "standby", "silent" (lease gone or no beat) or "stopped"
    heartbeat: object


class LeaseStatus(TypedDict):
    """Who holds the HA patrol lease: the active host (None: nobody), every known daemon."""

    active_host: str | None
    daemons: list[DaemonRow]
    lease_error: NotRequired[str]  # Redis could not be asked (no secrets: host:port/db)


def uses_lease(cfg: Config) -> bool:
    """Whether patrol daemons compete for the HA lease: the gate or the pool in Redis."""
    return "redis" in (cfg.lock.backend, cfg.pool.backend) and cfg.patrol.lease_seconds > 0


def lease_status(cfg: Config, now_ms: int) -> LeaseStatus | None:
    """The HA lease as Redis has it now, or None when the config uses no lease.

    A daemon that still says "active" without holding the lease, or a standby that stopped
    beating for three lease times, is "silent" (dead or cut off). Redis unreachable: no
    active host, no daemons, and ``lease_error`` says why.
    """
    if not uses_lease(cfg):
        return None
    from xaf_hub.errors import HubError
    from xaf_hub.store.redis.client import connect
    from xaf_hub.store.redis.lease import host_of, known_daemons, lease_token, member_of

    client = connect(cfg.lock)
    try:
        token = lease_token(client, cfg.lock.redis_prefix)
        daemons = known_daemons(client, cfg.lock.redis_prefix, now_ms)
    except HubError as exc:
        return {"active_host": None, "daemons": [], "lease_error": str(exc)}
    finally:
        client.close()
    holder = member_of(token) if token else None
    silent_ms = 3 * cfg.patrol.lease_seconds * 1000
    rows: list[DaemonRow] = []
    for d in daemons:
        role = str(d.get("role") or "")
        if d.get("member") == holder:
            role = "active"
        elif role == "active" or (role == "standby" and now_ms - d["heartbeat_ms"] > silent_ms):
            role = "silent"  # its lease is gone, or it stopped beating: dead or cut off
        rows.append(
            {
                "host": d.get("host"),
                "pid": d.get("pid"),
                "role": role,
                "heartbeat": d.get("heartbeat"),
            }
        )
    return {"active_host": host_of(token) if token else None, "daemons": rows}
