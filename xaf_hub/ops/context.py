"""The context every operation runs in, for commands and patrol jobs alike.

``OpsContext`` is built once per command run or patrol run: config, clock, env, the
transport seam (tests inject loopback transports), a log-line sink and a "stop requested"
probe. Stores (gate, task pool, model state) and clients are made from it on demand, so an
operation never reaches for a global; it owns what they open (``store.backends.Stores``) and
closes it at its end (``close``, or ``with``); a command's context shares the command's
``Stores``. ``Fleet`` is one scan of the fleet as operations use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.records import SessionRecord, Snapshot
from xaf_hub.core.text import redact
from xaf_hub.errors import UnreachableError
from xaf_hub.fleet.client import OpencodeClient
from xaf_hub.fleet.scan import InstanceScan, TransportFactory, make_client, scan_fleet
from xaf_hub.store import audit as audit_log
from xaf_hub.store.backends import Stores
from xaf_hub.store.fence import Fence
from xaf_hub.store.pool import TaskPool
from xaf_hub.store.tasks import Task, of_project

if TYPE_CHECKING:  # `status` reads the pool through this context: the rest loads on use
    from xaf_hub.store.gate import Gate
    from xaf_hub.store.model_state import ModelState


def utc_now() -> datetime:
    """The default patrol clock: an aware UTC datetime."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class OpsContext:
    """An operation's inputs and I/O seams; operations and patrol jobs take it first."""

    cfg: Config
    clock: Callable[[], datetime] = utc_now
    env: Mapping[str, str] = field(default_factory=dict)
    transport_factory: TransportFactory | None = None
    log: Callable[[str], None] = lambda line: None
    stop_requested: Callable[[], bool] = lambda: False
    # The HA patrol daemon's lease at this moment: the Redis stores write only while it holds.
    fence: Callable[[], Fence | None] = lambda: None
    # The stores of the run this context belongs to (a command's, shared with it); None: its own.
    shared: Stores | None = field(default=None, repr=False, compare=False)
    # What the context's stores open (one Redis client), closed with the context.
    stores: Stores = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stores", self.shared or Stores(self.cfg))

    def __enter__(self) -> OpsContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close what the context's stores opened (safe to call more than once)."""
        self.stores.close()

    def but(self, **changes: Any) -> OpsContext:
        """This context with ``changes`` (another stop probe, a fence), sharing its stores:
        what either opens is closed with this one."""
        return replace(self, shared=self.stores, **changes)

    def now(self) -> datetime:
        """The current time from the injected clock (aware)."""
        return self.clock()

    @property
    def repo_root(self) -> Path:
        """patrol.repo_root, else the config file's folder."""
        if self.cfg.patrol.repo_root is not None:
            return self.cfg.patrol.repo_root
        return self.cfg.path.parent if self.cfg.path is not None else Path.cwd()

    @property
    def patrol_dir(self) -> Path:
        """Where the patrol keeps its reports, pause flag and locks."""
        return self.cfg.state_dir / "patrol"

    def backlog(self) -> TaskPool:
        """The task pool store ``pool.backend`` names (the file, or Redis)."""
        return self.stores.pool(self.clock, self.fence())

    def own(self, tasks: Iterable[Task]) -> list[Task]:
        """The tasks of the chosen project (every task when one project is configured)."""
        return of_project(tasks, self.cfg.project_name, [p.name for p in self.cfg.projects])

    def model_state(self) -> ModelState:
        """The blackout / healed-failure store."""
        return self.stores.model_state(self.fence())

    def gate(self) -> Gate:
        """The dispatch gate (locks and reservations)."""
        return self.stores.gate(self.fence())

    def client(self, inst: InstanceConfig) -> OpencodeClient:
        """A fresh client for ``inst``; use it as ``async with``."""
        return make_client(self.cfg, inst, self.transport_factory)

    def redact(self, text: str) -> str:
        """``text`` with every configured secret replaced."""
        return redact(text, self.cfg.secrets())

    def audit(self, command: str, **fields: Any) -> None:
        """Append one audit line for a write the patrol made: ``store.audit.append``'s
        ``fields`` (instance, session, result, reason, extra), every secret kept out."""
        audit_log.append(
            self.cfg.state_dir, command=command, env=self.env, secrets=self.cfg.secrets(), **fields
        )

    @contextlib.asynccontextmanager
    async def audited(
        self, command: str, *, instance: str, session: str,
        extra: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[None]:
        """Audit a failure of what runs inside (result "failed", its reason), and raise it on;
        the line is written off the event loop."""
        try:
            yield
        except Exception as exc:
            await aio.blocking(self.audit, command, instance=instance, session=session,
                               result="failed", reason=str(exc), extra=extra)
            raise

    async def scan_named(self, instance: str | None = None) -> tuple[Snapshot, list[InstanceScan]]:
        """Scan ``instance`` (its name), or every instance when None; nothing raised for one
        that did not answer (its scan says why)."""
        targets = [self.cfg.instance(instance)] if instance else list(self.cfg.instances)
        return await scan_fleet(self.cfg, targets, transport_factory=self.transport_factory)

    async def scan(self) -> Fleet:
        """Scan every instance; UnreachableError when instances exist and none answered.

        Run state is asked for project directories only (the patrol acts on nothing else),
        so sessions outside the project always look idle here.
        """
        _, scans = await scan_fleet(
            self.cfg, transport_factory=self.transport_factory, project_only=True
        )
        fleet = Fleet(scans)
        if scans and not fleet.reachable:
            reasons = "; ".join(f"{s.inst.name}: {s.reason}" for s in scans)
            raise UnreachableError.fleet_down(reasons)
        return fleet


@dataclass(frozen=True)
class Fleet:
    """One scan of the fleet, as the jobs use it."""

    scans: Sequence[InstanceScan]

    @property
    def reachable(self) -> list[InstanceScan]:
        """Instances that answered."""
        return [s for s in self.scans if s.reachable]

    def work_sessions(self) -> list[tuple[InstanceConfig, SessionRecord]]:
        """Project sessions that are not sub-agent children (their parent owns them)."""
        return [(sc.inst, s) for sc in self.reachable for s in sc.sessions
                if s.project and not s.parent_id]

    def seen_as(self, cfg: Config) -> Fleet:
        """This scan of every project (``Config.every_project``) as ``cfg``'s project sees it:
        each instance its project's, each session the project's when its folders hold it."""
        if len(cfg.projects) < 2:
            return self
        insts = {i.name: i for i in cfg.instances}
        return Fleet([sc.seen_by(insts[sc.inst.name]) for sc in self.scans])

    def scan_of(self, instance: str) -> InstanceScan | None:
        """The scan of one instance by name."""
        return next((s for s in self.scans if s.inst.name == instance), None)
