"""Patrol job 2: classify the project's sessions (``core.runstate.classify``) and resume
interrupted ones.

A resume goes through the gate, never overfills an instance, and happens once per session; a
person's decision is never resumed (docs/architecture.md §8, step 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.clock import to_ms
from xaf_hub.core.discipline import RESUME_PROMPT
from xaf_hub.core.records import SessionRecord
from xaf_hub.core.runstate import LastRun, answer_hint, classify
from xaf_hub.errors import HubError
from xaf_hub.notify.record import SessionLine, Why
from xaf_hub.ops.budget import run_ceiling
from xaf_hub.ops.ceiling import read_run
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.decisions import load_decisions, person_stop
from xaf_hub.ops.models import choose_model
from xaf_hub.ops.planner import plan_reuse
from xaf_hub.ops.rooms import in_room
from xaf_hub.ops.send import SendResult, build_prompt, send_work
from xaf_hub.ops.waiting import PendingRequest, apply_policy, pending_of
from xaf_hub.patrol.context import Cycle, pool_discipline
from xaf_hub.store.model_state import ModelState

STEP = "check_agents"
LOOKBACK = timedelta(hours=24)  # the sessions a round looks at (and fix_free_limit heals)
# A run that "stopped without finishing" must be this quiet before it is resumed; the
# patrol reads ``patrol.run_start_grace_seconds`` (this is its default).
RUN_START_GRACE_MS = 60_000

# Why an interrupted session is not resumed now, as a code, with its words; the codes that leave
# it to a person are the action's ``why``.
Refusal = Literal["", "touched", "production", "resumed_once", "starting", "over_ceiling"]
REFUSAL_WORDS: dict[Refusal, str] = {
    "touched": "already prompted this cycle",
    "production": "production instance: the patrol never writes there",
    "resumed_once": "interrupted again after the patrol resumed it once; left for a human "
    "(xaf-hub dispatch --session ID --text ...)",
    "starting": "its run changed a moment ago and may still be starting; checked next cycle",
    "over_ceiling": "its run already cost more than its run ceiling; left for a person",
}
_FOR_PERSON: dict[Refusal, Why] = {"production": "production", "resumed_once": "resumed_once",
                                   "over_ceiling": "interrupted"}


def resume_key(instance: str, session: str) -> str:
    """The healed-memory key that records the patrol's one resume of a session."""
    return f"resume:{instance}:{session}"


def resume_refusal(
    *,
    production: bool,
    touched: bool,
    already_resumed: bool,
    run: LastRun | None,
    quiet_ms: int = RUN_START_GRACE_MS,
    grace_ms: int = RUN_START_GRACE_MS,
) -> Refusal:
    """Why an interrupted session must not be resumed now ("" = resume it) (pure).

    ``quiet_ms`` is how long the session has not changed: a run that "stopped without
    finishing" less than ``grace_ms`` ago may just be starting (its status can lag behind its
    messages).
    """
    rules: tuple[tuple[Refusal, bool], ...] = (  # the first that holds, in this order
        ("touched", touched), ("production", production), ("resumed_once", already_resumed),
        ("starting", run is not None and run.outcome == "running" and quiet_ms < grace_ms),
    )
    return next((why for why, holds in rules if holds), "")


async def check_agents(pctx: OpsContext, cycle: Cycle) -> None:
    """Classify every recent project session and resume the interrupted ones."""
    fleet, _ = await cycle.scan(pctx)
    cycle.note_instances(pctx, fleet)
    now_ms = to_ms(pctx.now())
    horizon = now_ms - int(LOOKBACK.total_seconds() * 1000)
    items = [
        (inst, rec) for inst, rec in fleet.work_sessions() if rec.running or rec.updated >= horizon
    ]
    runs = await cycle.last_runs(pctx, [(i, r) for i, r in items if not r.running])
    people = await aio.blocking(load_decisions, pctx)
    if people.problem:
        cycle.log.error(pctx, STEP, people.problem)
    interrupted = []
    for inst, rec in items:
        run = runs.get((inst.name, rec.id))
        state, detail = classify(rec, run, now_ms, pctx.cfg.patrol.stale_minutes)
        decision = people.for_session(inst.name, rec.id, run.created_ms if run else None)
        if decision is not None and not rec.running:
            if decision.kind != "steered" and state == "idle":
                state = "interrupted"  # stopped with a prompt still unanswered: looks idle
            if state == "interrupted":
                detail = decision.text
                cycle.log.add(pctx, STEP, "person", "skipped", rec, detail=detail,
                              why=decision.kind)
        model = run.model if run and run.model else rec.model
        asks = rec.waiting if state == "waiting" else None  # the request its run waits on
        cycle.log.sessions.append(SessionLine(
            inst.name, rec.id, rec.title, state, detail, model, rec.updated,
            asks.request_id if asks else "", answer_hint(asks) if asks else "", rec.owner,
        ))
        if state == "interrupted" and decision is None:
            interrupted.append((inst, rec, run))
    await answer_by_policy(pctx, cycle, pending_of(fleet.reachable).requests, now_ms)
    if not interrupted:
        return
    models = pctx.model_state()
    override = await aio.blocking(pool_discipline, pctx, cycle.log, STEP)
    # Most recently interrupted first: the freshest work is the most likely to matter.
    for inst, rec, run in sorted(interrupted, key=lambda x: x[1].updated, reverse=True):
        if pctx.stop_requested():
            break
        await resume_one(pctx, cycle, inst, rec, run, override, models, now_ms)


async def resume_one(
    pctx: OpsContext,
    cycle: Cycle,
    inst: InstanceConfig,
    rec: SessionRecord,
    run: LastRun | None,
    override: str | None,
    models: ModelState,
    now_ms: int,
) -> Refusal:
    """Resume one interrupted session (not a person's decision) unless a rule says no.

    Returns that rule ("" = sent). The round calls it for each interrupted session; the
    daemon's live reactions for one.
    """
    why = resume_refusal(
        production=inst.production,
        touched=(inst.name, rec.id) in cycle.log.touched,
        already_resumed=await aio.blocking(models.was_healed, resume_key(inst.name, rec.id)),
        run=run,
        quiet_ms=now_ms - rec.updated,
        grace_ms=int(pctx.cfg.patrol.run_start_grace_seconds * 1000),
    )
    if not why and await _over_ceiling(pctx, inst, rec):
        why = "over_ceiling"
    if why:
        cycle.log.add(pctx, STEP, "resume", "skipped", rec, detail=REFUSAL_WORDS[why],
                      why=_FOR_PERSON.get(why, ""))
        return why
    # Resume on the model the run used, unless its family is blacked out meanwhile.
    model = choose_model(
        pctx, inst, (run.model if run and run.model else rec.model) or None, pctx.now()
    )
    prompt = build_prompt(
        pctx, inst, RESUME_PROMPT, rec.title, override, "unknown", room=in_room(inst, rec)
    )
    plan = plan_reuse(inst, rec, via="patrol resume")
    since = run.created_ms if run else None

    async def send() -> SendResult:
        async with pctx.client(inst) as client:
            return await send_work(
                pctx, plan, prompt, model, client, command="patrol.resume", steer=False,
                still_wanted=lambda: person_stop(pctx, inst.name, rec.id, since),
            )

    sent = await cycle.attempt(pctx, STEP, "resume", rec, send(), later="tried again next cycle")
    if sent is None:
        return ""
    for warning in sent.warnings:
        cycle.log.note(pctx, f"{STEP}: {warning}")
    await aio.blocking(
        pctx.model_state().remember_healed, resume_key(inst.name, rec.id), model, model, pctx.now()
    )
    cycle.log.touched.add((inst.name, rec.id))
    how = "" if run is None else "stopped without finishing"
    how = "was aborted" if run is not None and run.outcome == "interrupted" else how
    cycle.log.add(pctx, STEP, "resume", "ok", rec, detail=how, model=model or "")
    return ""


async def _over_ceiling(pctx: OpsContext, inst: InstanceConfig, rec: SessionRecord) -> bool:
    """Whether the run to resume already cost more than its ceiling, by the server's figures
    (the hub's record of its stop may be lost with Redis)."""
    if run_ceiling(pctx.cfg, inst) is None:
        return False
    try:
        async with pctx.client(inst) as client:
            run = await read_run(pctx, inst, rec, client)
    except HubError:
        return False  # not read: the resume's own send meets the same server
    return run is not None and run.over


async def answer_by_policy(
    pctx: OpsContext, cycle: Cycle, requests: Sequence[PendingRequest], now_ms: int
) -> None:
    """Answer what ``permissions`` decides among the project's waiting runs and record it
    (the round here, the daemon's live reaction to a request as it appears).

    A session this cycle already acted on is left alone: above all a run the ceiling job
    stopped while it waited (``run_ceiling`` runs first), whose approval would let it go on."""

    ours = [
        p for p in requests
        if p.session.project and (p.instance, p.session.id) not in cycle.log.touched
    ]
    for o in await apply_policy(pctx, ours, now_ms):
        result = {"sent": "ok", "failed": "failed"}.get(o.result, "skipped")
        words = f"{o.answer.reply.words()} {o.request.waiting.request_id} by {o.answer.rule}"
        words += f": {o.detail}" if o.detail else ""
        cycle.log.add(pctx, STEP, "answer", result, o.request.session, detail=words)
