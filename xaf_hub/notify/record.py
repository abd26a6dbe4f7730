"""What a round did (``RoundLog`` and its entries): the record notify derives its messages from,
and the patrol's report reads. Notify owns it so it reads a round without knowing who ran it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from xaf_hub.core.records import SessionRecord
from xaf_hub.errors import Cause
from xaf_hub.ops.budget import BudgetLine

if TYPE_CHECKING:
    from xaf_hub.ops.context import OpsContext
    from xaf_hub.store.tasks import Task


@dataclass(frozen=True)
class StepOutcome:
    """How one job ended: ok, failed (with its exit code), skipped or not run."""

    name: str
    status: str
    code: int = 0
    error: str = ""
    seconds: float = 0.0
    cause: Cause | None = None  # a failed step's UnreachableError, as its code


# Why a row is left to a person, as a code beside its words (``Action.detail``), which the
# page says in the reader's language: a person's decision (interrupted, steered, decided), a
# run that stopped (unresumed) or ended on a refused request (denied), a claim the repository
# does not bear out (a verification state), a commit another task has (credited), the
# project's check (check_failed), an instance the patrol never writes (production), a session
# it resumed once already (resumed_once).
Why = Literal[
    "", "interrupted", "steered", "decided", "unresumed", "denied", "missing", "ambiguous",
    "no_claim", "old", "locked", "diverged", "too_many", "credited", "check_failed",
    "production", "resumed_once",
]


@dataclass(frozen=True)
class Action:
    """One thing a job did or decided not to do, for the report."""

    step: str
    kind: str  # heal | resume | add | dispatch | done | requeue | blocked | keep
    result: str  # ok | waiting | skipped | failed
    instance: str = ""
    session: str = ""
    task: str = ""
    title: str = ""
    detail: str = ""
    model: str = ""
    from_model: str = ""
    why: Why = ""

    @classmethod
    def of(
        cls, step: str, kind: str, result: str, about: SessionRecord | Task,
        instance: str | None = None, session: str = "", **fields: Any,
    ) -> Action:
        """An Action about one session (its instance, id and title) or one pool task (its id
        and title; where it was dispatched, unless ``instance`` and ``session`` name where it
        goes now)."""
        if isinstance(about, SessionRecord):
            return cls(step, kind, result, about.instance, about.id, title=about.title, **fields)
        if instance is None:
            instance, session = about.dispatched_to or "", about.session_id or ""
        return cls(step, kind, result, instance, session, task=about.id, title=about.title,
                   **fields)


@dataclass(frozen=True)
class SessionLine:
    """One project session as check_agents classified it."""

    instance: str
    session: str
    title: str
    state: str  # running | waiting | stale_busy | finished | failed | interrupted | idle
    detail: str
    model: str
    updated_ms: int
    # state "waiting": the request its run waits on, and how a person answers it
    request: str = ""
    answer: str = ""
    project: str = ""  # the configured project it belongs to


@dataclass(frozen=True)
class InstanceLine:
    """One instance's load as the patrol last saw it."""

    name: str
    reachable: bool
    reason: str
    running_project: int
    reserved: int
    limit: int
    production: bool


@dataclass
class RoundLog:
    """What one round did so far; the jobs append, the report and notify read."""

    started: datetime
    finished: datetime | None = None
    steps: list[StepOutcome] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    sessions: list[SessionLine] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # (instance, session) prompted this round: a later job must not judge or prompt them again.
    touched: set[tuple[str, str]] = field(default_factory=set)
    # (instance, session) whose heal or resume waits for a free slot (tried again next round).
    deferred: set[tuple[str, str]] = field(default_factory=set)
    # Pool tasks fill_slots left pending because a daily budget was reached -> the refusal.
    budget_held: dict[str, str] = field(default_factory=dict)
    # What the round's last scan showed (replaced by each scan): every instance's load, and
    # today's spend against the daily budgets, the project's line first, then one per
    # instance (ops.budget); with several projects every project's line, then each project's
    # own (``Cycle.note_instances``). The chat's budget notices read it.
    instances: list[InstanceLine] = field(default_factory=list)
    spend: list[BudgetLine] = field(default_factory=list)

    def acted(self) -> int:
        """Grows with every prompt sent and every action that did or failed to do something."""
        return len(self.touched) + sum(1 for a in self.actions if a.result in ("ok", "failed"))

    def add(
        self, pctx: OpsContext, step: str, kind: str, result: str, about: SessionRecord | Task,
        *where: str, **fields: Any,
    ) -> None:
        """Record the action ``Action.of`` builds from these, and log it as one line."""
        self.put(pctx, Action.of(step, kind, result, about, *where, **fields))

    def put(self, pctx: OpsContext, action: Action) -> None:
        """Record an action and log it as one line."""
        self.actions.append(action)
        where = "/".join(p for p in (action.instance, action.session) if p)
        what = " ".join(p for p in (action.task, where) if p)
        detail = f" - {action.detail}" if action.detail else ""
        pctx.log(pctx.redact(f"{action.step}: {action.kind} {what}: {action.result}{detail}"))

    def note(self, pctx: OpsContext, text: str) -> None:
        """Record a warning met on the way (the round goes on; the report lists it)."""
        line = pctx.redact(text)
        self.notes.append(line)
        pctx.log(f"note: {line}")

    def error(self, pctx: OpsContext, step: str, text: str) -> None:
        """Record a non-fatal error of one item (the job goes on with the others); ``step`` ""
        for one of the round itself."""
        line = pctx.redact(f"{step}: {text}" if step else text)
        self.errors.append(line)
        pctx.log(f"error: {line}")
