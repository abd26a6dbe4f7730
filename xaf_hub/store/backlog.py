"""The task pool (``tasks_backlog.json``): the locked store and pure task selection.

* ``TaskPool`` is the store's interface: ``load`` and ``update`` per backend, every rule
  (claim, requeue, manual records, import) written once on top of them. ``Backlog`` is the
  file backend; the Redis one is ``store.redis.pool.RedisBacklog``.
* ``Backlog`` is the file store. Every change is one locked read-modify-write through
  ``statefile.update_json``; the file is rewritten only when the pool really changed. A corrupt
  file is reported with its position and never reset. The record and file format live in
  ``backlog_schema`` (re-exported here).
* One row per piece of work: a manual dispatch adds a row; a later steer or restart of the
  same session adds its prompt to that row (``record_manual_dispatch``).
* ``claim`` marks a task dispatched only if its row is still the one the caller planned from
  (the patrol's last look before it sends).
* Failures: a task failure costs an attempt and backs off exponentially; an infrastructure
  failure backs off on its own schedule and parks the task after N in a row (``InfraPolicy``).
* ``pick_tasks`` / ``readiness`` are pure: which pending tasks an instance should take now.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeVar

from xaf_hub.core.backoff import Backoff
from xaf_hub.core.outcomes import TASK_STATES, TaskState, task_state
from xaf_hub.core.records import Room
from xaf_hub.errors import TaskChanged, UsageError
from xaf_hub.store.statefile import read_json, update_json
from xaf_hub.store.tasks import (
    PRIORITIES,
    SCHEMA_VERSION,
    STATUSES,
    TASK_KEYS,
    BacklogData,
    Priority,
    Status,
    Task,
    first_line,
    format_instant,
    instant_seconds,
    is_generated_id,
    new_task_id,
    parse_instant,
)

__all__ = [
    "MAX_BACKOFF",
    "PRIORITIES",
    "SCHEMA_VERSION",
    "STATUSES",
    "Backlog",
    "BacklogData",
    "InfraPolicy",
    "ManualRecord",
    "Priority",
    "Status",
    "Task",
    "TaskChanged",
    "TaskPool",
    "backoff_delay",
    "count_states",
    "first_line",
    "format_instant",
    "is_blocked",
    "is_generated_id",
    "new_task_id",
    "parse_instant",
    "pick_tasks",
    "readiness",
    "state_of",
]

_T = TypeVar("_T")

MAX_BACKOFF: Final = timedelta(hours=24)
_WHAT = "task pool"


@dataclass(frozen=True)
class InfraPolicy:
    """How infrastructure failures back off: the waits in order, and how many in a row park."""

    delays: tuple[timedelta, ...] = (
        timedelta(minutes=5),
        timedelta(minutes=15),
        timedelta(hours=1),
    )
    max_failures: int = 4

    def delay(self, failures: int) -> timedelta:
        """The wait after the ``failures``-th failure in a row (the last wait repeats)."""
        if not self.delays:
            return timedelta(0)
        steps = tuple(d.total_seconds() for d in self.delays)
        return timedelta(seconds=Backoff(steps=steps).delay(failures))


@dataclass(frozen=True)
class ManualRecord:
    """A manual dispatch's row: the row now, whether it is new, and the row before it."""

    task: Task
    created: bool
    before: Task | None = None


def backoff_delay(attempts: int, base_s: float = 600) -> timedelta:
    """Back-off after the ``attempts``-th failure: base·2^(attempts−1), capped at 24 h."""
    cap = MAX_BACKOFF.total_seconds()
    return timedelta(seconds=Backoff(first=base_s, cap=cap).delay(attempts))


def _utc_now() -> datetime:
    """Default clock of the store."""
    return datetime.now(UTC)


class TaskPool(abc.ABC):
    """The task pool's interface: a read, and atomic changes; the rest is rules.

    Two stores implement it: ``Backlog`` (the file on this host) and ``RedisBacklog`` (a key
    per task in Redis shared by every hub, ``store.redis.pool``); ``backends.Stores.pool``
    chooses by ``pool.backend``. Every operation below is one ``edit`` (one row) or one
    ``update`` (the whole pool), so what is atomic on one backend is atomic on the other: a
    ``claim`` seen by two hubs succeeds once.
    """

    #: Where the pool lives, for messages and ``backlog list --json`` (a path or a Redis key).
    where: str
    _clock: Callable[[], datetime]

    @abc.abstractmethod
    def load(self) -> BacklogData:
        """Read the pool; an absent pool is empty, a corrupt one raises StateFileError."""

    @abc.abstractmethod
    def update(self, mutate: Callable[[BacklogData], _T]) -> _T:
        """Run ``mutate`` on the pool atomically; write back only when it changed something."""

    @abc.abstractmethod
    def stamp(self) -> object:
        """A value that changes whenever any process (or host) writes the pool, read for the
        cost of one stat or one Redis GET: how a daemon hears that work arrived."""

    def edit(self, task_id: str, change: Callable[[Task | None], tuple[Task | None, _T]]) -> _T:
        """Change one row atomically: ``change(the row now, or None)`` gives (row, result).

        The row given back is written when it differs from the one read (a new id goes at the
        end of the pool); None removes the row. ``change`` may run more than once (a backend
        that compares and sets runs it again when another hub wrote the row first), so it only
        computes and raises. Here it is one ``update``; the Redis pool writes the row alone.
        """

        def mutate(data: BacklogData) -> _T:
            current = data.get(task_id)
            new, result = change(current)
            if new is not None and new.id != task_id:
                raise ValueError(f"edit of task {task_id!r} returned task {new.id!r}")
            if new is None:
                if current is not None:
                    data.tasks[:] = [t for t in data.tasks if t.id != task_id]
            elif current is None:
                data.append(new)
            elif new != current:
                data.replace(new)
            return result

        return self.update(mutate)

    def import_data(self, incoming: BacklogData, *, replace: bool = False) -> list[Task]:
        """Add ``incoming``'s tasks to the pool in one write (or, ``replace``, swap the pool).

        An id already in the pool refuses the whole import (UsageError naming the row);
        nothing is written then. Returns the tasks now in the pool from ``incoming``.
        """

        def mutate(data: BacklogData) -> list[Task]:
            if replace:
                data.tasks[:] = []
                data.discipline = incoming.discipline
                data.extra = dict(incoming.extra)
            # One set of ids for the whole import: linear in pool plus import, not their product.
            taken = {t.id for t in data.tasks}
            for i, task in enumerate(incoming.tasks):
                if not task.id.strip():
                    raise UsageError("a task in the pool needs an id")
                if task.id in taken:
                    if any(t.id == task.id for t in incoming.tasks[:i]):
                        raise UsageError(f"task id {task.id!r} already exists in the {_WHAT}")
                    raise UsageError(
                        f"tasks[{i}].id: task {task.id!r} is already in the {_WHAT} "
                        f"({self.where}); nothing imported (--replace swaps the whole pool)"
                    )
                taken.add(task.id)
            data.tasks.extend(incoming.tasks)
            return list(incoming.tasks)

        return self.update(mutate)

    def add(self, task: Task, *, now: datetime | None = None) -> Task:
        """Add one task; an empty id gets ``T-<yyyymmdd>-<hex>``, a missing created_at gets now."""
        when = now if now is not None else self._clock()
        new = task
        if new.created_at is None:
            new = dataclasses.replace(new, created_at=format_instant(when))
        generated = not new.id.strip()
        tried: set[str] = set()
        while True:
            if generated:
                new = dataclasses.replace(new, id=new_task_id(when, tried))
                tried.add(new.id)

            def change(current: Task | None, row: Task = new) -> tuple[Task | None, Task | None]:
                if current is None:
                    return row, row
                if generated:
                    return current, None  # a random id already taken: draw another
                raise UsageError(f"task id {row.id!r} already exists in the task pool")

            added = self.edit(new.id, change)
            if added is not None:
                return added

    def set_status(self, task_id: str, status: Status, **fields: Any) -> Task:
        """Set a task's status and any other task fields; unknown id or field raises UsageError."""
        bad = (set(fields) - TASK_KEYS - {"extra"}) | ({"id", "status"} & set(fields))
        if bad:
            raise UsageError(f"cannot set task field(s) {', '.join(sorted(bad))}")
        if status not in STATUSES:
            raise UsageError(f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")

        def change(current: Task | None) -> tuple[Task, Task]:
            old = _require(current, task_id)
            try:
                new = dataclasses.replace(old, status=status, **fields)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            return new, new

        return self.edit(task_id, change)

    def mark_dispatched(
        self, task_id: str, session_id: str, instance: str, model: str | None, now: datetime
    ) -> Task:
        """Record that a task was sent to ``session_id`` on ``instance``."""
        return self.set_status(
            task_id, "dispatched", **_dispatched(session_id, instance, model, now)
        )

    def claim(
        self,
        planned: Task,
        session_id: str,
        instance: str,
        model: str | None,
        now: datetime,
        *,
        base: str | None = None,
        room: Room | None = None,
    ) -> Task:
        """Mark ``planned`` dispatched only if its row is still exactly ``planned``.

        ``base`` is the expected branch's tip now (issue 37): only commits newer count for it.

        The patrol plans from a read of the pool and sends later; a person may have changed
        the row meanwhile (marked it done, or dispatched by hand). Then TaskChanged is raised,
        the row is left as the person made it and nothing may be sent.
        """

        def change(current: Task | None) -> tuple[Task, Task]:
            if current is None or current != planned or current.status != "pending":
                raise TaskChanged(planned.id, current)
            fields = _dispatched(session_id, instance, model, now, base, room)
            new = dataclasses.replace(current, status="dispatched", **fields)
            return new, new

        return self.edit(planned.id, change)

    def mark_done(
        self,
        task_id: str,
        now: datetime,
        *,
        commit: str | None = None,
        commits: Sequence[str] = (),
        verified: bool | None = None,
        expected: Task | None = None,
        judged: str | None = None,
        check: Mapping[str, Any] | None = None,
    ) -> Task:
        """Record that a task's session finished cleanly (and the commit found for it, if any,
        with every commit credited to it).

        ``judged`` names the rule that decided; ``check`` the check fields (``note_check``).

        With ``expected`` (the row the patrol judged, before a verification that may take the
        fetch's whole time) the row is marked only if it is still exactly that row; a person's
        change meanwhile stands and TaskChanged is raised.
        """

        def change(current: Task | None) -> tuple[Task, Task]:
            old = _require(current, task_id)
            if expected is not None and old != expected:
                raise TaskChanged(task_id, old)
            new = dataclasses.replace(
                old,
                status="done",
                done_at=format_instant(now),
                not_before=None,
                infra_failures=0,
                commit=commit,
                commits=tuple(commits),
                verified=verified,
                judged=judged,
                person=None,
                **(check or {}),
            )
            return new, new

        return self.edit(task_id, change)

    def note_check(self, expected: Task, **fields: Any) -> Task:
        """Write what the verification found on a row still exactly ``expected`` (else
        TaskChanged: a person's change stands): ``judged``, ``check``, ``check_commit``,
        ``check_output``, ``check_retries``, ``person`` (why it is left to a person), and
        ``dispatched_at`` when it goes back to its session."""
        allowed = {"judged", "check", "check_commit", "check_output", "check_retries"}
        allowed |= {"dispatched_at", "person"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"note_check: not a verification field: {sorted(unknown)}")
        return self.revise(expected, **fields)

    def mark_ready(
        self,
        expected: Task,
        *,
        commit: str,
        commits: Sequence[str],
        judged: str | None,
        check: Mapping[str, Any] | None = None,
    ) -> Task:
        """A task in a worktree of its own whose work is verified: ready to land (it stays
        dispatched until it has landed). TaskChanged when a person changed the row meanwhile."""
        return self.revise(
            expected, landing="ready", commit=commit, commits=tuple(commits), verified=True,
            judged=judged, person=None, **(check or {}),
        )

    def mark_landed(self, expected: Task, now: datetime, *, landed: str, judged: str) -> Task:
        """Its work is on the base branch (``landed``: the base's commit that carries it): done."""
        return self.revise(
            expected, status="done", done_at=format_instant(now), not_before=None,
            infra_failures=0, landing="landed", landed=landed, judged=judged,
        )

    def revise(self, expected: Task, **fields: Any) -> Task:
        """Change a row still exactly ``expected`` (else TaskChanged: a person's change stands)."""

        def change(current: Task | None) -> tuple[Task, Task]:
            old = _require(current, expected.id)
            if old != expected:
                raise TaskChanged(expected.id, old)
            new = dataclasses.replace(old, **fields)
            return new, new

        return self.edit(expected.id, change)

    def requeue(
        self,
        task_id: str,
        *,
        reason: str,
        infrastructure: bool,
        now: datetime,
        backoff_base_s: float = 600,
        policy: InfraPolicy | None = None,
    ) -> Task:
        """Put a failed task back to pending.

        A task failure costs an attempt and backs off (``backoff_delay``). An infrastructure
        failure costs no attempt; with a ``policy`` it counts as one more in a row, backs off
        by the policy and parks the task at ``policy.max_failures``; without one (the hub
        itself stopped before sending) it is sent again at once.
        """

        def change(current: Task | None) -> tuple[Task, Task]:
            old = _require(current, task_id)
            attempts, failures, parked = old.attempts, old.infra_failures, old.parked
            not_before: str | None = None
            if not infrastructure:
                attempts += 1
                failures = 0
                not_before = format_instant(now + backoff_delay(attempts, backoff_base_s))
            elif policy is not None:
                failures += 1
                if failures >= policy.max_failures:
                    parked = f"{failures} infrastructure failures in a row; last: {reason}"
                else:
                    not_before = format_instant(now + policy.delay(failures))
            new = dataclasses.replace(
                old,
                status="pending",
                attempts=attempts,
                infra_failures=failures,
                parked=parked,
                not_before=not_before,
                last_error=reason,
                **undispatched(),
            )
            return new, new

        return self.edit(task_id, change)

    def move_model(self, task_id: str, *, reason: str, failed_model: str, now: datetime) -> Task:
        """Put a task back to pending to run on another model: ``failed_model`` is avoided.

        No attempt is used and no back-off applies: the failure named the model, not the
        task or the infrastructure.
        """

        def change(current: Task | None) -> tuple[Task, Task]:
            old = _require(current, task_id)
            avoid = old.avoid_models
            if failed_model and failed_model not in avoid:
                avoid = (*avoid, failed_model)
            new = dataclasses.replace(
                old,
                status="pending",
                avoid_models=avoid,
                not_before=None,
                last_error=f"{reason} (on {failed_model or 'its model'}; moving to another model)",
                **undispatched(),
            )
            return new, new

        return self.edit(task_id, change)

    def discard(self, task_id: str) -> bool:
        """Remove a task from the pool; False when it was not there."""

        def change(current: Task | None) -> tuple[Task | None, bool]:
            return None, current is not None

        return self.edit(task_id, change)

    def record_manual_dispatch(
        self,
        prompt: str,
        session_id: str,
        instance: str,
        model: str | None,
        now: datetime,
        *,
        base: str | None = None,
        task_id: str = "",
        room: Room | None = None,
    ) -> ManualRecord:
        """Record a manual ``dispatch`` so the pool matches what really runs: one row per work.

        When a row already stands for this session (a steer, or a restart of an idle
        session), the prompt is added to that row's ``prompts`` and the row is dispatched
        again; otherwise a new row is added, titled by the text's first line, with ``base``
        (the expected branch's tip, issue 37).
        """
        stamp = format_instant(now)

        def mutate(data: BacklogData) -> ManualRecord:
            for old in data.tasks:
                if old.session_id == session_id and old.dispatched_to == instance:
                    new = dataclasses.replace(
                        old,
                        status="dispatched",
                        prompts=(*old.texts(), prompt),
                        steered_at=stamp,
                        model=model or old.model,
                        done_at=None,
                        parked=None,
                    )
                    return ManualRecord(data.replace(new), False, old)
            taken = {t.id for t in data.tasks}
            task = Task(
                id=task_id if task_id and task_id not in taken else new_task_id(now, taken),
                title=first_line(prompt) or "manual dispatch",
                status="dispatched",
                prompt=prompt,
                prompts=(prompt,),
                created_at=stamp,
                **_dispatched(session_id, instance, model, now, base, room),
            )
            return ManualRecord(data.append(task), True)

        return self.update(mutate)

    def take_back(self, record: ManualRecord) -> bool:
        """Undo a manual dispatch's record whose prompt never arrived; False if changed since.

        A new row is removed; a row the dispatch added a prompt to gets its earlier self back.
        Either happens only while the row is still what the dispatch wrote.
        """

        def change(current: Task | None) -> tuple[Task | None, bool]:
            if current is None or current != record.task:
                return current, False
            return record.before, True

        return self.edit(record.task.id, change)


class Backlog(TaskPool):
    """The task pool file: locked, atomic, never silently reset."""

    def __init__(
        self,
        path: Path,
        lock_timeout: float = 20,
        *,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.path = path
        self.where = str(path)
        self.lock_timeout = lock_timeout
        self._clock = clock

    def load(self) -> BacklogData:
        """Read the pool; a missing file is an empty pool, a corrupt one raises StateFileError."""
        try:
            raw = read_json(self.path, what=_WHAT)
        except FileNotFoundError:
            return BacklogData()
        return BacklogData.from_json(raw, path=self.path)

    def stamp(self) -> object:
        """The file's identity, time and size (None while absent): each write replaces it."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def update(self, mutate: Callable[[BacklogData], _T]) -> _T:
        """Run ``mutate`` on the pool under the lock; write back only when it changed something."""

        def apply(raw: Any) -> _T:
            data = BacklogData.from_json(raw, path=self.path)
            before = data._state()
            result = mutate(data)
            if data._state() != before:
                # Replace in place: update_json compares this very object to decide on writing.
                raw.clear()
                raw.update(data.to_json())
            return result

        return update_json(
            self.path,
            apply,
            default=lambda: BacklogData().to_json(),
            what=_WHAT,
            timeout=self.lock_timeout,
        )


def _require(current: Task | None, task_id: str) -> Task:
    """The row an edit found, or the UsageError ``BacklogData.require`` raises."""
    if current is None:
        raise UsageError(f"no task {task_id!r} in the task pool")
    return current


def _dispatched(
    session_id: str,
    instance: str,
    model: str | None,
    now: datetime,
    base: str | None = None,
    room: Room | None = None,
) -> dict[str, Any]:
    """The fields of a row just sent to a new session (no person has steered it yet), in its
    own worktree when ``room`` is given (its base is then the commit the worktree starts from)."""
    return {
        **unjudged(),
        "base": room.base if room is not None and room.base else base,
        "worktree": room.directory if room is not None else None,
        "branch": room.branch if room is not None else None,
        "checkout": room.checkout if room is not None else None,
        "landing": None,
        "landed": None,
        "conflicts": None,
        "session_id": session_id,
        "dispatched_at": format_instant(now),
        "dispatched_to": instance,
        "model": model or None,
        "done_at": None,
        "steered_at": None,
        "parked": None,
    }


def unjudged() -> dict[str, Any]:
    """The verification fields of a row whose work starts afresh (issue 37)."""
    return {
        "base": None,
        "judged": None,
        "check": None,
        "check_commit": None,
        "check_output": None,
        "check_retries": None,
        "person": None,
    }


def undispatched() -> dict[str, Any]:
    """The fields of a row back in the pool: its old session no longer stands for it."""
    return {
        **unjudged(),
        "session_id": None,
        "dispatched_at": None,
        "dispatched_to": None,
        "model": None,
        "done_at": None,
        "steered_at": None,
    }


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
