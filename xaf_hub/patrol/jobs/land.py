"""Patrol step: land every task whose verified work is ready (``project.integrate: "auto"``),
one at a time (``ops.land``), and tidy the branches and worktrees of tasks that landed or were
dropped. Called by ``fill_slots`` right after it settles, so a round or a live reaction that
finds a task verified lands it at once."""

from __future__ import annotations

from xaf_hub.core import aio
from xaf_hub.errors import HubError
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.land import land, tidy
from xaf_hub.patrol.context import Cycle

STEP = "land"
# What a landing did -> the report's section (patrol.report.SECTIONS) its action goes to.
_KINDS = {"landed": "landed", "sent_back": "retry", "person": "person"}


async def land_ready(pctx: OpsContext, cycle: Cycle) -> None:
    """Land what is ready, then tidy what has finished (each failure is the task's, never the
    round's)."""
    repo = pctx.cfg.repository
    if not repo.url:
        return
    for task in pctx.own((await aio.blocking(pctx.backlog().load)).tasks):
        if pctx.stop_requested():
            return
        key = (task.dispatched_to or "", task.session_id or "")
        try:
            if task.landing == "ready" and repo.integrate == "auto":
                done = await land(pctx, task.id)
                kind = _KINDS.get(done.result, "keep")
                outcome = "ok" if done.result in ("landed", "sent_back") else "skipped"
                cycle.log.add(pctx, STEP, kind, outcome, task, detail=done.detail)
                if done.result == "sent_back":
                    cycle.log.touched.add(key)
            elif task.landing in ("landed", "dropped") and task.worktree:
                left = await tidy(pctx, task)
                if left:
                    cycle.log.note(pctx, f"{STEP}: task {task.id}: {left}")
        except HubError as exc:
            cycle.log.error(pctx, STEP, f"task {task.id}: {exc}")
