"""Patrol job 4: settle dispatched tasks, then fill every free slot from the pool.

Settling judges each ``dispatched`` task by its session (``patrol.settle`` decides): done (with
``project.repository`` only once its claimed commits are verified), back to ``pending``, or kept
for a person; a person's decision (``ops.decisions``) is never requeued or sent again. Filling
picks for every free slot (``pick.pick_tasks``) and sends each through the gated path of
``dispatch``; a row a person changed since the plan is never sent (``Backlog.claim`` in
``before_prompt``). The rules step by step: docs/architecture.md §8.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.commits import claimed_commits, short
from xaf_hub.core.discipline import base_commit, expected_branches
from xaf_hub.core.records import Room, SessionRecord
from xaf_hub.errors import (
    BudgetReached,
    BusyError,
    HubError,
    NotProjectSession,
    SessionNotFound,
    TaskChanged,
    UnreachableError,
    UsageError,
)
from xaf_hub.fleet.client import OpencodeClient
from xaf_hub.fleet.scan import build_record, read_status
from xaf_hub.notify.record import Action, task_action
from xaf_hub.ops import budget
from xaf_hub.ops.context import Fleet, OpsContext
from xaf_hub.ops.decisions import decisions_from, people_interrupts
from xaf_hub.ops.heal import heal_candidate
from xaf_hub.ops.land import send_back
from xaf_hub.ops.load import free as slots_free
from xaf_hub.ops.load import instance_load
from xaf_hub.ops.models import choose_model, untried_model
from xaf_hub.ops.planner import (
    DispatchRequest,
    InstanceView,
    new_session_directory,
    plan_create,
)
from xaf_hub.ops.rooms import room_name
from xaf_hub.ops.send import build_prompt, send_work
from xaf_hub.patrol.context import Cycle, each_view, pool_discipline, project_views
from xaf_hub.patrol.jobs.land import land_ready
from xaf_hub.patrol.settle import (
    JUST_DISPATCHED,
    NO_ANSWER_GRACE,
    NOT_VERIFIED,
    Settlement,
    Sighting,
    credited_commits,
    is_infrastructure_failure,
    names_model,
    retry_text,
    settle,
    settle_check,
    settle_claim,
)
from xaf_hub.store.contain import CheckRun
from xaf_hub.store.gate import Gate
from xaf_hub.store.pick import is_blocked, pick_tasks
from xaf_hub.store.pool import InfraPolicy
from xaf_hub.store.repository import Check, GitFailed, Mirror, remote_name
from xaf_hub.store.tasks import Task, parse_instant

__all__ = [
    "JUST_DISPATCHED",
    "NO_ANSWER_GRACE",
    "STEP",
    "Settlement",
    "Sighting",
    "fair_slots",
    "fill_every_project",
    "fill_slots",
    "is_infrastructure_failure",
    "names_model",
    "plan_fill",
    "session_title",
    "settle",
    "settle_dispatched",
]

STEP = "fill_slots"


def plan_fill(
    tasks: Sequence[Task], slots: Sequence[tuple[str, int]], now: datetime, max_attempts: int
) -> list[tuple[str, Task]]:
    """Which task goes to which instance, in dispatch order (pure).

    Round one: each instance (in ``slots`` order) takes its own pinned tasks, then unpinned
    ones. Round two: instances with slots left borrow tasks pinned to other instances.
    """
    usable = [t for t in tasks if not is_blocked(t, max_attempts)]
    free = dict(slots)
    picked: set[str] = set()
    plan: list[tuple[str, Task]] = []
    for borrow in (False, True):
        for name, _ in slots:
            if free[name] <= 0:
                continue
            # Non-pending tasks stay in the list: dependencies are judged against them.
            pool = [
                t
                for t in usable
                if t.status != "pending"
                or (t.id not in picked and (borrow or not t.instance or t.instance == name))
            ]
            for task in pick_tasks(pool, name, free[name], now):
                plan.append((name, task))
                picked.add(task.id)
                free[name] -= 1
    return plan


def fair_slots(
    server_free: Mapping[str, int], wants: Mapping[str, Mapping[str, tuple[int, int, int]]]
) -> dict[str, dict[str, int]]:
    """How many of each server's free slots each project takes (pure): one slot at a time to
    the project with the fewest runs there (the earlier one on a tie) among those with a task
    planned there and room left under its share, so no queue, however long, starves another.

    ``wants``: project -> server -> (its runs there, its free slots there, its tasks planned
    there), projects in config order.
    """
    given: dict[str, dict[str, int]] = {p: {} for p in wants}
    for server, room in server_free.items():
        for _ in range(room):
            open_ = [p for p, per in wants.items() if server in per
                     and given[p].get(server, 0) < min(per[server][1], per[server][2])]
            if not open_:
                break
            p = min(open_, key=lambda q: wants[q][server][0] + given[q].get(server, 0))
            given[p][server] = given[p].get(server, 0) + 1
    return given


def plannable(pctx: OpsContext, tasks: list[Task]) -> list[Task]:
    """What a fill plans from: the project's own pending tasks, and every other task (a
    ``depends_on`` may name another project's)."""
    mine = {t.id for t in pctx.own(tasks)}
    return [t for t in tasks if t.id in mine or t.status != "pending"]


def session_title(task: Task) -> str:
    """The new session's title: the task title, led by its id when the title lacks it."""
    return task.title if task.id in task.title else f"{task.id} {task.title}"


# ---------------------------------------------------------------------------------------------
# I/O


async def fill_every_project(pctx: OpsContext, cycle: Cycle) -> None:
    """``fill_slots`` for the chosen project, else for every configured one, each taking the
    free slots ``fair_slots`` gives it; one project's failure is raised after the others ran."""
    views = project_views(pctx)
    if len(views) == 1:
        return await fill_slots(pctx, cycle)
    now = pctx.now()
    data = await aio.blocking(pctx.backlog().load)
    wants: dict[str, dict[str, tuple[int, int, int]]] = {}
    server_free: dict[str, int] = {}
    for view in views:
        fleet, _ = await cycle.scan(view)
        gate = view.gate()
        loads = {
            sc.inst.name: await aio.blocking(instance_load, sc, gate, allow_prod=True)
            for sc in fleet.scans
        }
        for name, load in loads.items():
            known = load.reserved is not None and not load.run_state_unknown
            server_free[name] = slots_free(
                load.limit, load.running_project + load.running_others, load.reserved or 0
            ) if known and load.reachable else 0
        planned = Counter(name for name, _ in plan_fill(
            plannable(view, data.tasks),
            [(inst.name, free) for inst, free, _ in free_slots(fleet, gate)],
            now, view.cfg.patrol.max_attempts,
        ))
        wants[view.cfg.project_name] = {
            name: (load.running_project + load.reserved_own, load.free, planned[name])
            for name, load in loads.items()
        }
    given = fair_slots(server_free, wants)
    await each_view(views, lambda view: fill_slots(view, cycle, given[view.cfg.project_name]))


async def fill_slots(
    pctx: OpsContext, cycle: Cycle, allot: Mapping[str, int] | None = None
) -> None:
    """Settle dispatched tasks, then dispatch pending ones into every free slot (at most
    ``allot``'s per instance, when given)."""
    fleet, scanned_at = await cycle.scan(pctx)
    cycle.note_instances(pctx, fleet)
    backlog = pctx.backlog()
    await settle_dispatched(
        pctx, cycle, fleet, pctx.own((await aio.blocking(backlog.load)).tasks), scanned_at
    )
    await land_ready(pctx, cycle)
    if pctx.stop_requested():
        return
    data = await aio.blocking(backlog.load)
    gate = pctx.gate()
    now = pctx.now()
    # An instance past its own budget takes no new work today: the others take its tasks.
    # The project's budget holds every task, with the reason (send_work checks again).
    over = budget.over_budget(pctx.cfg, fleet.scans, now)
    budget_stop: dict[str, str] = {}  # instance, or "" for the project -> the refusal
    for _, err in sorted(over.items()):
        if err.instance:
            cycle.log.note(pctx, f"{STEP}: {err}; it takes no new work today")
        else:
            budget_stop[""] = str(err)
    spent = {name for name, err in over.items() if err.instance}
    slots = [(inst, min(free, free if allot is None else allot.get(inst.name, 0)), where)
             for inst, free, where in free_slots(fleet, gate) if inst.name not in spent]
    slots = [s for s in slots if s[1] > 0]
    plan = plan_fill(
        plannable(pctx, data.tasks),
        [(inst.name, free) for inst, free, _ in slots],
        now,
        pctx.cfg.patrol.max_attempts,
    )
    if not plan:
        return
    tips = await _tips(pctx, cycle)
    where = {inst.name: (inst, directory) for inst, _, directory in slots}
    models = {name: choose_model(pctx, inst, None, now) for name, (inst, _) in where.items()}
    override = pctx.cfg.discipline_or(data.discipline)
    stopped: set[str] = set()
    for name, task in plan:
        if pctx.stop_requested():
            break
        if name in stopped:
            continue
        why = budget_stop.get("") or budget_stop.get(name)
        if why:  # a budget was reached: the task stays pending with the reason
            cycle.log.budget_held[task.id] = why
            cycle.log.add(pctx, task_action(STEP, "dispatch", "waiting", task, name, detail=why))
            continue
        inst, directory = where[name]
        model = models[name]
        if task.avoid_models:
            model = untried_model(pctx, inst, task.avoid_models, now) or model
        try:
            base = _base(pctx, inst, task, override, tips)
            await _dispatch(pctx, cycle, inst, directory, task, model, override, base)
        except BudgetReached as exc:
            budget_stop[exc.instance] = str(exc)
            cycle.log.budget_held[task.id] = str(exc)
            cycle.log.add(pctx, task_action(STEP, "dispatch", "waiting", task, name,
                                            detail=str(exc)))
        except BusyError as exc:
            stopped.add(name)
            cycle.log.add(pctx, task_action(STEP, "dispatch", "waiting", task, name,
                                            detail=f"instance full: {exc}"))
        except UnreachableError as exc:
            stopped.add(name)
            cycle.log.error(pctx, STEP, f"dispatch {task.id} to {name}: {exc}")
        except HubError as exc:
            cycle.log.add(pctx, task_action(STEP, "dispatch", "failed", task, name,
                                            detail=str(exc)))
            cycle.log.error(pctx, STEP, f"dispatch {task.id} to {name}: {exc}")


async def _tips(pctx: OpsContext, cycle: Cycle) -> dict[str, str] | None:
    """Every branch's tip on project.repository now, the bases of this round's tasks.

    None without a repository; {} when it cannot be read (the tasks go out with no base and
    are judged as before: "base unknown").
    """
    if not pctx.cfg.repository.url:
        return None
    mirror = Mirror.of(pctx.cfg)
    try:
        return await aio.blocking(mirror.tips)
    except (GitFailed, BusyError, OSError) as exc:
        cycle.log.note(pctx, f"{STEP}: tasks sent without a base (base unknown): {exc}")
        return {}
    finally:
        if mirror.rebuilt:
            cycle.log.note(pctx, f"{STEP}: {mirror.rebuilt}")


def _expected_branches(
    pctx: OpsContext, inst: InstanceConfig | None, titles: Sequence[str], override: str | None
) -> tuple[str, ...]:
    """The branches the discipline told a task's agent to push to; () for any branch."""
    mainline = inst is not None and inst.branch_policy == "mainline"
    base = pctx.cfg.patrol.base_branch
    return expected_branches(mainline, base_branch=base, titles=titles, override=override)


def _base(
    pctx: OpsContext,
    inst: InstanceConfig,
    task: Task,
    override: str | None,
    tips: dict[str, str] | None,
) -> str | None:
    """A task's base: its expected branch's tip (``core.discipline.base_commit``)."""
    if not tips:
        return None
    branches = _expected_branches(pctx, inst, [task.title or task.id], override)
    return base_commit(tips, branches, pctx.cfg.patrol.base_branch)


def free_slots(fleet: Fleet, gate: Gate) -> list[tuple[InstanceConfig, int, str]]:
    """(instance, free slots, new-session directory) of every instance that can take work."""
    out = []
    for sc in fleet.scans:
        if not sc.reachable or sc.inst.production:
            continue
        load = instance_load(sc, gate, allow_prod=True)
        view = InstanceView(sc.inst, True, "", tuple(sc.sessions), load.reserved or 0,
                            reserved_own=load.reserved_own)
        try:
            directory = new_session_directory(view, DispatchRequest(text="fill"))
        except (UsageError, NotProjectSession):
            continue  # nowhere to create a session: no folder, or default_directory outside
        if load.free > 0:
            out.append((sc.inst, load.free, directory))
    return out


async def _dispatch(
    pctx: OpsContext,
    cycle: Cycle,
    inst: InstanceConfig,
    directory: str,
    task: Task,
    model: str | None,
    override: str | None,
    base: str | None = None,
) -> None:
    title = session_title(task)
    plan = plan_create(inst, directory, title, via=f"patrol fill_slots ({task.id})")
    if pctx.cfg.repository.isolation == "worktree":
        plan = dataclasses.replace(plan, room=room_name(task.id, task.title))
    room = bool(plan.room)
    prompt = build_prompt(pctx, inst, task.work_text(), task.title, override, room=room)
    created: list[str] = []

    def record(session_id: str, room: Room | None) -> None:
        # Marked before the prompt goes out: if the patrol dies in between, the next cycle
        # finds the task dispatched (and settles it) instead of sending the work again.
        # Marked only if the row is still the one planned from: a person's change wins.
        created.append(session_id)
        try:
            pctx.backlog().claim(
                task, session_id, inst.name, model, pctx.now(), base=base, room=room
            )
        except TaskChanged:
            raise
        except HubError as exc:
            cycle.log.error(
                pctx,
                STEP,
                f"task {task.id}: session {inst.name}/{session_id} created but the pool "
                f"could not record it, so no prompt was sent: {exc}",
            )
            raise

    async with pctx.client(inst) as client:
        try:
            result = await send_work(
                pctx, plan, prompt, model, client, command="patrol.fill_slots", before_prompt=record
            )
        except TaskChanged as exc:
            detail = await _drop_empty(pctx, client, inst, created, str(exc))
            cycle.log.add(pctx, task_action(STEP, "dispatch", "skipped", task, inst.name,
                                            detail=detail))
            return
    for warning in result.warnings:
        cycle.log.note(pctx, f"{STEP}: {warning}")
    cycle.log.touched.add((inst.name, result.session_id))
    _record(pctx, cycle, task_action(STEP, "dispatch", "ok", task, inst.name, result.session_id,
                                     detail=task.priority, model=result.model or ""),
            "dispatched", task.id)


def _record(pctx: OpsContext, cycle: Cycle, action: Action, audited: str, reason: str,
            **extra: Any) -> None:
    """Audit a write to a task's row (``audited``: the audit line's result) and log its action."""
    pctx.audit("patrol.backlog", instance=action.instance, session=action.session,
               result=audited, reason=reason, extra={"task": action.task, **extra})
    cycle.log.add(pctx, action)


async def _drop_empty(
    pctx: OpsContext,
    client: OpencodeClient,
    inst: InstanceConfig,
    created: list[str],
    why: str,
) -> str:
    """Delete the session created for a task that changed before its prompt (it is empty)."""
    if not created:
        return why
    try:
        await client.delete(created[0])
    except HubError as exc:
        return f"{why}; its empty session {created[0]} stays idle (delete failed: {exc})"
    await aio.blocking(
        pctx.audit,
        "patrol.fill_slots",
        instance=inst.name,
        session=created[0],
        result="deleted",
        reason="empty session: its task changed before the prompt",
    )
    return f"{why}; its empty session was deleted"


async def _with_run_state(
    pctx: OpsContext, inst: InstanceConfig, rec: SessionRecord
) -> SessionRecord:
    """Ask the run state of a task session outside the project (a forced manual dispatch)."""
    try:
        async with pctx.client(inst) as client:
            status = (await client.status(rec.directory)).get(rec.id)
    except HubError:
        return dataclasses.replace(rec, running=True, run_state="busy")  # unknown: leave it be
    state, message, nxt = read_status(status)
    return dataclasses.replace(
        rec, running=state != "idle", run_state=state, retry_message=message, retry_next=nxt
    )


async def _look_up(
    pctx: OpsContext, inst: InstanceConfig, session_id: str
) -> tuple[SessionRecord | None, bool]:
    """A task's session the round's scan did not list, asked for by id: (record, reachable).

    (None, True) only when the instance says it does not know the session; an error is
    (None, False), judged like an unreachable instance (kept, requeued after stale_minutes).
    A session that is there (created after the scan, or archived, which lists leave out) is
    judged like any other.
    """
    if not session_id:
        return None, True
    try:
        async with pctx.client(inst) as client:
            s = await client.get_session(session_id)
            status = (await client.status(s.directory)).get(session_id) if s.directory else None
    except SessionNotFound:
        return None, True
    except HubError:
        return None, False
    return build_record(inst, s, status, inst.rules.is_project(s.directory)), True


async def settle_dispatched(
    pctx: OpsContext,
    cycle: Cycle,
    fleet: Fleet,
    tasks: Sequence[Task],
    scanned_at: datetime | None = None,
) -> None:
    """Mark finished tasks done and requeue failed ones.

    A task dispatched after ``scanned_at`` (by a concurrent `dispatch` or another hub's round)
    is left alone: the scan cannot have seen its session, and calling it gone would send the
    work twice. The pool stores whole seconds, so "after" is compared at that grain; and a
    session the scan did not list is looked up by id before it is called gone (another host's
    clock may run behind this one's).
    """
    since = None if scanned_at is None else scanned_at.replace(microsecond=0)

    def too_new(task: Task) -> bool:
        when = parse_instant(task.dispatched_at)
        return since is not None and when is not None and when >= since

    # Verified work waiting to land (or for a person to land it) is not judged again.
    dispatched = [
        t for t in tasks
        if t.status == "dispatched" and not too_new(t) and t.landing not in ("ready", "person")
    ]
    if not dispatched:
        return
    configured = {i.name for i in pctx.cfg.instances}
    found: dict[str, tuple[InstanceConfig, SessionRecord | None, bool]] = {}
    for task in dispatched:
        sc = fleet.scan_of(task.dispatched_to or "")
        if sc is None:
            continue
        rec, reachable = None, sc.reachable
        if sc.reachable:
            rec = next((s for s in sc.sessions if s.id == task.session_id), None)
            if rec is None:
                rec, reachable = await _look_up(pctx, sc.inst, task.session_id or "")
            elif not rec.project:
                rec = await _with_run_state(pctx, sc.inst, rec)
        found[task.id] = (sc.inst, rec, reachable)
    idle = [(inst, rec) for inst, rec, _ in found.values() if rec is not None and not rec.running]
    # Verification reads each final answer, which the rounds' memory does not keep.
    runs = await cycle.last_runs(pctx, idle, answers=bool(pctx.cfg.repository.url))
    now = pctx.now()
    people = decisions_from(people_interrupts(pctx), tasks)
    patrol = pctx.cfg.patrol
    grace = timedelta(seconds=patrol.no_answer_grace_seconds)
    young = timedelta(seconds=patrol.just_dispatched_seconds)
    judged: list[tuple[Task, InstanceConfig | None, Sighting, Settlement]] = []
    for task in dispatched:
        inst, rec, reachable = found.get(task.id, (None, None, False))
        key = (task.dispatched_to or "", task.session_id or "")
        decision = people.for_task(task)
        seen = Sighting(
            configured=task.dispatched_to in configured,
            reachable=reachable,
            session=rec,
            run=runs.get(key),
            touched=key in cycle.log.touched,
            deferred=key in cycle.log.deferred,
            decision=decision.text if decision is not None else "",
        )
        verdict = settle(task, seen, now, patrol.stale_minutes, grace, young)
        judged.append((task, inst, seen, verdict))
    checks = await _verify(pctx, cycle, [(t, i, s) for t, i, s, v in judged if v.action == "done"])
    # Each commit is credited to one task: those done before, and those done this round; a
    # commit another task's answer names this round is that task's.
    credited = credited_commits(tasks)
    claims: dict[str, list[str]] = {}
    for tid, (answer, _) in checks.items():
        for c in answer.claimed:
            claims.setdefault(c, []).append(tid)
    checked = [0.0]  # seconds of project checks this round (bounded: see _run_check)
    for task, inst, seen, first in judged:
        check, where = checks.get(task.id, (None, ""))
        shared = inst is None or inst.branch_policy == "mainline"
        verdict = settle_claim(
            first, check, where, shared=shared, credited=credited, claims=claims, task=task.id
        )
        try:
            verdict = await _run_check(pctx, task, verdict, checked)
            if verdict.action == "done":
                run = verdict.check
                ran = (
                    {"check": "passed", "check_commit": verdict.commit, "check_output": run.tail}
                    if run is not None
                    else {}
                )
                if task.branch and verdict.verified and pctx.cfg.repository.integrate != "off":
                    # Its own branch: done once it has landed (patrol.jobs.land, or a person).
                    await aio.blocking(
                        pctx.backlog().mark_ready, task, commit=verdict.commit,
                        commits=verdict.commits, judged=verdict.judged or None, check=ran,
                    )
                    for c in verdict.commits:
                        credited[c] = task.id
                    cycle.log.add(pctx, task_action(
                        STEP, "verified", "ok", task,
                        detail=f"verified, ready to land: {verdict.judged or verdict.commit}",
                    ))
                    continue
                verified = verdict.verified is True
                await aio.blocking(
                    pctx.backlog().mark_done,
                    task.id,
                    now,
                    commit=verdict.commit or None,
                    commits=verdict.commits,
                    verified=verdict.verified,
                    expected=task,  # a person's change during the verification stands
                    judged=verdict.judged or (None if verified else NOT_VERIFIED),
                    check=ran,
                )
                for c in verdict.commits:
                    credited[c] = task.id
                proof = (
                    {"commit": verdict.commit, "commits": list(verdict.commits)}
                    if verdict.verified
                    else {}
                )
                said = f"verified: commit {verdict.commit} on the repository" if proof else ""
                if len(verdict.commits) > 1:
                    more = len(verdict.commits) - 10
                    said += ", credited with " + ", ".join(map(short, verdict.commits[:10]))
                    said += f" and {more} more" if more > 0 else ""
                if verdict.judged:
                    said += f" ({verdict.judged})"
                _record(pctx, cycle, task_action(STEP, "done" if verified else "finished", "ok",
                                                 task, detail=said or NOT_VERIFIED),
                        "done", task.id, verified=verified, **proof)
            elif verdict.action == "requeue":
                detail = await aio.blocking(_requeue, pctx, task, inst, seen, verdict, now)
                _record(pctx, cycle, task_action(STEP, "requeue", "ok", task, detail=detail),
                        "requeued", detail)
            elif verdict.action == "retry":
                assert inst is not None and seen.session is not None
                await _send_back(pctx, cycle, inst, seen.session, task, verdict)
            elif not verdict.reason:
                if task.person:  # the patrol goes on with it: no longer a person's
                    await aio.blocking(pctx.backlog().note_check, task, person=None)
            else:
                await aio.blocking(_note_judged, pctx, task, verdict)
                kind = "person" if verdict.person else "keep"
                cycle.log.add(pctx, task_action(STEP, kind, "skipped", task,
                                                detail=verdict.reason, why=verdict.why))
        except TaskChanged as exc:
            # A person changed the row while the round judged it (a verification can take
            # the fetch's whole time): their change stands, nothing is written over it.
            cycle.log.add(pctx, task_action(STEP, "keep", "skipped", task, detail=str(exc)))
        except HubError as exc:
            cycle.log.error(pctx, STEP, f"settle task {task.id}: {exc}")


async def _verify(
    pctx: OpsContext,
    cycle: Cycle,
    finished: Sequence[tuple[Task, InstanceConfig | None, Sighting]],
) -> dict[str, tuple[Check, str]]:
    """Look up each finished task's claimed commits on project.repository (one fetch):
    task id -> (what the mirror found, the expected branches as a reason names them).

    {} without a repository: every task is done on the agent's word (verified null).
    """
    repo = pctx.cfg.repository
    if not repo.url or not finished:
        return {}
    override = pool_discipline(pctx, cycle.log, STEP)
    wanted: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for task, inst, seen in finished:
        answer = seen.run.answer if seen.run is not None else ""
        # The discipline named the branch from the task's title (fill_slots) or, in a
        # resume or heal, from the session's: either is where the agent was told to push.
        titles = [task.title] + ([seen.session.title] if seen.session is not None else [])
        branches = (task.branch,) if task.branch else _expected_branches(
            pctx, inst, [t or task.id for t in titles], override
        )
        wanted.append((claimed_commits(answer), branches))
    mirror = Mirror.of(pctx.cfg)
    bases = [task.base for task, _, _ in finished]
    checks = await aio.blocking(mirror.check_all, wanted, bases, repo.locked)
    if mirror.rebuilt:
        cycle.log.note(pctx, f"{STEP}: {mirror.rebuilt}")
    return {
        task.id: (check, remote_name(branches))
        for (task, _, _), check, (_, branches) in zip(finished, checks, wanted, strict=True)
    }


async def _run_check(
    pctx: OpsContext, task: Task, verdict: Settlement, checked: list[float]
) -> Settlement:
    """Run project.check_command on a verified commit and weigh it (``settle_check``).

    Not run again for a commit whose check already failed with no retry left; a worktree
    that cannot be made keeps the task as it is for the next round. Checks run one after
    another; once this round's (``checked``) add up to ``check_timeout_seconds``, no more
    start: the tasks left wait for the next round, so one round costs at most about twice
    the bound however many tasks finished.
    """
    repo = pctx.cfg.repository
    if verdict.action != "done" or not verdict.verified or not repo.check_command:
        return verdict
    settled = task.check == "failed" and task.check_commit == verdict.commit
    run: CheckRun | None = None
    if not (settled and (task.check_retries or 0) >= repo.check_retries):
        if checked[0] >= repo.check_timeout_seconds:
            return Settlement(
                "keep",
                reason=f"waiting for the check: this round's checks took {checked[0]:.0f}s; "
                "it runs next round",
            )
        try:
            run = await aio.blocking(
                Mirror.of(pctx.cfg).run_check,
                verdict.commit,
                repo.check_command,
                repo.check_timeout_seconds,
            )
        except (GitFailed, BusyError, OSError) as exc:
            return Settlement("keep", reason=f"waiting for the check: it could not start: {exc}")
        checked[0] += run.seconds
    return settle_check(verdict, run, task, repo.check_retries)


def _note_judged(pctx: OpsContext, task: Task, verdict: Settlement) -> None:
    """Write on a row kept which rule decided (and a failed check's output), and whether and
    why it is left to a person (its state then says so: ``store.pick.state_of``)."""
    fields: dict[str, object] = {}
    if verdict.judged and verdict.judged != task.judged:
        fields["judged"] = verdict.judged
    run = verdict.check
    if run is not None:
        fields.update(check="failed", check_commit=verdict.commit, check_output=run.tail)
    person = verdict.reason if verdict.person else None
    if person != task.person:
        fields["person"] = person
    if fields:
        pctx.backlog().note_check(task, **fields)


async def _send_back(
    pctx: OpsContext,
    cycle: Cycle,
    inst: InstanceConfig,
    rec: SessionRecord,
    task: Task,
    verdict: Settlement,
) -> None:
    """A failed check goes back to the same session once more, with the output's end and the
    discipline (``ops.land.send_back``); the row records the retry before the prompt."""
    run = verdict.check
    assert run is not None
    repo = pctx.cfg.repository
    text = retry_text(repo.check_command, verdict.commit, run)
    key = (inst.name, rec.id)
    try:
        sent = await send_back(
            pctx, task, text, rec=rec, override=pool_discipline(pctx, cycle.log, STEP),
            command="patrol.check_retry", judged=verdict.judged, check="failed",
            check_commit=verdict.commit, check_output=run.tail,
            check_retries=(task.check_retries or 0) + 1,
        )
    except BusyError as exc:
        cycle.log.add(pctx, task_action(
            STEP, "keep", "waiting", task, *key,
            detail=f"check failed; sent back when a slot frees ({exc})",
        ))
        return
    for warning in sent.warnings:
        cycle.log.note(pctx, f"{STEP}: {warning}")
    cycle.log.touched.add(key)
    last = run.tail.strip().splitlines()[-1] if run.tail.strip() else ""
    _record(pctx, cycle, task_action(
        STEP, "retry", "ok", task, *key,
        detail=f"{verdict.reason}: {last}" if last else verdict.reason,
    ), "check_failed", verdict.reason, commit=verdict.commit)


def _requeue(
    pctx: OpsContext,
    task: Task,
    inst: InstanceConfig | None,
    seen: Sighting,
    verdict: Settlement,
    now: datetime,
) -> str:
    """Send a failed task back to the pool: next model, back-off or parked; say what happened."""
    backlog = pctx.backlog()
    rec, run = seen.session, seen.run
    if rec is not None and run is not None:
        cand = heal_candidate(rec, run)
        if cand is not None:
            # The pool moves on; the abandoned session must not be healed later.
            pctx.model_state().remember_healed(cand.key, cand.model or None, None, now)
    if verdict.model_named and inst is not None:
        failed = task.model or (run.model if run is not None else "") or ""
        tried = (*task.avoid_models, failed)
        nxt = untried_model(pctx, inst, tried, now)
        if nxt is not None:
            backlog.move_model(task.id, reason=verdict.reason, failed_model=failed, now=now)
            return f"failed on {failed or 'its model'}: {verdict.reason}; next model {nxt}"
    if not verdict.infrastructure:
        max_attempts = pctx.cfg.patrol.max_attempts
        new = backlog.requeue(task.id, reason=verdict.reason, infrastructure=False, now=now)
        detail = f"task failure: {verdict.reason} (attempt {new.attempts} of {max_attempts})"
        if is_blocked(new, max_attempts):
            detail += "; attempts used up, blocked until a human resets it"
        return detail
    policy = InfraPolicy(max_failures=pctx.cfg.patrol.max_infra_failures)
    new = backlog.requeue(
        task.id,
        reason=verdict.reason,
        infrastructure=True,
        now=now,
        policy=policy if verdict.backoff else None,
    )
    detail = f"infrastructure failure: {verdict.reason}"
    if new.parked:
        return f"{detail}; parked: {new.parked}"
    if new.not_before:
        detail += f" ({new.infra_failures} in a row; not before {new.not_before})"
    return detail
