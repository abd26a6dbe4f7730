"""Is one session's run really going? Judge it, wait for it, heal it the patrol's way.

The building blocks of ``xaf-hub confirm --session ID [--fix]`` and ``dispatch --confirm-wait``
(SPEC §6, §7):

* ``sighting`` / ``judge`` (pure) — read a session's run state and newest messages as one of
  running, retrying, finished, failed, aborted, interrupted, pending or idle, with the
  provider's message and the next try for a retry.
* ``wait_step`` (pure) and ``wait_for_run`` — after a send, poll until the run is seen to start
  or fail; a rate-limit or model-unavailable failure is handed to the healer on the spot.
* ``heal_session`` — the one way both commands heal: ``fix_free_limit.heal_candidate`` decides,
  ``fix_free_limit.heal`` acts (blackout through ``ModelState.mark_blackout``, next model of
  the chain, abort a stuck retry, continue prompt with the discipline block), and the failure
  is remembered so neither the patrol nor a second command heals it again.

"Started" needs more than one glimpse of ``busy``: a provider that answers 429 at once leaves
the session busy for a moment before it turns to ``retry``. A run counts as started when the
model has begun answering (its assistant message has parts), when it already finished, or
when it stayed busy for ``BUSY_SETTLE_SECONDS``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from xaf_hub.client import OpencodeClient, RawStatus, ServerSession
from xaf_hub.config import InstanceConfig
from xaf_hub.errors import BusyError, UnreachableError
from xaf_hub.model_state import ErrorClass, classify_error, classify_message
from xaf_hub.outcome import error_text
from xaf_hub.patrol.context import Cycle, LastRun, PatrolContext, last_run, pool_discipline
from xaf_hub.patrol.fix_free_limit import STEP, HealCandidate, blackout_family, heal
from xaf_hub.patrol.fix_free_limit import heal_candidate as _heal_candidate
from xaf_hub.records import SessionRecord
from xaf_hub.scan import build_record

# Messages read per look: enough to find everything after the baseline of a fresh send.
LOOK_WINDOW = 10
POLL_SECONDS = 0.5
# Busy this long without a failure counts as started even before the model's first token.
BUSY_SETTLE_SECONDS = 5.0
# A heal near the end of the window still gets this long to show the new run.
POST_HEAL_SECONDS = 10.0
# More heals than this in one wait means the chain itself is in trouble: left to the patrol.
MAX_HEALS = 3

RunVerdict = Literal[
    "running", "retrying", "finished", "failed", "aborted", "interrupted", "pending", "idle"
]
WaitState = Literal["running", "finished", "failed", "retrying", "no_sign", "unreachable"]
Step = Literal["wait", "started", "finished", "heal", "failed"]


@dataclass(frozen=True)
class Sighting:
    """One look at a session: server run state plus the newest messages (since a baseline)."""

    rec: SessionRecord
    run: LastRun
    answered: bool = False  # the model has begun answering the newest run
    attempt: int = 0  # retry attempt number (0 unless retrying)
    newest_id: str = ""  # newest message id of the whole session: the next baseline


@dataclass(frozen=True)
class Verdict:
    """What a sighting means, in words a person can act on."""

    state: RunVerdict
    model: str
    detail: str = ""
    signal: ErrorClass = "none"  # classification of the retry message or the error
    next_ms: int = 0  # a retry's next try, ms since the epoch
    attempt: int = 0


@dataclass(frozen=True)
class Healing:
    """One heal: what failed, where the work went, and the blackout it caused."""

    state: str  # retry | failed: the shape of the failure that was healed
    signal: str  # rate_limited | model_unavailable
    from_model: str
    to_model: str | None  # None: no usable model left, nothing was sent
    reason: str
    family: str | None = None  # blacked-out family, if this heal marked one
    until_ms: int | None = None
    already: bool = False  # someone (the patrol) healed this failure first; nothing was done
    notes: tuple[str, ...] = ()  # non-fatal problems met on the way (e.g. unreadable pool)

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "state": self.state,
            "signal": self.signal,
            "from_model": self.from_model,
            "to_model": self.to_model,
            "reason": self.reason,
            "blackout": None
            if self.family is None
            else {"family": self.family, "until_ms": self.until_ms},
            "already_healed": self.already,
        }


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


def _info(message: Mapping[str, Any]) -> Mapping[str, Any]:
    info = message.get("info")
    return info if isinstance(info, Mapping) else message


def messages_since(
    messages: Sequence[Mapping[str, Any]], baseline: str | None
) -> list[Mapping[str, Any]]:
    """The messages after ``baseline`` (a message id); all of them for None or ""."""
    if not baseline:
        return list(messages)
    ids = [str(_info(m).get("id") or "") for m in messages]
    if baseline in ids:
        return list(messages[ids.index(baseline) + 1 :])
    # The baseline fell out of the window: more than a window of new messages came since.
    return list(messages)


def answered(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the newest message is an assistant message that has begun (it has parts).

    A run waiting between retries has an assistant message with no parts (API §4.5).
    """
    if not messages:
        return False
    newest = messages[-1]
    parts = newest.get("parts")
    return _info(newest).get("role") == "assistant" and isinstance(parts, list) and bool(parts)


def sighting(
    inst: InstanceConfig,
    session: ServerSession,
    status: RawStatus | None,
    messages: Sequence[Mapping[str, Any]],
    baseline: str | None = None,
) -> Sighting:
    """Combine a session, its status entry and its newest messages (oldest first)."""
    project = inst.rules.is_project(session.directory) if session.directory else False
    rec = build_record(inst, session, status, project)
    newer = messages_since(messages, baseline)
    newest_id = str(_info(messages[-1]).get("id") or "") if messages else ""
    attempt = int(status.get("attempt") or 0) if status and status.get("type") == "retry" else 0
    return Sighting(rec, last_run(newer), answered(newer), attempt, newest_id or baseline or "")


def judge(s: Sighting) -> Verdict:
    """Say what a sighting means (pure)."""
    rec, run = s.rec, s.run
    model = run.model or rec.model
    if rec.run_state == "retry":
        return Verdict(
            "retrying",
            model,
            rec.retry_message,
            classify_message(rec.retry_message),
            rec.retry_next,
            s.attempt,
        )
    if rec.run_state == "busy":
        detail = "the model is answering" if s.answered else "busy; no answer from the model yet"
        return Verdict("running", model, detail)
    outcome = run.outcome
    if outcome == "succeeded":
        return Verdict("finished", model, "the last run finished")
    if outcome == "aborted":
        return Verdict("aborted", model, "the last run was aborted")
    if outcome == "running":
        return Verdict("interrupted", model, "the last run stopped without finishing")
    if outcome == "rate_limited" or outcome.startswith("failed:"):
        return Verdict("failed", model, error_text(run.error) or outcome, classify_error(run.error))
    if outcome == "pending":
        return Verdict(
            "pending",
            model,
            "the last prompt has no answer yet (just sent, or refused before any reply)",
        )
    return Verdict("idle", model, "no run yet")


def heal_candidate(s: Sighting) -> HealCandidate | None:
    """The patrol's verdict on whether this sighting shows a healable failure."""
    return _heal_candidate(s.rec, s.run if s.run.outcome != "none" else None)


def wait_step(s: Sighting, v: Verdict, busy_seconds: float) -> tuple[Step, HealCandidate | None]:
    """What a wait does after one look (pure)."""
    if v.state in ("retrying", "failed"):
        cand = heal_candidate(s)
        if cand is not None:
            return "heal", cand
        # A retry on something else (a 500, a dropped connection) may still recover.
        return ("wait" if v.state == "retrying" else "failed"), None
    if v.state == "running":
        started = s.answered or busy_seconds >= BUSY_SETTLE_SECONDS
        return ("started" if started else "wait"), None
    if v.state == "finished":
        return "finished", None
    if v.state == "aborted":
        return "failed", None
    # pending, idle, or "stopped without finishing" while the status catches up: look again.
    return "wait", None


# ---------------------------------------------------------------------------------------------
# Looking and healing (I/O)


async def look(
    client: OpencodeClient,
    inst: InstanceConfig,
    session: ServerSession,
    baseline: str | None = None,
) -> Sighting:
    """Read a session's run state, then its newest messages (status first: it may lag)."""
    statuses = await client.running([session.directory]) if session.directory else {}
    messages = await client.messages(session.id, limit=LOOK_WINDOW)
    return sighting(inst, session, statuses.get(session.id), messages, baseline)


async def heal_session(
    pctx: PatrolContext,
    inst: InstanceConfig,
    rec: SessionRecord,
    cand: HealCandidate,
    *,
    origin: str,
) -> Healing:
    """Heal one failure exactly as fix_free_limit does, unless it was healed already.

    Raises what ``fix_free_limit.heal`` raises (BusyError when the re-send finds no free slot).
    """
    state = pctx.model_state()
    base = Healing(cand.state, cand.signal, cand.model, None, cand.reason)
    if state.was_healed(cand.key):
        return replace(base, already=True)
    cycle = Cycle(pctx.now())
    override = pool_discipline(pctx, cycle, STEP)
    target = await heal(pctx, cycle, inst, rec, cand, state, override, origin=origin)
    family = blackout_family(cand, pctx.cfg.models.families())
    until: int | None = None
    if family is not None:
        current = state.active_blackouts(pctx.now()).get(family)
        until = current.until_ms if current is not None else None
    return Healing(
        cand.state,
        cand.signal,
        cand.model,
        target,
        cand.reason,
        family,
        until,
        notes=tuple(cycle.errors),
    )


Look = Callable[[str | None], Awaitable[Sighting]]
Fix = Callable[[Sighting, HealCandidate], Awaitable[Healing]]


async def wait_for_run(
    look_at: Look,
    fix: Fix,
    *,
    window: float,
    baseline: str | None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    poll: float = POLL_SECONDS,
) -> WaitResult:
    """Poll until the run after ``baseline`` starts or fails; heal what the patrol would."""
    start = clock()
    deadline = start + window
    heals: list[Healing] = []
    busy_since: float | None = None
    blocked = ""  # why the last heal could not send (no free slot), tried again next look

    def done(state: WaitState, v: Verdict | None, detail: str = "") -> WaitResult:
        return WaitResult(
            state,
            v.model if v is not None else "",
            detail or (v.detail if v is not None else ""),
            round(clock() - start, 3),
            tuple(heals),
            v.next_ms if v is not None else 0,
        )

    verdict: Verdict | None = None
    while True:
        try:
            seen = await look_at(baseline)
        except UnreachableError as exc:
            return done("unreachable", verdict, exc.reason)
        verdict = judge(seen)
        now = clock()
        if seen.rec.run_state == "busy":
            busy_since = now if busy_since is None else busy_since
        else:
            busy_since = None
        step, cand = wait_step(seen, verdict, 0.0 if busy_since is None else now - busy_since)
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
                    baseline, busy_since = seen.newest_id, None
                    deadline = max(deadline, clock() + POST_HEAL_SECONDS)
        elif step == "started":
            return done("running", verdict)
        elif step == "finished":
            return done("finished", verdict)
        elif step == "failed":
            return done("failed", verdict)
        if clock() >= deadline:
            if blocked:
                return done(
                    "failed", verdict, f"{verdict.detail}; no free slot to re-send: {blocked}"
                )
            if verdict.state == "running":
                return done("running", verdict)
            if verdict.state == "retrying":
                return done("retrying", verdict)
            return done("no_sign", verdict)
        await sleep(max(0.0, min(poll, deadline - clock())))


async def confirm_run(
    pctx: PatrolContext,
    inst: InstanceConfig,
    session: ServerSession,
    *,
    baseline: str | None,
    window: float,
    origin: str,
) -> WaitResult:
    """Wait for the run just sent to ``session`` to start; heal it on the spot if it fails."""
    async with pctx.client(inst) as client:

        async def look_at(base: str | None) -> Sighting:
            return await look(client, inst, session, base)

        async def fix(seen: Sighting, cand: HealCandidate) -> Healing:
            return await heal_session(pctx, inst, seen.rec, cand, origin=origin)

        return await wait_for_run(look_at, fix, window=window, baseline=baseline)
