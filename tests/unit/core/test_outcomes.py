"""The one vocabulary of outcomes (core.outcomes): each value read right and told from its
neighbours, its words in both languages, and nothing green that a person still has to see."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.core.catalogue import TEXT as WORDS
from xaf_hub.core.outcomes import (
    RUNS,
    STOP_WINDOW_MS,
    TASK_STATES,
    TONES,
    Run,
    Stop,
    TaskState,
    run_outcome,
    run_words,
    task_state,
    task_words,
    tone,
)
from xaf_hub.core.runstate import outcome_of, refusal_text
from xaf_hub.fleet.wire import messages_of

# Measured on opencode 1.18.33 (tests/fleet.py): what a refused request leaves in the messages.
MEASURED = json.loads(
    (Path(__file__).parent / "fixtures" / "refused-1.18.33.json").read_text("utf-8")
)["runs"]


def user() -> dict[str, Any]:
    return {"info": {"role": "user", "id": "u"}, "parts": [{"type": "text", "text": "go"}]}


def answer(
    *, finish: str | None = "stop", error: dict[str, Any] | None = None, completed: bool = True,
    tool: str = "",
) -> dict[str, Any]:
    info: dict[str, Any] = {"role": "assistant", "id": "a", "time": {"created": 1}}
    if completed:
        info["time"]["completed"] = 2
    if finish:
        info["finish"] = finish
    if error:
        info["error"] = error
    parts: list[dict[str, Any]] = [{"type": "step-start"}]
    if tool:
        parts.append({"type": "tool", "tool": "bash", "state": {"status": tool, "error": "no"}})
    return {"info": info, "parts": parts}


ABORT = {"name": "MessageAbortedError", "data": {"message": "aborted"}}
E429 = {"name": "APIError", "data": {"message": "Rate limit exceeded", "statusCode": 429}}
E500 = {"name": "APIError", "data": {"message": "upstream", "statusCode": 500}}


@pytest.mark.parametrize(
    ("messages", "outcome"),
    [
        (MEASURED["denied"], "denied"),
        (MEASURED["question_dismissed"], "denied"),
        # Denied with a message: the model heard it and finished its answer.
        (MEASURED["denied_with_feedback"], "succeeded"),
        ([user(), answer()], "succeeded"),
        # A tool that failed in a step the model went on from is no refusal.
        ([user(), answer(finish="tool-calls", tool="error"), answer()], "succeeded"),
        # A step of tool calls that all ran, with the run over: not a refusal either.
        ([user(), answer(finish="tool-calls", tool="completed")], "succeeded"),
        ([user(), answer(error=E500)], "failed"),
        ([user(), answer(error=E429)], "rate_limited"),
        ([user(), answer(error=ABORT, finish=None)], "interrupted"),
        ([user(), answer(finish=None)], "interrupted"),  # aborted while it waited to retry
        ([user(), answer(completed=False, finish=None)], "running"),
        ([user()], "not_started"),
        ([], "not_started"),
    ],
)
def test_a_runs_outcome_from_its_messages(messages: list[dict[str, Any]], outcome: Run) -> None:
    assert outcome_of(messages_of(messages)) == outcome


def test_a_denied_run_is_not_succeeded_and_says_what_was_refused() -> None:
    """The server marks a denied run's last step finished ("tool-calls"), which was read as
    succeeded: green on the page, and a task settled as done."""
    raw = MEASURED["denied"]
    assert raw[-1]["info"]["finish"] == "tool-calls" and "error" not in raw[-1]["info"]
    denied = messages_of(raw)
    assert outcome_of(denied) != "succeeded" and tone(outcome_of(denied)) != "good"
    assert refusal_text(denied) == (
        "bash: The user rejected permission to use this specific tool call."
    )
    assert refusal_text(messages_of(MEASURED["question_dismissed"])) == (
        "question: The user dismissed this question"
    )
    assert refusal_text(messages_of(MEASURED["denied_with_feedback"])) == ""


NOW_MS = 1_800_000_000_000


def stop(kind: str, seconds_before: float) -> Stop:
    return Stop(kind, (NOW_MS / 1000) - seconds_before, "alice@box")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("read", "running", "the_stop", "outcome"),
    [
        ("succeeded", True, None, "running"),  # the server runs it now, whatever it said last
        ("", True, None, "running"),
        ("", False, None, None),  # not read: no word for it
        ("running", False, None, "interrupted"),  # never completed, nothing runs: stopped
        ("interrupted", False, stop("ceiling", 3), "ceiling"),
        ("interrupted", False, stop("person", 3), "interrupted"),
        # A ceiling's stop from before the run's last change is another run's.
        ("interrupted", False, stop("ceiling", STOP_WINDOW_MS / 1000 + 60), "interrupted"),
        ("succeeded", False, stop("ceiling", 3), "succeeded"),  # its abort did not take
        ("denied", False, None, "denied"),
        ("failed", False, stop("person", 3), "failed"),
    ],
)
def test_the_outcome_every_view_shows(
    read: Any, running: bool, the_stop: Stop | None, outcome: Run | None
) -> None:
    assert run_outcome(read, running=running, stop=the_stop, updated_ms=NOW_MS) == outcome


ROW = {"status": "pending", "landing": None, "parked": False, "person": False,
       "blocked": False, "verified": None}


@pytest.mark.parametrize(
    ("fields", "state"),
    [
        ({}, "waiting"),
        ({"blocked": True}, "blocked"),
        ({"parked": True, "blocked": True}, "person"),
        ({"status": "dispatched"}, "in_progress"),
        ({"status": "dispatched", "person": True}, "person"),
        # Finished without a repository (or on a person's word): the hub never calls it done.
        ({"status": "done"}, "unverified"),
        ({"status": "done", "verified": False}, "unverified"),
        ({"status": "done", "verified": True}, "verified"),
        ({"status": "dispatched", "landing": "ready", "verified": True}, "ready_to_land"),
        ({"status": "dispatched", "landing": "conflict"}, "conflict"),
        ({"status": "dispatched", "landing": "person"}, "land_by_person"),
        ({"status": "done", "landing": "landed", "verified": True}, "landed"),
        ({"status": "pending", "landing": "dropped", "parked": True}, "dropped"),
    ],
)
def test_a_tasks_state_from_its_row(fields: dict[str, Any], state: TaskState) -> None:
    assert task_state(**{**ROW, **fields}) == state


def test_nothing_is_green_that_a_person_still_has_to_look_at() -> None:
    assert {v for v, t in TONES.items() if t == "good"} == {"succeeded", "verified", "landed"}
    for value in ("denied", "ceiling", "interrupted", "unverified", "person", "blocked",
                  "land_by_person"):
        assert tone(value) == "person", value  # type: ignore[arg-type]
    assert tone("failed") == "bad"
    assert set(TONES) == set(RUNS) | set(TASK_STATES)


def test_every_value_has_its_words_in_both_languages() -> None:
    for value in RUNS:
        assert all(WORDS[f"run.{value}"]) and all(WORDS[f"run.{value}_d"])
        assert run_words(value) != run_words(value, "zh")
    for state in TASK_STATES:
        assert all(WORDS[f"task.{state}"]) and task_words(state) != task_words(state, "zh")
    assert len({run_words(v) for v in RUNS}) == len(RUNS)  # no two values read alike
    assert len({task_words(s) for s in TASK_STATES}) == len(TASK_STATES)
    assert task_words("unverified") == "finished, not verified"
    assert run_words("ceiling") == "stopped at its ceiling"
