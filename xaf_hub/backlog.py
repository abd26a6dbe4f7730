"""The task pool (``tasks_backlog.json``): records, the locked store and pure task selection.

File layout (schema version 1)::

    {"schema_version": 1, "discipline": null, "tasks": [{"id": "F-8", "title": ..., ...}]}

* ``Task`` is one frozen record; ``Task.from_json`` is strict (a wrong type, an unknown status
  or priority is a ``StateFileError`` naming the file, the task index and the key). Keys the
  hub does not know are kept in ``Task.extra`` and written back unchanged, so a hand-added
  note survives every rewrite.
* ``Backlog`` is the store. Every change is one locked read-modify-write through
  ``statefile.update_json``; the file is rewritten only when the pool really changed. A corrupt
  file is reported with its position and never reset.
* ``pick_tasks`` / ``readiness`` are pure: which pending tasks an instance should take now.

Times in the file are ISO 8601 strings written by the hub; ``not_before`` and ``created_at``
may also be milliseconds since the epoch (hand-edited files). A time without an offset is read
as local time, the way ``datetime.timestamp`` reads it.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, cast, get_args

from xaf_hub.errors import StateFileError, UsageError
from xaf_hub.statefile import read_json, update_json

__all__ = [
    "MAX_BACKOFF",
    "PRIORITIES",
    "SCHEMA_VERSION",
    "STATUSES",
    "Backlog",
    "BacklogData",
    "Priority",
    "Status",
    "Task",
    "backoff_delay",
    "format_instant",
    "is_generated_id",
    "new_task_id",
    "parse_instant",
    "pick_tasks",
    "readiness",
]

_T = TypeVar("_T")

SCHEMA_VERSION: Final = 1
MAX_BACKOFF: Final = timedelta(hours=24)

Priority = Literal["P0", "P1", "P2", "P3"]
Status = Literal["pending", "dispatched", "done"]
PRIORITIES: Final[tuple[str, ...]] = get_args(Priority)
STATUSES: Final[tuple[str, ...]] = get_args(Status)

_WHAT = "task pool"
_TASK_ID_RE = re.compile(r"^T-\d{8}-[0-9a-f]{4}$")

# Declared types of every known task key: (accepted JSON types, may be null).
# bool is excluded from int explicitly below because JSON true is not a count.
_STR = (str,)
_FIELD_TYPES: Final[dict[str, tuple[tuple[type, ...], bool]]] = {
    "id": (_STR, False),
    "title": (_STR, False),
    "priority": (_STR, False),
    "module": (_STR, False),
    "instance": (_STR, False),
    "status": (_STR, False),
    "spec": (_STR, False),
    "prompt": (_STR, False),
    "session_id": (_STR, True),
    "dispatched_at": (_STR, True),
    "dispatched_to": (_STR, True),
    "model": (_STR, True),
    "done_at": (_STR, True),
    "attempts": ((int,), False),
    "not_before": ((str, int), True),
    "last_error": (_STR, True),
    "created_at": ((str, int), True),
    "depends_on": ((list, tuple), False),
}
_INSTANT_KEYS: Final = ("dispatched_at", "done_at", "not_before", "created_at")


class _FieldProblem(Exception):
    """One bad task key; turned into StateFileError or ValueError by the caller."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


def _json_type(value: object) -> str:
    """Name a value's JSON type for an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def parse_instant(value: str | int | float | None) -> datetime | None:
    """Read an ISO 8601 string or epoch milliseconds (None stays None); bad text: ValueError."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a boolean is not a time")
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value / 1000, tz=UTC)
    text = value.strip()
    if not text:
        return None
    return datetime.fromisoformat(text)


def format_instant(when: datetime) -> str:
    """Write a time the way the pool stores it (ISO 8601, seconds)."""
    return when.isoformat(timespec="seconds")


def _epoch(value: str | int | None) -> float | None:
    """Seconds since the epoch for a stored time (validated on load, so parsing succeeds)."""
    parsed = parse_instant(value)
    return None if parsed is None else parsed.timestamp()


_WANTED: Final[dict[tuple[type, ...], str]] = {
    (str,): "a string",
    (int,): "an integer",
    (str, int): "an ISO 8601 string or epoch milliseconds",
    (list, tuple): "an array of task ids",
}


def _check_field(key: str, value: object, *, allow_empty_id: bool = False) -> None:
    """Raise _FieldProblem when ``value`` is not valid for task key ``key``."""
    types, nullable = _FIELD_TYPES[key]
    if value is None:
        if not nullable:
            raise _FieldProblem(key, "must not be null")
        return
    if isinstance(value, bool) or not isinstance(value, types):
        raise _FieldProblem(key, f"expected {_WANTED[types]}, got {_json_type(value)}")
    if key == "id" and not allow_empty_id and not cast(str, value).strip():
        raise _FieldProblem(key, "must not be empty")
    if key == "title" and not cast(str, value).strip():
        raise _FieldProblem(key, "must not be empty")
    if key == "priority" and value not in PRIORITIES:
        raise _FieldProblem(key, f"expected one of {', '.join(PRIORITIES)}, got {value!r}")
    if key == "status" and value not in STATUSES:
        raise _FieldProblem(key, f"expected one of {', '.join(STATUSES)}, got {value!r}")
    if key == "attempts" and cast(int, value) < 0:
        raise _FieldProblem(key, f"must be 0 or more, got {value}")
    if key == "depends_on":
        for i, dep in enumerate(cast(Sequence[object], value)):
            if not isinstance(dep, str) or not dep.strip():
                raise _FieldProblem(f"{key}[{i}]", f"expected a task id, got {_json_type(dep)}")
    if key in _INSTANT_KEYS:
        try:
            parse_instant(cast("str | int", value))
        except (ValueError, OverflowError, OSError):
            raise _FieldProblem(
                key, f"not an ISO 8601 time or epoch milliseconds: {value!r}"
            ) from None


@dataclass(frozen=True)
class Task:
    """One unit of work in the pool (architecture §8), plus attempts, back-off and dependencies."""

    id: str
    title: str
    priority: Priority = "P2"
    module: str = ""
    instance: str = ""  # "" = any instance may take it
    status: Status = "pending"
    spec: str = ""  # design document, relative to the repo root
    prompt: str = ""  # the work text; the discipline block is appended at dispatch time
    session_id: str | None = None
    dispatched_at: str | None = None
    dispatched_to: str | None = None
    model: str | None = None
    done_at: str | None = None
    attempts: int = 0
    not_before: str | int | None = None  # back-off: not dispatched before this time
    last_error: str | None = None
    created_at: str | int | None = None
    depends_on: tuple[str, ...] = ()
    # Keys the hub does not know, kept verbatim so a rewrite never drops them.
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        """Refuse a record that would write an invalid pool file."""
        # Accept any sequence of ids but keep a tuple, so the record stays immutable.
        if isinstance(self.depends_on, list):
            object.__setattr__(self, "depends_on", tuple(self.depends_on))
        for key in _FIELD_TYPES:
            try:
                # An empty id is allowed here only so Backlog.add can fill one in.
                _check_field(key, getattr(self, key), allow_empty_id=True)
            except _FieldProblem as exc:
                raise ValueError(f"task {self.id!r}: {exc.key}: {exc.message}") from None
        clash = set(self.extra) & set(_FIELD_TYPES)
        if clash:
            raise ValueError(f"task {self.id!r}: extra repeats known keys {sorted(clash)}")

    @classmethod
    def from_json(cls, raw: object, *, path: Path | str = "?", index: int = 0) -> Task:
        """Build a task from its JSON object; any problem names the file, index and key."""
        where = f"{_WHAT} {path}: tasks[{index}]"
        if not isinstance(raw, dict):
            raise StateFileError(f"{where}: expected an object, got {_json_type(raw)}")
        for key in ("id", "title"):
            if key not in raw:
                raise StateFileError(f"{where}: missing required key {key!r}")
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in _FIELD_TYPES:
                extra[key] = copy.deepcopy(value)
                continue
            try:
                _check_field(key, value)
            except _FieldProblem as exc:
                raise StateFileError(f"{where}.{exc.key}: {exc.message}") from None
            known[key] = tuple(value) if key == "depends_on" else value
        return cls(**known, extra=extra)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object stored in the pool file (known keys first, then extras)."""
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            data[f.name] = list(value) if f.name == "depends_on" else value
        data.update(copy.deepcopy(dict(self.extra)))
        return data


@dataclass
class BacklogData:
    """The whole pool as read from disk; ``Backlog.update`` hands it to a mutator to change."""

    tasks: list[Task] = field(default_factory=list)
    discipline: str | None = None  # pool-wide discipline override (architecture §8)
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: object, *, path: Path | str = "?") -> BacklogData:
        """Validate a parsed pool file; problems name the file and where in it."""
        where = f"{_WHAT} {path}"
        if not isinstance(raw, dict):
            raise StateFileError(
                f"{where}: expected a JSON object at the top, got {_json_type(raw)}"
            )
        version = raw.get("schema_version", SCHEMA_VERSION)
        if isinstance(version, bool) or not isinstance(version, int):
            raise StateFileError(f"{where}: schema_version: expected an integer")
        if version != SCHEMA_VERSION:
            raise StateFileError(
                f"{where}: schema_version {version} is not supported (this xaf-hub reads "
                f"{SCHEMA_VERSION}); upgrade xaf-hub instead of editing the file"
            )
        discipline = raw.get("discipline")
        if discipline is not None and not isinstance(discipline, str):
            raise StateFileError(f"{where}: discipline: expected a string or null")
        raw_tasks = raw.get("tasks", [])
        if not isinstance(raw_tasks, list):
            raise StateFileError(f"{where}: tasks: expected an array, got {_json_type(raw_tasks)}")
        tasks = [Task.from_json(item, path=path, index=i) for i, item in enumerate(raw_tasks)]
        seen: dict[str, int] = {}
        for i, task in enumerate(tasks):
            if task.id in seen:
                first = seen[task.id]
                raise StateFileError(
                    f"{where}: tasks[{i}].id: duplicate id {task.id!r} (also tasks[{first}])"
                )
            seen[task.id] = i
        extra = {
            k: copy.deepcopy(v)
            for k, v in raw.items()
            if k not in ("schema_version", "discipline", "tasks")
        }
        return cls(tasks=tasks, discipline=discipline, schema_version=version, extra=extra)

    def to_json(self) -> dict[str, Any]:
        """Return the whole file's JSON document."""
        data: dict[str, Any] = {
            "schema_version": self.schema_version,
            "discipline": self.discipline,
            "tasks": [t.to_json() for t in self.tasks],
        }
        data.update(copy.deepcopy(self.extra))
        return data

    def get(self, task_id: str) -> Task | None:
        """Return the task with this id, or None."""
        for task in self.tasks:
            if task.id == task_id:
                return task
        return None

    def require(self, task_id: str) -> Task:
        """Return the task with this id or raise UsageError."""
        task = self.get(task_id)
        if task is None:
            raise UsageError(f"no task {task_id!r} in the task pool")
        return task

    def replace(self, task: Task) -> Task:
        """Swap in a new version of an existing task (matched by id), keeping its place."""
        for i, old in enumerate(self.tasks):
            if old.id == task.id:
                self.tasks[i] = task
                return task
        raise UsageError(f"no task {task.id!r} in the task pool")

    def append(self, task: Task) -> Task:
        """Add a task at the end; its id must be new and not empty."""
        if not task.id.strip():
            raise UsageError("a task in the pool needs an id")
        if self.get(task.id) is not None:
            raise UsageError(f"task id {task.id!r} already exists in the task pool")
        self.tasks.append(task)
        return task

    def extend(self, tasks: Iterable[Task]) -> list[Task]:
        """Add several tasks (ids must be new); return them."""
        return [self.append(t) for t in tasks]

    def _state(self) -> tuple[Any, ...]:
        """A comparable snapshot; tasks are frozen so a shallow list copy is enough."""
        return (tuple(self.tasks), self.discipline, self.schema_version, copy.deepcopy(self.extra))


def new_task_id(now: datetime, taken: Iterable[str]) -> str:
    """Return a fresh ``T-<yyyymmdd>-<4 hex>`` id not in ``taken``."""
    used = set(taken)
    while True:
        candidate = f"T-{now:%Y%m%d}-{secrets.token_hex(2)}"
        if candidate not in used:
            return candidate


def backoff_delay(attempts: int, base_s: float = 600) -> timedelta:
    """Back-off after the ``attempts``-th failure: base·2^(attempts−1), capped at 24 h."""
    if attempts <= 0:
        return timedelta(0)
    # Float arithmetic and an exponent cap: a runaway count must not overflow timedelta.
    seconds = base_s * 2.0 ** min(attempts - 1, 1000)
    return timedelta(seconds=min(seconds, MAX_BACKOFF.total_seconds()))


def _utc_now() -> datetime:
    """Default clock of the store."""
    return datetime.now(UTC)


class Backlog:
    """The task pool file: locked, atomic, never silently reset."""

    def __init__(
        self,
        path: Path,
        lock_timeout: float = 20,
        *,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.path = path
        self.lock_timeout = lock_timeout
        self._clock = clock

    def load(self) -> BacklogData:
        """Read the pool; a missing file is an empty pool, a corrupt one raises StateFileError."""
        try:
            raw = read_json(self.path, what=_WHAT)
        except FileNotFoundError:
            return BacklogData()
        return BacklogData.from_json(raw, path=self.path)

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

    def add(self, task: Task, *, now: datetime | None = None) -> Task:
        """Add one task; an empty id gets ``T-<yyyymmdd>-<hex>``, a missing created_at gets now."""
        when = now if now is not None else self._clock()

        def mutate(data: BacklogData) -> Task:
            new = task
            if not new.id.strip():
                new = dataclasses.replace(new, id=new_task_id(when, (t.id for t in data.tasks)))
            if new.created_at is None:
                new = dataclasses.replace(new, created_at=format_instant(when))
            return data.append(new)

        return self.update(mutate)

    def set_status(self, task_id: str, status: Status, **fields: Any) -> Task:
        """Set a task's status and any other task fields; unknown id or field raises UsageError."""
        bad = (set(fields) - set(_FIELD_TYPES) - {"extra"}) | ({"id", "status"} & set(fields))
        if bad:
            raise UsageError(f"cannot set task field(s) {', '.join(sorted(bad))}")
        if status not in STATUSES:
            raise UsageError(f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")

        def mutate(data: BacklogData) -> Task:
            old = data.require(task_id)
            try:
                new = dataclasses.replace(old, status=status, **fields)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            return data.replace(new)

        return self.update(mutate)

    def mark_dispatched(
        self, task_id: str, session_id: str, instance: str, model: str | None, now: datetime
    ) -> Task:
        """Record that a task was sent to ``session_id`` on ``instance``."""
        return self.set_status(
            task_id,
            "dispatched",
            session_id=session_id,
            dispatched_at=format_instant(now),
            dispatched_to=instance,
            model=model or None,
            done_at=None,
        )

    def mark_done(self, task_id: str, now: datetime) -> Task:
        """Record that a task's session finished cleanly."""
        return self.set_status(task_id, "done", done_at=format_instant(now), not_before=None)

    def requeue(
        self,
        task_id: str,
        *,
        reason: str,
        infrastructure: bool,
        now: datetime,
        backoff_base_s: float = 600,
    ) -> Task:
        """Put a failed task back to pending; a task failure costs an attempt and backs off."""

        def mutate(data: BacklogData) -> Task:
            old = data.require(task_id)
            attempts = old.attempts if infrastructure else old.attempts + 1
            # An infrastructure failure (rate limit, instance down) is not the task's fault:
            # no attempt used and no waiting beyond what the model blackout already imposes.
            not_before = (
                None
                if infrastructure
                else format_instant(now + backoff_delay(attempts, backoff_base_s))
            )
            new = dataclasses.replace(
                old,
                status="pending",
                attempts=attempts,
                not_before=not_before,
                last_error=reason,
                session_id=None,
                dispatched_at=None,
                dispatched_to=None,
                model=None,
                done_at=None,
            )
            return data.replace(new)

        return self.update(mutate)

    def discard(self, task_id: str) -> bool:
        """Remove a task from the pool; False when it was not there."""

        def mutate(data: BacklogData) -> bool:
            kept = [t for t in data.tasks if t.id != task_id]
            found = len(kept) != len(data.tasks)
            data.tasks[:] = kept
            return found

        return self.update(mutate)

    def record_manual_dispatch(
        self,
        title: str,
        prompt: str,
        session_id: str,
        instance: str,
        model: str | None,
        now: datetime,
    ) -> Task:
        """Add a task for a manual ``dispatch`` so the pool matches what is really running."""
        stamp = format_instant(now)

        def mutate(data: BacklogData) -> Task:
            task = Task(
                id=new_task_id(now, (t.id for t in data.tasks)),
                title=title.strip() or prompt.strip().splitlines()[0][:80] or "manual dispatch",
                status="dispatched",
                prompt=prompt,
                session_id=session_id,
                dispatched_at=stamp,
                dispatched_to=instance,
                model=model or None,
                created_at=stamp,
            )
            return data.append(task)

        return self.update(mutate)


def _priority_rank(task: Task) -> int:
    """0 for P0 ... 3 for P3."""
    return PRIORITIES.index(task.priority)


def readiness(task: Task, tasks: Sequence[Task], now: datetime) -> str:
    """Return "" when a task may be dispatched now, else a short reason why not."""
    if task.status != "pending":
        return f"status is {task.status}"
    not_before = _epoch(task.not_before)
    if not_before is not None and not_before > now.timestamp():
        return f"backing off until {format_instant(parse_instant(task.not_before) or now)}"
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
    for index, task in enumerate(tasks):
        if readiness(task, tasks, now):
            continue
        tier = 0 if task.instance == instance else 1 if not task.instance else 2
        created = _epoch(task.created_at)
        ranked.append(
            (tier, _priority_rank(task), float("-inf") if created is None else created, index, task)
        )
    ranked.sort(key=lambda r: r[:4])
    return [r[4] for r in ranked[:free]]


def is_generated_id(task_id: str) -> bool:
    """Tell whether an id has the hub's generated ``T-<yyyymmdd>-<hex>`` form."""
    return bool(_TASK_ID_RE.match(task_id))


def is_blocked(task: Task, max_attempts: int) -> bool:
    """A pending task that used up its attempts waits for a human."""
    return task.status == "pending" and task.attempts >= max_attempts
