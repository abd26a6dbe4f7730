"""Patrol job 4: settle dispatched tasks (``settle_tasks``), then fill every free slot from the
pool.

Filling picks for every free slot (``pick.pick_tasks``) and sends each through the gated path of
``dispatch``; a row a person changed since the plan is never sent (``Backlog.claim`` in
``before_prompt``). The rules step by step: docs/architecture.md §8.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.discipline import base_commit
from xaf_hub.core.records import Room
from xaf_hub.errors import (
    BudgetReached,
    BusyError,
    HubError,
    NotProjectSession,
    TaskChanged,
    UnreachableError,
    UsageError,
)
from xaf_hub.fleet.client import OpencodeClient
from xaf_hub.notify.record import Action
from xaf_hub.ops import budget
from xaf_hub.ops.context import Fleet, OpsContext
from xaf_hub.ops.load import free as slots_free
from xaf_hub.ops.load import instance_load
from xaf_hub.ops.models import choose_model
from xaf_hub.ops.planner import (
    DispatchRequest,
    InstanceView,
    new_session_directory,
    plan_create,
)
from xaf_hub.ops.rooms import room_name
from xaf_hub.ops.send import build_prompt, send_work
from xaf_hub.patrol.context import Cycle, each_view, project_views, task_branches
from xaf_hub.patrol.jobs.land import land_ready
from xaf_hub.patrol.jobs.settle_tasks import STEP, settle_dispatched
from xaf_hub.store.gate import Gate
from xaf_hub.store.pick import is_blocked, pick_tasks
from xaf_hub.store.repository import GitFailed, Mirror
from xaf_hub.store.tasks import Task

__all__ = [
    "STEP",
    "fair_slots",
    "fill_every_project",
    "fill_slots",
    "plan_fill",
    "session_title",
]



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
    free = [(inst.name, n) for inst, n, _ in slots]
    plan = plan_fill(plannable(pctx, data.tasks), free, now, pctx.cfg.patrol.max_attempts)
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
            cycle.log.add(pctx, STEP, "dispatch", "waiting", task, name, detail=why)
            continue
        inst, directory = where[name]
        model = models[name]
        if task.avoid_models:
            model = choose_model(pctx, inst, None, now, task.avoid_models) or model
        try:
            # Its base: the tip of the branch the discipline names for it (none: no tips).
            branches = task_branches(pctx, inst, [task.title or task.id], override)
            base = base_commit(tips, branches, pctx.cfg.patrol.base_branch) if tips else None
            await _dispatch(pctx, cycle, inst, directory, task, model, override, base)
        except BudgetReached as exc:
            budget_stop[exc.instance] = str(exc)
            cycle.log.budget_held[task.id] = str(exc)
            cycle.log.add(pctx, STEP, "dispatch", "waiting", task, name, detail=str(exc))
        except BusyError as exc:
            stopped.add(name)
            detail = f"instance full: {exc}"
            cycle.log.add(pctx, STEP, "dispatch", "waiting", task, name, detail=detail)
        except UnreachableError as exc:
            stopped.add(name)
            cycle.log.error(pctx, STEP, f"dispatch {task.id} to {name}: {exc}")
        except HubError as exc:
            cycle.log.add(pctx, STEP, "dispatch", "failed", task, name, detail=str(exc))
            cycle.log.error(pctx, STEP, f"dispatch {task.id} to {name}: {exc}")


async def _tips(pctx: OpsContext, cycle: Cycle) -> dict[str, str]:
    """Every branch's tip on project.repository now, the bases of this round's tasks; {}
    without a repository or when it cannot be read (the tasks go out with no base and are
    judged as before: "base unknown").
    """
    if not pctx.cfg.repository.url:
        return {}
    mirror = Mirror.of(pctx.cfg)
    try:
        return await aio.blocking(mirror.tips)
    except (GitFailed, BusyError, OSError) as exc:
        cycle.log.note(pctx, f"{STEP}: tasks sent without a base (base unknown): {exc}")
        return {}
    finally:
        if mirror.rebuilt:
            cycle.log.note(pctx, f"{STEP}: {mirror.rebuilt}")


def free_slots(fleet: Fleet, gate: Gate) -> list[tuple[InstanceConfig, int, str]]:
    """(instance, free slots, new-session directory) of every instance that can take work."""
    out = []
    for sc in fleet.scans:
        if not sc.reachable or sc.inst.production:
            continue
        load = instance_load(sc, gate, allow_prod=True)
        view = InstanceView(sc.inst, True, "", tuple(sc.sessions), load.reserved or 0)
        try:
            directory = new_session_directory(view, DispatchRequest(text="fill"))
        except (UsageError, NotProjectSession):
            continue  # nowhere to create a session: no folder, or default_directory outside
        if load.free > 0:
            out.append((sc.inst, load.free, directory))
    return out


async def _dispatch(
    pctx: OpsContext, cycle: Cycle, inst: InstanceConfig, directory: str, task: Task,
    model: str | None, override: str | None, base: str | None = None,
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
            pctx.backlog().claim(task, session_id, inst.name, model, pctx.now(), base=base,
                                 room=room)
        except HubError as exc:
            if not isinstance(exc, TaskChanged):  # a person's change: the caller says so
                said = f"session {inst.name}/{session_id} created but the pool could not record it"
                cycle.log.error(pctx, STEP, f"task {task.id}: {said}, so no prompt was sent: {exc}")
            raise

    async with pctx.client(inst) as client:
        try:
            result = await send_work(
                pctx, plan, prompt, model, client, command="patrol.fill_slots", before_prompt=record
            )
        except TaskChanged as exc:
            detail = await _drop_empty(pctx, client, inst, created, str(exc))
            cycle.log.add(pctx, STEP, "dispatch", "skipped", task, inst.name, detail=detail)
            return
    for warning in result.warnings:
        cycle.log.note(pctx, f"{STEP}: {warning}")
    cycle.log.touched.add((inst.name, result.session_id))
    act = Action.of(STEP, "dispatch", "ok", task, inst.name, result.session_id,
                    detail=task.priority, model=result.model or "")
    cycle.record(pctx, act, "dispatched", task.id)


async def _drop_empty(
    pctx: OpsContext, client: OpencodeClient, inst: InstanceConfig, created: list[str], why: str
) -> str:
    """Delete the session created for a task that changed before its prompt (it is empty)."""
    if not created:
        return why
    try:
        await client.delete(created[0])
    except HubError as exc:
        return f"{why}; its empty session {created[0]} stays idle (delete failed: {exc})"
    await aio.blocking(pctx.audit, "patrol.fill_slots", instance=inst.name, session=created[0],
                       result="deleted", reason="empty session: its task changed before the prompt")
    return f"{why}; its empty session was deleted"
