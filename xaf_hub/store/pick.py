"""Which pending tasks an instance should take now, and where each task stands: pure rules
over the pool's rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from xaf_hub.core.outcomes import TASK_STATES, TaskState, task_state
from xaf_hub.store.tasks import PRIORITIES, Task, format_instant, instant_seconds, parse_instant


def readiness(
    task: Task,
    tasks: Sequence[Task],
    now: datetime,
    *,
    status_of: Mapping[str, str] | None = None,
) -> str:
    """Return "" when a task may be dispatched now, else a short reason why not.

    ``status_of`` (id -> status of ``tasks``) spares the look-up table's making when asking
    about many tasks of one pool: once per pool, not once per task.
    """
    if task.status != "pending":
        return f"status is {task.status}"
    if task.parked:
        return f"parked: {task.parked}"
    not_before = instant_seconds(task.not_before)
    if not_before is not None and not_before > now.timestamp():
        return f"backing off until {format_instant(parse_instant(task.not_before) or now)}"
    if status_of is None:
        status_of = {t.id: t.status for t in tasks}
    # A dependency that is not in the pool blocks the task: it cannot be confirmed done.
    waiting = [dep for dep in task.depends_on if status_of.get(dep) != "done"]
    if waiting:
        return "waiting for " + ", ".join(waiting)
    return ""


def pick_tasks(tasks: Sequence[Task], instance: str, free: int, now: datetime) -> list[Task]:
    """Choose up to ``free`` ready tasks for ``instance``: own pins, then unpinned, then borrowed.

    Within each tier: priority P0 > P3, then older ``created_at`` (a task without one counts as
    oldest, it predates the field), then file order. The caller removes picked tasks before
    asking for the next instance.
    """
    if free <= 0:
        return []
    ranked: list[tuple[int, int, float, int, Task]] = []
    status_of = {t.id: t.status for t in tasks}
    for index, task in enumerate(tasks):
        if readiness(task, tasks, now, status_of=status_of):
            continue
        tier = 0 if task.instance == instance else 1 if not task.instance else 2
        created = instant_seconds(task.created_at)
        rank = PRIORITIES.index(task.priority)  # 0 for P0 ... 3 for P3
        ranked.append((tier, rank, float("-inf") if created is None else created, index, task))
    ranked.sort(key=lambda r: r[:4])
    return [r[4] for r in ranked[:free]]


def is_blocked(task: Task, max_attempts: int) -> bool:
    """A pending task that used up its attempts waits for a human."""
    return task.status == "pending" and task.attempts >= max_attempts


def count_states(tasks: Sequence[Task], now: datetime, max_attempts: int) -> dict[TaskState, int]:
    """How many tasks stand in each state (``state_of``), every state named: what the page's
    work queue and the report count, as ``backlog list`` says them (pure)."""
    status_of = {t.id: t.status for t in tasks}
    counts = dict.fromkeys(TASK_STATES, 0)
    for t in tasks:
        counts[state_of(t, tasks, now, max_attempts, status_of=status_of)[0]] += 1
    return counts


def state_of(
    task: Task,
    tasks: Sequence[Task],
    now: datetime,
    max_attempts: int,
    *,
    status_of: Mapping[str, str] | None = None,
) -> tuple[TaskState, str]:
    """Where a task stands (``core.outcomes.task_state``: what the page, ``backlog`` and the
    report count with) and, in one line, why: what it waits for, why a person has it, which
    rule decided (pure)."""
    state = task_state(
        status=task.status,
        landing=task.landing,
        parked=bool(task.parked),
        person=bool(task.person),
        blocked=is_blocked(task, max_attempts),
        verified=task.verified,
    )
    if state == "waiting":
        return state, readiness(task, tasks, now, status_of=status_of) or "ready"
    if state == "blocked":
        return state, f"{task.attempts} of {max_attempts} attempts used"
    if state == "person":
        return state, task.parked or task.person or ""
    if state == "landed":
        return state, f"on the base branch as {task.landed[:7]}" if task.landed else ""
    return state, task.judged or ""
