"""Which model a piece of work runs on: the fleet's model state, chains and the choice.

Blackouts and healed failures live in one store (a file, or Redis when
``models.state_backend`` asks); ``choose_model`` applies the current blackouts to an
instance's chain. Every send path picks its model here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core.clock import iso_time, to_ms
from xaf_hub.errors import UsageError
from xaf_hub.store.audit import caller
from xaf_hub.store.model_state import (
    WHY_WORDS,
    Blackout,
    ModelState,
    family_of,
    resolve_dispatch_model,
)

if TYPE_CHECKING:  # ops.context imports this module
    from xaf_hub.ops.context import OpsContext


def model_chain(cfg: Config, inst: InstanceConfig) -> tuple[str, ...]:
    """The instance's model chain, else the global one."""
    return inst.models or cfg.models.chain


def choose_model(
    ops: OpsContext, inst: InstanceConfig, explicit: str | None, now: datetime | None = None,
    avoid: Sequence[str] = (),
) -> str | None:
    """``pick_model`` with the current blackouts, no model of ``avoid``.

    A task whose run failed by naming its model (provider 401, model unavailable) moves
    along the chain this way, past the models it tried, before its failure counts as
    infrastructure; None when every model was tried.
    """
    resting = ops.model_state().resting(now or datetime.now(UTC))
    return pick_model(ops.cfg, inst, explicit, resting, avoid)


def pick_model(
    cfg: Config, inst: InstanceConfig, explicit: str | None, resting: set[str],
    avoid: Sequence[str] = (),
) -> str | None:
    """resolve_dispatch_model for one instance: its chain, the default model, what rests;
    no model of ``avoid``."""
    default = cfg.models.default_dispatch_model
    chain = [m for m in model_chain(cfg, inst) if m not in avoid]
    return resolve_dispatch_model(explicit=explicit, chain=chain, blacked_out=resting,
                                  default_model=None if default in avoid else default,
                                  families=cfg.models.families())


# ---------------------------------------------------------------------------------------------
# What rests, for people: `xaf-hub models`, the page's resting panel and `doctor` read this.



# A model line's rest fields (``rest_json``'s), in the order the line gives them.
_LINE_REST = ("resting_until", "rests", "scope", "why", "why_words", "reason", "source")


@dataclass(frozen=True)
class ModelLine:
    """One model of the chains: its family, its rest (if any) and who would use it next."""

    model: str
    family: str | None
    rest: Blackout | None  # the rest that keeps it unused (its own, else its family's)
    next_for: tuple[str, ...]  # instances whose next dispatch would run on it

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``resting_until`` ISO 8601 UTC, null when it does not rest)."""
        rest = rest_json(self.rest) if self.rest is not None else {}
        return {
            "model": self.model,
            "family": self.family,
            "resting": self.rest is not None,
            **{key: rest.get(key) for key in _LINE_REST},
            "next_for": list(self.next_for),
        }


@dataclass(frozen=True)
class ModelsView:
    """Every model of the chains and every rest in force (some rest models in no chain)."""

    lines: tuple[ModelLine, ...]
    rests: tuple[Blackout, ...]
    reset_hour: int
    timezone: str

    def to_json(self) -> dict[str, Any]:
        """The JSON form of `xaf-hub models --json`."""
        return {
            "models": [line.to_json() for line in self.lines],
            "rests": [rest_json(b) for b in self.rests],
            "reset_hour": self.reset_hour,
            "timezone": self.timezone,
        }


def rest_json(b: Blackout) -> dict[str, Any]:
    """One rest as JSON (what rests, until when, why)."""
    return {
        "rests": b.family,
        "scope": b.scope,
        "resting_until": iso_time(b.until_ms),
        "why": b.why,
        "why_words": WHY_WORDS.get(b.why, b.why),
        "reason": b.reason,
        "source": b.source,
    }


def chain_models(cfg: Config) -> tuple[str, ...]:
    """Every model a dispatch may pick: the chains (global, then each instance's), the default."""
    instances = (m for inst in cfg.instances for m in inst.models)
    every = (*cfg.models.chain, *instances, cfg.models.default_dispatch_model)
    return tuple(dict.fromkeys(m for m in every if m))


def families_chosen(cfg: Config) -> dict[str, list[str]]:
    """The blackout families a person chose: all of them when the config names
    ``models.blackout_families``, else those holding a model the config names (the built-in
    family alone, over models nobody named, is nobody's choice)."""
    families = cfg.models.families()
    if cfg.models.families_named:
        return families
    used = {family_of(m, families) for m in chain_models(cfg)}
    return {name: prefixes for name, prefixes in families.items() if name in used}


def models_view(cfg: Config, now: datetime, state: ModelState) -> ModelsView:
    """What rests and until when, for every model of the chains (one reading of the state).

    Raises StateFileError / the Redis store's errors when the model state cannot be read.
    """
    rests = state.active_blackouts(now)
    families = cfg.models.families()
    resting = set(rests)
    next_for: dict[str, list[str]] = {}
    for inst in cfg.instances:
        pick = pick_model(cfg, inst, None, resting)
        if pick:
            next_for.setdefault(pick, []).append(inst.name)
    lines = []
    for model in chain_models(cfg):
        family = family_of(model, families)
        rest = rests.get(model) or (rests.get(family) if family is not None else None)
        lines.append(ModelLine(model, family, rest, tuple(next_for.get(model, ()))))
    ordered = tuple(sorted(rests.values(), key=lambda b: (b.until_ms, b.family)))
    return ModelsView(tuple(lines), ordered, cfg.models.blackout_reset_hour, cfg.models.timezone)


def rest_scope_of(cfg: Config, target: str) -> str:
    """Whether ``target`` names a family or a model; UsageError for neither."""
    if target in cfg.models.families():
        return "family"
    if "/" in target.strip("/") and not target.startswith("/"):
        return "model"
    families = ", ".join(sorted(cfg.models.families())) or "none configured"
    raise UsageError(
        f"{target!r} is neither a blackout family ({families}) nor a model 'provider/model'"
    )


def end_rest(ops: OpsContext, target: str) -> list[Blackout]:
    """A person ends the rest of a family or a model (the model's own and its family's).

    Returns the rests that were in force and ended (empty: nothing rested). Audited.
    """
    model = rest_scope_of(ops.cfg, target) == "model"
    family = family_of(target, ops.cfg.models.families()) if model else None
    ended = ops.model_state().end_rests({t for t in (target, family) if t}, ops.now())
    ops.audit("models.clear", result="cleared" if ended else "nothing",
              reason=f"rest of {target} ended by a person",
              extra={"ended": [rest_json(b) for b in ended]})
    return ended


def start_rest(ops: OpsContext, target: str, until: datetime, reason: str = "") -> Blackout:
    """A person rests a model or a family until ``until``; returns the rest as stored. Audited."""
    scope = rest_scope_of(ops.cfg, target)
    now = ops.now()
    state = ops.model_state()
    state.mark_rest(target, scope=scope, until_ms=to_ms(until), why="person",
                    reason=reason or "set by a person",
                    source=f"models.rest {caller(ops.env) or 'cli'}", now=now)
    rest = state.active_blackouts(now)[target]
    ops.audit("models.rest", result="rested", reason=reason or "set by a person",
              extra=rest_json(rest))
    return rest
