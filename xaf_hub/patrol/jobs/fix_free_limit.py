"""Patrol job 1: decide which sessions to heal now (a rate limit or an unavailable model, not
healed before, not production, not a person's decision); ``ops.heal`` does the healing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.clock import to_ms
from xaf_hub.core.records import SessionRecord
from xaf_hub.core.runstate import LastRun
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.decisions import Decisions, load_decisions, person_stop
from xaf_hub.ops.heal import STEP, HealCandidate, heal, heal_candidate
from xaf_hub.patrol.context import Cycle, pool_discipline
from xaf_hub.patrol.jobs.check_agents import LOOKBACK, REFUSAL_WORDS
from xaf_hub.store.model_state import ModelState

__all__ = ["STEP", "fix_free_limit", "heal_item"]


async def fix_free_limit(pctx: OpsContext, cycle: Cycle) -> None:
    """Heal every rate-limited or model-unavailable project session once."""
    fleet, _ = await cycle.scan(pctx)
    horizon = to_ms(pctx.now() - LOOKBACK)  # failures older than this are history, not to heal now
    items = [
        (inst, rec)
        for inst, rec in fleet.work_sessions()
        if rec.run_state == "retry" or (rec.run_state == "idle" and rec.updated >= horizon)
    ]
    runs = await cycle.last_runs(pctx, items)
    state = pctx.model_state()
    # Each read once, when the first heal needs it.
    discipline = functools.cache(lambda: pool_discipline(pctx, cycle.log, STEP))
    people = functools.cache(lambda: load_decisions(pctx))
    for inst, rec in items:
        if pctx.stop_requested():
            break
        run = runs.get((inst.name, rec.id))
        cand = heal_candidate(rec, run)
        if cand is None or await aio.blocking(state.was_healed, cand.key):
            continue
        decisions = await aio.blocking(people)
        await heal_item(pctx, cycle, inst, rec, run, cand, state, decisions, discipline)


async def heal_item(
    pctx: OpsContext,
    cycle: Cycle,
    inst: InstanceConfig,
    rec: SessionRecord,
    run: LastRun | None,
    cand: HealCandidate,
    state: ModelState,
    people: Decisions,
    discipline: Callable[[], str | None],
) -> None:
    """Heal one candidate the job chose (the round, or a live reaction to one event).

    ``discipline`` gives the pool's discipline override, read only when a prompt is sent.
    """
    decision = people.for_session(inst.name, rec.id, run.created_ms if run else None)
    if decision is not None:
        cycle.log.add(pctx, STEP, "person", "skipped", rec, detail=decision.text,
                      why=decision.kind)
        return
    if inst.production:
        words = REFUSAL_WORDS["production"]
        cycle.log.add(pctx, STEP, "heal", "skipped", rec, detail=words, why="production")
        return
    since = run.created_ms if run else None
    healing = await cycle.attempt(
        pctx, STEP, "heal", rec,
        heal(pctx, inst, rec, cand, state, await aio.blocking(discipline),
             still_wanted=lambda: person_stop(pctx, inst.name, rec.id, since)),
        later="healed next cycle", from_model=cand.model,
    )
    if healing is None:
        return
    if healing.to_model is not None:
        cycle.log.touched.add((rec.instance, rec.id))
    result = "waiting" if healing.to_model is None else "ok"  # no usable model yet
    cycle.log.add(pctx, STEP, "heal", result, rec, detail=healing.detail,
                  model=healing.to_model or "", from_model=healing.from_model)
