"""Is one session's run really going? Look at it, wait for it, heal it on the spot.

The blocks of ``confirm`` and ``dispatch --confirm-wait``: ``sighting``/``judge`` (pure) read a
session's run state; ``wait_for_run`` polls until the run is seen to start or fail and hands a
rate-limit or model-unavailable failure to ``ops.heal.heal_session`` (docs/architecture.md §7).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.records import Message, SessionRecord
from xaf_hub.core.runstate import LastRun, Verdict, last_run
from xaf_hub.core.runstate import judge as _judge
from xaf_hub.errors import BusyError, UnreachableError
from xaf_hub.fleet.client import OpencodeClient, RawStatus, ServerSession
from xaf_hub.fleet.scan import build_record
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.heal import HealCandidate, Healing, heal_session
from xaf_hub.ops.heal import heal_candidate as _heal_candidate

# Messages read per look: enough to find everything after the baseline of a fresh send.
LOOK_WINDOW = 10
POLL_SECONDS = 0.5
# A heal near the end of the window still gets this long to show the new run.
POST_HEAL_SECONDS = 10.0
# More heals than this in one wait means the chain itself is in trouble: left to the patrol.
MAX_HEALS = 3

WaitState = Literal["running", "finished", "failed", "retrying", "no_sign", "unreachable"]
Step = Literal["wait", "started", "finished", "heal", "failed"]
# The steps that end a wait, and how it ended.
_ENDS: dict[Step, WaitState] = {"started": "running", "finished": "finished", "failed": "failed"}
# A wait's step after a look at a run that ended, by the verdict's state.
_STEP_OF: dict[str, Step] = {"finished": "finished", "aborted": "failed", "denied": "failed"}
# How a wait that reached its deadline ended, by the verdict's state.
_AT_DEADLINE: dict[str, WaitState] = {"running": "running", "retrying": "retrying"}


@dataclass(frozen=True)
class Sighting:
    """One look at a session: server run state plus the newest messages (since a baseline)."""

    rec: SessionRecord
    run: LastRun
    answered: bool = False  # the model has begun answering the newest run
    attempt: int = 0  # retry attempt number (0 unless retrying)
    newest_id: str = ""  # newest message id of the whole session: the next baseline


@dataclass(frozen=True)
class WaitResult:
    """How a wait after a send ended."""

    state: WaitState
    model: str
    detail: str
    seconds: float
    heals: tuple[Healing, ...] = ()
    next_ms: int = 0


# ---------------------------------------------------------------------------------------------
# Reading (pure)


def messages_since(messages: Sequence[Message], baseline: str | None) -> list[Message]:
    """The messages after ``baseline`` (a message id); all of them for None or ""."""
    ids = [m.id for m in messages]
    # A baseline not among them fell out of the window: more than a window of new messages came.
    return list(messages[ids.index(baseline) + 1 :] if baseline and baseline in ids else messages)


def answered(messages: Sequence[Message]) -> bool:
    """Whether the newest message is an assistant message that has begun (it has parts).

    A run waiting between retries has an assistant message with no parts (API §4.5).
    """
    return bool(messages) and messages[-1].role == "assistant" and bool(messages[-1].parts)


def sighting(
    inst: InstanceConfig, session: ServerSession, status: RawStatus | None,
    messages: Sequence[Message], baseline: str | None = None,
) -> Sighting:
    """Combine a session, its status entry and its newest messages (oldest first)."""
    # A worktree's session is the project's through the checkout it was made from.
    project = inst.claims(session.directory, session.checkout) if session.directory else False
    rec = build_record(inst, session, status, project)
    newer = messages_since(messages, baseline)
    newest_id = messages[-1].id if messages else ""
    attempt = int(status.get("attempt") or 0) if status and status.get("type") == "retry" else 0
    return Sighting(rec, last_run(newer), answered(newer), attempt, newest_id or baseline or "")


def judge(s: Sighting) -> Verdict:
    """Say what a sighting means (pure): ``core.runstate.judge`` with what the look saw."""
    return _judge(s.rec, s.run, answered=s.answered, attempt=s.attempt)


def heal_candidate(s: Sighting) -> HealCandidate | None:
    """The patrol's verdict on whether this sighting shows a healable failure."""
    return _heal_candidate(s.rec, s.run if s.run.outcome != "not_started" else None)


def wait_step(s: Sighting, v: Verdict) -> tuple[Step, HealCandidate | None]:
    """What a wait does after one look (pure). A busy run counts as started once the model
    answers: before, a provider's 429 may still come, however long the server took to ask."""
    if v.state in ("retrying", "failed"):
        cand = heal_candidate(s)
        if cand is not None:
            return "heal", cand
        # A retry on something else (a 500, a dropped connection) may still recover.
        return ("wait" if v.state == "retrying" else "failed"), None
    if v.state == "running":
        return ("started" if s.answered else "wait"), None
    if v.state == "waiting":
        return "started", None  # it ran, and stopped to ask a person: no heal, no more wait
    # Pending, idle, or "stopped without finishing" while the status catches up: look again.
    return _STEP_OF.get(v.state, "wait"), None


# ---------------------------------------------------------------------------------------------
# Looking and healing (I/O)


async def look(
    client: OpencodeClient, inst: InstanceConfig, session: ServerSession,
    baseline: str | None = None,
) -> Sighting:
    """Read a session's run state, then its newest messages (status first: it may lag)."""
    statuses = await client.running([session.directory]) if session.directory else {}
    messages = await client.messages(session.id, limit=LOOK_WINDOW)
    return sighting(inst, session, statuses.get(session.id), messages, baseline)


Look = Callable[[str | None], Awaitable[Sighting]]
Fix = Callable[[Sighting, HealCandidate], Awaitable[Healing]]


async def wait_for_run(
    look_at: Look, fix: Fix, *, window: float, baseline: str | None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> WaitResult:
    """Poll until the run after ``baseline`` starts or fails; heal what the patrol would."""
    start = clock()
    deadline = start + window
    heals: list[Healing] = []
    blocked = ""  # why the last heal could not send (no free slot), tried again next look

    def done(state: WaitState, v: Verdict | None, detail: str = "") -> WaitResult:
        if v is None:
            return WaitResult(state, "", detail, round(clock() - start, 3), tuple(heals))
        return WaitResult(state, v.model, detail or v.detail, round(clock() - start, 3),
                          tuple(heals), v.next_ms)

    verdict: Verdict | None = None
    while True:
        try:
            seen = await look_at(baseline)
        except UnreachableError as exc:
            return done("unreachable", verdict, exc.reason)
        verdict = judge(seen)
        step, cand = wait_step(seen, verdict)
        if step == "heal" and cand is not None:
            if len(heals) >= MAX_HEALS:
                return done(
                    "failed", verdict, f"still failing after {MAX_HEALS} heals: {verdict.detail}"
                )
            try:
                healing = await fix(seen, cand)
            except BusyError as exc:
                blocked = str(exc)
            else:
                blocked = ""
                if not healing.already:
                    heals.append(healing)
                    if healing.to_model is None:
                        return done("failed", verdict, "no usable model left in the chain")
                    baseline = seen.newest_id
                    deadline = max(deadline, clock() + POST_HEAL_SECONDS)
        elif step in _ENDS:
            return done(_ENDS[step], verdict)
        if clock() >= deadline:
            if blocked:
                return done(
                    "failed", verdict, f"{verdict.detail}; no free slot to re-send: {blocked}"
                )
            return done(_AT_DEADLINE.get(verdict.state, "no_sign"), verdict)
        await sleep(max(0.0, min(POLL_SECONDS, deadline - clock())))


async def confirm_run(
    ops: OpsContext, inst: InstanceConfig, session: ServerSession, *, baseline: str | None,
    window: float, origin: str,
) -> WaitResult:
    """Wait for the run just sent to ``session`` to start; heal it on the spot if it fails."""
    async with ops.client(inst) as client:

        async def look_at(base: str | None) -> Sighting:
            return await look(client, inst, session, base)

        async def fix(seen: Sighting, cand: HealCandidate) -> Healing:
            return await heal_session(ops, inst, seen.rec, cand, origin=origin)

        return await wait_for_run(look_at, fix, window=window, baseline=baseline)
