"""Patrol job 4, its first half: settle each ``dispatched`` task from its session.

``patrol.settle`` decides: done (with ``project.repository`` only once its claimed commits are
verified and the project's check passed), back to ``pending``, sent back once after a failed
check, or kept for a person; a person's decision (``ops.decisions``) is never requeued or sent
again. ``fill_slots`` runs this before it fills the free slots (docs/architecture.md §8).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.clock import read_instant
from xaf_hub.core.commits import claimed_commits, short
from xaf_hub.core.records import SessionRecord
from xaf_hub.errors import BusyError, HubError, SessionNotFound, TaskChanged
from xaf_hub.fleet.scan import build_record, read_status
from xaf_hub.notify.record import Action
from xaf_hub.ops.context import Fleet, OpsContext
from xaf_hub.ops.decisions import decisions_from, people_interrupts
from xaf_hub.ops.heal import heal_candidate
from xaf_hub.ops.land import send_back
from xaf_hub.ops.models import choose_model
from xaf_hub.patrol.context import Cycle, pool_discipline, task_branches
from xaf_hub.patrol.settle import (
    NOT_VERIFIED,
    Settlement,
    Sighting,
    credited_commits,
    retry_text,
    settle,
    settle_check,
    settle_claim,
)
from xaf_hub.store.contain import CheckRun
from xaf_hub.store.pick import is_blocked
from xaf_hub.store.pool import InfraPolicy
from xaf_hub.store.repository import Check, GitFailed, Mirror, remote_name
from xaf_hub.store.tasks import Task

# Settling is the first half of the fill_slots step: its actions and errors are logged as that.
STEP = "fill_slots"


async def _with_run_state(
    pctx: OpsContext, inst: InstanceConfig, rec: SessionRecord
) -> SessionRecord:
    """Ask the run state of a task session outside the project (a forced manual dispatch)."""
    try:
        async with pctx.client(inst) as client:
            status = (await client.status(rec.directory)).get(rec.id)
    except HubError:
        return dataclasses.replace(rec, running=True, run_state="busy")  # unknown: leave it be
    state, message, nxt = read_status(status)
    return dataclasses.replace(
        rec, running=state != "idle", run_state=state, retry_message=message, retry_next=nxt
    )


async def _look_up(
    pctx: OpsContext, inst: InstanceConfig, session_id: str
) -> tuple[SessionRecord | None, bool]:
    """A task's session the round's scan did not list, asked for by id: (record, reachable).

    (None, True) only when the instance says it does not know the session; an error is
    (None, False), judged like an unreachable instance (kept, requeued after stale_minutes).
    A session that is there (created after the scan, or archived, which lists leave out) is
    judged like any other.
    """
    if not session_id:
        return None, True
    try:
        async with pctx.client(inst) as client:
            s = await client.get_session(session_id)
            status = (await client.status(s.directory)).get(session_id) if s.directory else None
    except SessionNotFound:
        return None, True
    except HubError:
        return None, False
    return build_record(inst, s, status, inst.rules.is_project(s.directory)), True


async def settle_dispatched(
    pctx: OpsContext, cycle: Cycle, fleet: Fleet, tasks: Sequence[Task],
    scanned_at: datetime | None = None,
) -> None:
    """Mark finished tasks done and requeue failed ones.

    A task dispatched after ``scanned_at`` (by a concurrent `dispatch` or another hub's round)
    is left alone: the scan cannot have seen its session, and calling it gone would send the
    work twice. The pool stores whole seconds, so "after" is compared at that grain; and a
    session the scan did not list is looked up by id before it is called gone (another host's
    clock may run behind this one's).
    """
    since = None if scanned_at is None else scanned_at.replace(microsecond=0)

    def too_new(task: Task) -> bool:
        when = read_instant(task.dispatched_at)
        return since is not None and when is not None and when >= since

    # Verified work waiting to land (or for a person to land it) is not judged again.
    dispatched = [
        t for t in tasks
        if t.status == "dispatched" and not too_new(t) and t.landing not in ("ready", "person")
    ]
    if not dispatched:
        return
    configured = {i.name for i in pctx.cfg.instances}
    found: dict[str, tuple[InstanceConfig, SessionRecord | None, bool]] = {}
    for task in dispatched:
        sc = fleet.scan_of(task.dispatched_to or "")
        if sc is None:
            continue
        rec, reachable = None, sc.reachable
        if sc.reachable:
            rec = next((s for s in sc.sessions if s.id == task.session_id), None)
            if rec is None:
                rec, reachable = await _look_up(pctx, sc.inst, task.session_id or "")
            elif not rec.project:
                rec = await _with_run_state(pctx, sc.inst, rec)
        found[task.id] = (sc.inst, rec, reachable)
    idle = [(inst, rec) for inst, rec, _ in found.values() if rec is not None and not rec.running]
    # Verification reads each final answer, which the rounds' memory does not keep.
    runs = await cycle.last_runs(pctx, idle, answers=bool(pctx.cfg.repository.url))
    now = pctx.now()
    people = decisions_from(people_interrupts(pctx), tasks)
    patrol = pctx.cfg.patrol
    grace = timedelta(seconds=patrol.no_answer_grace_seconds)
    young = timedelta(seconds=patrol.just_dispatched_seconds)
    judged: list[tuple[Task, InstanceConfig | None, Sighting, Settlement]] = []
    for task in dispatched:
        inst, rec, reachable = found.get(task.id, (None, None, False))
        key = (task.dispatched_to or "", task.session_id or "")
        decision = people.for_task(task)
        seen = Sighting(
            task.dispatched_to in configured, reachable, rec, runs.get(key),
            touched=key in cycle.log.touched, deferred=key in cycle.log.deferred,
            decision=decision.text if decision is not None else "",
        )
        verdict = settle(task, seen, now, patrol.stale_minutes, grace, young)
        judged.append((task, inst, seen, verdict))
    checks = await _verify(pctx, cycle, [(t, i, s) for t, i, s, v in judged if v.action == "done"])
    # Each commit is credited to one task: those done before, and those done this round; a
    # commit another task's answer names this round is that task's.
    credited = credited_commits(tasks)
    claims: dict[str, list[str]] = {}
    for tid, (answer, _) in checks.items():
        for c in answer.claimed:
            claims.setdefault(c, []).append(tid)
    checked = [0.0]  # seconds of project checks this round (bounded: see _run_check)
    for task, inst, seen, first in judged:
        check, where = checks.get(task.id, (None, ""))
        shared = inst is None or inst.branch_policy == "mainline"
        verdict = settle_claim(
            first, check, where, shared=shared, credited=credited, claims=claims, task=task.id
        )
        try:
            verdict = await _run_check(pctx, task, verdict, checked)
            if verdict.action == "done":
                ran = {} if (run := verdict.check) is None else {
                    "check": "passed", "check_commit": verdict.commit, "check_output": run.tail}
                if task.branch and verdict.verified and pctx.cfg.repository.integrate != "off":
                    # Its own branch: done once it has landed (patrol.jobs.land, or a person).
                    await aio.blocking(
                        pctx.backlog().mark_ready, task, commit=verdict.commit,
                        commits=verdict.commits, judged=verdict.judged or None, check=ran,
                    )
                    credited.update(dict.fromkeys(verdict.commits, task.id))
                    said = f"verified, ready to land: {verdict.judged or verdict.commit}"
                    cycle.log.add(pctx, STEP, "verified", "ok", task, detail=said)
                    continue
                verified = verdict.verified is True
                await aio.blocking(
                    pctx.backlog().mark_done, task.id, now, commit=verdict.commit or None,
                    commits=verdict.commits, verified=verdict.verified,
                    expected=task,  # a person's change during the verification stands
                    judged=verdict.judged or (None if verified else NOT_VERIFIED), check=ran,
                )
                credited.update(dict.fromkeys(verdict.commits, task.id))
                proof = {} if not verdict.verified else {
                    "commit": verdict.commit, "commits": list(verdict.commits)}
                said = f"verified: commit {verdict.commit} on the repository" if proof else ""
                if len(verdict.commits) > 1:
                    more = len(verdict.commits) - 10
                    said += ", credited with " + ", ".join(map(short, verdict.commits[:10]))
                    said += f" and {more} more" if more > 0 else ""
                if verdict.judged:
                    said += f" ({verdict.judged})"
                act = Action.of(STEP, "done" if verified else "finished", "ok", task,
                                detail=said or NOT_VERIFIED)
                cycle.record(pctx, act, "done", task.id, verified=verified, **proof)
            elif verdict.action == "requeue":
                detail = await aio.blocking(_requeue, pctx, task, inst, seen, verdict, now)
                act = Action.of(STEP, "requeue", "ok", task, detail=detail)
                cycle.record(pctx, act, "requeued", detail)
            elif verdict.action == "retry":
                assert inst is not None and seen.session is not None
                await _send_back(pctx, cycle, inst, seen.session, task, verdict)
            elif not verdict.reason:
                if task.person:  # the patrol goes on with it: no longer a person's
                    await aio.blocking(pctx.backlog().note_check, task, person=None)
            else:
                await aio.blocking(_note_judged, pctx, task, verdict)
                kind = "person" if verdict.person else "keep"
                cycle.log.add(pctx, STEP, kind, "skipped", task, detail=verdict.reason,
                              why=verdict.why)
        except TaskChanged as exc:
            # A person changed the row while the round judged it (a verification can take
            # the fetch's whole time): their change stands, nothing is written over it.
            cycle.log.add(pctx, STEP, "keep", "skipped", task, detail=str(exc))
        except HubError as exc:
            cycle.log.error(pctx, STEP, f"settle task {task.id}: {exc}")


async def _verify(
    pctx: OpsContext, cycle: Cycle, finished: Sequence[tuple[Task, InstanceConfig | None, Sighting]]
) -> dict[str, tuple[Check, str]]:
    """Look up each finished task's claimed commits on project.repository (one fetch):
    task id -> (what the mirror found, the expected branches as a reason names them).

    {} without a repository: every task is done on the agent's word (verified null).
    """
    repo = pctx.cfg.repository
    if not repo.url or not finished:
        return {}
    override = pool_discipline(pctx, cycle.log, STEP)
    wanted: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for task, inst, seen in finished:
        answer = seen.run.answer if seen.run is not None else ""
        # The discipline named the branch from the task's title (fill_slots) or, in a
        # resume or heal, from the session's: either is where the agent was told to push.
        titles = [task.title] + ([seen.session.title] if seen.session is not None else [])
        branches = (task.branch,) if task.branch else task_branches(
            pctx, inst, [t or task.id for t in titles], override
        )
        wanted.append((claimed_commits(answer), branches))
    mirror = Mirror.of(pctx.cfg)
    bases = [task.base for task, _, _ in finished]
    checks = await aio.blocking(mirror.check_all, wanted, bases, repo.locked)
    if mirror.rebuilt:
        cycle.log.note(pctx, f"{STEP}: {mirror.rebuilt}")
    return {
        task.id: (check, remote_name(branches))
        for (task, _, _), check, (_, branches) in zip(finished, checks, wanted, strict=True)
    }


async def _run_check(
    pctx: OpsContext, task: Task, verdict: Settlement, checked: list[float]
) -> Settlement:
    """Run project.check_command on a verified commit and weigh it (``settle_check``).

    Not run again for a commit whose check already failed with no retry left; a worktree
    that cannot be made keeps the task as it is for the next round. Checks run one after
    another; once this round's (``checked``) add up to ``check_timeout_seconds``, no more
    start: the tasks left wait for the next round, so one round costs at most about twice
    the bound however many tasks finished.
    """
    repo = pctx.cfg.repository
    if verdict.action != "done" or not verdict.verified or not repo.check_command:
        return verdict
    settled = task.check == "failed" and task.check_commit == verdict.commit
    run: CheckRun | None = None
    if not (settled and (task.check_retries or 0) >= repo.check_retries):
        if checked[0] >= repo.check_timeout_seconds:
            said = f"this round's checks took {checked[0]:.0f}s; it runs next round"
            return Settlement("keep", reason=f"waiting for the check: {said}")
        try:
            run = await aio.blocking(Mirror.of(pctx.cfg).run_check, verdict.commit,
                                     repo.check_command, repo.check_timeout_seconds)
        except (GitFailed, BusyError, OSError) as exc:
            return Settlement("keep", reason=f"waiting for the check: it could not start: {exc}")
        checked[0] += run.seconds
    return settle_check(verdict, run, task, repo.check_retries)


def _note_judged(pctx: OpsContext, task: Task, verdict: Settlement) -> None:
    """Write on a row kept which rule decided (and a failed check's output), and whether and
    why it is left to a person (its state then says so: ``store.pick.state_of``)."""
    fields: dict[str, object] = {}
    if verdict.judged and verdict.judged != task.judged:
        fields["judged"] = verdict.judged
    run = verdict.check
    if run is not None:
        fields.update(check="failed", check_commit=verdict.commit, check_output=run.tail)
    person = verdict.reason if verdict.person else None
    if person != task.person:
        fields["person"] = person
    if fields:
        pctx.backlog().note_check(task, **fields)


async def _send_back(
    pctx: OpsContext, cycle: Cycle, inst: InstanceConfig, rec: SessionRecord, task: Task,
    verdict: Settlement,
) -> None:
    """A failed check goes back to the same session once more, with the output's end and the
    discipline (``ops.land.send_back``); the row records the retry before the prompt."""
    run = verdict.check
    assert run is not None
    text = retry_text(pctx.cfg.repository.check_command, verdict.commit, run)
    key = (inst.name, rec.id)
    try:
        sent = await send_back(
            pctx, task, text, rec=rec, override=pool_discipline(pctx, cycle.log, STEP),
            command="patrol.check_retry", judged=verdict.judged, check="failed",
            check_commit=verdict.commit, check_output=run.tail,
            check_retries=(task.check_retries or 0) + 1,
        )
    except BusyError as exc:
        said = f"check failed; sent back when a slot frees ({exc})"
        cycle.log.add(pctx, STEP, "keep", "waiting", task, *key, detail=said)
        return
    for warning in sent.warnings:
        cycle.log.note(pctx, f"{STEP}: {warning}")
    cycle.log.touched.add(key)
    last = run.tail.strip().splitlines()[-1] if run.tail.strip() else ""
    said = f"{verdict.reason}: {last}" if last else verdict.reason
    act = Action.of(STEP, "retry", "ok", task, *key, detail=said)
    cycle.record(pctx, act, "check_failed", verdict.reason, commit=verdict.commit)


def _requeue(
    pctx: OpsContext, task: Task, inst: InstanceConfig | None, seen: Sighting, verdict: Settlement,
    now: datetime,
) -> str:
    """Send a failed task back to the pool: next model, back-off or parked; say what happened."""
    backlog = pctx.backlog()
    rec, run = seen.session, seen.run
    cand = heal_candidate(rec, run) if rec is not None and run is not None else None
    if cand is not None:
        # The pool moves on; the abandoned session must not be healed later.
        pctx.model_state().remember_healed(cand.key, cand.model or None, None, now)
    if verdict.model_named and inst is not None:
        failed = task.model or (run.model if run is not None else "") or ""
        tried = (*task.avoid_models, failed)
        nxt = choose_model(pctx, inst, None, now, tried)
        if nxt is not None:
            backlog.move_model(task.id, reason=verdict.reason, failed_model=failed, now=now)
            return f"failed on {failed or 'its model'}: {verdict.reason}; next model {nxt}"
    if not verdict.infrastructure:
        max_attempts = pctx.cfg.patrol.max_attempts
        new = backlog.requeue(task.id, reason=verdict.reason, infrastructure=False, now=now)
        detail = f"task failure: {verdict.reason} (attempt {new.attempts} of {max_attempts})"
        if is_blocked(new, max_attempts):
            detail += "; attempts used up, blocked until a human resets it"
        return detail
    policy = InfraPolicy(max_failures=pctx.cfg.patrol.max_infra_failures)
    new = backlog.requeue(task.id, reason=verdict.reason, infrastructure=True, now=now,
                          policy=policy if verdict.backoff else None)
    detail = f"infrastructure failure: {verdict.reason}"
    if new.parked:
        return f"{detail}; parked: {new.parked}"
    if new.not_before:
        detail += f" ({new.infra_failures} in a row; not before {new.not_before})"
    return detail
