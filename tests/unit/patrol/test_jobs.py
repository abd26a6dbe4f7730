"""The pure parts of the four patrol jobs, with plain data: last runs, session classes,
which failures to heal and with what model, resume refusals, task settlement, fill order."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from xaf_hub.config.load import parse_config
from xaf_hub.core import aio
from xaf_hub.core.records import SessionRecord
from xaf_hub.core.runstate import LastRun, classify, last_run
from xaf_hub.errors import BudgetReached, BusyError, HubError, RunsAgain
from xaf_hub.fleet.scan import InstanceScan
from xaf_hub.fleet.wire import messages_of
from xaf_hub.notify.record import RoundLog
from xaf_hub.ops.context import Fleet
from xaf_hub.ops.heal import heal_candidate, heal_key, heal_target, rest_for
from xaf_hub.patrol.context import Cycle
from xaf_hub.patrol.jobs.check_agents import resume_refusal
from xaf_hub.patrol.jobs.fill_slots import free_slots, plan_fill, session_title
from xaf_hub.patrol.settle import (
    Settlement,
    Sighting,
    credited_commits,
    failure_of,
    retry_text,
    settle,
    settle_check,
    settle_claim,
)
from xaf_hub.store.contain import CheckRun
from xaf_hub.store.gate import FileGate
from xaf_hub.store.pick import is_blocked
from xaf_hub.store.repository import Check
from xaf_hub.store.tasks import Task, format_instant

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
FAMILIES = {"opencode": ["opencode/", "opencode-go/"]}

E429 = {
    "name": "APIError",
    "data": {
        "message": "Rate limit exceeded: free usage limit reached.",
        "statusCode": 429,
        "isRetryable": True,
    },
}
E404 = {
    "name": "APIError",
    "data": {
        "message": "The model `missing-model` does not exist",
        "statusCode": 404,
        "isRetryable": False,
        "responseBody": '{"error": {"code": "model_not_found"}}',
    },
}
E500 = {"name": "APIError", "data": {"message": "The server had an error", "statusCode": 500}}
E400 = {"name": "APIError", "data": {"message": "bad request: tool schema", "statusCode": 400}}
ENET = {
    "name": "APIError",
    "data": {"message": "Cannot connect to API: Unable to connect.", "isRetryable": True},
}
ABORT = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}
OVERFLOW = {"name": "ContextOverflowError", "data": {"message": "context too long"}}


def assistant(
    mid: str = "msg_a",
    *,
    error: dict[str, Any] | None = None,
    finish: str | None = None,
    completed: bool = True,
    model: str = "opencode/free-model",
) -> dict[str, Any]:
    provider, ident = model.split("/")
    info: dict[str, Any] = {
        "id": mid,
        "role": "assistant",
        "providerID": provider,
        "modelID": ident,
        "time": {"created": NOW_MS - 5000},
    }
    if completed:
        info["time"]["completed"] = NOW_MS - 1000
    if error is not None:
        info["error"] = error
    if finish is not None:
        info["finish"] = finish
    return {"info": info, "parts": []}


def user(mid: str = "msg_u", model: str = "backup/good-model") -> dict[str, Any]:
    provider, ident = model.split("/")
    return {
        "info": {
            "id": mid,
            "role": "user",
            "time": {"created": NOW_MS},
            "model": {"providerID": provider, "modelID": ident},
        },
        "parts": [],
    }


def rec(
    state: str = "idle",
    *,
    message: str = "",
    updated: int = NOW_MS,
    model: str = "",
    sid: str = "ses_1",
) -> SessionRecord:
    return SessionRecord(
        instance="lan-b",
        id=sid,
        title="work",
        directory="/srv/app",
        updated=updated,
        running=state != "idle",
        run_state=state,  # type: ignore[arg-type]
        retry_message=message,
        model=model,
        project=True,
    )


# --------------------------------------------------------------------------- last_run


@pytest.mark.parametrize(
    ("messages", "outcome", "model", "mid"),
    [
        ([], "not_started", "", ""),
        ([assistant(finish="stop"), user()], "pending", "backup/good-model", "msg_u"),
        (
            [user(), assistant(finish="stop", model="fake/fake-model")],
            "succeeded",
            "fake/fake-model",
            "msg_a",
        ),
        ([user(), assistant(error=E429)], "rate_limited", "opencode/free-model", "msg_a"),
        (
            [user(), assistant(error=E404)],
            "failed",
            "opencode/free-model",
            "msg_a",
        ),
        ([user(), assistant(error=ABORT)], "interrupted", "opencode/free-model", "msg_a"),
        # an abort in a retry wait
        ([user(), assistant()], "interrupted", "opencode/free-model", "msg_a"),
        ([user(), assistant(completed=False)], "running", "opencode/free-model", "msg_a"),
        (
            [user(), assistant(error=OVERFLOW)],
            "failed",
            "opencode/free-model",
            "msg_a",
        ),
    ],
)
def test_last_run(messages: list[dict[str, Any]], outcome: str, model: str, mid: str) -> None:
    run = last_run(messages_of(messages))
    assert (run.outcome, run.model, run.message_id) == (outcome, model, mid)


@pytest.mark.parametrize("created", ["1e400", "soon", 1e400, -5, 10**30, [1]])
def test_a_start_no_clock_reads_is_unknown(created: Any) -> None:
    # A failed message's start is when its rest counts from (ops.heal): never an error.
    msg = assistant(error=E429)
    msg["info"]["time"]["created"] = created
    run = last_run(messages_of([user(), msg]))
    assert (run.outcome, run.created_ms) == ("rate_limited", 0)


# --------------------------------------------------------------------------- check_agents

STALE = 90.0


@pytest.mark.parametrize(
    ("record", "run", "state", "detail"),
    [
        (rec("retry", message="Rate limit exceeded"), None, "running", "retrying: Rate limit"),
        (rec("busy", updated=NOW_MS - 60_000), None, "running", "busy"),
        (rec("busy", updated=NOW_MS - 91 * 60_000), None, "stale_busy", "91 min"),
        (rec("busy", updated=0), None, "running", "busy"),
        (rec(), None, "idle", "could not be read"),
        (rec(), LastRun("succeeded"), "finished", ""),
        (rec(), LastRun("interrupted"), "interrupted", "aborted"),
        (rec(), LastRun("running"), "interrupted", "without finishing"),
        (rec(), LastRun("rate_limited", error=E429), "failed", "HTTP 429"),
        (
            rec(),
            LastRun("failed", error=OVERFLOW),
            "failed",
            "context too long",
        ),
        (rec(), LastRun("pending"), "idle", "no answer yet"),
        (rec(), LastRun("not_started"), "idle", "never ran"),
    ],
)
def test_classify(record: SessionRecord, run: LastRun | None, state: str, detail: str) -> None:
    got_state, got_detail = classify(record, run, NOW_MS, STALE)
    assert got_state == state and detail in got_detail


ABORTED = LastRun("interrupted", "msg_a", created_ms=NOW_MS - 60_000)


@pytest.mark.parametrize(
    ("kwargs", "refused"),
    [
        ({}, ""),
        ({"touched": True}, "touched"),
        ({"production": True}, "production"),
        ({"already_resumed": True}, "resumed_once"),
        # A run that stopped without finishing a moment ago may still be starting.
        ({"run": LastRun("running", "msg_a", created_ms=NOW_MS), "quiet_ms": 5_000}, "starting"),
        ({"run": LastRun("running", "msg_a", created_ms=NOW_MS), "quiet_ms": 120_000}, ""),
        # The grace is the caller's (patrol.run_start_grace_seconds).
        ({"run": LastRun("running", "msg_a", created_ms=NOW_MS), "quiet_ms": 5_000,
          "grace_ms": 2_000}, ""),
        ({"run": LastRun("running", "msg_a", created_ms=NOW_MS), "quiet_ms": 5_000,
          "grace_ms": 10_000}, "starting"),
        ({"quiet_ms": 5_000}, ""),  # an abort is final at once
    ],
)
def test_resume_refusal(kwargs: dict[str, Any], refused: str) -> None:
    args = {
        "production": False,
        "touched": False,
        "already_resumed": False,
        "run": ABORTED,
        **kwargs,
    }
    assert resume_refusal(**args) == refused


# --------------------------------------------------------------------------- fix_free_limit


def test_heal_candidate_stuck_retry_with_a_rate_limit() -> None:
    run = last_run(messages_of([user(), assistant("msg_r", completed=False)]))
    cand = heal_candidate(
        rec("retry", message="Rate limit exceeded: free usage limit reached"), run
    )
    assert cand is not None
    assert (cand.state, cand.signal, cand.model) == ("retry", "rate_limited", "opencode/free-model")
    assert cand.key == heal_key("lan-b", "ses_1", "msg_r") == "heal:lan-b:ses_1:msg_r"


@pytest.mark.parametrize(
    ("record", "messages", "expected"),
    [
        (rec("retry", message="Cannot connect to API: Unable to connect."), [], None),
        (rec("busy"), [user(), assistant(error=E429)], None),
        (rec(), [user(), assistant(error=E429)], ("failed", "rate_limited")),
        (rec(), [user(), assistant(error=E404)], ("failed", "model_unavailable")),
        (rec(), [user(), assistant(error=E500)], None),
        (rec(), [user(), assistant(error=ABORT)], None),
        (rec(), [user(), assistant(finish="stop")], None),
        (rec(), [assistant(error=E429), user()], None),  # re-prompted already: the error is history
        (rec(), [], None),
    ],
)
def test_which_failures_to_heal(
    record: SessionRecord, messages: list[dict[str, Any]], expected: tuple[str, str] | None
) -> None:
    cand = heal_candidate(record, last_run(messages_of(messages)) if messages else None)
    assert (None if cand is None else (cand.state, cand.signal)) == expected
    if cand is not None:
        assert cand.key == "heal:lan-b:ses_1:msg_a" and cand.model == "opencode/free-model"


@pytest.mark.parametrize(
    ("signal", "model", "family"),
    [
        ("rate_limited", "opencode/free-model", "opencode"),
        ("rate_limited", "opencode-go/kimi", "opencode"),
        ("rate_limited", "backup/good-model", None),
        ("rate_limited", "", None),
        ("model_unavailable", "opencode/free-model", None),
    ],
)
def test_blackout_only_for_a_rate_limit_on_a_blackout_family(
    signal: str, model: str, family: str | None
) -> None:
    failed = assistant(error=E429 if signal == "rate_limited" else E404)
    run = last_run(messages_of([user(), failed]))
    cand = heal_candidate(rec(), run)
    assert cand is not None
    cand = type(cand)(**{**cand.__dict__, "model": model})
    now = datetime.fromtimestamp(cand.at_ms / 1000, UTC)  # right after the failure
    rest = rest_for(cand, scope="family", families=FAMILIES, reset_hour=8, tz=UTC, now=now,
                    longest=timedelta(hours=24))
    assert (rest.target if rest is not None and rest.scope == "family" else None) == family


CHAIN = ["opencode/free-model", "backup/good-model", "backup/other-model"]


@pytest.mark.parametrize(
    ("current", "blacked", "default", "target"),
    [
        ("opencode/free-model", {"opencode"}, "fake/fake-model", "backup/good-model"),
        ("backup/good-model", set(), "fake/fake-model", "backup/other-model"),
        ("backup/other-model", set(), "fake/fake-model", "fake/fake-model"),  # chain exhausted
        ("backup/other-model", set(), "backup/other-model", None),  # default is the failing one
        ("backup/other-model", {"opencode"}, "opencode/free-model", None),  # default blacked out
        ("backup/other-model", set(), None, None),
        ("fake/missing-model", {"opencode"}, None, "backup/good-model"),  # not in the chain
        ("", set(), None, "opencode/free-model"),
    ],
)
def test_heal_target(
    current: str, blacked: set[str], default: str | None, target: str | None
) -> None:
    assert heal_target(current, CHAIN, default, blacked, FAMILIES) == target


# --------------------------------------------------------------------------- fill_slots


@pytest.mark.parametrize(
    ("error", "infra"),
    [
        (E429, True),
        (E404, True),
        (E500, True),
        (ENET, True),
        (None, True),
        ({"name": "ProviderAuthError", "data": {"providerID": "x", "message": "bad key"}}, True),
        ({"name": "APIError", "data": {"message": "Incorrect API key", "statusCode": 401}}, True),
        (E400, False),
        (OVERFLOW, False),
        ({"name": "MessageOutputLengthError", "data": {}}, False),
        ({"name": "UnknownError", "data": {"message": "something odd"}}, False),
        ({"name": "UnknownError", "data": {"message": "Model not found: fake/nope."}}, True),
    ],
)
def test_infrastructure_or_task_failure(error: dict[str, Any] | None, infra: bool) -> None:
    assert failure_of(error)[0] is infra


def dispatched(tid: str = "T1", *, ago: timedelta = timedelta(minutes=10)) -> Task:
    return Task(
        id=tid,
        title=f"{tid} work",
        status="dispatched",
        session_id="ses_1",
        dispatched_to="lan-b",
        dispatched_at=format_instant(NOW - ago),
    )


def made(created_ms: int) -> SessionRecord:
    """An idle session the server created at ``created_ms`` (its own clock)."""
    return dataclasses.replace(rec(), created=created_ms)


@pytest.mark.parametrize(
    ("task", "seen", "action", "infra", "reason"),
    [
        (Task(id="T1", title="t"), Sighting(), "keep", False, ""),
        (dispatched(), Sighting(configured=False), "requeue", True, "no longer configured"),
        (dispatched(), Sighting(reachable=False), "keep", False, "unreachable"),
        (
            dispatched(ago=timedelta(hours=2)),
            Sighting(reachable=False),
            "requeue",
            True,
            "unreachable for more than 90 min",
        ),
        (dispatched(), Sighting(session=None), "requeue", True, "session gone"),
        (dispatched(), Sighting(session=rec("busy")), "keep", False, ""),
        (dispatched(), Sighting(session=rec(), touched=True), "keep", False, "this cycle"),
        (dispatched(), Sighting(session=rec(), deferred=True), "keep", False, "free slot"),
        (dispatched(), Sighting(session=rec(), run=LastRun("succeeded")), "done", False, ""),
        (
            dispatched(),
            Sighting(session=rec(), run=LastRun("rate_limited", error=E429)),
            "requeue",
            True,
            "HTTP 429",
        ),
        (
            dispatched(),
            Sighting(session=rec(), run=LastRun("failed", error=E400)),
            "requeue",
            False,
            "HTTP 400",
        ),
        (
            dispatched(), Sighting(session=rec(), run=LastRun("interrupted")), "keep", False,
            "a human",
        ),
        (
            dispatched(), Sighting(session=rec(), run=LastRun("denied")), "keep", False,
            "refused request",
        ),
        (
            dispatched(ago=timedelta(seconds=10)),
            Sighting(session=rec(), run=LastRun("pending")),
            "keep",
            False,
            "",
        ),
        (
            dispatched(),
            Sighting(session=rec(), run=LastRun("pending")),
            "requeue",
            True,
            "never answered",
        ),
        (dispatched(), Sighting(session=rec(), run=None), "keep", False, "could not be read"),
        (
            dispatched(ago=timedelta(seconds=30)),
            Sighting(session=rec(), run=LastRun("not_started")),
            "requeue",
            True,
            "never received its prompt",
        ),
        # The row's stamp comes from another host whose clock lags 30 s; the server made the
        # session 3 s ago and its prompt is still on the way: not "never received", yet.
        (
            dispatched(ago=timedelta(seconds=30)),
            Sighting(session=made(NOW_MS - 3000), run=LastRun("not_started")),
            "keep",
            False,
            "just created",
        ),
        (
            dispatched(ago=timedelta(seconds=30)),
            Sighting(session=made(NOW_MS - 30_000), run=LastRun("not_started")),
            "requeue",
            True,
            "never received its prompt",
        ),
        # Read between the row and its prompt: the session does not show the prompt yet.
        (
            dispatched(ago=timedelta(seconds=3)),
            Sighting(session=rec(), run=LastRun("not_started")),
            "keep",
            False,
            "just dispatched",
        ),
        (
            dispatched(ago=timedelta(seconds=3)),
            Sighting(session=rec(), run=LastRun("succeeded")),
            "keep",
            False,
            "just dispatched",
        ),
    ],
)
def test_settle(task: Task, seen: Sighting, action: str, infra: bool, reason: str) -> None:
    verdict = settle(task, seen, NOW, 90.0)
    assert (verdict.action, verdict.infrastructure) == (action, infra)
    assert reason in verdict.reason


@pytest.mark.parametrize(("hours", "action"), [(2, "requeue"), (1, "keep")])
def test_a_dispatch_time_written_without_an_offset_reads_as_utc(hours: int, action: str) -> None:
    # The pool takes a time without an offset (a person's edit); it used to stop the round
    # (naive minus aware), now it is UTC, as every time read from a file is.
    naive = (NOW - timedelta(hours=hours)).replace(tzinfo=None).isoformat()
    task = dataclasses.replace(dispatched(), dispatched_at=naive)
    assert settle(task, Sighting(reachable=False), NOW, 90.0).action == action


def test_a_denied_run_is_never_done_and_waits_for_a_person() -> None:
    """Its run ended because a request was refused: not the agent's finished work (it used to
    settle as done, the run reading "succeeded"), and no retry the person did not ask for."""
    verdict = settle(dispatched(), Sighting(session=rec(), run=LastRun("denied")), NOW, 90.0)
    assert (verdict.action, verdict.person) == ("keep", True)
    state, _ = classify(rec(), LastRun("denied"), NOW_MS, STALE)
    assert state == "denied"  # not "interrupted": check_agents resumes only those


def pending(tid: str, prio: str = "P2", pin: str = "", **kw: Any) -> Task:
    return Task(
        id=tid,
        title=f"{tid} work",
        priority=prio,
        instance=pin,  # type: ignore[arg-type]
        **kw,
    )


def test_plan_fill_pins_first_then_unpinned_then_borrowed() -> None:
    tasks = [
        pending("alpha", "P2"),
        pending("bravo", "P0", "lan-b"),
        pending("charlie", "P1"),
        pending("delta", "P3"),
        pending("echo", "P1", "local-a"),
    ]
    plan = plan_fill(tasks, [("local-a", 2), ("lan-b", 2)], NOW, 3)
    assert [(i, t.id) for i, t in plan] == [
        ("local-a", "echo"),
        ("local-a", "charlie"),
        ("lan-b", "bravo"),
        ("lan-b", "alpha"),
    ]


def test_plan_fill_never_steals_a_pin_from_an_instance_with_room() -> None:
    tasks = [pending("for-b", "P0", "lan-b"), pending("free", "P3")]
    plan = plan_fill(tasks, [("local-a", 2), ("lan-b", 1)], NOW, 3)
    assert [(i, t.id) for i, t in plan] == [("local-a", "free"), ("lan-b", "for-b")]


def test_plan_fill_borrows_when_the_pinned_instance_is_full() -> None:
    tasks = [pending("for-b", "P1", "lan-b"), pending("for-c", "P0", "lan-c")]
    plan = plan_fill(tasks, [("local-a", 3)], NOW, 3)
    assert [t.id for _, t in plan] == ["for-c", "for-b"]


def test_plan_fill_skips_blocked_backing_off_and_waiting_tasks() -> None:
    later = format_instant(NOW + timedelta(hours=1))
    tasks = [
        pending("blocked", "P0", attempts=3),
        pending("backoff", "P0", not_before=later),
        pending("child", "P0", depends_on=("parent",)),
        Task(id="parent", title="parent", status="done", instance="lan-c"),
        Task(id="other-child", title="x", depends_on=("running",)),
        Task(id="running", title="running", status="dispatched"),
        pending("ok", "P3"),
    ]
    plan = plan_fill(tasks, [("local-a", 5)], NOW, 3)
    assert [t.id for _, t in plan] == ["child", "ok"]
    assert is_blocked(tasks[0], 3) and not is_blocked(tasks[-1], 3)


def test_plan_fill_respects_free_slots() -> None:
    tasks = [pending(f"t{i}") for i in range(5)]
    assert plan_fill(tasks, [("a", 0), ("b", 1)], NOW, 3) == [("b", tasks[0])]
    assert plan_fill(tasks, [], NOW, 3) == []


def test_free_slots_never_offers_a_default_directory_outside_the_roots(tmp_path: Path) -> None:
    cfg = parse_config(
        {"project": {"name": "p"}, "state_dir": str(tmp_path), "instances": [
            {"name": "in", "url": "http://127.0.0.1:9", "roots": ["/srv/p"],
             "default_directory": "/srv/p/app"},
            {"name": "out", "url": "http://127.0.0.1:9", "roots": ["/srv/p"],
             "default_directory": "/srv/elsewhere"},
        ]},
        path=tmp_path / "config.json", env={},
    )
    fleet = Fleet([InstanceScan(i, reachable=True) for i in cfg.instances])
    gate = FileGate(tmp_path, cfg.lock)
    assert free_slots(fleet, gate) == [(cfg.instance("in"), 2, "/srv/p/app")]


def test_session_title_leads_with_the_id() -> None:
    assert session_title(Task(id="F-8", title="F-8 清理旧 CF 值")) == "F-8 清理旧 CF 值"
    assert session_title(Task(id="T-1", title="fix login")) == "T-1 fix login"


# ---------------------------------------------------------------------------------------------
# settle_claim: a "done" weighed against what the repository mirror found


@pytest.mark.parametrize(
    ("check", "expected"),
    [
        (None, Settlement("done")),  # no project.repository: done on the agent's word
        (
            Check("verified", commit="a" * 40),
            Settlement(
                "done",
                commit="a" * 40,
                commits=("a" * 40,),
                verified=True,
                judged="base unknown: commit aaaaaaa (sent before bases)",
            ),
        ),
        (
            Check(
                "verified",
                commit="a" * 40,
                new=("b" * 40, "a" * 40),
                claimed=("a" * 40, "b" * 40),
                base_known=True,
            ),
            Settlement(
                "done",
                commit="a" * 40,
                commits=("b" * 40, "a" * 40),
                verified=True,
                judged="new work: 2 commits after its base",
            ),
        ),
        (
            Check("diverged", reason="claimed commits aaaaaaa, bbbbbbb are on diverging lines"),
            Settlement(
                "keep",
                reason="not verified: claimed commits aaaaaaa, bbbbbbb are on diverging lines",
                person=True,
                judged="claims diverge",
                why="diverged",
            ),
        ),
        (
            Check("too_many", reason="more than 200 commits between the task's base"),
            Settlement(
                "keep",
                reason="not verified: more than 200 commits between the task's base",
                person=True,
                judged="too many commits",
                why="too_many",
            ),
        ),
        (
            Check("missing", reason="claimed commit 0123456 is not on origin/main"),
            Settlement(
                "keep",
                reason="not verified: claimed commit 0123456 is not on origin/main",
                person=True,
                judged="claim not found",
                why="missing",
            ),
        ),
        (
            Check("ambiguous", reason="claimed commit 0123456 is ambiguous"),
            Settlement(
                "keep",
                reason="not verified: claimed commit 0123456 is ambiguous",
                person=True,
                judged="claim ambiguous",
                why="ambiguous",
            ),
        ),
        (
            Check("no_claim", reason="no commit hash in the final answer"),
            Settlement(
                "keep",
                reason="not verified: no commit hash in the final answer",
                person=True,
                judged="no claim",
                why="no_claim",
            ),
        ),
        (
            Check("old", reason="claimed commit 0123456 was already on origin/main"),
            Settlement(
                "keep",
                reason="not verified: claimed commit 0123456 was already on origin/main",
                person=True,
                judged="not new work",
                why="old",
            ),
        ),
        (
            Check("locked", commit="a" * 40, reason="commit aaaaaaa touches locked paths: t/x"),
            Settlement(
                "keep",
                reason="not verified: commit aaaaaaa touches locked paths: t/x",
                person=True,
                judged="locked path",
                why="locked",
            ),
        ),
        (  # the remote did not answer: nothing is decided, not even "needs a person"
            Check("unreachable", reason="repository not checked: git fetch gave no answer"),
            Settlement(
                "keep",
                reason="waiting for verification: repository not checked: git fetch gave no answer",
            ),
        ),
    ],
)
def test_settle_claim(check: Check | None, expected: Settlement) -> None:
    assert settle_claim(Settlement("done"), check) == expected


@pytest.mark.parametrize(
    "verdict",
    [Settlement("keep"), Settlement("requeue", True, "boom"), Settlement("keep", reason="x")],
)
def test_settle_claim_leaves_what_is_not_done_alone(verdict: Settlement) -> None:
    assert settle_claim(verdict, Check("verified", commit="a" * 40)) == verdict
    assert settle_claim(verdict, Check("missing", reason="gone")) == verdict


def test_a_commit_credited_to_another_task_is_refused() -> None:
    check = Check("verified", commit="a" * 40, new=("a" * 40,), base_known=True)
    refused = settle_claim(
        Settlement("done"), check, "origin/main", credited={"a" * 40: "T-7"}, task="T-1"
    )
    assert refused == Settlement(
        "keep",
        reason="not verified: commit aaaaaaa is already credited to T-7",
        person=True,
        judged="already credited",
        why="credited",
    )
    done = settle_claim(Settlement("done"), check, "origin/main", task="T-1")
    assert done.judged == "new work: 1 commit on origin/main after its base"
    assert done.commits == ("a" * 40,)


X, Y, Z = "1" * 40, "2" * 40, "3" * 40


@pytest.mark.parametrize(
    ("shared", "credited", "claims", "commits", "judged"),
    [
        # Its own branch: every commit of its range is its own, the unnamed ones too.
        (False, {}, {}, (X, Y, Z), "new work: 3 commits on origin/x after its base"),
        # A shared branch: a commit no task names (a person's, another agent's) is no one's.
        (True, {}, {}, (Z,), "new work: 1 commit on origin/x after its base (and 2 not its own)"),
        # Another task has a commit of the range (done before, or named this round): its own.
        (
            False,
            {X: "T-2"},
            {},
            (Y, Z),
            "new work: 2 commits on origin/x after its base (and 1 not its own)",
        ),
        (
            False,
            {},
            {Y: ["T-3"]},
            (X, Z),
            "new work: 2 commits on origin/x after its base (and 1 not its own)",
        ),
        # The task's own name among those naming a commit does not make it another's.
        (
            False,
            {},
            {Y: ["T-1", "T-3"], X: ["T-1"]},
            (X, Z),
            "new work: 2 commits on origin/x after its base (and 1 not its own)",
        ),
    ],
)
def test_each_commit_of_the_range_is_credited_once(
    shared: bool,
    credited: dict[str, str],
    claims: dict[str, list[str]],
    commits: tuple[str, ...],
    judged: str,
) -> None:
    check = Check("verified", commit=Z, new=(X, Y, Z), claimed=(Z,), base_known=True)
    done = settle_claim(
        Settlement("done"),
        check,
        "origin/x",
        shared=shared,
        credited=credited,
        claims=claims,
        task="T-1",
    )
    assert (done.action, done.commit, done.commits, done.judged) == ("done", Z, commits, judged)


def test_a_named_commit_of_the_range_credited_elsewhere_waits_for_a_person() -> None:
    """T-1 was done with two commits (its top is Y); T-2 names the older one: not its work."""
    rows = [
        Task(id="T-1", title="a", status="done", commit=Y, commits=(X, Y), verified=True),
        Task(id="T-0", title="b", status="done", commit=Z, verified=True),  # kept before commits
        Task(id="T-2", title="c", status="dispatched", commit=None),
    ]
    assert credited_commits(rows) == {X: "T-1", Y: "T-1", Z: "T-0"}
    check = Check("verified", commit=X, new=(X,), claimed=(X,), base_known=True)
    out = settle_claim(Settlement("done"), check, credited=credited_commits(rows), task="T-2")
    assert (out.action, out.person, out.judged) == ("keep", True, "already credited")
    assert out.reason == "not verified: commit 1111111 is already credited to T-1"


SHA = "c" * 40
VERIFIED = Settlement("done", commit=SHA, verified=True, judged="new work: 1 commit")
PASSED = CheckRun(True, 0, "12 passed", 2.0)
FAILED = CheckRun(False, 1, "FAILED test_login - assert 500 == 200\n1 failed", 2.0)
SLOW = CheckRun(False, None, "(killed: no end within 5s)", 5.0)


def _task(**kw: Any) -> Task:
    return Task(id="T1", title="t", status="dispatched", **kw)


@pytest.mark.parametrize(
    ("verdict", "run", "task", "retries", "action", "reason", "judged"),
    [
        (VERIFIED, PASSED, _task(), 1, "done", "", "new work: 1 commit; check: passed"),
        # a failure goes back to its session while retries last...
        (
            VERIFIED,
            FAILED,
            _task(),
            1,
            "retry",
            "check failed on commit ccccccc (exit 1); sent back to its session (retry 1 of 1)",
            "check: failed (exit 1), sent back",
        ),
        (
            VERIFIED,
            SLOW,
            _task(check_retries=1),
            2,
            "retry",
            "check failed on commit ccccccc (ran out of time); sent back to its session "
            "(retry 2 of 2)",
            "check: failed (ran out of time), sent back",
        ),
        # ...then it needs a person, with the output's last line
        (
            VERIFIED,
            FAILED,
            _task(check_retries=1),
            1,
            "keep",
            "not verified: check failed on commit ccccccc (exit 1): 1 failed",
            "check: failed",
        ),
        (
            VERIFIED,
            FAILED,
            _task(),
            0,
            "keep",
            "not verified: check failed on commit ccccccc (exit 1): 1 failed",
            "check: failed",
        ),
        # not run again on a commit whose check failed with no retry left: still a person's
        (
            VERIFIED,
            None,
            _task(check="failed", check_commit=SHA, check_retries=1, check_output="boom"),
            1,
            "keep",
            "not verified: check failed on commit ccccccc: boom",
            "check: failed",
        ),
        # no check configured, or nothing verified: as it was
        (VERIFIED, None, _task(), 1, "done", "", "new work: 1 commit"),
        (Settlement("done"), PASSED, _task(), 1, "done", "", ""),
        (Settlement("keep", reason="x"), FAILED, _task(), 1, "keep", "x", ""),
    ],
)
def test_settle_check(
    verdict: Settlement,
    run: CheckRun | None,
    task: Task,
    retries: int,
    action: str,
    reason: str,
    judged: str,
) -> None:
    out = settle_check(verdict, run, task, retries)
    assert (out.action, out.reason, out.judged) == (action, reason, judged)
    assert out.person == (action == "keep" and verdict.verified is True)


def test_the_retry_prompt_carries_the_failing_output() -> None:
    text = retry_text("make test", SHA, FAILED)
    assert "`make test`" in text and "exited with 1" in text and "ccccccc" in text
    assert "FAILED test_login - assert 500 == 200\n1 failed" in text
    assert "report the new commit hash" in text


@pytest.mark.parametrize(
    ("error", "result", "detail"),
    [
        (RunsAgain("it runs again"), "skipped", "it runs again"),
        (BusyError("lan-a is full"), "waiting", "no free slot yet, tried again next cycle "
                                                "(lan-a is full)"),
        (BudgetReached("spent $5"), "waiting", "daily budget reached, tried again next cycle "
                                               "(spent $5)"),
        (HubError("refused"), "failed", "refused"),
    ],
)
def test_a_heal_or_resume_that_sent_nothing_is_logged_once_by_its_refusal(
    error: HubError, result: str, detail: str
) -> None:
    """Cycle.attempt: the one ladder of a heal's and a resume's refusals."""
    pctx: Any = SimpleNamespace(log=lambda line: None, redact=lambda text: text)
    cycle = Cycle(RoundLog(started=NOW))
    rec = SessionRecord("lan-a", "ses_1", "Add the export", "/srv/p")

    async def act() -> str:
        raise error

    got = aio.run(cycle.attempt(pctx, "check_agents", "resume", rec, act(),
                                later="tried again next cycle"))
    assert got is None
    [action] = cycle.log.actions
    assert (action.kind, action.result, action.detail) == ("resume", result, detail)
    assert cycle.log.deferred == ({("lan-a", "ses_1")} if result == "waiting" else set())
    assert len(cycle.log.errors) == (result == "failed")
