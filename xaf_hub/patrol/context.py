"""What every patrol job shares: the injected context, the cycle's record, the last-run view.

* ``PatrolContext`` — built once per run: config, clock, env, transport seam, a log line sink
  and a "stop requested" probe. Stores (gate, task pool, model state) and clients are made
  from it on demand, so a job never reaches for a global.
* ``Cycle`` — what one cycle did, filled in by the jobs in order and read by the report: step
  outcomes, actions (heals, resumes, dispatches, pool changes), session classes, errors, and
  which sessions were already prompted this cycle (so a later job leaves them alone).
* ``LastRun`` / ``last_run`` — the newest message of a session, read as plain data (pure).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from xaf_hub import audit as audit_log
from xaf_hub.backlog import Backlog
from xaf_hub.client import OpencodeClient
from xaf_hub.config import Config, InstanceConfig
from xaf_hub.errors import HubError, StateFileError, UnreachableError
from xaf_hub.gate import Gate, make_gate
from xaf_hub.model_state import ModelState
from xaf_hub.outcome import outcome_of
from xaf_hub.output import redact
from xaf_hub.records import SessionRecord
from xaf_hub.scan import InstanceScan, TransportFactory, make_client, scan_fleet

# Only the newest message decides the last run; messages can be large, so read just that one.
MESSAGE_WINDOW = 1
# Concurrent message reads per cycle step (the server answers each in a few ms).
_MESSAGE_FAN_OUT = 8


def utc_now() -> datetime:
    """The default patrol clock: an aware UTC datetime."""
    return datetime.now(UTC)


def _silent(line: str) -> None:
    return None


def _never() -> bool:
    return False


@dataclass(frozen=True)
class PatrolContext:
    """The patrol's inputs and I/O seams; jobs take it as their first argument."""

    cfg: Config
    clock: Callable[[], datetime] = utc_now
    env: Mapping[str, str] = field(default_factory=dict)
    transport_factory: TransportFactory | None = None
    log: Callable[[str], None] = _silent
    stop_requested: Callable[[], bool] = _never

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

    def backlog(self) -> Backlog:
        """The task pool store."""
        return Backlog(
            self.cfg.backlog_path, lock_timeout=self.cfg.lock.lock_timeout_seconds, clock=self.clock
        )

    def model_state(self) -> ModelState:
        """The blackout / healed-failure store."""
        from xaf_hub.dispatcher import model_state

        return model_state(self.cfg)

    def gate(self) -> Gate:
        """The dispatch gate (locks and reservations)."""
        return make_gate(self.cfg)

    def client(self, inst: InstanceConfig) -> OpencodeClient:
        """A fresh client for ``inst``; use it as ``async with``."""
        transport = self.transport_factory(inst) if self.transport_factory else None
        return make_client(self.cfg, inst, transport)

    def redact(self, text: str) -> str:
        """``text`` with every configured secret replaced."""
        return redact(text, self.cfg.secrets())

    def audit(
        self,
        command: str,
        *,
        instance: str = "",
        session: str = "",
        result: str = "ok",
        reason: str = "",
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Append one audit line for a write the patrol made."""
        audit_log.append(
            self.cfg.state_dir,
            command=command,
            instance=instance,
            session=session,
            result=result,
            reason=self.redact(reason),
            env=self.env,
            extra=extra,
        )

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
            raise UnreachableError("fleet", f"no instance answered ({reasons})")
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
        return [
            (sc.inst, s)
            for sc in self.reachable
            for s in sc.sessions
            if s.project and not s.parent_id
        ]

    def scan_of(self, instance: str) -> InstanceScan | None:
        """The scan of one instance by name."""
        return next((s for s in self.scans if s.inst.name == instance), None)


# ---------------------------------------------------------------------------------------------
# The last run of a session (pure)


@dataclass(frozen=True)
class LastRun:
    """What a session's newest message says.

    ``outcome`` is ``outcome_of``'s word for an assistant message (succeeded, failed:<name>,
    rate_limited, failed:model_unavailable, aborted, running = never completed), ``pending``
    when the newest message is a prompt with no answer yet, ``none`` without messages.
    """

    outcome: str
    message_id: str = ""
    model: str = ""
    error: Mapping[str, Any] | None = None
    created_ms: int = 0


def _info(message: Mapping[str, Any]) -> Mapping[str, Any]:
    info = message.get("info")
    return info if isinstance(info, Mapping) else message


def _model_of(info: Mapping[str, Any]) -> str:
    provider, model = info.get("providerID"), info.get("modelID")
    if not (provider and model):
        ref = info.get("model")
        if isinstance(ref, Mapping):
            provider, model = ref.get("providerID"), ref.get("modelID") or ref.get("id")
    return f"{provider}/{model}" if provider and model else ""


def last_run(messages: Sequence[Mapping[str, Any]]) -> LastRun:
    """Read the newest message (``messages`` oldest first, as the server returns them)."""
    if not messages:
        return LastRun("none")
    info = _info(messages[-1])
    times = info.get("time")
    created = int((times.get("created") if isinstance(times, Mapping) else 0) or 0)
    message_id, model = str(info.get("id") or ""), _model_of(info)
    if info.get("role") != "assistant":
        # A prompt nobody answered yet: just sent, or refused before any reply (unknown model).
        return LastRun("pending", message_id, model, None, created)
    err = info.get("error")
    return LastRun(
        outcome_of([messages[-1]]),
        message_id,
        model,
        err if isinstance(err, Mapping) else None,
        created,
    )


# ---------------------------------------------------------------------------------------------
# The cycle's record


@dataclass(frozen=True)
class StepOutcome:
    """How one job ended: ok, failed (with its exit code), skipped or not run."""

    name: str
    status: str
    code: int = 0
    error: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class Action:
    """One thing a job did or decided not to do, for the report."""

    step: str
    kind: str  # heal | resume | add | dispatch | done | requeue | blocked | keep
    result: str  # ok | waiting | skipped | failed
    instance: str = ""
    session: str = ""
    task: str = ""
    title: str = ""
    detail: str = ""
    model: str = ""
    from_model: str = ""


def session_action(step: str, kind: str, result: str, rec: SessionRecord, **fields: str) -> Action:
    """An Action about one session (instance, id and title taken from the record)."""
    return Action(step, kind, result, rec.instance, rec.id, title=rec.title, **fields)


@dataclass(frozen=True)
class SessionLine:
    """One project session as check_agents classified it."""

    instance: str
    session: str
    title: str
    state: str  # running | stale_busy | finished | failed | interrupted | idle
    detail: str
    model: str
    updated_ms: int


@dataclass(frozen=True)
class InstanceLine:
    """One instance's load as the patrol last saw it."""

    name: str
    reachable: bool
    reason: str
    running_project: int
    reserved: int
    limit: int
    production: bool


@dataclass
class Cycle:
    """What one cycle did so far; the jobs append, the report reads."""

    started: datetime
    finished: datetime | None = None
    steps: list[StepOutcome] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    sessions: list[SessionLine] = field(default_factory=list)
    instances: list[InstanceLine] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # (instance, session) prompted this cycle: a later job must not judge or prompt them again.
    touched: set[tuple[str, str]] = field(default_factory=set)
    # (instance, session) whose heal or resume waits for a free slot (tried again next cycle).
    deferred: set[tuple[str, str]] = field(default_factory=set)
    _runs: dict[tuple[str, str, int], LastRun] = field(default_factory=dict, repr=False)

    def add(self, pctx: PatrolContext, action: Action) -> None:
        """Record an action and log it as one line."""
        self.actions.append(action)
        where = "/".join(p for p in (action.instance, action.session) if p)
        what = " ".join(p for p in (action.task, where) if p)
        pctx.log(
            pctx.redact(
                f"{action.step}: {action.kind} {what}: {action.result}"
                + (f" - {action.detail}" if action.detail else "")
            )
        )

    def error(self, pctx: PatrolContext, step: str, text: str) -> None:
        """Record a non-fatal error of one item (the job goes on with the others)."""
        line = pctx.redact(f"{step}: {text}")
        self.errors.append(line)
        pctx.log(f"error: {line}")

    def note_instances(self, pctx: PatrolContext, fleet: Fleet) -> None:
        """Remember every instance's load from ``fleet`` for the report."""
        gate = pctx.gate()
        lines = []
        for sc in fleet.scans:
            running = {s.id for s in sc.sessions if s.running}
            reserved = len(gate.pending(sc.inst.name, running)) if sc.reachable else 0
            lines.append(
                InstanceLine(
                    sc.inst.name,
                    sc.reachable,
                    sc.reason,
                    sum(1 for s in sc.sessions if s.project and s.running),
                    reserved,
                    sc.inst.concurrency_limit,
                    sc.inst.production,
                )
            )
        self.instances = lines

    async def last_runs(
        self, pctx: PatrolContext, items: Sequence[tuple[InstanceConfig, SessionRecord]]
    ) -> dict[tuple[str, str], LastRun]:
        """The last run of each session; unreadable ones are left out.

        Cached per (instance, session, updated): a session that did not change since an
        earlier job of this cycle read it is not read again.
        """
        result: dict[tuple[str, str], LastRun] = {}
        wanted: dict[str, list[SessionRecord]] = {}
        insts: dict[str, InstanceConfig] = {}
        for inst, rec in items:
            cached = self._runs.get((inst.name, rec.id, rec.updated))
            if cached is not None and (inst.name, rec.id) not in self.touched:
                result[(inst.name, rec.id)] = cached
            else:
                wanted.setdefault(inst.name, []).append(rec)
                insts[inst.name] = inst
        sem = asyncio.Semaphore(_MESSAGE_FAN_OUT)

        async def per_instance(name: str, recs: list[SessionRecord]) -> None:
            async with pctx.client(insts[name]) as client:

                async def one(rec: SessionRecord) -> None:
                    async with sem:
                        try:
                            msgs = await client.messages(rec.id, limit=MESSAGE_WINDOW)
                        except HubError:
                            return  # gone or unreadable: judged as unknown
                    run = last_run(msgs)
                    self._runs[(name, rec.id, rec.updated)] = run
                    result[(name, rec.id)] = run

                await asyncio.gather(*(one(r) for r in recs))

        await asyncio.gather(*(per_instance(n, r) for n, r in wanted.items()))
        return result


def pool_discipline(pctx: PatrolContext, cycle: Cycle, step: str) -> str | None:
    """The task pool's discipline override; a corrupt pool is reported, never fatal here."""
    try:
        return pctx.backlog().load().discipline
    except StateFileError as exc:
        cycle.error(pctx, step, f"task pool unreadable, prompts use the default discipline: {exc}")
        return None
