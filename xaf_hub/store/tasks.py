"""The task pool's file format: one task record (``Task``), the whole document (``BacklogData``)
and their checks.

``Task.from_json`` is strict: a bad value is a ``StateFileError`` naming the file, the task index
and the key. Unknown keys survive every rewrite (docs/architecture.md §9).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal, cast, get_args

from xaf_hub.config.reader import choice_problem, json_type, type_problem
from xaf_hub.core.clock import format_instant, parse_instant
from xaf_hub.errors import StateFileError, UsageError

__all__ = [
    "PRIORITIES",
    "SCHEMA_VERSION",
    "STATUSES",
    "BacklogData",
    "Priority",
    "Status",
    "Task",
    "TASK_KEYS",
    "WHAT",
    "first_line",
    "format_instant",
    "found",
    "instant_seconds",
    "is_generated_id",
    "new_task_id",
    "of_project",
    "parse_instant",
    "project_of",
]

SCHEMA_VERSION: Final = 1

Priority = Literal["P0", "P1", "P2", "P3"]
Landing = Literal["ready", "conflict", "person", "landed", "dropped"]
LANDINGS: Final[tuple[str, ...]] = get_args(Landing)
Status = Literal["pending", "dispatched", "done"]
PRIORITIES: Final[tuple[str, ...]] = get_args(Priority)
STATUSES: Final[tuple[str, ...]] = get_args(Status)

WHAT: Final = "task pool"
_TASK_ID_RE = re.compile(r"^T-\d{8}-[0-9a-f]{4}$")

# The JSON types each annotation of ``Task`` accepts; a field's "| None" makes it nullable.
_JSON_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "str": (str,),
    "Priority": (str,),
    "Status": (str,),
    "Landing": (str,),
    "int": (int,),
    "bool": (bool,),
    "tuple[str, ...]": (list, tuple),
}
_INSTANT_KEYS: Final = ("dispatched_at", "done_at", "not_before", "created_at", "steered_at")
_CHOICES: Final = {"priority": PRIORITIES, "status": STATUSES, "landing": LANDINGS}


def instant_seconds(value: str | int | None) -> float | None:
    """Seconds since the epoch for a stored time (validated on load, so parsing succeeds)."""
    parsed = parse_instant(value)
    return None if parsed is None else parsed.timestamp()


def _field_problem(key: str, value: object, *, allow_empty_id: bool = False) -> tuple[str, str]:
    """(the key or item, what is wrong) when ``value`` is not valid for task key ``key``;
    ("", "") when it is."""
    types, nullable = _FIELD_TYPES[key]
    if value is None and nullable:
        return "", ""
    problem = type_problem(value, types)
    if not problem and key in _CHOICES:
        problem = choice_problem(value, _CHOICES[key])
    if problem:
        return key, problem
    empty_ok = key == "id" and allow_empty_id
    if key in ("id", "title") and not cast(str, value).strip() and not empty_ok:
        return key, "must not be empty"
    if types == (int,) and cast(int, value) < 0:
        return key, f"must be 0 or more, got {value}"
    if key in _LIST_KEYS:
        for i, item in enumerate(cast(Sequence[object], value)):
            if not isinstance(item, str) or (key != "prompts" and not item.strip()):
                what = "a task id" if key == "depends_on" else "a text"
                return f"{key}[{i}]", f"expected {what}, got {json_type(item)}"
    if key in _INSTANT_KEYS:
        try:
            parse_instant(cast("str | int", value))
        except (ValueError, OverflowError, OSError):
            return key, f"not an ISO 8601 time or epoch milliseconds: {value!r}"
    return "", ""


@dataclass(frozen=True)
class Task:
    """One piece of work in the pool (architecture §8): its prompts, attempts and back-off.

    ``prompts`` are the texts sent for it by hand, in order (a dispatch, then each steer of its
    session); empty for a task added to the pool, whose text is ``prompt`` or the title.
    ``steered_at`` is when a person last steered its session by hand. ``infra_failures``
    counts infrastructure failures in a row; ``parked`` (the reason) keeps the patrol from
    sending it until someone sets it pending again. ``avoid_models`` are models that
    failed it by name (provider 401, model unavailable) and are skipped when choosing.
    """

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
    prompts: tuple[str, ...] = ()
    steered_at: str | None = None
    infra_failures: int = 0
    parked: str | None = None
    avoid_models: tuple[str, ...] = ()
    # Done: the commit the patrol found on project.repository (the top its check ran on),
    # every commit credited to the task (oldest first; empty before the hub kept them), and
    # whether it looked (True: found there; None: not checked, no repository or a person's word).
    commit: str | None = None
    commits: tuple[str, ...] = ()
    verified: bool | None = None
    # The expected branch's tip when the task was sent (its claims must be newer);
    # which rule decided its "done" or its wait for a person (one line); the project's check
    # of its claimed commit ("passed" / "failed"), that commit, the end of the check's output
    # and how many times a failure went back to the session.
    base: str | None = None
    judged: str | None = None
    check: str | None = None
    check_commit: str | None = None
    check_output: str | None = None
    check_retries: int | None = None
    # Its room (project.isolation "worktree"): the worktree's folder on its server, its branch
    # and the project checkout it was made from.
    worktree: str | None = None
    branch: str | None = None
    checkout: str | None = None
    # Bringing its verified branch onto the base branch (store.landing): "ready", "conflict"
    # (sent back to rebase), "person" (waits for one), "landed" or "dropped"; the base's commit
    # that carries the work; how many conflicts went back to the session.
    landing: Landing | None = None
    landed: str | None = None
    conflicts: int | None = None
    # Dispatched, and left to a person by the patrol (its work not verified, a person's stop, a
    # refused request...): why, in one line; None while the patrol goes on with it.
    person: str | None = None
    # The configured project it is for ("": the config's first project, as before projects).
    project: str = ""
    # Keys the hub does not know, kept verbatim so a rewrite never drops them.
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        """Refuse a record that would write an invalid pool file."""
        # Accept any sequence but keep a tuple, so the record stays immutable.
        for key in _LIST_KEYS:
            if isinstance(getattr(self, key), list):
                object.__setattr__(self, key, tuple(getattr(self, key)))
        for key in _FIELD_TYPES:
            # An empty id is allowed here only so Backlog.add can fill one in.
            bad, problem = _field_problem(key, getattr(self, key), allow_empty_id=True)
            if problem:
                raise ValueError(f"task {self.id!r}: {bad}: {problem}")
        clash = set(self.extra) & set(_FIELD_TYPES)
        if clash:
            raise ValueError(f"task {self.id!r}: extra repeats known keys {sorted(clash)}")

    def texts(self) -> tuple[str, ...]:
        """Every text of this piece of work, in the order it was given."""
        if self.prompts:
            return self.prompts
        return (self.prompt or self.title,)

    def work_text(self) -> str:
        """What a new session for this task is told: all its texts, in order."""
        return "\n\n".join(t for t in self.texts() if t.strip()) or self.title

    @classmethod
    def from_json(cls, raw: object, *, path: Path | str = "?", index: int = 0) -> Task:
        """Build a task from its JSON object; any problem names the file, index and key."""
        where = f"{WHAT} {path}: tasks[{index}]"
        if not isinstance(raw, dict):
            raise StateFileError(f"{where}: {type_problem(raw, (dict,))}")
        for key in ("id", "title"):
            if key not in raw:
                raise StateFileError(f"{where}: missing required key {key!r}")
        for key, value in raw.items():
            bad, problem = _field_problem(key, value) if key in _FIELD_TYPES else ("", "")
            if problem:
                raise StateFileError(f"{where}.{bad}: {problem}")
        # Lists become tuples in __post_init__.
        known = {k: v for k, v in raw.items() if k in _FIELD_TYPES}
        extra = {k: copy.deepcopy(v) for k, v in raw.items() if k not in _FIELD_TYPES}
        return cls(**known, extra=extra)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object stored in the pool file (known keys first, then extras)."""
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            unset = f.name in _UNSET_OMITTED and value in (None, ())
            if unset or (f.name, value) == ("project", ""):
                continue  # a pool file written before them stays as it was
            data[f.name] = list(value) if f.name in _LIST_KEYS else value
        data.update(copy.deepcopy(dict(self.extra)))
        return data


def _declared(annotation: str) -> tuple[tuple[type, ...], bool]:
    """(accepted JSON types, may be null) of a ``Task`` field's annotation."""
    parts = annotation.split(" | ")
    return tuple(t for p in parts if p != "None" for t in _JSON_TYPES[p]), "None" in parts


# Declared types of every known task key, from ``Task``'s annotations, checked the way the
# config is (config.reader.type_problem).
_FIELD_TYPES: Final = {
    f.name: _declared(str(f.type)) for f in dataclasses.fields(Task) if f.name != "extra"
}
TASK_KEYS: Final = frozenset(_FIELD_TYPES)
_NAMES: Final = tuple(_FIELD_TYPES)
# Keys holding an array of strings (kept as tuples in the record).
_LIST_KEYS: Final = tuple(k for k, (types, _) in _FIELD_TYPES.items() if list in types)
# Keys left out of the file while unset (null, empty): the verification of a done task, its
# room and landing, and why a person has it (the fields from ``commit`` to ``person``).
_UNSET_OMITTED: Final = _NAMES[_NAMES.index("commit") : _NAMES.index("person") + 1]


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
        where = f"{WHAT} {path}"
        if not isinstance(raw, dict):
            raise StateFileError(
                f"{where}: expected a JSON object at the top, got {json_type(raw)}"
            )
        version = raw.get("schema_version", SCHEMA_VERSION)
        if problem := type_problem(version, (int,)):
            raise StateFileError(f"{where}: schema_version: {problem}")
        if version != SCHEMA_VERSION:
            raise StateFileError(
                f"{where}: schema_version {version} is not supported (this xaf-hub reads "
                f"{SCHEMA_VERSION}); upgrade xaf-hub instead of editing the file"
            )
        discipline = raw.get("discipline")
        if discipline is not None and (problem := type_problem(discipline, (str,))):
            raise StateFileError(f"{where}: discipline: {problem}")
        raw_tasks = raw.get("tasks", [])
        if problem := type_problem(raw_tasks, (list,)):
            raise StateFileError(f"{where}: tasks: {problem}")
        tasks = [Task.from_json(item, path=path, index=i) for i, item in enumerate(raw_tasks)]
        seen: dict[str, int] = {}
        for i, task in enumerate(tasks):
            if (first := seen.setdefault(task.id, i)) != i:
                raise StateFileError(
                    f"{where}: tasks[{i}].id: duplicate id {task.id!r} (also tasks[{first}])"
                )
        known = ("schema_version", "discipline", "tasks")
        extra = {k: copy.deepcopy(v) for k, v in raw.items() if k not in known}
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
        return next((task for task in self.tasks if task.id == task_id), None)

    def require(self, task_id: str) -> Task:
        """Return the task with this id or raise UsageError."""
        return found(self.get(task_id), task_id)

    def replace(self, task: Task) -> Task:
        """Swap in a new version of an existing task (matched by id), keeping its place."""
        for i, old in enumerate(self.tasks):
            if old.id == task.id:
                self.tasks[i] = task
                return task
        return found(None, task.id)

    def append(self, task: Task) -> Task:
        """Add a task at the end; its id must be new and not empty."""
        if not task.id.strip():
            raise UsageError("a task in the pool needs an id")
        if self.get(task.id) is not None:
            raise UsageError(f"task id {task.id!r} already exists in the {WHAT}")
        self.tasks.append(task)
        return task

    def extend(self, tasks: Iterable[Task]) -> list[Task]:
        """Add several tasks (ids must be new); return them."""
        return [self.append(t) for t in tasks]

    def _state(self) -> tuple[Any, ...]:
        """A comparable snapshot; tasks are frozen so a shallow list copy is enough."""
        return (tuple(self.tasks), self.discipline, self.schema_version, copy.deepcopy(self.extra))


def found(task: Task | None, task_id: str) -> Task:
    """The row a look-up found, or the UsageError that names the missing id."""
    if task is None:
        raise UsageError(f"no task {task_id!r} in the {WHAT}")
    return task


def project_of(task: Task, projects: Sequence[str]) -> str:
    """The project ``task`` is for: its own, else the first of ``projects`` (a pool written
    before projects, or by a one-project config, names none)."""
    return task.project or (projects[0] if projects else "")


def of_project(tasks: Iterable[Task], project: str, projects: Sequence[str]) -> list[Task]:
    """The tasks of ``project``; with one project configured, every task is its."""
    return [t for t in tasks if len(projects) <= 1 or project_of(t, projects) == project]


def new_task_id(now: datetime, taken: Iterable[str]) -> str:
    """Return a fresh ``T-<yyyymmdd>-<4 hex>`` id not in ``taken``."""
    used = set(taken)
    while True:
        candidate = f"T-{now:%Y%m%d}-{os.urandom(2).hex()}"
        if candidate not in used:
            return candidate


def first_line(text: str, limit: int = 80) -> str:
    """A task's title from its text: the first non-empty line, shortened."""
    return next((line.strip()[:limit] for line in text.splitlines() if line.strip()), "")


def is_generated_id(task_id: str) -> bool:
    """Tell whether an id has the hub's generated ``T-<yyyymmdd>-<hex>`` form."""
    return bool(_TASK_ID_RE.match(task_id))
