"""The one vocabulary of what happened: a run's outcome (``Run``) and a task's state
(``TaskState``), as values with their words and tone (pure).

Only a run that succeeded, a task done and verified and a task landed are ``good``
(docs/architecture.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

from xaf_hub.core.catalogue import text

Run = Literal[
    "succeeded", "failed", "denied", "ceiling", "interrupted", "rate_limited", "running",
    "not_started",
]
# In the order a task goes through them (the page's work queue lists them so).
TaskState = Literal[
    "waiting", "in_progress", "person", "blocked", "unverified", "verified", "ready_to_land",
    "conflict", "land_by_person", "landed", "dropped",
]
Tone = Literal["good", "person", "bad", "neutral"]
StopKind = Literal["person", "ceiling"]

# The one phrase for the "waiting" verdict and class: every view says it this way.
WAITING_WORDS = "waiting for a person"

RUNS: Final[tuple[Run, ...]] = get_args(Run)
TASK_STATES: Final[tuple[TaskState, ...]] = get_args(TaskState)

TONES: Final[dict[str, Tone]] = {
    "succeeded": "good",
    "failed": "bad",
    "denied": "person",
    "ceiling": "person",
    "interrupted": "person",
    "rate_limited": "person",
    "running": "neutral",
    "not_started": "neutral",
    "waiting": "neutral",
    "blocked": "person",
    "person": "person",
    "in_progress": "neutral",
    "unverified": "person",
    "verified": "good",
    "ready_to_land": "neutral",
    "conflict": "neutral",
    "land_by_person": "person",
    "landed": "good",
    "dropped": "neutral",
}

# A stop the hub recorded applies to a run whose session last changed at most this long
# after it (the abort changes the session; clocks of hub and server may differ a little).
STOP_WINDOW_MS: Final = 5 * 60_000


@dataclass(frozen=True)
class Stop:
    """A stop the hub recorded for a session: a person's ``interrupt``, or the hub's own past
    the run ceiling (``ops.decisions.hub_stops``); ``at`` in epoch seconds."""

    kind: StopKind
    at: float
    who: str = ""


def run_words(value: Run, lang: str = "en") -> str:
    """The word for a run's outcome."""
    return text(lang, f"run.{value}")


def task_words(value: TaskState, lang: str = "en") -> str:
    """The words for a task's state."""
    return text(lang, f"task.{value}")


def tone(value: Run | TaskState) -> Tone:
    """Whether a value is good, needs a person, is bad, or is neutral."""
    return TONES[value]


def stop_applies(stop: Stop | None, updated_ms: int) -> bool:
    """Whether the hub's ``stop`` ended the run of a session that last changed at
    ``updated_ms``: made at most ``STOP_WINDOW_MS`` before that change (a later run moves it)."""
    return stop is not None and stop.at * 1000 >= updated_ms - STOP_WINDOW_MS


def run_outcome(
    read: Run | Literal[""], *, running: bool, stop: Stop | None = None, updated_ms: int = 0
) -> Run | None:
    """A session's last run as every view shows it (None: its messages were not read).

    ``read`` is what its messages say (``core.runstate.outcome_of``), ``running`` whether the
    server runs it now; a run whose last message never completed while nothing runs was
    stopped mid-run. ``stop`` is the hub's latest recorded stop of the session: one made at
    most ``STOP_WINDOW_MS`` before the session last changed (``updated_ms``) says who
    interrupted the run, and a ceiling's makes it ``ceiling``.
    """
    if running:
        return "running"
    if not read:
        return None
    if read == "running":
        read = "interrupted"
    ceiling = stop is not None and stop.kind == "ceiling" and stop_applies(stop, updated_ms)
    return "ceiling" if read == "interrupted" and ceiling else read


_LANDINGS: Final[dict[str, TaskState]] = {
    "ready": "ready_to_land",
    "conflict": "conflict",
    "person": "land_by_person",
    "landed": "landed",
}


def task_state(
    *,
    status: str,
    landing: str | None,
    parked: bool,
    person: bool,
    blocked: bool,
    verified: bool | None,
) -> TaskState:
    """Where a task stands, from its row (pure): its way to the base branch first (worktrees),
    then the status. A done task is ``verified`` only when the hub found its work on the
    repository; done on the agent's or a person's word it is ``unverified``."""
    if landing is not None:
        return _LANDINGS.get(landing, "dropped")
    if status == "done":
        return "verified" if verified is True else "unverified"
    if status == "dispatched":
        return "person" if person else "in_progress"
    if parked:
        return "person"
    return "blocked" if blocked else "waiting"


def waiting_count(n: int) -> str:
    """'1 waiting for a person' (status's reason, the patrol's report)."""
    return f"{n} {WAITING_WORDS}"
