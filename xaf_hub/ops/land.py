"""Landing verified work on the base branch, one task at a time per project (docs/worktrees.md).

``land`` lands one task under the ``LANDING`` lock: checks again when the base moved, pushes
without force, records, then removes the task's branch and worktree. A conflict goes back to the
task's session up to ``project.conflict_retries`` times; work already on the base is recorded,
never pushed twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from xaf_hub.core import aio
from xaf_hub.core.commits import short
from xaf_hub.core.records import Room, SessionRecord
from xaf_hub.errors import BusyError, UnreachableError, UsageError
from xaf_hub.fleet.scan import build_record
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.planner import plan_reuse
from xaf_hub.ops.rooms import close_room, in_room
from xaf_hub.ops.send import SendResult, build_prompt, held, pool_discipline, send_work
from xaf_hub.store import landing
from xaf_hub.store.contain import CheckRun
from xaf_hub.store.gate import Gate
from xaf_hub.store.repository import GitFailed, Mirror
from xaf_hub.store.tasks import Task, format_instant

LANDING = "@landing"  # the gate lock every landing holds (no instance is called that)
MOVED_TRIES = 3  # the base moved under the push this many times: the task waits a round

Result = Literal["landed", "sent_back", "person", "waiting", "dropped"]


@dataclass(frozen=True)
class Landed:
    """What ``land`` did with one task, in words for the report and as a value."""

    task: str
    result: Result
    detail: str
    commit: str = ""  # landed: the base branch's commit that carries the work


def can_land(task: Task, *, person: bool = False) -> str:
    """Why ``task`` cannot be landed now ("": it can); ``person``: a person asks."""
    if not task.worktree and not task.branch:
        return f"task {task.id} did not work in a worktree of its own: nothing to land"
    if task.landing == "landed":
        return f"task {task.id} has landed already ({short(task.landed or '')})"
    wanted = ("ready", "person", "conflict") if person else ("ready",)
    if task.landing not in wanted or not task.commit:
        return f"task {task.id} is not verified and ready to land (landing: {task.landing})"
    return ""


async def land(ops: OpsContext, task_id: str, *, person: bool = False) -> Landed:
    """Land one task's verified work now (see the module's docstring). UnreachableError when
    git cannot fetch, build or push it (the task stays as it was)."""
    cfg = ops.cfg
    if not cfg.repository.url:
        raise UsageError("project.repository is not set: the hub can land nothing")
    gate = ops.gate()
    async with held(gate, LANDING):
        task = (await aio.blocking(ops.backlog().load)).require(task_id)
        why = can_land(task, person=person)
        if why:
            raise UsageError(why)
        try:
            return await _land(ops, gate, task)
        except (GitFailed, OSError) as exc:
            raise UnreachableError("repository", f"{task.id} not landed: {exc}") from exc


async def _land(ops: OpsContext, gate: Gate, task: Task) -> Landed:
    """``land`` under ``gate``'s landing lock, for a task that can land."""
    cfg = ops.cfg
    mirror = Mirror.of(cfg)
    base = cfg.patrol.base_branch
    message = f"Merge {task.branch} ({task.id}: {task.title})"
    top, resolved = task.commit or "", False
    if task.landing in ("person", "conflict"):
        # A person resolved it on the branch and says so: the branch as it is now lands, and
        # the check runs on what lands (nobody checked that commit yet).
        now = (await aio.blocking(mirror.tips)).get(task.branch or "", "")
        top, resolved = (now, True) if now and now != top else (top, False)
    pool = ops.own((await aio.blocking(ops.backlog().load)).tasks)  # on its repository
    for _ in range(MOVED_TRIES):
        prep = await aio.blocking(
            landing.prepare, mirror, base, top, task.base,
            "merge" if cfg.repository.integrate_method == "merge" else "rebase", message,
        )
        if prep.state not in ("gone", "empty"):
            why = await aio.blocking(_kept_off, mirror, pool, task, prep.tip, top)
            if why:
                return _for_person(ops, task, why)
        if prep.state == "already":
            return await _landed(ops, task, prep.tip, "already on the base branch")
        if prep.state in ("empty", "gone"):
            return _for_person(ops, task, landing.describe(prep, base))
        if prep.state == "conflict":
            return await _conflict(ops, task, prep)
        if (prep.rechecked or resolved) and cfg.repository.check_command:
            run = await aio.blocking(mirror.run_check, prep.result, cfg.repository.check_command,
                                     cfg.repository.check_timeout_seconds)
            if not run.passed:
                return await _check_failed(ops, task, prep, run)
        if not await aio.blocking(gate.owns_lock, LANDING):
            raise BusyError("the landing lock was lost before the push: nothing was pushed")
        pushed = await aio.blocking(landing.push, mirror, prep.result, base, prep.tip)
        if pushed == "pushed":
            return await _landed(ops, task, prep.result, landing.describe(prep, base))
    return Landed(
        task.id, "waiting", f"origin/{base} moved under {MOVED_TRIES} pushes in a row; "
        "tried again next round"
    )


# How many of the latest landings each landing makes sure the base branch still holds.
LANDED_KEPT = 20


def _kept_off(mirror: Mirror, pool: Sequence[Task], task: Task, tip: str, top: str) -> str:
    """Why this landing must wait for a person ("" when it may go on): the base branch no
    longer holds what an earlier task landed (someone rewrote it), or the task's commits hold
    work a person dropped (its branch took in a dropped task's commits)."""
    landed = sorted(
        (t for t in pool if t.landing == "landed" and t.landed and t.id != task.id),
        key=lambda t: str(t.done_at or ""), reverse=True,
    )[:LANDED_KEPT]
    for t in landed:
        if not landing.contains(mirror, tip, t.landed or ""):
            return (f"origin/{landing.branch_of(mirror, tip)} no longer holds what {t.id} "
                    f"landed ({short(t.landed or '')}): the base branch was rewritten")
    dropped = {c: t.id for t in pool if t.landing == "dropped" for c in t.commits}
    if dropped:
        for c in landing.commits(mirror, task.base or tip, top):
            if c in dropped:
                return f"its branch holds {short(c)} of {dropped[c]}, which a person dropped"
    return ""


async def _landed(ops: OpsContext, task: Task, commit: str, how: str) -> Landed:
    """Record the landing, then take the task's branch and worktree away."""
    judged = f"landed on origin/{ops.cfg.patrol.base_branch} as {short(commit)} ({how})"
    task = await aio.blocking(ops.backlog().mark_landed, task, ops.now(), landed=commit,
                              judged=judged)
    await aio.blocking(ops.audit, "land", instance=task.dispatched_to or "",
                       session=task.session_id or "", result="landed", reason=task.id,
                       extra={"task": task.id, "commit": commit})
    left = await tidy(ops, task)
    return Landed(task.id, "landed", judged + (f"; {left}" if left else ""), commit)


async def tidy(ops: OpsContext, task: Task) -> str:
    """Delete a finished task's remote branch, then its worktree on its server: "" when both
    went, else what stays (a failure: the next round tries again). A landed task's branch goes
    only while it holds the landed work (a lease on its commit): one that moved on keeps its
    worktree too, and the row lets both go (said once); the base branch never goes."""
    if task.branch and task.branch != ops.cfg.patrol.base_branch:
        expected = task.commit if task.landing == "landed" else None
        try:
            gone = await aio.blocking(
                landing.delete_branch, Mirror.of(ops.cfg), task.branch, expected
            )
        except (GitFailed, BusyError, OSError) as exc:
            return f"its branch {task.branch} stays on the remote ({exc})"
        if not gone:
            await aio.blocking(ops.backlog().revise, task, worktree=None)
            return (
                f"its branch {task.branch} moved on past {short(expected or '')}: kept on the "
                "remote with its worktree (work nobody judged)"
            )
    if task.worktree and task.checkout and task.dispatched_to:
        inst = next((i for i in ops.cfg.instances if i.name == task.dispatched_to), None)
        if inst is None:
            return f"its worktree stays: instance {task.dispatched_to} is not configured"
        async with ops.client(inst) as client:
            why = await close_room(client, Room(task.worktree, task.branch or "", task.checkout))
        if why:
            return why
        await aio.blocking(ops.backlog().revise, task, worktree=None)
    return ""


def _for_person(ops: OpsContext, task: Task, why: str) -> Landed:
    ops.backlog().revise(task, landing="person", judged=f"not landed: {why}")
    return Landed(task.id, "person", f"not landed: {why}; waits for a person")


async def _conflict(ops: OpsContext, task: Task, prep: landing.Prepared) -> Landed:
    base = ops.cfg.patrol.base_branch
    said = landing.describe(prep, base)
    used = task.conflicts or 0
    if used >= ops.cfg.repository.conflict_retries:
        return _for_person(ops, task, said)
    files = "\n".join(f"- {f}" for f in prep.files)
    text = (
        f"Your branch could not be landed on `{base}`: it conflicts with work that landed "
        f"there since you started. The files:\n{files}\n\n"
        f"Rebase your branch onto the current `origin/{base}` (git fetch origin, then git "
        f"rebase origin/{base}), resolve each conflict keeping what both changes meant, check "
        "that the project still works, then push your branch again (git push "
        "--force-with-lease origin HEAD) and report the new commit hash."
    )
    await send_back(ops, task, text, landing="conflict", conflicts=used + 1, base=prep.tip,
                    judged=f"conflict, sent back: {said}")
    return Landed(task.id, "sent_back", f"conflict, sent back to its session: {said}")


async def _check_failed(
    ops: OpsContext, task: Task, prep: landing.Prepared, run: CheckRun
) -> Landed:
    """The check failed on the work rebuilt on a base that moved: back to the session."""
    base = ops.cfg.patrol.base_branch
    retries = (task.check_retries or 0) + 1
    said = "ran out of time" if run.code is None else f"exited with {run.code}"
    if retries > ops.cfg.repository.check_retries:
        await aio.blocking(ops.backlog().revise, task, check="failed",
                                check_commit=prep.result, check_output=run.tail)
        return _for_person(ops, task, f"the check {said} on it rebuilt on origin/{base}")
    text = (
        f"Your work passed the project's check, but rebuilt on the current `origin/{base}` "
        f"(which moved since) the check (`{ops.cfg.repository.check_command}`) {said}. "
        f"The end of its output:\n\n```\n{run.tail.replace('```', '` ` `')}\n```\n\n"
        f"Rebase your branch onto `origin/{base}`, fix the cause (do not change the tests or "
        "the check), push your branch again (git push --force-with-lease origin HEAD) and "
        "report the new commit hash."
    )
    await send_back(ops, task, text, landing=None, base=prep.tip, check="failed",
                    check_commit=prep.result, check_output=run.tail, check_retries=retries,
                    judged=f"check: failed on origin/{base} ({said}), sent back")
    return Landed(task.id, "sent_back", f"the check {said} on the moved base: sent back")


async def send_back_by_person(ops: OpsContext, task_id: str, text: str) -> Landed:
    """A person sends a task's work back to its session with ``text``: it works on, and is
    judged (and landed) again when that run ends."""
    gate = ops.gate()
    async with held(gate, LANDING):
        task = (await aio.blocking(ops.backlog().load)).require(task_id)
        if task.landing == "landed" or task.status != "dispatched":
            state = task.landing or task.status
            raise UsageError(f"task {task.id} is {state}: nothing to send back")
        tip = await aio.blocking(_base_tip, ops)
        await send_back(ops, task, text, landing=None, base=tip or task.base,
                        judged="sent back by a person")
    return Landed(task.id, "sent_back", "sent back to its session")


async def drop(ops: OpsContext, task_id: str) -> Landed:
    """A person gives a task's work up: its run is stopped, the task parked, its branch and
    worktree removed."""
    gate = ops.gate()
    async with held(gate, LANDING):
        task = (await aio.blocking(ops.backlog().load)).require(task_id)
        if not task.worktree and not task.branch:
            raise UsageError(f"task {task.id} did not work in a worktree of its own")
        if task.landing == "landed":
            raise UsageError(f"task {task.id} has landed already: nothing to drop")
        if task.dispatched_to and task.session_id:
            async with ops.client(ops.cfg.instance(task.dispatched_to)) as client:
                await client.abort(task.session_id, task.worktree)
        task = await aio.blocking(ops.backlog().revise, task, status="pending", landing="dropped",
                                  parked="dropped by a person", judged="dropped by a person")
        await aio.blocking(ops.audit, "land", instance=task.dispatched_to or "",
                           session=task.session_id or "", result="dropped", reason=task.id,
                           extra={"task": task.id})
        left = await tidy(ops, task)
    return Landed(task.id, "dropped", "dropped: parked" + (f"; {left}" if left else ""))


def _base_tip(ops: OpsContext) -> str | None:
    try:
        return Mirror.of(ops.cfg).tips().get(ops.cfg.patrol.base_branch)
    except (GitFailed, BusyError, OSError):
        return None


async def send_back(
    ops: OpsContext, task: Task, text: str, *, rec: SessionRecord | None = None,
    override: str | None = None, command: str = "land.send_back", **fields: object,
) -> SendResult:
    """Send ``text`` into the task's own session (``rec`` when the caller has read it; the
    discipline with it) through the gate, writing ``fields`` on its row first (and when it was
    sent: it is judged again once that run ends). BusyError when its server is full."""
    if not task.dispatched_to or not task.session_id:
        raise UsageError(f"task {task.id} has no session to send it back to")
    inst = ops.cfg.instance(task.dispatched_to)
    async with ops.client(inst) as client:
        if rec is None:
            s = await client.get_session(task.session_id, task.worktree)
            rec = replace(build_record(inst, s, None, True), branch=task.branch or "")
        if override is None:
            override, _ = pool_discipline(ops)
        # Its work is on its branch: continue there, never create it again.
        prompt = build_prompt(ops, inst, text, task.title, override, "exists",
                              room=in_room(inst, rec))
        stamp = {"dispatched_at": format_instant(ops.now())}

        def record(_: str, __: Room | None) -> None:
            ops.backlog().revise(task, **fields, **stamp)

        return await send_work(
            ops, plan_reuse(inst, rec, via=f"{command} ({task.id})"), prompt, task.model,
            client, command=command, steer=False, before_prompt=record,
        )
