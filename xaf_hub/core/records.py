"""Plain records shared by every layer: sessions, instance summaries, snapshots."""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar

from xaf_hub.core.clock import MAX_TIME_MS, iso_time
from xaf_hub.core.outcomes import Run
from xaf_hub.errors import Cause, UsageError

_P = TypeVar("_P")

# A session id is shown no shorter than this ("ses_" and 8 characters of its time part).
ID_PREFIX_MIN = 12

RunState = Literal["idle", "busy", "retry"]
RequestKind = Literal["permission", "question"]


def sane_ms(value: Any) -> int:
    """A server's epoch-milliseconds value, or 0 (unknown) when not a number in range."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return 0
    # A tuple, not ``int | float`` (a new union object per call): this runs for every time
    # field of every session listed.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return int(value) if 0 < value <= MAX_TIME_MS else 0  # NaN and infinities fail the test


@dataclass(frozen=True)
class Waiting:
    """A request a session's run waits on for a person to answer (architecture §4).

    ``permission``: a tool asks leave (``permission`` names it: bash, edit, ...; ``patterns``
    what it would touch; ``always`` what an "always" answer would allow from now on).
    ``question``: the agent's question tool; ``choices`` holds each question's option labels.
    ``asked`` is what is asked as the server said it, lines and all (not yet made safe for a
    terminal: views do that). ``whole``: the hub holds all a rule must see of it (a bash
    request's whole command, another permission's every pattern); a rule approves nothing less.
    """

    kind: RequestKind
    request_id: str
    asked: str
    since: int = 0  # epoch ms the tool began waiting; 0 unknown
    permission: str = ""
    patterns: tuple[str, ...] = ()
    always: tuple[str, ...] = ()
    choices: tuple[tuple[str, ...], ...] = ()
    whole: bool = False

    def to_json(self) -> dict[str, Any]:
        """The export form: the record's ``waiting`` field."""

        return {
            "kind": self.kind,
            "request_id": self.request_id,
            "asked": self.asked,
            "since": self.since,
            "since_at": iso_time(self.since),
            "permission": self.permission,
            "patterns": list(self.patterns),
            "always": list(self.always),
            "options": [list(c) for c in self.choices],
            "whole": self.whole,
        }


@dataclass(frozen=True)
class Room:
    """A task's own worktree on its server: its folder, its branch, the project checkout it
    was made from and the commit it started from (``ops.rooms``)."""

    directory: str
    branch: str
    checkout: str
    base: str = ""


@dataclass(frozen=True)
class Part:
    """One part of an opencode message: text (``synthetic`` when the server wrote it), a tool
    call (``tool``, ``call_id``, its ``state`` object) or a file (``path``)."""

    type: str
    text: str = ""
    synthetic: bool = False
    tool: str = ""
    call_id: str = ""
    state: Mapping[str, Any] = field(default_factory=dict)
    path: str = ""


@dataclass(frozen=True)
class Message:
    """One opencode message, read once from the wire (``fleet.wire.message_of``). Times are
    ms since the epoch (0: none; ``completed`` 0 while it runs); ``model`` "provider/model"
    or ""; ``error`` the server's error object of a failed answer."""

    role: str
    id: str = ""
    session_id: str = ""
    created: int = 0
    completed: int = 0
    model: str = ""
    cost: float | None = None
    tokens: int = 0
    finish: str = ""
    error: Mapping[str, Any] | None = None
    parts: tuple[Part, ...] = ()


@dataclass(frozen=True)
class SessionRecord:
    """One opencode session, normalised across API dialects.

    Times are milliseconds since the epoch (0 when the server gave none).
    """

    instance: str
    id: str
    title: str
    directory: str
    created: int = 0
    updated: int = 0
    cost: float | None = 0.0  # USD; None: unknown (missing or absurd), never read as 0
    running: bool = False
    run_state: RunState = "idle"
    retry_message: str = ""
    retry_next: int = 0
    parent_id: str = ""
    model: str = ""
    outcome: Run | Literal[""] = ""  # its last run as its messages say; "" not read
    project: bool = False
    branch: str = ""  # the branch of the worktree it works in ("": not in a worktree)
    owner: str = ""  # the configured project it belongs to ("": none), exported as "project"
    waiting: Waiting | None = None  # the request its run waits on, if any

    def to_json(self) -> dict[str, Any]:
        """Return the export form (architecture §3 field names), with each epoch-ms time also
        as ISO 8601 (`created_at`, `updated_at`, `retry_next_at`; null when unknown)."""

        # Every field is a str/int/float/bool: no deep copy needed (asdict's is slow on a
        # whole snapshot).
        doc = {_EXPORTED.get(name, name): getattr(self, name) for name in _SESSION_EXPORT}
        doc["project"] = self.owner or None  # the project's name, in the owner's place
        doc["created_at"] = iso_time(self.created)
        doc["updated_at"] = iso_time(self.updated)
        doc["retry_next_at"] = iso_time(self.retry_next)
        if self.waiting is not None:  # in its place among the fields, as its export form
            doc["waiting"] = self.waiting.to_json()
        return doc


_SESSION_EXPORT = tuple(f.name for f in fields(SessionRecord) if f.name != "project")
_EXPORTED = {"owner": "project"}  # a field exported under another name


@dataclass(frozen=True)
class InstanceSummary:
    """What one scan learnt about one instance."""

    name: str
    url: str
    reachable: bool
    reason: str = ""
    cause: Cause | None = None  # what ``reason`` says, as the code decisions read
    version: str = ""
    api: str = ""
    total_sessions: int = 0
    project_sessions: int = 0
    running_total: int = 0
    running_project: int = 0
    limit: int = 2
    danger: bool = False
    note: str = ""
    release: str = ""  # the release and the run-state behaviour detected (xaf_hub.releases)
    run_state_unknown: str = ""  # why run state could not be read: counted full (fail closed)
    waiting: int = 0  # project sessions whose run waits for a person (they still count)
    waiting_unknown: str = ""  # why pending requests could not be read ("" when they were)

    def to_json(self) -> dict[str, Any]:
        """Return the export form."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class SpendSlots:
    """Project sessions' cost grouped by the quarter hour of their last activity
    (``updated``), for the sessions active at or after ``since_ms``: today's spend without the
    sessions themselves, on any clock (every time zone's midnight falls on a quarter hour).
    Each slot is (its start in epoch ms, known USD, sessions of unknown cost, sessions);
    ``ops.budget.spend_slots`` makes them, ``ops.budget.slots_today`` sums them."""

    since_ms: int
    slots: tuple[tuple[int, float, int, int], ...] = ()


@dataclass(frozen=True)
class Tally:
    """An instance's counts when its scan holds only some of its sessions: the live board's
    summary (``ops.live_board``) keeps the running ones and these, what `status` reads."""

    total_sessions: int
    project_sessions: int
    running_total: int
    running_project: int
    waiting: int  # running project sessions whose run waits for a person
    spend: SpendSlots | None = None  # None: not counted (``Tally.of``)

    @classmethod
    def of(cls, sessions: Iterable[SessionRecord]) -> Tally:
        """The counts of ``sessions`` (all of an instance's), the one place they are counted."""
        total = project = running_total = running = waiting = 0
        for s in sessions:
            total += 1
            running_total += s.running
            if s.project:
                project += 1
                running += s.running
                waiting += s.running and s.waiting is not None
        return cls(total, project, running_total, running, waiting)


def source_of(taken: int, total: int) -> str:
    """Where a view of ``total`` instances came from: "live" (all from a live view), "scan"
    (none) or "mixed"."""
    return "scan" if not taken else "live" if taken == total else "mixed"


@dataclass(frozen=True)
class Snapshot:
    """The result of scanning the fleet once."""

    generated_at: int
    instances: tuple[InstanceSummary, ...]
    sessions: tuple[SessionRecord, ...] = field(default_factory=tuple)
    warnings: tuple[str, ...] = field(default_factory=tuple)
    # Seconds since each instance taken from a live view (the live board, ``serve``'s own
    # follower) was confirmed current; an instance absent here was scanned.
    live: Mapping[str, float] = field(default_factory=dict, compare=False)

    @property
    def source(self) -> str:
        """Where the view came from: "live", "mixed" or "scan" (``source_of``)."""
        return source_of(len(self.live), len(self.instances))

    @property
    def live_age(self) -> float | None:
        """The oldest confirmation among the instances taken live (None: all scanned)."""
        return max(self.live.values()) if self.live else None

    def source_json(self) -> dict[str, Any]:
        """What a JSON document says of its source (as `status --json` says it)."""
        age = self.live_age
        return {
            "source": self.source,
            "live_age_seconds": None if age is None else round(age, 1),
            "live_instances": sorted(self.live),
        }

    def source_words(self) -> str:
        """"live, 2 s old" or "live for lan-a, lan-b (2 s old), the rest scanned" ("" when
        everything was scanned)."""
        if self.live_age is None:
            return ""
        age = f"{self.live_age:.0f} s old"
        if self.source == "live":
            return f"live, {age}"
        return f"live for {', '.join(sorted(self.live))} ({age}), the rest scanned"

    @property
    def unreachable(self) -> list[dict[str, str]]:
        """Instances that did not answer, with their reason."""
        return [{"instance": i.name, "reason": i.reason} for i in self.instances if not i.reachable]

    def counts(self, by: Literal["instance", "owner"] = "instance",
               names: Iterable[str] | None = None) -> dict[str, tuple[int, int]]:
        """(project sessions, busy ones: the server reports them busy or retrying) per
        instance or per project (``owner``); ``names`` (default: the instances) come first,
        each even with none."""
        first = [i.name for i in self.instances] if names is None else names
        counts = dict.fromkeys(first, (0, 0))
        for s in self.project_sessions():
            n, busy = counts.get(key := getattr(s, by), (0, 0))
            counts[key] = (n + 1, busy + (s.running or s.run_state != "idle"))
        return counts

    def project_sessions(self, instance: str | None = None) -> list[SessionRecord]:
        """Project sessions, newest first, optionally of one instance."""
        rows = [
            s for s in self.sessions if s.project and (instance is None or s.instance == instance)
        ]
        return sorted(rows, key=lambda s: s.updated, reverse=True)


def running_project(sessions: Iterable[SessionRecord]) -> int:
    """How many of ``sessions`` are project sessions the server reports running."""
    return sum(1 for s in sessions if s.project and s.running)


def find_session(
    places: Iterable[tuple[_P, Iterable[SessionRecord]]], wanted: str
) -> tuple[_P, SessionRecord] | None:
    """The session whose id is ``wanted``, with its place (an instance's scan or view); else
    the one whose id starts with ``wanted``. None when no id does; UsageError (exit 4) naming
    the ids when several different ones start with it."""
    pairs = [(place, s) for place, sessions in places for s in sessions]
    exact = next(((place, s) for place, s in pairs if s.id == wanted), None)
    if exact is not None or not wanted:
        return exact
    hits = [(place, s) for place, s in pairs if s.id.startswith(wanted)]
    ids = sorted({s.id for _, s in hits})
    if len(ids) > 1:
        more = f" and {len(ids) - 5} more" if len(ids) > 5 else ""
        raise UsageError(f"{wanted} is the start of {len(ids)} session ids ({', '.join(ids[:5])}"
                         f"{more}): give more of it")
    return hits[0] if hits else None


def prefix_width(ids: Iterable[str], shown: Iterable[str]) -> int:
    """The fewest leading characters that tell each of ``shown`` apart from every other id of
    ``ids`` (at least ID_PREFIX_MIN): the width a table may cut session ids to."""
    known = sorted(set(ids))
    need = ID_PREFIX_MIN
    for sid in set(shown):
        i = bisect.bisect_left(known, sid)
        for other in known[max(i - 1, 0) : i + 2]:
            if other != sid:
                need = max(need, len(os.path.commonprefix([sid, other])) + 1)
    return need
