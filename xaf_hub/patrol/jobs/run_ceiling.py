"""Patrol job: stop the runs that cost more than their ceiling (``budget.run_usd``).

The round looks at every running project session (not a sub-agent's, not on a production
instance) of an instance with a run ceiling, reads what its run cost since its prompt and
stops a run past the ceiling (``ops.ceiling.stop_over_ceiling``: task parked "over the run
ceiling", run aborted, audited). The daemon does the same live, within seconds of a step's
cost (``patrol.live``); the round is the net for what it missed and all ``patrol --once`` does.
"""

from __future__ import annotations

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.records import SessionRecord
from xaf_hub.errors import HubError
from xaf_hub.notify.record import session_action
from xaf_hub.ops.budget import run_ceiling
from xaf_hub.ops.ceiling import STEP, judge_run, over_ceiling, stop_over_ceiling
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.context import Cycle

__all__ = ["STEP", "check_run", "run_ceiling_job"]


def guarded(pctx: OpsContext, inst: InstanceConfig, rec: SessionRecord) -> bool:
    """Whether the patrol watches this session's run against a ceiling."""
    return (
        rec.running
        and not rec.parent_id
        and not inst.production
        and run_ceiling(pctx.cfg, inst) is not None
    )


async def check_run(
    pctx: OpsContext, cycle: Cycle, inst: InstanceConfig, rec: SessionRecord, origin: str
) -> bool:
    """Read one running session's run cost; stop and record it when past its ceiling.

    Returns True when it was stopped.
    """
    async with pctx.client(inst) as client:
        cost, ceiling = await over_ceiling(pctx, inst, rec, client)
        if ceiling is None or cost is None or not judge_run(ceiling, cost):
            return False
        over = await stop_over_ceiling(pctx, inst, rec, client, cost, ceiling, origin=origin)
    cycle.log.touched.add((inst.name, rec.id))
    cycle.log.add(
        pctx,
        session_action(STEP, "ceiling", "ok" if over.aborted else "failed", rec,
                       detail=over.detail, task=over.task),
    )
    return True


async def run_ceiling_job(pctx: OpsContext, cycle: Cycle) -> None:
    """Stop every watched run past its ceiling."""
    if pctx.cfg.budget.run_usd is None and all(
        i.budget_run_usd is None for i in pctx.cfg.instances
    ):
        return  # no ceiling anywhere: nothing to read
    fleet, _ = await cycle.scan(pctx)
    for inst, rec in fleet.work_sessions():
        if pctx.stop_requested():
            break
        if not guarded(pctx, inst, rec):
            continue
        try:
            await check_run(pctx, cycle, inst, rec, "patrol")
        except HubError as exc:
            cycle.log.error(pctx, STEP, f"{inst.name}/{rec.id}: {exc}")
