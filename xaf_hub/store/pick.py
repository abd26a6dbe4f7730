"""Which pending tasks an instance should take now: pure rules over the pool's rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from xaf_hub.store.tasks import PRIORITIES, Task, format_instant, instant_seconds, parse_instant


def _priority_rank(task: Task) -> int:
    """0 for P0 ... 3 for P3."""
    return PRIORITIES.index(task.priority)


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
        ranked.append(
            (tier, _priority_rank(task), float("-inf") if created is None else created, index, task)
        )
    ranked.sort(key=lambda r: r[:4])
    return [r[4] for r in ranked[:free]]


def is_blocked(task: Task, max_attempts: int) -> bool:
    """A pending task that used up its attempts waits for a human."""
    return task.status == "pending" and task.attempts >= max_attempts
