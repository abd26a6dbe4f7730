"""Patrol job 4: settle dispatched tasks, then fill every free slot from the pool.

**Settling** a ``dispatched`` task looks at its session:

* finished cleanly (last run succeeded, not running) -> ``done``;
* failed for a *task* reason (context overflow, output too long, content filter, a 4xx the
  provider gave for the request itself...) -> back to ``pending`` with one attempt used and a
  back-off (``Backlog.requeue(infrastructure=False)``);
* failed for an *infrastructure* reason (rate limit, model unavailable, provider auth or 5xx,
  no connection to the provider, session gone, prompt never answered, instance unreachable for
  longer than ``patrol.stale_minutes``, instance removed from the config) -> back to
  ``pending`` without using an attempt (``infrastructure=True``). The abandoned session's
  failure is then marked settled, so fix_free_limit never heals it behind the pool's back;
* running, healed or resumed this cycle, or waiting for a slot to be -> left alone;
* interrupted and not resumed (check_agents resumes a session once; an operator's interrupt is
  a decision) -> left ``dispatched`` and listed in the report for a human.

**max_attempts**: a task whose attempts reach ``patrol.max_attempts`` stays ``pending`` but is
*blocked*: fill_slots never picks it again and the report lists it with its last error until a
human resets it (``xaf-hub backlog set ID --status pending --reset``).

**Filling**: free slots per instance are ``ops.load.instance_load``'s, on every reachable,
non-production instance with a directory for new sessions. Picking is ``backlog.pick_tasks``
in two rounds — first every instance takes its own pinned tasks then unpinned ones, then
instances with slots left borrow tasks pinned elsewhere — so an instance never takes a task
pinned to another one that still has room for it. Each pick goes through the same gated path
as ``dispatch`` (``planner.plan_create`` + ``ops.send.send_work``); a BusyError stops filling
that instance. The task is then marked ``dispatched`` (``Backlog.mark_dispatched``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from xaf_hub.backlog import Task, is_blocked, parse_instant, pick_tasks
from xaf_hub.config import InstanceConfig
from xaf_hub.errors import BusyError, HubError, UnreachableError, UsageError
from xaf_hub.gate import Gate
from xaf_hub.model_state import classify_error
from xaf_hub.ops.heal import heal_candidate
from xaf_hub.ops.load import instance_load
from xaf_hub.ops.models import choose_model
from xaf_hub.ops.runstate import LastRun, error_text
from xaf_hub.ops.send import build_prompt, send_work
from xaf_hub.patrol.context import Action, Cycle, Fleet, PatrolContext
from xaf_hub.planner import DispatchRequest, InstanceView, new_session_directory, plan_create
from xaf_hub.records import RunState, SessionRecord

STEP = "fill_slots"
# A prompt with no answer after this long was refused (e.g. a model the server does not know).
NO_ANSWER_GRACE = timedelta(minutes=2)
# A task's row is written just before its prompt is sent; a session read in between still
# shows its state from before the prompt. Rows younger than this are not judged yet.
JUST_DISPATCHED = timedelta(seconds=10)

_INFRA_ERROR_NAMES = frozenset({"ProviderAuthError"})
_INFRA_STATUS = frozenset({401, 403, 408, 409, 425})


def is_infrastructure_failure(error: Mapping[str, Any] | None) -> bool:
    """Tell an infrastructure failure (not the task's fault) from a task failure (pure)."""
    if error is None:
        return True  # no error object: the run never got going
    if classify_error(error) in ("rate_limited", "model_unavailable"):
        return True
    name = str(error.get("name") or "")
    if name in _INFRA_ERROR_NAMES:
        return True
    if name == "APIError":
        data = error.get("data") if isinstance(error.get("data"), Mapping) else {}
        assert isinstance(data, Mapping)
        code = data.get("statusCode")
        if not isinstance(code, int) or isinstance(code, bool):
            return True  # no HTTP status: the provider could not be reached at all
        return code >= 500 or code in _INFRA_STATUS
    return False


@dataclass(frozen=True)
class Sighting:
    """What the patrol saw of a dispatched task's session this cycle."""

    configured: bool = True
    reachable: bool = True
    session: SessionRecord | None = None
    run: LastRun | None = None
    touched: bool = False  # healed or resumed this cycle
    deferred: bool = False  # heal or resume waits for a free slot


@dataclass(frozen=True)
class Settlement:
    """What to do with a dispatched task."""

    action: Literal["keep", "done", "requeue"]
    infrastructure: bool = False
    reason: str = ""


def _age(task: Task, now: datetime) -> timedelta | None:
    try:
        at = parse_instant(task.dispatched_at)
    except ValueError:
        return None
    return None if at is None else now - at


def settle(task: Task, seen: Sighting, now: datetime, stale_minutes: float) -> Settlement:
    """Decide a dispatched task's fate from its session (pure)."""
    if task.status != "dispatched":
        return Settlement("keep")
    if not task.session_id or not task.dispatched_to:
        return Settlement("keep", reason="dispatched without a session id or instance")
    if not seen.configured:
        return Settlement("requeue", True, f"instance {task.dispatched_to} is no longer configured")
    age = _age(task, now)
    if not seen.reachable:
        if age is not None and age > timedelta(minutes=stale_minutes):
            return Settlement(
                "requeue",
                True,
                f"instance {task.dispatched_to} unreachable for more than {stale_minutes:g} min",
            )
        return Settlement("keep", reason="instance unreachable; checked again next cycle")
    if seen.session is None:
        return Settlement("requeue", True, "session gone from its instance")
    if seen.touched:
        return Settlement("keep", reason="healed or resumed this cycle")
    if seen.deferred:
        return Settlement("keep", reason="waiting for a free slot to be healed or resumed")
    if seen.session.running:
        return Settlement("keep")
    if age is not None and age < JUST_DISPATCHED:
        return Settlement("keep", reason="just dispatched; its prompt may not show yet")
    run = seen.run
    if run is None:
        return Settlement("keep", reason="last run could not be read")
    outcome = run.outcome
    if outcome == "succeeded":
        return Settlement("done")
    if outcome in ("aborted", "running"):
        return Settlement("keep", reason="interrupted and not resumed: needs a human")
    if outcome == "none":
        # No message at all: the session was recorded before its prompt (fill_slots does
        # that on purpose) and the hub stopped in between. Nothing ran; send it again.
        return Settlement(
            "requeue", True, "the session never received its prompt (the hub stopped first)"
        )
    if outcome == "pending":
        if age is not None and age > NO_ANSWER_GRACE:
            return Settlement(
                "requeue", True, "the prompt was never answered (model unknown to the server?)"
            )
        return Settlement("keep")
    reason = error_text(run.error) or outcome
    return Settlement("requeue", is_infrastructure_failure(run.error), reason)


def plan_fill(
    tasks: Sequence[Task], slots: Sequence[tuple[str, int]], now: datetime, max_attempts: int
) -> list[tuple[str, Task]]:
    """Which task goes to which instance, in dispatch order (pure).

    Round one: each instance (in ``slots`` order) takes its own pinned tasks, then unpinned
    ones. Round two: instances with slots left borrow tasks pinned to other instances.
    """
    usable = [t for t in tasks if not is_blocked(t, max_attempts)]
    free = dict(slots)
    picked: set[str] = set()
    plan: list[tuple[str, Task]] = []
    for borrow in (False, True):
        for name, _ in slots:
            if free[name] <= 0:
                continue
            # Non-pending tasks stay in the list: dependencies are judged against them.
            pool = [
                t
                for t in usable
                if t.status != "pending"
                or (t.id not in picked and (borrow or not t.instance or t.instance == name))
            ]
            for task in pick_tasks(pool, name, free[name], now):
                plan.append((name, task))
                picked.add(task.id)
                free[name] -= 1
    return plan


def session_title(task: Task) -> str:
    """The new session's title: the task title, led by its id when the title lacks it."""
    return task.title if task.id in task.title else f"{task.id} {task.title}"


# ---------------------------------------------------------------------------------------------
# I/O


async def fill_slots(pctx: PatrolContext, cycle: Cycle) -> None:
    """Settle dispatched tasks, then dispatch pending ones into every free slot."""
    scanned_at = pctx.now()
    fleet = await pctx.scan()
    cycle.note_instances(pctx, fleet)
    backlog = pctx.backlog()
    await settle_dispatched(pctx, cycle, fleet, backlog.load().tasks, scanned_at)
    if pctx.stop_requested():
        return
    data = backlog.load()
    gate = pctx.gate()
    slots = free_slots(fleet, gate)
    now = pctx.now()
    plan = plan_fill(
        data.tasks,
        [(inst.name, free) for inst, free, _ in slots],
        now,
        pctx.cfg.patrol.max_attempts,
    )
    if not plan:
        return
    where = {inst.name: (inst, directory) for inst, _, directory in slots}
    models = {name: choose_model(pctx.cfg, inst, None, now) for name, (inst, _) in where.items()}
    override = data.discipline
    stopped: set[str] = set()
    for name, task in plan:
        if pctx.stop_requested():
            break
        if name in stopped:
            continue
        inst, directory = where[name]
        try:
            await _dispatch(pctx, cycle, inst, directory, task, models[name], override)
        except BusyError as exc:
            stopped.add(name)
            cycle.add(
                pctx,
                Action(
                    STEP,
                    "dispatch",
                    "waiting",
                    name,
                    task=task.id,
                    title=task.title,
                    detail=f"instance full: {exc}",
                ),
            )
        except UnreachableError as exc:
            stopped.add(name)
            cycle.error(pctx, STEP, f"dispatch {task.id} to {name}: {exc}")
        except HubError as exc:
            cycle.add(
                pctx,
                Action(
                    STEP,
                    "dispatch",
                    "failed",
                    name,
                    task=task.id,
                    title=task.title,
                    detail=str(exc),
                ),
            )
            cycle.error(pctx, STEP, f"dispatch {task.id} to {name}: {exc}")


def free_slots(fleet: Fleet, gate: Gate) -> list[tuple[InstanceConfig, int, str]]:
    """(instance, free slots, new-session directory) of every instance that can take work."""
    out = []
    for sc in fleet.scans:
        if not sc.reachable or sc.inst.production:
            continue
        load = instance_load(sc, gate, allow_prod=True)
        view = InstanceView(sc.inst, True, "", tuple(sc.sessions), load.reserved or 0)
        try:
            directory = new_session_directory(view, DispatchRequest(text="fill"))
        except UsageError:
            continue  # neither default_directory nor roots: nowhere to create a session
        if load.free > 0:
            out.append((sc.inst, load.free, directory))
    return out


async def _dispatch(
    pctx: PatrolContext,
    cycle: Cycle,
    inst: InstanceConfig,
    directory: str,
    task: Task,
    model: str | None,
    override: str | None,
) -> None:
    title = session_title(task)
    plan = plan_create(inst, directory, title, via=f"patrol fill_slots ({task.id})")
    prompt = build_prompt(pctx, inst, task.prompt or task.title, task.title, override)

    def record(session_id: str) -> None:
        # Marked before the prompt goes out: if the patrol dies in between, the next cycle
        # finds the task dispatched (and settles it) instead of sending the work again.
        try:
            pctx.backlog().mark_dispatched(task.id, session_id, inst.name, model, pctx.now())
        except HubError as exc:
            cycle.error(
                pctx,
                STEP,
                f"task {task.id}: session {inst.name}/{session_id} created but the pool "
                f"could not record it, so no prompt was sent: {exc}",
            )
            raise

    async with pctx.client(inst) as client:
        result = await send_work(
            pctx, plan, prompt, model, client, command="patrol.fill_slots", before_prompt=record
        )
    for warning in result.warnings:
        cycle.note(pctx, f"{STEP}: {warning}")
    cycle.touched.add((inst.name, result.session_id))
    pctx.audit(
        "patrol.backlog",
        instance=inst.name,
        session=result.session_id,
        result="dispatched",
        reason=task.id,
        extra={"task": task.id},
    )
    cycle.add(
        pctx,
        Action(
            STEP,
            "dispatch",
            "ok",
            inst.name,
            result.session_id,
            task=task.id,
            title=task.title,
            detail=task.priority,
            model=result.model or "",
        ),
    )


async def _with_run_state(
    pctx: PatrolContext, inst: InstanceConfig, rec: SessionRecord
) -> SessionRecord:
    """Ask the run state of a task session outside the project (a forced manual dispatch)."""
    try:
        async with pctx.client(inst) as client:
            status = (await client.status(rec.directory)).get(rec.id)
    except HubError:
        return dataclasses.replace(rec, running=True, run_state="busy")  # unknown: leave it be
    kind = status.get("type") if status else None
    state: RunState = "retry" if kind == "retry" else "busy" if kind == "busy" else "idle"
    return dataclasses.replace(rec, running=state != "idle", run_state=state)


async def settle_dispatched(
    pctx: PatrolContext,
    cycle: Cycle,
    fleet: Fleet,
    tasks: Sequence[Task],
    scanned_at: datetime | None = None,
) -> None:
    """Mark finished tasks done and requeue failed ones.

    A task dispatched after ``scanned_at`` (by a concurrent `dispatch`) is left alone: the
    scan cannot have seen its session, and calling it gone would send the work twice.
    """

    def too_new(task: Task) -> bool:
        when = parse_instant(task.dispatched_at)
        return scanned_at is not None and when is not None and when >= scanned_at

    dispatched = [t for t in tasks if t.status == "dispatched" and not too_new(t)]
    if not dispatched:
        return
    configured = {i.name for i in pctx.cfg.instances}
    found: dict[str, tuple[InstanceConfig, SessionRecord | None, bool]] = {}
    for task in dispatched:
        sc = fleet.scan_of(task.dispatched_to or "")
        rec = None
        if sc is not None and sc.reachable:
            rec = next((s for s in sc.sessions if s.id == task.session_id), None)
            if rec is not None and not rec.project:
                rec = await _with_run_state(pctx, sc.inst, rec)
        if sc is not None:
            found[task.id] = (sc.inst, rec, sc.reachable)
    idle = [(inst, rec) for inst, rec, _ in found.values() if rec is not None and not rec.running]
    runs = await cycle.last_runs(pctx, idle)
    now = pctx.now()
    backlog = pctx.backlog()
    state = pctx.model_state()
    max_attempts = pctx.cfg.patrol.max_attempts
    for task in dispatched:
        inst, rec, reachable = found.get(task.id, (None, None, False))
        key = (task.dispatched_to or "", task.session_id or "")
        seen = Sighting(
            configured=task.dispatched_to in configured,
            reachable=reachable,
            session=rec,
            run=runs.get(key),
            touched=key in cycle.touched,
            deferred=key in cycle.deferred,
        )
        verdict = settle(task, seen, now, pctx.cfg.patrol.stale_minutes)
        try:
            if verdict.action == "done":
                backlog.mark_done(task.id, now)
                pctx.audit(
                    "patrol.backlog",
                    instance=key[0],
                    session=key[1],
                    result="done",
                    reason=task.id,
                    extra={"task": task.id},
                )
                cycle.add(
                    pctx, Action(STEP, "done", "ok", key[0], key[1], task=task.id, title=task.title)
                )
            elif verdict.action == "requeue":
                if rec is not None and seen.run is not None:
                    cand = heal_candidate(rec, seen.run)
                    if cand is not None:
                        # The pool moves on; the abandoned session must not be healed later.
                        state.remember_healed(cand.key, cand.model or None, None, now)
                new = backlog.requeue(
                    task.id, reason=verdict.reason, infrastructure=verdict.infrastructure, now=now
                )
                kind = "infrastructure" if verdict.infrastructure else "task"
                detail = f"{kind} failure: {verdict.reason}"
                if not verdict.infrastructure:
                    detail += f" (attempt {new.attempts} of {max_attempts})"
                    if is_blocked(new, max_attempts):
                        detail += "; attempts used up, blocked until a human resets it"
                pctx.audit(
                    "patrol.backlog",
                    instance=key[0],
                    session=key[1],
                    result="requeued",
                    reason=detail,
                    extra={"task": task.id},
                )
                cycle.add(
                    pctx,
                    Action(
                        STEP,
                        "requeue",
                        "ok",
                        key[0],
                        key[1],
                        task=task.id,
                        title=task.title,
                        detail=detail,
                    ),
                )
            elif verdict.reason:
                cycle.add(
                    pctx,
                    Action(
                        STEP,
                        "keep",
                        "skipped",
                        key[0],
                        key[1],
                        task=task.id,
                        title=task.title,
                        detail=verdict.reason,
                    ),
                )
        except HubError as exc:
            cycle.error(pctx, STEP, f"settle task {task.id}: {exc}")
