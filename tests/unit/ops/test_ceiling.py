"""A run's cost from its prompt (``ops.ceiling.run_cost``) and the ceiling's judgment: labelled
message lists as opencode returns them (oldest first), with the run's cost a person would add."""

from __future__ import annotations

from typing import Any

import pytest

from xaf_hub.ops.ceiling import judge_run, run_cost


def user() -> dict[str, Any]:
    return {"info": {"role": "user"}, "parts": []}


def step(cost: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"role": "assistant"}
    if cost is not ...:
        info["cost"] = cost
    return {"info": info, "parts": []}


RUNS: list[tuple[str, list[dict[str, Any]], float | None]] = [
    ("one step", [user(), step(0.05)], 0.05),
    ("earlier runs do not count", [user(), step(1.0), user(), step(0.02), step(0.03)], 0.05),
    ("the prompt just sent, no answer yet", [user(), step(0.5), user()], None),
    ("a release that reports no cost (key missing)", [user(), step(...)], None),
    ("a broken cost is unknown, not 0", [user(), step("0.5"), step(-1)], None),
    ("a broken step among good ones", [user(), step(0.04), step(float("nan"))], 0.04),
    ("a free model: known, zero", [user(), step(0)], 0.0),
    ("older than what was read: the newest steps", [step(0.1), step(0.2)], pytest.approx(0.3)),
    ("no messages", [], None),
]


@pytest.mark.parametrize(("case", "messages", "cost"), RUNS, ids=[r[0] for r in RUNS])
def test_run_cost(case: str, messages: list[dict[str, Any]], cost: Any) -> None:
    assert run_cost(messages) == cost, case


@pytest.mark.parametrize(
    ("ceiling", "cost", "over"),
    [
        (0.05, 0.06, True),
        (0.05, 0.05, False),  # at the ceiling is within it
        (0.05, None, False),  # unknown cost: shown, never stopped
        (None, 100.0, False),  # no ceiling
        (0.0, 0.01, True),
        (0.0, 0.0, False),
    ],
)
def test_judge_run(ceiling: float | None, cost: float | None, over: bool) -> None:
    assert judge_run(ceiling, cost) is over
