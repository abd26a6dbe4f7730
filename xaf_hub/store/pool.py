"""The task pool's interface (``TaskPool``), and every rule of it written once on top of it.

A store gives ``load``, ``update`` (the whole pool, atomically) and ``stamp``; every rule is one
``edit`` or ``update``, so what is atomic on one store is atomic on the other
(docs/architecture.md §8 and §9).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar

from xaf_hub.core.backoff import Backoff
from xaf_hub.core.records import Room
from xaf_hub.errors import TaskChanged, UsageError
from xaf_hub.store.tasks import (
    STATUSES,
    TASK_KEYS,
    WHAT,
    BacklogData,
    Status,
    Task,
    first_line,
    format_instant,
    found,
    new_task_id,
)

_T = TypeVar("_T")

MAX_BACKOFF: Final = timedelta(hours=24)


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


def utc_now() -> datetime:
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
                        raise UsageError(f"task id {task.id!r} already exists in the {WHAT}")
                    raise UsageError(
                        f"tasks[{i}].id: task {task.id!r} is already in the {WHAT} "
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
                raise UsageError(f"task id {row.id!r} already exists in the {WHAT}")

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

        try:
            return self._rewrite(task_id, lambda _: {"status": status, **fields})
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def mark_dispatched(
        self, task_id: str, session_id: str, instance: str, model: str | None, now: datetime
    ) -> Task:
        """Record that a task was sent to ``session_id`` on ``instance``."""
        return self.set_status(
            task_id, "dispatched", **_dispatched(session_id, instance, model, now)
        )

    def claim(
        self, planned: Task, session_id: str, instance: str, model: str | None, now: datetime, *,
        base: str | None = None, room: Room | None = None,
    ) -> Task:
        """Mark ``planned`` dispatched only if its row is still exactly ``planned``.

        ``base`` is the expected branch's tip now: only commits newer count for it.

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
        self, task_id: str, now: datetime, *,
        commit: str | None = None, commits: Sequence[str] = (), verified: bool | None = None,
        expected: Task | None = None, judged: str | None = None,
        check: Mapping[str, Any] | None = None,
    ) -> Task:
        """Record that a task's session finished cleanly (and the commit found for it, if any,
        with every commit credited to it).

        ``judged`` names the rule that decided; ``check`` the check fields (``note_check``).

        With ``expected`` (the row the patrol judged, before a verification that may take the
        fetch's whole time) the row is marked only if it is still exactly that row; a person's
        change meanwhile stands and TaskChanged is raised.
        """

        done: dict[str, Any] = dict(status="done", done_at=format_instant(now), not_before=None)
        done.update(infra_failures=0, commit=commit, commits=tuple(commits), verified=verified)
        done.update(judged=judged, person=None, **(check or {}))
        return self._rewrite(task_id, lambda _: done, expected)

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
        self, expected: Task, *,
        commit: str, commits: Sequence[str], judged: str | None,
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
        return self._rewrite(expected.id, lambda _: fields, expected)

    def _rewrite(
        self, task_id: str, make: Callable[[Task], Mapping[str, Any]], expected: Task | None = None
    ) -> Task:
        """Give row ``task_id`` the fields ``make`` works out from it (UsageError when there is no
        such row); with ``expected``, only while it is still exactly that row (else
        TaskChanged: a person's change stands)."""

        def change(current: Task | None) -> tuple[Task, Task]:
            old = found(current, task_id)
            if expected is not None and old != expected:
                raise TaskChanged(task_id, old)
            new = dataclasses.replace(old, **make(old))
            return new, new

        return self.edit(task_id, change)

    def requeue(
        self, task_id: str, *,
        reason: str, infrastructure: bool, now: datetime, policy: InfraPolicy | None = None,
    ) -> Task:
        """Put a failed task back to pending.

        A task failure costs an attempt and backs off (``backoff_delay``). An infrastructure
        failure costs no attempt; with a ``policy`` it counts as one more in a row, backs off
        by the policy and parks the task at ``policy.max_failures``; without one (the hub
        itself stopped before sending) it is sent again at once.
        """

        def fields(old: Task) -> dict[str, Any]:
            attempts, failures, parked = old.attempts, old.infra_failures, old.parked
            not_before: str | None = None
            if not infrastructure:
                attempts += 1
                failures = 0
                not_before = format_instant(now + backoff_delay(attempts))
            elif policy is not None:
                failures += 1
                if failures >= policy.max_failures:
                    parked = f"{failures} infrastructure failures in a row; last: {reason}"
                else:
                    not_before = format_instant(now + policy.delay(failures))
            back = dict(status="pending", attempts=attempts, infra_failures=failures, parked=parked)
            return {**back, "not_before": not_before, "last_error": reason, **undispatched()}

        return self._rewrite(task_id, fields)

    def move_model(self, task_id: str, *, reason: str, failed_model: str, now: datetime) -> Task:
        """Put a task back to pending to run on another model: ``failed_model`` is avoided.

        No attempt is used and no back-off applies: the failure named the model, not the
        task or the infrastructure.
        """

        error = f"{reason} (on {failed_model or 'its model'}; moving to another model)"

        def fields(old: Task) -> dict[str, Any]:
            avoid = old.avoid_models
            if failed_model and failed_model not in avoid:
                avoid = (*avoid, failed_model)
            back = dict(status="pending", avoid_models=avoid, not_before=None, last_error=error)
            return {**back, **undispatched()}

        return self._rewrite(task_id, fields)

    def discard(self, task_id: str) -> bool:
        """Remove a task from the pool; False when it was not there."""
        return self.edit(task_id, lambda current: (None, current is not None))

    def record_manual_dispatch(
        self, prompt: str, session_id: str, instance: str, model: str | None, now: datetime, *,
        base: str | None = None, task_id: str = "", room: Room | None = None, project: str = "",
    ) -> ManualRecord:
        """Record a manual ``dispatch`` so the pool matches what really runs: one row per work.

        When a row already stands for this session (a steer, or a restart of an idle
        session), the prompt is added to that row's ``prompts`` and the row is dispatched
        again; otherwise a new row is added, titled by the text's first line, with ``base``
        (the expected branch's tip).
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
                project=project,
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


def _dispatched(
    session_id: str, instance: str, model: str | None, now: datetime, base: str | None = None,
    room: Room | None = None,
) -> dict[str, Any]:
    """The fields of a row just sent to a new session (no person has steered it yet), in its
    own worktree when ``room`` is given (its base is then the commit the worktree starts from)."""
    return {
        **undispatched(),
        **dict.fromkeys(("landing", "landed", "conflicts", "parked")),
        "base": room.base if room is not None and room.base else base,
        "worktree": room.directory if room is not None else None,
        "branch": room.branch if room is not None else None,
        "checkout": room.checkout if room is not None else None,
        "session_id": session_id,
        "dispatched_at": format_instant(now),
        "dispatched_to": instance,
        "model": model or None,
    }


def unjudged() -> dict[str, Any]:
    """The verification fields of a row whose work starts afresh."""
    keys = ("base", "judged", "check", "check_commit", "check_output", "check_retries", "person")
    return dict.fromkeys(keys)


def undispatched() -> dict[str, Any]:
    """The fields of a row back in the pool: its old session no longer stands for it."""
    keys = ("session_id", "dispatched_at", "dispatched_to", "model", "done_at", "steered_at")
    return {**unjudged(), **dict.fromkeys(keys)}
