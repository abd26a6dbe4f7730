"""How fill_slots settles a dispatched task from what its session shows (pure).

``settle`` turns a ``Sighting`` into a ``Settlement`` (keep, done, or requeue as a task,
infrastructure or model failure); ``settle_claim`` and ``settle_check`` weigh the mirror's findings
and the project's check, and ``Settlement.judged`` names the rule that decided
(docs/architecture.md §8, docs/verification.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from xaf_hub.core.clock import read_instant
from xaf_hub.core.commits import short
from xaf_hub.core.records import SessionRecord
from xaf_hub.core.runstate import LastRun, classify_error, error_text
from xaf_hub.core.text import shorten
from xaf_hub.notify.record import Why
from xaf_hub.store.contain import CheckRun
from xaf_hub.store.repository import Check
from xaf_hub.store.tasks import Task

# A prompt with no answer after this long was refused (e.g. a model the server does not know);
# the patrol reads ``patrol.no_answer_grace_seconds`` (this is its default).
NO_ANSWER_GRACE = timedelta(minutes=2)
# A task's row is written just before its prompt is sent; a session read in between still
# shows its state from before the prompt. Rows younger than this are not judged yet; the
# patrol reads ``patrol.just_dispatched_seconds`` (this is its default).
JUST_DISPATCHED = timedelta(seconds=10)

# What a task finished without ``project.repository`` records as its rule (``judged``): the
# pool calls it done (its dependants may start), every view "finished, not verified".
NOT_VERIFIED = "not verified: no project.repository to check its work"

_INFRA_ERROR_NAMES = frozenset({"ProviderAuthError"})
_INFRA_STATUS = frozenset({401, 403, 408, 409, 425})


def failure_of(error: Mapping[str, Any] | None) -> tuple[bool, bool]:
    """Whether a run's error is an infrastructure failure (not the task's fault, as opposed to
    a task failure), and whether it is about the model (its key refused, or it is unavailable)
    (pure)."""
    if error is None:
        return True, False  # no error object: the run never got going
    kind, name = classify_error(error), str(error.get("name") or "")
    data = error.get("data")
    code = data.get("statusCode") if isinstance(data, Mapping) else None
    api, auth = name == "APIError", name in _INFRA_ERROR_NAMES
    model = kind == "model_unavailable" or auth or (api and code in (401, 403))
    if auth or kind in ("rate_limited", "model_unavailable"):
        return True, model
    if not api:
        return False, model
    if not isinstance(code, int) or isinstance(code, bool):
        return True, model  # no HTTP status: the provider could not be reached at all
    return code >= 500 or code in _INFRA_STATUS, model


@dataclass(frozen=True)
class Sighting:
    """What the patrol saw of a dispatched task's session this cycle."""

    configured: bool = True
    reachable: bool = True
    session: SessionRecord | None = None
    run: LastRun | None = None
    touched: bool = False  # healed or resumed this cycle
    deferred: bool = False  # heal or resume waits for a free slot
    decision: str = ""  # a person's decision about it (ops.decisions), as one line


@dataclass(frozen=True)
class Settlement:
    """What to do with a dispatched task."""

    action: Literal["keep", "done", "requeue", "retry"]
    infrastructure: bool = False
    reason: str = ""
    person: bool = False  # kept because a person decided: listed under "needs a person"
    backoff: bool = True  # an infrastructure failure that counts towards parking
    model_named: bool = False  # the failure names the model: try the next one first
    commit: str = ""  # done: the commit found on the repository (full hash), the top checked
    commits: tuple[str, ...] = ()  # done: every commit credited to the task, oldest first
    verified: bool | None = None  # done: True when found there; None when nobody looked
    judged: str = ""  # which rule decided (new work, check passed, locked path...), one line
    check: CheckRun | None = None  # the project's check, when it ran this round
    why: Why = ""  # kept for a person: why, as a code (``reason`` holds the words)


def dispatch_age(task: Task, now: datetime) -> timedelta | None:
    """How long ago ``task`` was dispatched (None: no readable time). A time a person wrote
    without an offset reads as UTC (read_instant), never as naive."""
    at = read_instant(task.dispatched_at)
    return None if at is None else now - at


def settle(
    task: Task,
    seen: Sighting,
    now: datetime,
    stale_minutes: float,
    grace: timedelta = NO_ANSWER_GRACE,
    young: timedelta = JUST_DISPATCHED,
) -> Settlement:
    """Decide a dispatched task's fate from its session (pure).

    A person's decision turns every requeue into "keep, needs a person", and names why
    an interrupted session is left alone; finishing cleanly still makes the task done.
    """
    verdict = _settle(task, seen, now, stale_minutes, grace, young)
    if seen.decision and (verdict.action == "requeue" or verdict.why == "unresumed"):
        return Settlement("keep", reason=seen.decision, person=True, why="decided")
    return verdict


def _settle(
    task: Task, seen: Sighting, now: datetime, stale_minutes: float, grace: timedelta,
    young: timedelta,
) -> Settlement:
    if task.status != "dispatched":
        return Settlement("keep")
    if not task.session_id or not task.dispatched_to:
        return Settlement("keep", reason="dispatched without a session id or instance")
    if not seen.configured:
        return Settlement("requeue", True, f"instance {task.dispatched_to} is no longer configured")
    age = dispatch_age(task, now)
    if not seen.reachable:
        if age is not None and age > timedelta(minutes=stale_minutes):
            said = f"instance {task.dispatched_to} unreachable for more than {stale_minutes:g} min"
            return Settlement("requeue", True, said)
        return Settlement("keep", reason="instance unreachable; checked again next cycle")
    if seen.session is None:
        return Settlement("requeue", True, "session gone from its instance")
    if seen.touched:
        return Settlement("keep", reason="healed or resumed this cycle")
    if seen.deferred:
        return Settlement("keep", reason="waiting for a free slot to be healed or resumed")
    if seen.session.running:
        return Settlement("keep")
    if age is not None and age < young:
        return Settlement("keep", reason="just dispatched; its prompt may not show yet")
    run = seen.run
    if run is None:
        return Settlement("keep", reason="last run could not be read")
    outcome = run.outcome
    if outcome == "succeeded":
        return Settlement("done")
    if outcome in ("interrupted", "running"):
        said = "interrupted and not resumed: needs a human"
        return Settlement("keep", reason=said, why="unresumed")
    if outcome == "denied":
        said = ("its run ended on a refused request (a permission denied or a question dismissed): "
                "a person decides")
        return Settlement("keep", reason=said, person=True, why="denied")
    if outcome == "not_started":
        # No message at all: the session was recorded before its prompt (fill_slots does
        # that on purpose) and the hub stopped in between. Nothing ran; send it again. Unless
        # the server made the session a moment ago: the row's stamp comes from the host that
        # sent it, whose clock may lag, and its prompt may still be on the way.
        made = seen.session.created
        if made and now.timestamp() * 1000 - made < young.total_seconds() * 1000:
            return Settlement("keep", reason="just created; its prompt may not show yet")
        said = "the session never received its prompt (the hub stopped first)"
        return Settlement("requeue", True, said, backoff=False)
    if outcome == "pending":
        if age is not None and age > grace:
            said = "the prompt was never answered (model unknown to the server?)"
            return Settlement("requeue", True, said)
        return Settlement("keep")
    reason = error_text(run.error) or outcome
    infra, model = failure_of(run.error)
    return Settlement("requeue", infra, reason, model_named=infra and model)


def settle_claim(
    verdict: Settlement,
    check: Check | None,
    where: str = "",
    *,
    shared: bool = True,
    credited: Mapping[str, str] | None = None,
    claims: Mapping[str, Sequence[str]] | None = None,
    task: str = "",
) -> Settlement:
    """Weigh a "done" against the repository (pure); ``check`` None: no repository set.

    Only a clean range of new commits on the expected branch (``where``) makes it done, each commit
    credited to ``task`` unless ``credited`` gives it to another task or, on a ``shared`` branch,
    ``claims`` shows no task names it. Anything doubtful keeps the task for a person; a remote that
    did not answer keeps it for the next round (docs/verification.md).
    """
    if verdict.action != "done" or check is None:
        return verdict
    if check.state == "unreachable":
        return Settlement("keep", reason=f"waiting for verification: {check.reason}")
    if check.state != "verified":
        rule = _RULES.get(check.state, "claim not found")
        return Settlement("keep", reason=f"not verified: {check.reason}", person=True,
                          judged=rule, why=check.state)
    owners, named = credited or {}, claims or {}
    mine = check.claimed or (check.commit,)
    for commit in mine:
        owner = owners.get(commit, task)
        if owner != task:
            reason = f"commit {short(commit)} is already credited to {owner}"
            return Settlement("keep", reason=f"not verified: {reason}", person=True,
                              judged="already credited", why="credited")

    def ours(commit: str) -> bool:
        if commit in mine:
            return True
        if owners.get(commit, task) != task or set(named.get(commit, ())) - {task}:
            return False  # another task's work
        return not shared  # named by no task: the task's own on its own branch only

    span = check.new or mine
    commits = tuple(c for c in span if ours(c))
    on = f" on {where}" if where else ""
    count = f"{len(commits)} commit{'s' if len(commits) != 1 else ''}"
    if check.base_known:
        judged = f"new work: {count}{on} after its base"
        others = len(span) - len(commits)
        if others:
            judged += f" (and {others} not its own)"
    elif len(commits) == 1:
        judged = f"base unknown: commit {short(check.commit)}{on} (sent before bases)"
    else:
        judged = f"base unknown: {count} up to {short(check.commit)}{on} (sent before bases)"
    return Settlement("done", commit=check.commit, commits=commits, verified=True, judged=judged)


def credited_commits(tasks: Sequence[Task]) -> dict[str, str]:
    """Every commit credited to a done task, or to one whose verified work waits to land ->
    that task (a row kept before ``commits``: its ``commit``) (pure)."""
    return {
        c: t.id
        for t in tasks
        if t.status == "done" or t.landing in ("ready", "person")
        for c in (t.commits or ((t.commit,) if t.commit else ()))
    }


_RULES = {
    "old": "not new work",
    "locked": "locked path",
    "diverged": "claims diverge",
    "too_many": "too many commits",
    "ambiguous": "claim ambiguous",
    "no_claim": "no claim",
}


def settle_check(verdict: Settlement, run: CheckRun | None, task: Task, retries: int) -> Settlement:
    """Weigh the project's check of a verified commit (pure); ``run`` None: no check set.

    Not run for want of a sandbox (``refused``): kept for a person, "not verified: check not
    contained". Passed: done, ``check: passed``. Failed: back to its session (``retry``) while fewer
    than ``retries`` failures went back already; then kept for a person with the output's end.
    A commit whose check already failed with no retry left is not run again (``run`` None,
    the task's own record says it failed): still a person's.
    """
    if verdict.action != "done" or not verdict.verified:
        return verdict
    if run is None:
        stale = task.check == "failed" and task.check_commit == verdict.commit
        if stale and (task.check_retries or 0) >= retries:
            return _check_failed_for_person(verdict, task.check_output or "", None)
        return verdict
    if run.contained == "refused":  # no sandbox here and no consent: not run, a person's
        said = f"not verified: check not contained: {run.tail}"
        return Settlement("keep", reason=said, person=True, commit=verdict.commit,
                          judged="check: not contained")
    if run.passed:
        said = "passed" if run.contained == "contained" else "passed (not contained)"
        return dataclasses.replace(verdict, judged=f"{verdict.judged}; check: {said}", check=run)
    used = task.check_retries or 0
    if used < retries:
        exit_said = "ran out of time" if run.code is None else f"exit {run.code}"
        return Settlement(
            "retry",
            reason=f"check failed on commit {short(verdict.commit)} ({exit_said}); "
            f"sent back to its session (retry {used + 1} of {retries})",
            commit=verdict.commit,
            judged=f"check: failed ({exit_said}), sent back",
            check=run,
        )
    return _check_failed_for_person(verdict, run.tail, run)


def _check_failed_for_person(verdict: Settlement, tail: str, run: CheckRun | None) -> Settlement:
    last = shorten(tail.strip().splitlines()[-1], 160) if tail.strip() else "no output"
    how = "" if run is None else " (ran out of time)" if run.code is None else f" (exit {run.code})"
    said = f"not verified: check failed on commit {short(verdict.commit)}{how}: {last}"
    return Settlement("keep", reason=said, person=True, commit=verdict.commit,
                      judged="check: failed", check=run, why="check_failed")


def retry_text(command: str, commit: str, run: CheckRun) -> str:
    """What a session is told when the project's check failed on its commit (pure)."""
    said = "ran out of time" if run.code is None else f"exited with {run.code}"
    return (
        f"The project's check (`{command}`) {said} on your commit {short(commit)}, so the task "
        "is not done yet. The end of its output:\n\n```\n"
        f"{run.tail.replace('```', '` ` `')}\n```\n\n"
        "Fix the cause on the branch that holds that commit (do not change the tests or the "
        "check to make it pass), commit, push, and report the new commit hash."
    )
