"""Patrol job: stop the runs in flight that cost more than their ceiling (``budget.run_usd``),
sub-agents included; the round is the net for what the daemon's live check missed
(docs/budget.md).
"""

from __future__ import annotations

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.records import SessionRecord
from xaf_hub.errors import HubError
from xaf_hub.fleet.client import OpencodeClient
from xaf_hub.ops.budget import run_ceiling, run_roots
from xaf_hub.ops.ceiling import STEP, read_run, stop_over_ceiling
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.context import Cycle

__all__ = ["STEP", "check_run", "run_ceiling_job"]


def guarded(pctx: OpsContext, inst: InstanceConfig) -> bool:
    """Whether the patrol watches the runs of ``inst`` against a ceiling."""
    return not inst.production and run_ceiling(pctx.cfg, inst) is not None


async def check_run(
    pctx: OpsContext,
    cycle: Cycle,
    inst: InstanceConfig,
    rec: SessionRecord,
    client: OpencodeClient,
    origin: str,
) -> bool:
    """Read the run of the root session ``rec``; stop and record it when past its ceiling
    while some session of it works (one that ended, or was stopped already, is left alone).

    Returns whether it is to be watched on: some session of it still works (an abort the
    server did not confirm included).
    """
    run = await read_run(pctx, inst, rec, client)
    if run is None or not run.busy or not run.over:
        return run is not None and bool(run.busy)
    over = await stop_over_ceiling(pctx, inst, rec, client, run, origin=origin)
    cycle.log.touched.add((inst.name, rec.id))
    result = "ok" if over.aborted else "failed"
    cycle.log.add(pctx, STEP, "ceiling", result, rec, detail=over.detail, task=over.task)
    return not over.aborted


async def run_ceiling_job(pctx: OpsContext, cycle: Cycle) -> None:
    """Stop every watched run past its ceiling."""
    if not any(run_ceiling(pctx.cfg, i) is not None for i in pctx.cfg.instances):
        return  # no ceiling anywhere: nothing to read
    fleet, _ = await cycle.scan(pctx)
    for sc in fleet.reachable:
        runs = run_roots(s for s in sc.sessions if s.project).values()
        if not guarded(pctx, sc.inst) or not runs:
            continue
        async with pctx.client(sc.inst) as client:
            for rec in runs:
                if pctx.stop_requested():
                    return
                try:
                    await check_run(pctx, cycle, sc.inst, rec, client, "patrol")
                except HubError as exc:
                    cycle.log.error(pctx, STEP, f"{sc.inst.name}/{rec.id}: {exc}")
