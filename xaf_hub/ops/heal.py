"""Heal a session that hit a rate limit or an unavailable model: the one way, for everyone
(the patrol, ``confirm --fix``, ``dispatch --confirm-wait``).

A stuck retry is aborted and prompted again under the instance lock, an idle failed session is
prompted through the gate; the rest is marked first, then the next model of the chain. Each
failure is healed once (docs/architecture.md §7).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.clock import next_reset, to_ms
from xaf_hub.core.discipline import CONTINUE_PROMPT
from xaf_hub.core.limits import stated_end
from xaf_hub.core.records import SessionRecord
from xaf_hub.core.runstate import ErrorClass, LastRun, classify_error, classify_message, error_text
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.models import model_chain
from xaf_hub.ops.planner import plan_reuse
from xaf_hub.ops.rooms import in_room
from xaf_hub.ops.send import abort_and_prompt, build_prompt, pool_discipline, send_work
from xaf_hub.store.model_state import (
    HEAL_PREFIX,
    HealedSession,
    ModelState,
    family_of,
    next_model_in_chain,
    resolve_dispatch_model,
)

STEP = "fix_free_limit"

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
    at_ms: int = 0  # when the failed message began (0: now, a retry still under way)
    next_ms: int = 0  # a retry's next try (the provider's Retry-After when far enough off)
    error: Mapping[str, Any] | None = None  # a failed run's error (headers, message, body)


def heal_key(instance: str, session: str, identity: str) -> str:
    """The healed-memory key of one failure."""
    return f"{HEAL_PREFIX}{instance}:{session}:{identity}"


def heal_candidate(rec: SessionRecord, run: LastRun | None) -> HealCandidate | None:
    """Decide whether a session shows a healable failure (pure)."""
    if rec.run_state == "retry":
        if classify_message(rec.retry_message) != "rate_limited":
            return None
        # The retry lives inside one assistant message; its id names this stuck run.
        identity = run.message_id if run is not None and run.message_id else "retry"
        model = run.model if run is not None and run.model else rec.model
        key = heal_key(rec.instance, rec.id, identity)
        return HealCandidate(rec.instance, rec.id, "retry", "rate_limited", model, key,
                             rec.retry_message, next_ms=rec.retry_next)
    if rec.run_state != "idle" or run is None or run.error is None or not run.message_id:
        return None
    kind: ErrorClass = classify_error(run.error)
    if kind not in ("rate_limited", "model_unavailable"):
        return None
    signal: Signal = "rate_limited" if kind == "rate_limited" else "model_unavailable"
    key = heal_key(rec.instance, rec.id, run.message_id)
    return HealCandidate(rec.instance, rec.id, "failed", signal, run.model or rec.model, key,
                         error_text(run.error), run.created_ms, error=run.error)


def window_over(cand: HealCandidate, reset_hour: int, tz: tzinfo, now: datetime) -> bool:
    """Whether the rest a failure called for already ended: a reset hour passed since it.

    A heal that waited for a usable model past the reset must not black the family out again
    from the same old failure (each round after a reset would push the rest a day on, and the
    heal would wait for ever); a new rate limit is a new failure and blacks it out anew.
    """
    if cand.at_ms <= 0:
        return False  # a retry still under way: limited now
    began = datetime.fromtimestamp(cand.at_ms / 1000, UTC)
    return next_reset(began, reset_hour, tz) <= now


@dataclass(frozen=True)
class Rest:
    """The rest a rate limit calls for: what rests, until when, and why then."""

    target: str  # a family, or a model id when ``scope`` is "model"
    scope: str  # family | model
    until_ms: int
    why: str  # stated (the provider said when) | reset_hour (it said nothing)


def rest_for(
    cand: HealCandidate, *, scope: str, families: Mapping[str, Sequence[str]], reset_hour: int,
    tz: tzinfo, now: datetime, longest: timedelta,
) -> Rest | None:
    """The rest a failure calls for, or None (pure; docs/architecture.md §7).

    Only a rate limit rests anything: until the provider's stated end, else the next reset hour
    for a blackout family, never more than ``longest`` from now; None when that end already
    passed. ``scope`` "family" rests the model's family (the model alone when it has none),
    "model" the model alone.
    """
    if cand.signal != "rate_limited" or not cand.model:
        return None
    family = family_of(cand.model, families)
    stated = stated_end(now=now, next_ms=cand.next_ms, error=cand.error, said_ms=cand.at_ms,
                        message=cand.reason if cand.state == "retry" else "", longest=longest)
    if stated is not None:
        until_ms, why = to_ms(stated), "stated"
    elif family is None or window_over(cand, reset_hour, tz, now):
        return None
    else:
        until_ms, why = to_ms(next_reset(now, reset_hour, tz)), "reset_hour"
    until_ms = min(until_ms, to_ms(now + longest))
    if until_ms <= to_ms(now):
        return None
    if scope == "family" and family is not None:
        return Rest(family, "family", until_ms, why)
    return Rest(cand.model, "model", until_ms, why)


def heal_target(
    current: str, chain: Sequence[str], default_model: str | None, blacked_out: set[str],
    families: Mapping[str, Sequence[str]],
) -> str | None:
    """The next usable model after ``current``; else the default if usable and different."""
    nxt = next_model_in_chain(current or None, chain, blacked_out, families)
    if nxt is not None:
        return nxt
    fallback = resolve_dispatch_model(explicit=None, chain=(), default_model=default_model,
                                      blacked_out=blacked_out, families=families)
    return fallback if fallback and fallback != current else None


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
    blackout: str = ""  # "<family> blacked out until <local time>", when this heal marked one

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        doc = {k: getattr(self, k) for k in ("state", "signal", "from_model", "to_model", "reason")}
        rest = None if self.family is None else {"family": self.family, "until_ms": self.until_ms}
        return {**doc, "blackout": rest, "already_healed": self.already}

    @property
    def detail(self) -> str:
        """One line for reports: what failed, and the blackout it caused."""
        if self.to_model is None:
            failed = f"{self.signal} on {self.from_model or 'unknown model'}"
            said = (failed, self.blackout, "no usable model left in the chain")
            return "; ".join(p for p in said if p)
        text = f"{self.signal} ({self.state}): {self.reason[:160]}"
        return f"{text}; {self.blackout}" if self.blackout else text


async def heal(
    ops: OpsContext, inst: InstanceConfig, rec: SessionRecord, cand: HealCandidate,
    state: ModelState, override: str | None, *, origin: str = "patrol",
    still_wanted: Callable[[], str] | None = None,
) -> Healing:
    """Heal one session: blackout if due, next model, abort a stuck retry, continue prompt.

    ``Healing.to_model`` is None when no usable model is left (nothing was sent). ``origin``
    names the caller in the blackout's source and the audit log ("patrol", "dispatch",
    "confirm"); nothing else differs. Raises BusyError when the re-send finds no free slot,
    RunsAgain when ``still_wanted`` (the patrol's: ``decisions.person_stop``) says a person
    stopped it since it was judged.
    """
    cfg = ops.cfg
    families = cfg.models.families()
    now = ops.now()
    rest = rest_for(cand, scope=cfg.models.rest_scope, families=families,
                    reset_hour=state.reset_hour, tz=state.tz, now=now,
                    longest=timedelta(hours=cfg.models.max_rest_hours))
    blackout, until_ms, family = "", None, None
    if rest is not None:
        # The rest first, then the target: the target must already skip what rests.
        family = rest.target
        until_ms = await aio.blocking(
            state.mark_rest, rest.target, scope=rest.scope, until_ms=rest.until_ms, why=rest.why,
            reason=cand.reason[:300], source=f"{origin}.{STEP} {inst.name}/{rec.id}", now=now,
        )
        until = datetime.fromtimestamp(until_ms / 1000, state.tz)
        said = " (as the provider said)" if rest.why == "stated" else ""
        blackout = f"{family} blacked out until {until:%Y-%m-%d %H:%M}{said}"
        await aio.blocking(
            ops.audit, f"{origin}.blackout", instance=inst.name, session=rec.id,
            result="blackout", reason=cand.reason[:300],
            extra={"family": family, "until_ms": until_ms, "scope": rest.scope, "why": rest.why},
        )
    base = Healing(cand.state, cand.signal, cand.model, None, cand.reason, family, until_ms,
                   blackout=blackout)
    target = heal_target(cand.model, model_chain(cfg, inst), cfg.models.default_dispatch_model,
                         state.resting(now), families)
    if target is None:
        return base
    prompt = build_prompt(ops, inst, CONTINUE_PROMPT, rec.title, override, "unknown",
                          room=in_room(inst, rec))
    if cand.state == "retry":
        await abort_and_prompt(ops, inst, rec.id, rec.directory, prompt, target,
                               command=f"{origin}.heal", reason="stuck in retry with a rate limit",
                               still_wanted=still_wanted)
    else:
        plan = plan_reuse(inst, rec, via=f"heal ({cand.signal})")
        async with ops.client(inst) as client:
            await send_work(ops, plan, prompt, target, client, command=f"{origin}.heal",
                            steer=False, still_wanted=still_wanted)
    await aio.blocking(state.remember_healed, cand.key, cand.model or None, target, now,
                       who=HealedSession(inst.name, rec.id, rec.title))
    if family is not None:
        current = state.active_blackouts(now).get(family)
        base = replace(base, until_ms=current.until_ms if current is not None else until_ms)
    return replace(base, to_model=target)


async def heal_session(
    ops: OpsContext, inst: InstanceConfig, rec: SessionRecord, cand: HealCandidate, *, origin: str
) -> Healing:
    """Heal one failure as the patrol does, unless it was healed already (by anyone).

    Raises what ``heal`` raises (BusyError when the re-send finds no free slot).
    """
    state = ops.model_state()
    if await aio.blocking(state.was_healed, cand.key):
        return Healing(cand.state, cand.signal, cand.model, None, cand.reason, already=True)
    override, problem = await aio.blocking(pool_discipline, ops)
    healing = await heal(ops, inst, rec, cand, state, override, origin=origin)
    return replace(healing, notes=(f"{STEP}: {problem}",) if problem else ())
