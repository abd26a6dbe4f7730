"""What every patrol job shares besides the operations context: the round as its jobs see it.

``Cycle`` holds what the jobs read and ``Cycle.log``, what they did (the report and notify read
only the log); ``TIME_DECISIONS`` are the decisions a round takes even when it skips a session's
read (docs/architecture.md §8).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.discipline import expected_branches
from xaf_hub.core.records import SessionRecord
from xaf_hub.core.runstate import LastRun, last_run
from xaf_hub.errors import BudgetReached, BusyError, HubError, RunsAgain
from xaf_hub.notify.record import Action, InstanceLine, RoundLog
from xaf_hub.ops.budget import BudgetLine, budget_lines, spends, totals
from xaf_hub.ops.context import Fleet, OpsContext
from xaf_hub.ops.load import instance_load
from xaf_hub.ops.send import pool_discipline as _pool_discipline
from xaf_hub.store.patrol_state import RunMemory
from xaf_hub.store.statefile import file_lock

# Only the newest message decides the last run; messages can be large, so read just that one.
MESSAGE_WINDOW = 1
# Concurrent message reads per cycle step (the server answers each in a few ms).
_MESSAGE_FAN_OUT = 8

T = TypeVar("T")
CYCLE_LOCK = "cycle.lock"

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
    # patrol.run_start_grace_seconds (quiet = now - updated; run.outcome kept).
    "resume after the run-start grace",
    # settle_tasks: a prompt unanswered past patrol.no_answer_grace_seconds, an
    # instance unreachable past stale_minutes, a task's back-off (not_before) ending.
    "settle: no-answer grace, unreachable too long, back-off due",
    # ops.decisions: an operator's interrupt after the run (audit log, read every round,
    # against run.created_ms, kept).
    "a person's interrupt after the run",
)


# ---------------------------------------------------------------------------------------------
# What the jobs read, and the log of what they did


@dataclass
class Cycle:
    """One round as its jobs see it: what they read besides the operations context (the
    fleet's scan, the sessions' last runs with the rounds' memory) and ``log``, the append-only
    record of what they did (``notify.record.RoundLog``), which the report and notify read."""

    log: RoundLog
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
    _views: dict[str, Fleet] = field(default_factory=dict, repr=False)  # per project

    async def scan(self, pctx: OpsContext) -> tuple[Fleet, datetime]:
        """The fleet as a job's project sees it, and when it was scanned: every job and
        project of this cycle shares one scan of every project while no job since has acted
        (prompted, healed, failed to), so an idle round scans once, like `status`; after an
        action the fleet is scanned again."""
        if self._scan is None or self._scan[2] != self.log.acted():
            at = pctx.now()
            whole = await pctx.but(cfg=pctx.cfg.every_project()).scan()
            self._scan, self._views = (whole, at, self.log.acted()), {}
        whole, at, _ = self._scan
        name = pctx.cfg.project_name
        if name not in self._views:
            self._views[name] = whole.seen_as(pctx.cfg)
        return self._views[name], at

    def note_instances(self, pctx: OpsContext, fleet: Fleet) -> None:
        """Put every instance's load (the runs of every project there, from this cycle's scan)
        and today's spend from ``fleet`` in the log."""
        gate = pctx.gate()
        self.log.instances = [
            InstanceLine(sc.inst.name, sc.reachable, sc.reason, load.running_project,
                         load.reserved or 0, load.limit, sc.inst.production)
            for sc in (self._scan[0] if self._scan else fleet).scans
            for load in [instance_load(sc, gate, allow_prod=True)]
        ]
        cfg, now = pctx.cfg, pctx.now()
        own = budget_lines(
            cfg, [(sc.inst, sc.sessions if sc.reachable else None) for sc in fleet.scans], now
        )
        if len(cfg.projects) < 2:
            self.log.spend = [own[0], *own[1]]
            return
        # Several projects: each project's job replaces its own lines, and every project's
        # spend against budget.daily_usd leads.
        every = totals(spends(cfg, fleet.scans, now).values())[1]
        self.log.spend = [
            BudgetLine("", every, cfg.budget.daily_usd, every=True),
            *(line for line in self.log.spend if line.project not in ("", cfg.project_name)),
            *(replace(line, project=cfg.project_name) for line in (own[0], *own[1])),
        ]

    async def attempt(
        self, pctx: OpsContext, step: str, kind: str, rec: SessionRecord, act: Awaitable[T],
        *, later: str, **fields: Any,
    ) -> T | None:
        """``act`` (a heal or resume of ``rec``), or None when it sent nothing: the session runs
        again (skipped), no slot or budget yet (waiting, ``later`` says when it is tried
        again), or an error (failed); each is logged as the ``kind`` action of ``step``."""
        try:
            return await act
        except RunsAgain as exc:
            self.log.add(pctx, step, kind, "skipped", rec, detail=str(exc), **fields)
        except BusyError as exc:
            self.log.deferred.add((rec.instance, rec.id))
            why = "daily budget reached" if isinstance(exc, BudgetReached) else "no free slot yet"
            detail = f"{why}, {later} ({exc})"
            self.log.add(pctx, step, kind, "waiting", rec, detail=detail, **fields)
        except HubError as exc:
            self.log.add(pctx, step, kind, "failed", rec, detail=str(exc), **fields)
            self.log.error(pctx, step, f"{kind} {rec.instance}/{rec.id}: {exc}")
        return None

    def record(
        self, pctx: OpsContext, action: Action, audited: str, reason: str, **extra: Any
    ) -> None:
        """Audit a write to a task's row (``audited``: the audit line's result) and log its
        action."""
        pctx.audit("patrol.backlog", instance=action.instance, session=action.session,
                   result=audited, reason=reason, extra={"task": action.task, **extra})
        self.log.put(pctx, action)

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
        wanted: list[tuple[InstanceConfig, SessionRecord]] = []
        for inst, rec in items:
            key = (inst.name, rec.id)
            self.asked.add(key)
            cached = None if key in self.log.touched else self._runs.get((*key, rec.updated))
            if answers and key in self._recalled:
                cached = None  # recalled without its answer: read it
            elif cached is None and key not in self.log.touched and self.memory is not None:
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
                wanted.append((inst, rec))
        async with contextlib.AsyncExitStack() as stack:
            insts = {inst.name: inst for inst, _ in wanted}
            clients = {n: await stack.enter_async_context(pctx.client(i)) for n, i in insts.items()}

            async def one(item: tuple[InstanceConfig, SessionRecord]) -> None:
                name, rec = item[0].name, item[1]
                try:
                    msgs = await clients[name].messages(rec.id, limit=MESSAGE_WINDOW)
                except HubError:
                    return  # gone or unreadable: judged as unknown
                run = last_run(msgs)
                self.reads += 1
                self._recalled.discard((name, rec.id))
                self._runs[(name, rec.id, rec.updated)] = run
                result[(name, rec.id)] = run
                if self.memory is not None:
                    self.memory.remember(name, rec.id, rec.updated, rec.run_state, run)

            await aio.bounded(_MESSAGE_FAN_OUT, one, wanted)
        return result


Job = Callable[[OpsContext, Cycle], Awaitable[None]]  # a patrol step, as the runner runs it


def cycle_lock(pctx: OpsContext) -> contextlib.AbstractContextManager[None]:
    """Hold ``patrol/cycle.lock`` (BusyError at once when taken): one round or live reaction at
    a time among the patrols of this machine."""
    return file_lock(pctx.patrol_dir / CYCLE_LOCK, 0, what="patrol cycle lock")


def project_views(pctx: OpsContext) -> list[OpsContext]:
    """The context of each project the patrol serves: the chosen one, else every configured
    one (a config of several projects run without --project)."""
    cfg = pctx.cfg
    return [pctx] if cfg.chosen else [pctx.but(cfg=cfg.choose(p.name)) for p in cfg.projects]


def owner_view(pctx: OpsContext, instance: str, owner: str) -> tuple[OpsContext, InstanceConfig]:
    """``pctx`` and its ``instance`` as project ``owner`` sees them (its own ceiling, discipline,
    ...) when several projects are served and none is chosen; else as they are."""
    if owner and not pctx.cfg.chosen:
        pctx = pctx.but(cfg=pctx.cfg.choose(owner))
    return pctx, pctx.cfg.instance(instance)


async def each_view(
    views: Sequence[OpsContext], job: Callable[[OpsContext], Awaitable[None]]
) -> None:
    """Run ``job`` for each project's context in turn; a failure is raised once every other
    project's turn ran (the first one), so one project's fault never stops another's work."""
    failed: BaseException | None = None
    for view in views:
        if view.stop_requested():
            break
        try:
            await job(view)
        except Exception as exc:  # noqa: BLE001 - raised below, after the others' turns
            failed = failed or exc
    if failed is not None:
        raise failed


def every_project(job: Job) -> Job:
    """A patrol job run for the chosen project, else for every configured one in turn."""
    async def run(pctx: OpsContext, cycle: Cycle) -> None:
        await each_view(project_views(pctx), lambda view: job(view, cycle))

    run.__name__ = run.__qualname__ = job.__name__
    return run


def pool_discipline(pctx: OpsContext, log: RoundLog, step: str) -> str | None:
    """The task pool's discipline override; a corrupt pool is reported, never fatal here."""
    override, problem = _pool_discipline(pctx)
    if problem:
        log.error(pctx, step, problem)
    return override


def task_branches(
    pctx: OpsContext, inst: InstanceConfig | None, titles: Sequence[str], override: str | None
) -> tuple[str, ...]:
    """The branches the discipline told a task's agent to push to; () for any branch."""
    mainline = inst is not None and inst.branch_policy == "mainline"
    base = pctx.cfg.patrol.base_branch
    return expected_branches(mainline, base_branch=base, titles=titles, override=override)
