"""A ceiling per run: what a run has cost since its prompt, and stopping one that passed it.

A **run** is what one prompt set going: the assistant messages after the newest user message,
from the prompt to idle. Its cost is the sum of their ``cost`` (``run_cost``, pure), which
every release reports on messages (1.2 and 1.14 on messages only; 1.18 on the session too).
``budget.run_usd`` (per instance ``budget_run_usd``, which wins) is its ceiling
(``ops.budget.run_ceiling``).

``stop_over_ceiling`` is the one way a run past its ceiling is stopped, by the patrol's round
and by the daemon's live watch alike: its pool task is parked "over the run ceiling" first (so
nothing settles or retries it: a person decides), then the run is aborted, then the audit log
says so. The caller records the action (report, page, one chat notice).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.records import SessionRecord
from xaf_hub.fleet.client import OpencodeClient
from xaf_hub.fleet.wire import cost_value
from xaf_hub.ops.budget import money, run_ceiling
from xaf_hub.ops.context import OpsContext
from xaf_hub.store.backlog import BacklogData

STEP = "run_ceiling"
OVER = "over the run ceiling"
# Messages read to find a run's prompt: a run of more steps than this is costed from the
# newest ones only (a lower bound, so it may be stopped later, never wrongly).
MESSAGES_READ = 100


def run_cost(messages: Sequence[Mapping[str, Any]]) -> float | None:
    """The cost of the newest run: assistant messages after the newest user message (pure).

    None when no assistant message of the run reports a usable cost (nothing to judge).
    """
    start = 0
    for i, msg in enumerate(messages):
        info = msg.get("info")
        if isinstance(info, Mapping) and info.get("role") == "user":
            start = i + 1
    total, known = 0.0, False
    for msg in messages[start:]:
        info = msg.get("info")
        if not isinstance(info, Mapping) or info.get("role") != "assistant":
            continue
        cost = cost_value(info.get("cost"))
        if cost is not None:
            total, known = total + cost, True
    return total if known else None


@dataclass(frozen=True)
class OverCeiling:
    """A run that passed its ceiling, and what was done about it."""

    instance: str
    session: str
    title: str
    cost: float
    ceiling: float
    task: str = ""  # the pool task parked for it ("" when the session is no pool task's)
    aborted: bool = False

    @property
    def detail(self) -> str:
        """One line for the report, the page and the chat."""
        what = f"{OVER}: this run cost {money(self.cost)}, its ceiling is {money(self.ceiling)}"
        done = "; aborted" if self.aborted else "; abort failed"
        task = f"; task {self.task} parked for a person" if self.task else ""
        return what + done + task


def judge_run(inst_ceiling: float | None, cost: float | None) -> bool:
    """Whether a run with ``cost`` passed ``inst_ceiling`` (pure; None: no ceiling or cost)."""
    return inst_ceiling is not None and cost is not None and cost > inst_ceiling


async def over_ceiling(
    ops: OpsContext, inst: InstanceConfig, rec: SessionRecord, client: OpencodeClient
) -> tuple[float | None, float | None]:
    """(the run's cost so far, its ceiling); (None, None) without a ceiling (nothing read)."""
    ceiling = run_ceiling(ops.cfg, inst)
    if ceiling is None:
        return None, None
    messages = await client.messages(rec.id, MESSAGES_READ, rec.directory or None)
    return run_cost(messages), ceiling


def _park(ops: OpsContext, session: str, reason: str) -> str:
    """Park the pool task dispatched to ``session``; its id, or "" when there is none."""

    def mutate(data: BacklogData) -> str:
        for task in data.tasks:
            if task.session_id == session and task.status == "dispatched":
                data.replace(
                    replace(task, status="pending", parked=reason, last_error=reason,
                            dispatched_at=None)
                )
                return task.id
        return ""

    return ops.backlog().update(mutate)


async def stop_over_ceiling(
    ops: OpsContext,
    inst: InstanceConfig,
    rec: SessionRecord,
    client: OpencodeClient,
    cost: float,
    ceiling: float,
    *,
    origin: str,
) -> OverCeiling:
    """Park the run's task, abort the run and audit it (module docstring)."""
    over = OverCeiling(inst.name, rec.id, rec.title, cost, ceiling)
    reason = f"{OVER} ({money(cost)} of {money(ceiling)})"
    task = _park(ops, rec.id, reason)
    try:
        await client.abort(rec.id, rec.directory or None)
        aborted = True
    except Exception as exc:  # noqa: BLE001 - reported, and tried again while it runs
        ops.log(ops.redact(f"{STEP}: abort of {inst.name}/{rec.id} failed: {exc}"))
        aborted = False
    over = replace(over, task=task, aborted=aborted)
    ops.audit(
        f"{origin}.{STEP}",
        instance=inst.name,
        session=rec.id,
        result="aborted" if aborted else "abort failed",
        reason=reason,
        extra={"cost_usd": round(cost, 6), "ceiling_usd": ceiling, "task": task},
    )
    return over
