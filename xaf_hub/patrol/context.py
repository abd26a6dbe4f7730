"""What every patrol job shares besides the operations context: the cycle's record.

* ``Cycle`` — what one cycle did, filled in by the jobs in order and read by the report: step
  outcomes, actions (heals, resumes, dispatches, pool changes), session classes, errors, and
  which sessions were already prompted this cycle (so a later job leaves them alone).
* ``pool_discipline`` — the pool's discipline override, an unreadable pool reported.
* ``TIME_DECISIONS`` — the decisions that wait on time, not on a session changing: a round
  that skips a session's read (``Cycle.last_runs`` with the rounds' ``RunMemory``) still takes
  them, from the remembered last run.

Jobs take the operations context, ``xaf_hub.ops.context.OpsContext``, like every command.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.records import SessionRecord
from xaf_hub.core.runstate import LastRun, last_run
from xaf_hub.errors import HubError
from xaf_hub.ops.budget import BudgetLine, budget_lines
from xaf_hub.ops.context import Fleet, OpsContext
from xaf_hub.ops.load import instance_load
from xaf_hub.ops.send import pool_discipline as _pool_discipline
from xaf_hub.store.patrol_state import RunMemory

# Only the newest message decides the last run; messages can be large, so read just that one.
MESSAGE_WINDOW = 1
# Concurrent message reads per cycle step (the server answers each in a few ms).
_MESSAGE_FAN_OUT = 8

# A round reads a session's last run only when the scan shows its ``updated`` time or run
# state moved since the round that last read it, or it is running or retrying (architecture
# §8). The memory keeps the read's result (``LastRun``: outcome, message id, model, error,
# created time), never a decision; so each of these decisions, which wait on time passing
# rather than on the session changing, is taken again every round from the scan, the
# remembered last run, the stores and ``now``:
TIME_DECISIONS: tuple[str, ...] = (
    # fix_free_limit: a heal that found no usable model (its families blacked out) is tried
    # again once a blackout ends (``blackout_reset_hour``): run.error/model/message_id kept.
    "heal once a blackout ends",
    # fix_free_limit / check_agents: a heal or resume deferred for a free slot is tried again.
    "heal or resume waiting for a free slot",
    # fix_free_limit / check_agents: the 24-hour window, from the scan's ``updated``.
    "24-hour look-back window",
    # check_agents: busy with no update for patrol.stale_minutes (busy: never remembered).
    "stale busy session by age",
    # check_agents: a run that stopped without finishing is resumed once it is quiet for
    # RUN_START_GRACE_MS (quiet = now - updated; run.outcome kept).
    "resume after the run-start grace",
    # fill_slots.settle: a prompt unanswered past patrol.no_answer_grace_seconds, an
    # instance unreachable past stale_minutes, a task's back-off (not_before) ending.
    "settle: no-answer grace, unreachable too long, back-off due",
    # ops.decisions: an operator's interrupt after the run (audit log, read every round,
    # against run.created_ms, kept).
    "a person's interrupt after the run",
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
    state: str  # running | waiting | stale_busy | finished | failed | interrupted | idle
    detail: str
    model: str
    updated_ms: int
    # state "waiting": the request its run waits on, and how a person answers it
    request: str = ""
    answer: str = ""


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
    # Today's spend against the daily budgets as the last scan saw it: the project's line
    # first, then one per instance (ops.budget); the chat's budget notices read it.
    spend: list[BudgetLine] = field(default_factory=list)
    # Pool tasks fill_slots left pending because a daily budget was reached -> the refusal.
    budget_held: dict[str, str] = field(default_factory=dict)
    # What earlier rounds read (a round's, not a live reaction's); None: read every session.
    memory: RunMemory | None = field(default=None, repr=False)
    # (instance, session) whose last run a job asked for this cycle (the memory keeps these).
    asked: set[tuple[str, str]] = field(default_factory=set, repr=False)
    # How many last runs were read from the servers, and how many taken from the memory.
    reads: int = 0
    recalled: int = 0
    _runs: dict[tuple[str, str, int], LastRun] = field(default_factory=dict, repr=False)
    # Sessions whose run in ``_runs`` came from the memory (which keeps no answer).
    _recalled: set[tuple[str, str]] = field(default_factory=set, repr=False)
    _scan: tuple[Fleet, datetime, int] | None = field(default=None, repr=False)

    def _acted(self) -> int:
        """Grows with every prompt sent and every action that did or failed to do something."""
        return len(self.touched) + sum(1 for a in self.actions if a.result in ("ok", "failed"))

    async def scan(self, pctx: OpsContext) -> tuple[Fleet, datetime]:
        """The fleet for a job, and when it was scanned: a job reuses an earlier job's scan of
        this cycle while no job since has acted (prompted, healed, failed to), so an idle
        round scans once, like `status`; after an action the fleet is scanned again."""
        if self._scan is not None and self._scan[2] == self._acted():
            return self._scan[0], self._scan[1]
        at = pctx.now()
        fleet = await pctx.scan()
        self._scan = (fleet, at, self._acted())
        return fleet, at

    def add(self, pctx: OpsContext, action: Action) -> None:
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

    def note(self, pctx: OpsContext, text: str) -> None:
        """Record a warning met on the way (the round goes on; the report lists it)."""
        line = pctx.redact(text)
        self.notes.append(line)
        pctx.log(f"note: {line}")

    def error(self, pctx: OpsContext, step: str, text: str) -> None:
        """Record a non-fatal error of one item (the job goes on with the others)."""
        line = pctx.redact(f"{step}: {text}")
        self.errors.append(line)
        pctx.log(f"error: {line}")

    def note_instances(self, pctx: OpsContext, fleet: Fleet) -> None:
        """Remember every instance's load from ``fleet`` for the report."""
        gate = pctx.gate()
        lines = []
        for sc in fleet.scans:
            load = instance_load(sc, gate, allow_prod=True)
            lines.append(
                InstanceLine(
                    sc.inst.name,
                    sc.reachable,
                    sc.reason,
                    load.running_project,
                    load.reserved or 0,
                    load.limit,
                    sc.inst.production,
                )
            )
        self.instances = lines
        project, spends = budget_lines(
            pctx.cfg,
            [(sc.inst, sc.sessions if sc.reachable else None) for sc in fleet.scans],
            pctx.now(),
        )
        self.spend = [project, *spends]

    async def last_runs(
        self,
        pctx: OpsContext,
        items: Sequence[tuple[InstanceConfig, SessionRecord]],
        *,
        answers: bool = False,
    ) -> dict[tuple[str, str], LastRun]:
        """The last run of each session; unreadable ones are left out.

        Cached per (instance, session, updated): a session that did not change since an
        earlier job of this cycle read it is not read again. With the rounds' ``memory``, an
        idle session whose ``updated`` and run state are those of the round that last read
        it is not read either; a running or retrying one always is. The memory keeps no
        answers: ``answers`` (the commit verification reads the final answer) reads every
        session whose run was taken from the memory.
        """
        result: dict[tuple[str, str], LastRun] = {}
        wanted: dict[str, list[SessionRecord]] = {}
        insts: dict[str, InstanceConfig] = {}
        for inst, rec in items:
            key = (inst.name, rec.id)
            self.asked.add(key)
            cached = None if key in self.touched else self._runs.get((*key, rec.updated))
            if answers and key in self._recalled:
                cached = None  # recalled without its answer: read it
            elif cached is None and key not in self.touched and self.memory is not None:
                cached = self.memory.recall(*key, rec.updated, rec.run_state)
                if cached is not None and rec.run_state == "idle" and not answers:
                    self.recalled += 1
                    self._recalled.add(key)
                    self._runs[(*key, rec.updated)] = cached
                else:
                    cached = None  # running or retrying: always read
            if cached is not None:
                result[key] = cached
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
                    self.reads += 1
                    self._recalled.discard((name, rec.id))
                    self._runs[(name, rec.id, rec.updated)] = run
                    result[(name, rec.id)] = run
                    if self.memory is not None:
                        self.memory.remember(name, rec.id, rec.updated, rec.run_state, run)

                await aio.gather(*(one(r) for r in recs))

        await aio.gather(*(per_instance(n, r) for n, r in wanted.items()))
        return result


def pool_discipline(pctx: OpsContext, cycle: Cycle, step: str) -> str | None:
    """The task pool's discipline override; a corrupt pool is reported, never fatal here."""
    override, problem = _pool_discipline(pctx)
    if problem:
        cycle.error(pctx, step, problem)
    return override
