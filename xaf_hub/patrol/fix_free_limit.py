"""Patrol job 1: heal sessions that hit a rate limit or an unavailable model (SPEC §7, §8.1).

Two shapes of the same failure are healed:

* a session still in ``retry`` whose retry message is a rate-limit message (the provider may
  keep it there for hours with a long Retry-After): abort the stuck run, then prompt again;
* an idle session whose newest message is an assistant message that ended with a rate-limit
  or model-unavailable error: prompt again, through the gate (the run takes a slot again).

Order, as the seed learnt the hard way: mark the blackout first (only for a rate-limit signal
on a model of a blackout family, only through ``ModelState.mark_blackout``), then pick the next
usable model in the instance's chain (default_dispatch_model when the chain is exhausted),
then send the continue prompt with the discipline block. Each failure is healed once: its key
is instance + session + the failing assistant message id (a retry's message id for a stuck
retry), remembered in ``.model_state.json``. A new failure of the healed run is a new message,
so it is healed again with the model after that — the chain moves on, it never loops back.

The patrol never writes to a production instance, and never touches sub-agent sessions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from xaf_hub.client import OpencodeClient
from xaf_hub.config import InstanceConfig
from xaf_hub.discipline import CONTINUE_PROMPT
from xaf_hub.dispatcher import build_prompt, execute, model_chain
from xaf_hub.errors import BusyError, HubError
from xaf_hub.model_state import (
    ErrorClass,
    ModelState,
    classify_error,
    classify_message,
    family_of,
    next_model_in_chain,
    resolve_dispatch_model,
    to_ms,
)
from xaf_hub.outcome import error_text
from xaf_hub.patrol.context import Cycle, LastRun, PatrolContext, pool_discipline, session_action
from xaf_hub.planner import Plan
from xaf_hub.records import SessionRecord

STEP = "fix_free_limit"
# Failures older than this are history, not something to heal now.
LOOKBACK = timedelta(hours=24)
# How long to wait for an aborted retry to go idle before sending the new prompt.
ABORT_SETTLE_SECONDS = 10.0

Signal = Literal["rate_limited", "model_unavailable"]


@dataclass(frozen=True)
class HealCandidate:
    """A session the job should heal, and why."""

    instance: str
    session: str
    state: Literal["retry", "failed"]
    signal: Signal
    model: str  # the model that failed ("" when unknown)
    key: str  # the failure's identity, for "never heal twice"
    reason: str


def heal_key(instance: str, session: str, identity: str) -> str:
    """The healed-memory key of one failure."""
    return f"heal:{instance}:{session}:{identity}"


def heal_candidate(rec: SessionRecord, run: LastRun | None) -> HealCandidate | None:
    """Decide whether a session shows a healable failure (pure)."""
    if rec.run_state == "retry":
        if classify_message(rec.retry_message) != "rate_limited":
            return None
        # The retry lives inside one assistant message; its id names this stuck run.
        identity = run.message_id if run is not None and run.message_id else "retry"
        model = run.model if run is not None and run.model else rec.model
        return HealCandidate(
            rec.instance,
            rec.id,
            "retry",
            "rate_limited",
            model,
            heal_key(rec.instance, rec.id, identity),
            rec.retry_message,
        )
    if rec.run_state != "idle" or run is None or run.error is None or not run.message_id:
        return None
    kind: ErrorClass = classify_error(run.error)
    if kind not in ("rate_limited", "model_unavailable"):
        return None
    signal: Signal = "rate_limited" if kind == "rate_limited" else "model_unavailable"
    return HealCandidate(
        rec.instance,
        rec.id,
        "failed",
        signal,
        run.model or rec.model,
        heal_key(rec.instance, rec.id, run.message_id),
        error_text(run.error),
    )


def blackout_family(cand: HealCandidate, families: Mapping[str, Sequence[str]]) -> str | None:
    """The family to black out: only for a rate limit on a model of a blackout family."""
    if cand.signal != "rate_limited" or not cand.model:
        return None
    return family_of(cand.model, families)


def heal_target(
    current: str,
    chain: Sequence[str],
    default_model: str | None,
    blacked_out: set[str],
    families: Mapping[str, Sequence[str]],
) -> str | None:
    """The next usable model after ``current``; else the default if usable and different."""
    nxt = next_model_in_chain(current or None, chain, blacked_out, families)
    if nxt is not None:
        return nxt
    fallback = resolve_dispatch_model(
        explicit=None,
        chain=(),
        default_model=default_model,
        blacked_out=blacked_out,
        families=families,
    )
    return fallback if fallback and fallback != current else None


async def wait_until_idle(
    client: OpencodeClient, directory: str, session: str, timeout: float
) -> bool:
    """Poll the directory's status until ``session`` is no longer running (or timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        if session not in await client.status(directory):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.2)


async def fix_free_limit(pctx: PatrolContext, cycle: Cycle) -> None:
    """Heal every rate-limited or model-unavailable project session once."""
    fleet = await pctx.scan()
    now = pctx.now()
    horizon = to_ms(now - LOOKBACK)
    items = [
        (inst, rec)
        for inst, rec in fleet.work_sessions()
        if rec.run_state == "retry" or (rec.run_state == "idle" and rec.updated >= horizon)
    ]
    runs = await cycle.last_runs(pctx, items)
    state = pctx.model_state()
    override: str | None = None
    loaded = False
    for inst, rec in items:
        if pctx.stop_requested():
            break
        cand = heal_candidate(rec, runs.get((inst.name, rec.id)))
        if cand is None or state.was_healed(cand.key):
            continue
        if inst.production:
            cycle.add(
                pctx,
                session_action(
                    STEP,
                    "heal",
                    "skipped",
                    rec,
                    detail="production instance: the patrol never writes there",
                ),
            )
            continue
        if not loaded:
            override, loaded = pool_discipline(pctx, cycle, STEP), True
        try:
            await heal(pctx, cycle, inst, rec, cand, state, override)
        except BusyError as exc:
            cycle.deferred.add((inst.name, rec.id))
            cycle.add(
                pctx,
                session_action(
                    STEP,
                    "heal",
                    "waiting",
                    rec,
                    detail=f"no free slot yet, healed next cycle ({exc})",
                    from_model=cand.model,
                ),
            )
        except HubError as exc:
            cycle.add(
                pctx,
                session_action(STEP, "heal", "failed", rec, detail=str(exc), from_model=cand.model),
            )
            cycle.error(pctx, STEP, f"heal {inst.name}/{rec.id}: {exc}")


async def heal(
    pctx: PatrolContext,
    cycle: Cycle,
    inst: InstanceConfig,
    rec: SessionRecord,
    cand: HealCandidate,
    state: ModelState,
    override: str | None,
    *,
    origin: str = "patrol",
) -> str | None:
    """Heal one session: blackout if due, next model, abort a stuck retry, continue prompt.

    Returns the new model, or None when no usable model is left (nothing was sent). Also
    the building block for ``dispatch --confirm-wait`` and ``confirm --fix``
    (patrol/confirm.py); ``origin`` names the caller in the blackout's source and the audit
    log ("patrol", "dispatch", "confirm"), nothing else differs.
    """
    cfg = pctx.cfg
    families = cfg.models.families()
    now = pctx.now()
    family = blackout_family(cand, families)
    blackout = ""
    if family is not None:
        # Blackout first, then the target: the target must already skip the family.
        until_ms = state.mark_blackout(
            family, cand.reason[:300], f"{origin}.{STEP} {inst.name}/{rec.id}", now
        )
        until = datetime.fromtimestamp(until_ms / 1000, state.tz)
        blackout = f"{family} blacked out until {until:%Y-%m-%d %H:%M}"
        pctx.audit(
            f"{origin}.blackout",
            instance=inst.name,
            session=rec.id,
            result="blackout",
            reason=cand.reason[:300],
            extra={"family": family, "until_ms": until_ms},
        )
    target = heal_target(
        cand.model,
        model_chain(cfg, inst),
        cfg.models.default_dispatch_model,
        state.blacked_out_families(now),
        families,
    )
    if target is None:
        cycle.add(
            pctx,
            session_action(
                STEP,
                "heal",
                "waiting",
                rec,
                detail="; ".join(
                    p
                    for p in (
                        f"{cand.signal} on {cand.model or 'unknown model'}",
                        blackout,
                        "no usable model left in the chain",
                    )
                    if p
                ),
                from_model=cand.model,
            ),
        )
        return None
    prompt = build_prompt(cfg, inst, CONTINUE_PROMPT, rec.title, override)
    if cand.state == "retry":
        await _abort_and_prompt(pctx, inst, rec, prompt, target, origin)
    else:
        plan = Plan("reuse", inst, rec, rec.directory, rec.title, via=f"heal ({cand.signal})")
        async with pctx.client(inst) as client:
            await execute(
                cfg,
                plan,
                prompt,
                target,
                client,
                pctx.gate(),
                command=f"{origin}.heal",
                env=pctx.env,
            )
    state.remember_healed(cand.key, cand.model or None, target, now)
    cycle.touched.add((inst.name, rec.id))
    detail = f"{cand.signal} ({cand.state}): {cand.reason[:160]}"
    if blackout:
        detail += f"; {blackout}"
    cycle.add(
        pctx,
        session_action(STEP, "heal", "ok", rec, detail=detail, model=target, from_model=cand.model),
    )
    return target


async def _abort_and_prompt(
    pctx: PatrolContext,
    inst: InstanceConfig,
    rec: SessionRecord,
    prompt: str,
    model: str,
    origin: str,
) -> None:
    """Abort a stuck retry and send the new prompt while holding the instance's gate lock.

    The session holds a slot while it retries; holding the lock across abort -> prompt keeps
    any other dispatch from taking that slot in between.
    """
    try:
        async with pctx.client(inst) as client:
            with pctx.gate().lock(inst.name):
                await client.abort(rec.id)
                await wait_until_idle(client, rec.directory, rec.id, ABORT_SETTLE_SECONDS)
                await client.prompt_async(rec.id, prompt, model)
    except Exception as exc:
        pctx.audit(
            f"{origin}.heal", instance=inst.name, session=rec.id, result="failed", reason=str(exc)
        )
        raise
    pctx.audit(
        f"{origin}.heal",
        instance=inst.name,
        session=rec.id,
        result="abort+prompt",
        reason="stuck in retry with a rate limit",
        extra={"model": model},
    )
