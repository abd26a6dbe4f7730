"""The stores the config names: files on this host, or Redis shared by every host.

``Stores`` is the one factory. ``lock.backend`` chooses the gate, ``pool.backend`` the task
pool, ``models.state_backend`` the model state; with the HA lease the rounds' memory of last
runs is in Redis too. A context (a command, a patrol daemon, an MCP call, the page) has one
``Stores`` and closes it at its end: what the stores open (one Redis client, a connection pool
every Redis store of the context shares) is closed with it (an ``ExitStack``). Apart from both
backends so neither imports the other; Redis is imported only when asked for.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from xaf_hub.config.load import Config
from xaf_hub.core.clock import resolve_timezone
from xaf_hub.errors import HubError
from xaf_hub.store.backlog import Backlog
from xaf_hub.store.fence import Fence
from xaf_hub.store.gate import FileGate, Gate, host_name
from xaf_hub.store.pool import TaskPool, utc_now

if TYPE_CHECKING:
    from xaf_hub.store.model_state import ModelState
    from xaf_hub.store.patrol_state import RunMemory


def shares_decisions(cfg: Config) -> bool:
    """Whether people's interrupts are kept in Redis too: with the gate or the pool there,
    a patrol on another host acts on this host's sessions."""
    return "redis" in (cfg.lock.backend, cfg.pool.backend)


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


class Stores:
    """Every store of one context, built here from the config; closed with the context.

    Store objects are light and made per use (a gate or a pool keeps per-object state, such as
    the locks it holds, that threads must not share); what is costly to open is opened once:
    the Redis client, whose connection pool is thread-safe, serves every Redis store of the
    context and is closed by ``close`` (or the ``with`` block's end). Using a closed
    ``Stores`` opens a new client (and it is closed at the next ``close``).
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._stack = contextlib.ExitStack()
        self._open = threading.Lock()
        self._client: Any = None

    def __enter__(self) -> Stores:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close what the stores opened (the Redis client); safe to call more than once."""
        with self._open:
            self._client = None
            stack, self._stack = self._stack, contextlib.ExitStack()
        stack.close()

    def redis(self) -> Any:
        """The context's one Redis client for ``lock.redis_url`` (connected on first use)."""
        with self._open:
            if self._client is None:
                # deferred: the redis extra loads only when configured, see docs/performance.md
                from xaf_hub.store.redis.client import connect

                client = connect(self.cfg.lock)
                self._stack.callback(client.close)
                self._client = client
            return self._client

    def gate(self, fence: Fence | None = None) -> Gate:
        """The gate ``lock.backend`` asks for: slot files here, or Redis shared by every host.

        ``fence`` (an HA patrol daemon's lease) guards the Redis gate's reservations; files
        hold on one host, where no second daemon competes.
        """
        cfg = self.cfg
        if cfg.lock.backend == "redis":
            # deferred: the redis extra loads only when configured, see docs/performance.md
            from xaf_hub.store.redis.gate import RedisGate

            return RedisGate(cfg.lock, self.redis(), fence=fence)
        return FileGate(cfg.lock_dir, cfg.lock)

    def model_state(self, fence: Fence | None = None) -> ModelState:
        """The model state ``models.state_backend`` asks for (blackouts, healed failures): the
        file here, or Redis for every host. ``fence`` guards Redis writes."""
        cfg = self.cfg
        policy = (
            cfg.models.blackout_reset_hour,
            resolve_timezone(cfg.models.timezone),
            cfg.models.families(),
        )
        timeout = cfg.lock.lock_timeout_seconds
        if cfg.models.state_backend == "redis":
            # deferred: the redis extra loads only when configured, see docs/performance.md
            from xaf_hub.store.redis.model_state import RedisModelState

            return RedisModelState(
                self.redis(), cfg.lock.redis_prefix, *policy, lock_timeout=timeout, fence=fence
            )
        # deferred: `status` reads no model state, see docs/performance.md
        from xaf_hub.store.model_state import MODEL_STATE_FILE, FileModelState

        return FileModelState(cfg.state_dir / MODEL_STATE_FILE, *policy, lock_timeout=timeout)

    def pool(
        self, clock: Callable[[], datetime] | None = None, fence: Fence | None = None
    ) -> TaskPool:
        """The task pool ``pool.backend`` asks for: the file here, or Redis keys for every hub."""
        cfg = self.cfg
        timeout = cfg.lock.lock_timeout_seconds
        now = clock or utc_now
        if cfg.pool.backend == "redis":
            # deferred: the redis extra loads only when configured, see docs/performance.md
            from xaf_hub.store.redis.pool import RedisBacklog

            return RedisBacklog(
                self.redis(), cfg.lock.redis_prefix, timeout, clock=now, fence=fence
            )
        return Backlog(cfg.backlog_path, timeout, clock=now)

    def run_memory(self, folder: Path, fence: Fence | None = None) -> RunMemory:
        """The rounds' memory of last runs: ``folder``'s file, or Redis when daemons share the
        rounds (``uses_lease``: the active daemon may be on another host next round).

        StateFileError when damaged; UnreachableError when Redis cannot be asked.
        """
        if uses_lease(self.cfg):
            # deferred: the redis extra loads only when configured, see docs/performance.md
            from xaf_hub.store.redis.runs import RedisRunMemory

            return RedisRunMemory.open(self.redis(), self.cfg.lock.redis_prefix, fence)
        # deferred: `status` reads no run memory, see docs/performance.md
        from xaf_hub.store.patrol_state import RunMemory

        return RunMemory.load(folder)

    def record_interrupt(
        self, instance: str, session: str, at: float, who: Mapping[str, str],
        kind: str = "interrupted",
    ) -> None:
        """Keep a stop no patrol may undo (a person's interrupt; ``kind`` "ceiling": the run
        ceiling's) where every host's patrol reads it (nothing without Redis).
        UnreachableError when Redis cannot be reached: the audit line here holds."""
        if not shares_decisions(self.cfg):
            return
        # deferred: the redis extra loads only when configured, see docs/performance.md
        from xaf_hub.store.redis.interrupts import record_interrupt

        record_interrupt(
            self.redis(), self.cfg.lock.redis_prefix, (instance, session), at, who, kind
        )

    def interrupts(self) -> dict[tuple[str, str], tuple[float, object, str]]:
        """Those stops made on any host, (at, who, kind) ({} without Redis); UnreachableError
        when Redis cannot be asked (the caller must not act as if there were none)."""
        if not shares_decisions(self.cfg):
            return {}
        # deferred: the redis extra loads only when configured, see docs/performance.md
        from xaf_hub.store.redis.interrupts import read_interrupts

        return read_interrupts(self.redis(), self.cfg.lock.redis_prefix)

    def event_claimer(self) -> Callable[[str], bool] | None:
        """With the HA lease, a function that lets one hub only queue each notification event
        (``store.redis.seen``); None when one host runs the patrol (its outbox is enough)."""
        if not uses_lease(self.cfg):
            return None
        # deferred: the redis extra loads only when configured, see docs/performance.md
        from xaf_hub.store.redis.seen import claimer

        return claimer(self.redis(), self.cfg.lock.redis_prefix)

    def publish_board(self, writer: str, text: str, summary: str) -> None:
        """Put a live board and its summary where the other hosts read them: Redis when the
        stores are there (``shares_decisions``); nothing otherwise (the state folder's files
        are the board)."""
        if shares_decisions(self.cfg):
            # deferred: the redis extra loads only when configured, see docs/performance.md
            from xaf_hub.store.redis.board import publish

            publish(self.redis(), self.cfg.lock.redis_prefix, writer, host_name(), text,
                    summary)

    def live_boards(self, summary: bool = False) -> list[str]:
        """The live boards every host put in Redis (``summary``: their summaries, and the
        whole board of a writer that put none; [] when the stores are files)."""
        if not shares_decisions(self.cfg):
            return []
        # deferred: the redis extra loads only when configured, see docs/performance.md
        from xaf_hub.store.redis.board import boards

        return boards(self.redis(), self.cfg.lock.redis_prefix, summary)

    def lease_status(self, now_ms: int) -> LeaseStatus | None:
        """The HA lease as Redis has it now, or None when the config uses no lease.

        A daemon that still says "active" without holding the lease, or a standby that
        stopped beating for three lease times, is "silent" (dead or cut off). Redis
        unreachable: no active host, no daemons, and ``lease_error`` says why.
        """
        cfg = self.cfg
        if not uses_lease(cfg):
            return None
        # deferred: the redis extra loads only when configured, see docs/performance.md
        from xaf_hub.store.redis.lease import host_of, known_daemons, lease_token, member_of

        try:
            client = self.redis()
            token = lease_token(client, cfg.lock.redis_prefix)
            daemons = known_daemons(client, cfg.lock.redis_prefix, now_ms)
        except HubError as exc:
            return {"active_host": None, "daemons": [], "lease_error": str(exc)}
        holder = member_of(token) if token else None
        silent_ms = 3 * cfg.patrol.lease_seconds * 1000
        rows: list[DaemonRow] = []
        for d in daemons:
            role = str(d.get("role") or "")
            if d.get("member") == holder:
                role = "active"
            elif role == "active" or (role == "standby" and now_ms - d["heartbeat_ms"] > silent_ms):
                role = "silent"  # its lease is gone, or it stopped beating: dead or cut off
            beat = d.get("heartbeat")
            rows.append(DaemonRow(host=d.get("host"), pid=d.get("pid"), role=role, heartbeat=beat))
        return {"active_host": host_of(token) if token else None, "daemons": rows}
