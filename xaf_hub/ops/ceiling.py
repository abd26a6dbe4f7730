"""A ceiling per run: what a run has cost since its prompt, and stopping one that passed it.

``read_run`` reads what one prompt's run cost, sub-agents included (``run_cost`` and
``cost_since`` are the pure sums); ``budget.run_usd`` (per instance ``budget_run_usd``) is its
ceiling. ``stop_over_ceiling`` is the one way a run past it is stopped, by the round and the
daemon's watch alike: its task parked, the stop recorded as a person's decision
(``ops.decisions``) before the whole family is aborted (``abort_run``), the outcome audited.
The abort needs only the server: a pool or decision Redis cannot take does not hold it back.
What a run is and the order of the stop: docs/architecture.md §6, "Runs in flight".
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import cast

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.records import Message, SessionRecord
from xaf_hub.errors import HubError
from xaf_hub.fleet.client import OpencodeClient, ServerSession
from xaf_hub.ops.budget import money, run_ceiling
from xaf_hub.ops.context import OpsContext
from xaf_hub.store.audit import who
from xaf_hub.store.tasks import BacklogData

STEP = "run_ceiling"
OVER = "over the run ceiling"
# Messages read of each session of a run: a run of more steps than this is costed from the
# newest ones only (a lower bound, so it may be stopped later, never wrongly).
MESSAGES_READ = 100
# Sessions of one run's family read at most (a lower bound beyond, as above).
MAX_FAMILY = 200


def _synthetic(message: Message) -> bool:
    """A user message the server wrote itself: every text part of it synthetic."""
    texts = [p for p in message.parts if p.type == "text"]
    return bool(texts) and all(p.synthetic for p in texts)


def _prompt(messages: Sequence[Message]) -> int:
    """Index of the newest prompt among ``messages``; -1 when none was read."""
    prompts = (i for i, m in enumerate(messages) if m.role == "user" and not _synthetic(m))
    return max(prompts, default=-1)


def _steps_cost(messages: Sequence[Message]) -> float | None:
    """The summed ``cost`` of the assistant messages among ``messages``; None when none
    reports a usable one (nothing to judge)."""
    costs = [m.cost for m in messages if m.role == "assistant" and m.cost is not None]
    return math.fsum(costs) if costs else None


def run_cost(messages: Sequence[Message]) -> float | None:
    """The root session's part of the newest run: its assistant messages after the newest
    prompt (pure; None: no usable cost)."""
    return _steps_cost(messages[_prompt(messages) + 1 :])


def run_start(messages: Sequence[Message]) -> int:
    """When the newest run began (epoch ms): its prompt's, else the oldest message read's
    (0: none read)."""
    return messages[max(_prompt(messages), 0)].created if messages else 0


def cost_since(messages: Sequence[Message], since_ms: int) -> float | None:
    """A sub-agent session's part of a run begun at ``since_ms`` (pure)."""
    return _steps_cost([m for m in messages if m.created >= since_ms])


@dataclass(frozen=True)
class Run:
    """One run as the server tells it now: its cost, its ceiling and the sessions in it."""

    cost: float | None
    ceiling: float
    family: tuple[ServerSession, ...] = ()  # its sub-agents' sessions, every generation
    busy: frozenset[str] = frozenset()  # the sessions of the run (root included) running

    @property
    def over(self) -> bool:
        """Whether the run passed its ceiling."""
        return judge_run(self.ceiling, self.cost)


async def family(client: OpencodeClient, root: str, directory: str = "") -> list[ServerSession]:
    """Every session under ``root`` (children, their children...), at most ``MAX_FAMILY``; one
    generation's lists asked at once."""
    out: list[ServerSession] = []
    seen, level = {root}, [(root, directory)]
    while level and len(out) < MAX_FAMILY:
        lists = await aio.gather(*(client.children(sid, where or None) for sid, where in level))
        level = []
        for child in (c for kids in lists for c in kids):
            if child.id not in seen:
                seen.add(child.id)
                out.append(child)
                level.append((child.id, child.directory))
    return out[:MAX_FAMILY]


async def root_of(client: OpencodeClient, session: ServerSession) -> ServerSession:
    """The session whose run ``session`` is part of: itself, or its topmost parent."""
    seen = {session.id}
    while session.parent_id and session.parent_id not in seen and len(seen) <= MAX_FAMILY:
        session = await client.get_session(session.parent_id)
        seen.add(session.id)
    return session


async def read_run(
    ops: OpsContext, inst: InstanceConfig, rec: SessionRecord, client: OpencodeClient
) -> Run | None:
    """The newest run of the root session ``rec``; None without a ceiling (nothing read)."""
    ceiling = run_ceiling(ops.cfg, inst)
    if ceiling is None:
        return None
    read = await aio.gather(
        client.messages(rec.id, MESSAGES_READ, rec.directory or None),
        family(client, rec.id, rec.directory),
    )
    messages = cast("list[Message]", read[0])
    kin = cast("list[ServerSession]", read[1])
    since = run_start(messages)
    # A sub-agent's session begun since the prompt spent for this run alone: the server's own
    # total when it keeps one (1.18), else its steps since the prompt are read. One quiet
    # since the prompt spent nothing of it.
    whole = [s for s in kin if s.created >= since and s.cost is not None]
    steps = [s for s in kin if s not in whole and s.updated >= since]
    parts = [run_cost(messages), *(s.cost for s in whole)]
    reads = [client.messages(s.id, MESSAGES_READ, s.directory or None) for s in steps]
    parts += [cost_since(m, since) for m in await aio.gather(*reads)]
    known = [c for c in parts if c is not None]
    busy = await client.running(sorted({rec.directory, *(s.directory for s in kin)} - {""}))
    mine = {rec.id, *(s.id for s in kin)}
    return Run(math.fsum(known) if known else None, ceiling, tuple(kin),
               frozenset(sid for sid in busy if sid in mine))


@dataclass(frozen=True)
class OverCeiling:
    """A run that passed its ceiling, and what was done about it."""

    instance: str
    session: str
    title: str
    cost: float
    ceiling: float
    task: str = ""  # the pool task parked for it ("" when the session is no pool task's)
    aborted: bool = False  # the server shows no session of the run running any more
    sub_agents: int = 0  # sessions of its sub-agents stopped with it

    @property
    def detail(self) -> str:
        """One line for the report, the page and the chat."""
        what = f"{OVER}: this run cost {money(self.cost)}, its ceiling is {money(self.ceiling)}"
        n = self.sub_agents
        kin = f" with {n} sub-agent session{'s' if n != 1 else ''}" if n else ""
        done = f"; aborted{kin}" if self.aborted else f"; abort{kin} not confirmed"
        task = f"; task {self.task} parked for a person" if self.task else ""
        return what + done + task


def judge_run(inst_ceiling: float | None, cost: float | None) -> bool:
    """Whether a run with ``cost`` passed ``inst_ceiling`` (pure; None: no ceiling or cost)."""
    return inst_ceiling is not None and cost is not None and cost > inst_ceiling


def _park(ops: OpsContext, session: str, reason: str) -> str:
    """Park the pool task dispatched to ``session``; its id, or "" when there is none."""

    def mutate(data: BacklogData) -> str:
        for task in data.tasks:
            if task.session_id == session and task.status == "dispatched":
                data.replace(replace(task, status="pending", parked=reason, last_error=reason,
                                     dispatched_at=None))
                return task.id
        return ""

    return ops.backlog().update(mutate)


async def abort_run(
    client: OpencodeClient, rec: SessionRecord, kin: Sequence[ServerSession]
) -> tuple[bool, int]:
    """Abort the root ``rec`` and its family ``kin`` at once, then read the server back (the
    family afresh, the run state of each): whatever still runs is aborted once more.
    (whether none runs now, how many sub-agent sessions the run has)."""
    root = ServerSession(rec.id, rec.title, rec.directory, 0, 0, None, "", "")
    targets = [root, *kin]
    for _ in range(2):
        await aio.gather(*(client.abort(s.id, s.directory or None) for s in targets))
        kin = await family(client, rec.id, rec.directory)
        busy = await client.running(sorted({rec.directory, *(s.directory for s in kin)} - {""}))
        targets = [s for s in (root, *kin) if s.id in busy]
        if not targets:
            return True, len(kin)
    return False, len(kin)


async def stop_over_ceiling(
    ops: OpsContext, inst: InstanceConfig, rec: SessionRecord, client: OpencodeClient, run: Run,
    *, origin: str,
) -> OverCeiling:
    """Park the run's task, abort the run with its family and audit it (module docstring)."""
    cost = run.cost or 0.0
    reason = f"{OVER} ({money(cost)} of {money(run.ceiling)})"
    task = ""
    with contextlib.suppress(HubError):  # Redis unreachable or this daemon standby: stop anyway
        task = _park(ops, rec.id, reason)
    figures = {"cost_usd": round(cost, 6), "ceiling_usd": run.ceiling, "task": task}
    # The decision before the abort, as a person's interrupt: whoever sees the run stopped
    # (a resume under the instance lock, a patrol on another host) finds it.
    await aio.blocking(ops.audit, f"{origin}.{STEP}", instance=inst.name, session=rec.id,
                       result="stopping", reason=reason, extra=figures)
    with contextlib.suppress(HubError):  # Redis unreachable: this host's audit line holds
        await aio.blocking(
            ops.stores.record_interrupt, inst.name, rec.id, time.time(), who(ops.env), "ceiling"
        )
    try:
        aborted, kin = await abort_run(client, rec, run.family)
    except Exception as exc:  # noqa: BLE001 - reported, and tried again while it runs
        ops.log(ops.redact(f"{STEP}: abort of {inst.name}/{rec.id} failed: {exc}"))
        aborted, kin = False, len(run.family)
    await aio.blocking(ops.audit, f"{origin}.{STEP}", instance=inst.name, session=rec.id,
                       result="aborted" if aborted else "abort failed", reason=reason,
              extra={**figures, "sub_agents": kin})
    return OverCeiling(inst.name, rec.id, rec.title, cost, run.ceiling, task, aborted, kin)
