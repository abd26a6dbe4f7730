"""A run's cost from its prompt (``ops.ceiling.run_cost``) and the ceiling's judgment: labelled
message lists as opencode returns them (oldest first), with the run's cost a person would add;
then whole runs with sub-agents on a fake server (``ceiling_support``): what they cost, and
how they are stopped."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.ops.ceiling_support import T0, Family, context, priced_run
from tests.unit.ops.ceiling_support import step as timed_step
from xaf_hub.core.records import SessionRecord
from xaf_hub.errors import UnreachableError
from xaf_hub.fleet.wire import messages_of
from xaf_hub.ops.ceiling import abort_run, judge_run, read_run, run_cost, stop_over_ceiling
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.decisions import load_decisions
from xaf_hub.store.tasks import Task


def user(*, synthetic: bool = False) -> dict[str, Any]:
    parts = [{"type": "text", "text": "a result", "synthetic": True}] if synthetic else []
    return {"info": {"role": "user"}, "parts": parts}


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
    # opencode posts a background sub-agent's result as a user message of synthetic text: the
    # server going on with the same run, not a new prompt.
    ("a sub-agent's result continues the run", [user(), step(0.02), user(synthetic=True),
                                                step(0.03)], 0.05),
]


@pytest.mark.parametrize(("case", "messages", "cost"), RUNS, ids=[r[0] for r in RUNS])
def test_run_cost(case: str, messages: list[dict[str, Any]], cost: Any) -> None:
    assert run_cost(messages_of(messages)) == cost, case


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


def root(sid: str = "ses_root", state: str = "idle") -> SessionRecord:
    return SessionRecord("a", sid, "work", "/srv/p/app", project=True, run_state=state,  # type: ignore[arg-type]
                         running=state != "idle")


def test_a_run_costs_what_its_sub_agents_spent_since_its_prompt(tmp_path: Path) -> None:
    """The root is free and idle; its sub-agents (a child still working in the background, a
    grandchild) spent $0.06 since the prompt: the run is over a $0.05 ceiling and still runs.
    A child of an earlier run is neither read nor counted."""
    server = Family()
    priced_run(server)
    pctx = context(tmp_path, server)
    inst = pctx.cfg.instances[0]

    async def read() -> Any:
        async with pctx.client(inst) as client:
            return await read_run(pctx, inst, root(), client)

    run = asyncio.run(read())
    assert run.cost == pytest.approx(0.06) and run.ceiling == 0.05 and run.over
    assert {s.id for s in run.family} == {"ses_old", "ses_kid", "ses_grandkid"}
    assert run.busy == {"ses_kid"}
    assert asyncio.run(read_run_without_ceiling(tmp_path / "none")) is None


def test_a_sub_agent_begun_since_the_prompt_costs_its_sessions_total(tmp_path: Path) -> None:
    """1.18 lists each session's own total: a sub-agent's session begun since the prompt is all
    this run's, so its total stands for its steps and its messages are not read (each read
    delays the stop while the run spends on). One begun before the prompt (a background
    sub-agent of an earlier run) is read: only its steps since the prompt count."""
    server = Family()
    priced_run(server)
    server.nodes["ses_kid"].created = T0 + 11
    server.nodes["ses_kid"].cost = 0.04  # its two steps
    server.nodes["ses_old"].updated = T0 + 60  # still at work for this run
    server.nodes["ses_old"].messages.append(timed_step(T0 + 60, 0.03))
    pctx = context(tmp_path, server)
    inst = pctx.cfg.instances[0]

    async def read() -> Any:
        async with pctx.client(inst) as client:
            return await read_run(pctx, inst, root(), client)

    assert asyncio.run(read()).cost == pytest.approx(0.04 + 0.02 + 0.03)
    assert sorted(server.reads) == ["ses_grandkid", "ses_old", "ses_root"]


async def read_run_without_ceiling(tmp_path: Path) -> Any:
    tmp_path.mkdir()
    server = Family()
    priced_run(server)
    pctx = context(tmp_path, server, run_usd=None)
    inst = pctx.cfg.instances[0]
    async with pctx.client(inst) as client:
        return await read_run(pctx, inst, root(), client)


@pytest.mark.parametrize(
    ("stubborn", "confirmed", "aborts"),
    [
        (0, True, 4),  # one abort each (root, child, grandchild, old child), read back: none runs
        (1, True, 5),  # the child shrugs the first off: aborted once more, then confirmed
        (2, False, 5),  # still running after the second: not confirmed (tried again later)
    ],
)
def test_a_stop_aborts_the_root_and_every_sub_agent_and_reads_the_server_back(
    tmp_path: Path, stubborn: int, confirmed: bool, aborts: int
) -> None:
    server = Family()
    priced_run(server, root_busy=True)
    server.nodes["ses_grandkid"].busy = True
    server.nodes["ses_kid"].stubborn = stubborn
    pctx = context(tmp_path, server)
    inst = pctx.cfg.instances[0]

    async def stop() -> Any:
        async with pctx.client(inst) as client:
            run = await read_run(pctx, inst, root(state="busy"), client)
            return await abort_run(client, root(state="busy"), run.family)

    assert asyncio.run(stop()) == (confirmed, 3)
    assert sorted(server.aborts[:4]) == ["ses_grandkid", "ses_kid", "ses_old", "ses_root"]
    assert server.aborts[4:] == ["ses_kid"] * (aborts - 4)


def test_a_stop_parks_the_task_and_is_a_decision_no_patrol_undoes(tmp_path: Path) -> None:
    server = Family()
    priced_run(server)
    pctx = context(tmp_path, server)
    inst = pctx.cfg.instances[0]
    pctx.backlog().add(Task(id="T1", title="work", status="dispatched", session_id="ses_root",
                            dispatched_to="a"))

    async def stop() -> Any:
        async with pctx.client(inst) as client:
            run = await read_run(pctx, inst, root(), client)
            return await stop_over_ceiling(pctx, inst, root(), client, run, origin="patrol.live")

    over = asyncio.run(stop())
    assert (over.aborted, over.task, over.sub_agents) == (True, "T1", 3)
    assert over.detail == ("over the run ceiling: this run cost $0.06, its ceiling is $0.05; "
                           "aborted with 3 sub-agent sessions; task T1 parked for a person")
    (task,) = pctx.backlog().load().tasks
    assert task.status == "pending" and task.parked == "over the run ceiling ($0.06 of $0.05)"
    lines = [json.loads(ln) for ln in (tmp_path / "home" / "audit.log").read_text().splitlines()]
    assert [(ln["command"], ln["result"], ln.get("sub_agents")) for ln in lines] == [
        ("patrol.live.run_ceiling", "stopping", None),  # the decision, before the abort
        ("patrol.live.run_ceiling", "aborted", 3),
    ]
    decision = load_decisions(pctx).for_session("a", "ses_root", T0)
    assert decision is not None and decision.kind == "ceiling"
    assert decision.text.startswith("stopped over its run ceiling at ")


def test_a_stop_aborts_the_run_when_the_pool_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis away (or the daemon standby, its pool writes fenced off): the task is not parked,
    and the run is aborted all the same."""
    server = Family()
    priced_run(server, root_busy=True)
    pctx = context(tmp_path, server)
    inst = pctx.cfg.instances[0]

    def unreachable(self: object) -> object:
        raise UnreachableError("redis", "connection refused")

    monkeypatch.setattr(OpsContext, "backlog", unreachable)

    async def stop() -> Any:
        async with pctx.client(inst) as client:
            run = await read_run(pctx, inst, root(state="busy"), client)
            return await stop_over_ceiling(pctx, inst, root(state="busy"), client, run,
                                           origin="patrol.live")

    over = asyncio.run(stop())
    assert (over.aborted, over.task) == (True, "")
    assert "ses_root" in server.aborts and not any(n.busy for n in server.nodes.values())
