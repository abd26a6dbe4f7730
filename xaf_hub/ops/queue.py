"""Work that waits its turn: a dispatch the fleet cannot take now becomes a pending pool task.

``queue_work`` adds the task with the instance it would have gone to as its preference, the
matched session, who asked and why it waits; nothing was sent (docs/agents.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from xaf_hub.store.pick import pick_tasks
from xaf_hub.store.tasks import BacklogData, Task, format_instant, new_task_id

if TYPE_CHECKING:  # `status` only counts the queue: the planner and patrol state load on use
    from xaf_hub.ops.context import OpsContext


@dataclass(frozen=True)
class Queued:
    """A task that entered the pool instead of being sent."""

    task: Task
    position: int  # 1 = the next the patrol starts on its instance
    of: int  # pending tasks ready to start, this one included
    reason: str  # why it could not start now
    daemon_running: bool  # a live patrol daemon on this host will start it when a slot frees

    def line(self) -> str:
        """What a person reads."""
        where = f" for {self.task.instance}" if self.task.instance else ""
        text = f"queued as {self.task.id}{where} (position {self.position} of {self.of}): "
        text += self.reason
        if not self.daemon_running:
            text += ("; no patrol daemon is running here, so nothing starts it until a patrol "
                     "round (xaf-hub patrol, or patrol --once from cron)")
        return text

    def to_json(self) -> dict[str, Any]:
        """Export form (`dispatch --queue --json`)."""
        return {
            "queued": True,
            "task": self.task.id,
            "position": self.position,
            "of": self.of,
            "instance": self.task.instance or None,
            "reason": self.reason,
            "daemon_running": self.daemon_running,
        }


def queue_length(data: BacklogData, now: datetime) -> int:
    """How many pending tasks are ready to start (the work queue's length)."""
    return len(pick_tasks(data.tasks, "", len(data.tasks), now))


def queue_work(
    octx: OpsContext, text: str, *, reason: str, instance: str = "", title: str | None = None,
    session: str | None = None, caller: str = "",
) -> Queued:
    """Add ``text`` to the pool as a pending task (under the pool's lock) and say where it
    stands. ``instance`` is the preference (the pool's pin); ``session`` the matched session."""
    # deferred: start-up, docs/performance.md
    from xaf_hub.ops.planner import default_title
    from xaf_hub.store.patrol_state import daemon_alive, heartbeat, patrol_dir

    now = octx.now()
    extra: dict[str, Any] = {"queued_reason": reason}
    if caller:
        extra["queued_by"] = caller
    if session:
        extra["prefer_session"] = session

    def mutate(data: BacklogData) -> tuple[Task, int, int]:
        task = data.append(Task(
            id=new_task_id(now, (t.id for t in data.tasks)), title=title or default_title(text),
            prompt=text, instance=instance, created_at=format_instant(now),
            project=octx.cfg.project_name, extra=extra,
        ))
        # The pending tasks ready to start, in the order the patrol starts them on ``instance``.
        ids = [t.id for t in pick_tasks(data.tasks, instance, len(data.tasks), now)]
        position = ids.index(task.id) + 1 if task.id in ids else len(ids) + 1
        return task, position, max(len(ids), position)

    task, position, of = octx.backlog().update(mutate)
    beat = heartbeat(patrol_dir(octx.cfg))
    return Queued(task, position, of, reason, daemon_alive(beat))
