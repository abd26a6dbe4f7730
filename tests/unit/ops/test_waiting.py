"""Runs that wait for a person (issue 35): the scan sees them, every count keeps them, the
patrol's words leave them alone, and an answer goes out only to a request the server still
lists. The fake server below answers like opencode 1.18.33 (measured: /permission and
/question answer per ``?directory=``; a reply to a request it no longer has is 404)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.ops.waiting_support import (
    DIR,
    NOW,
    PERM,
    QUESTION,
    audit_lines,
    fleet_with_both,
    make_ops,
    session,
)
from xaf_hub.config.load import PermissionRule, PermissionsConfig
from xaf_hub.core import aio
from xaf_hub.core.records import SessionRecord, Waiting
from xaf_hub.core.runstate import LastRun, classify, count_states, judge, shown_state
from xaf_hub.errors import ProductionRefused, RequestGone, UnreachableError, UsageError
from xaf_hub.fleet import wire
from xaf_hub.fleet.scan import scan_fleet
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.load import instance_load
from xaf_hub.ops.waiting import (
    Reply,
    answer_request,
    apply_policy,
    list_waiting,
    pending_of,
    policy_answer,
    question_answers,
)

# ------------------------------------------------------------------------------ seeing


def test_the_scan_marks_each_waiting_run_and_counts_it_against_the_limit(tmp_path: Path) -> None:
    ops = make_ops(tmp_path, fleet_with_both())
    snap, scans = aio.run(scan_fleet(ops.cfg, transport_factory=ops.transport_factory))
    by_id = {s.id: s for s in snap.sessions}
    perm, quest, work = by_id["ses_perm"].waiting, by_id["ses_quest"].waiting, by_id["ses_work"]
    assert perm is not None and quest is not None and work.waiting is None
    assert (perm.kind, perm.request_id, perm.permission, perm.asked, perm.always) == (
        "permission", "per_aaa1", "bash", "git push origin main", ("git push *",)
    )
    assert perm.since == NOW - 60_000  # the tool call's start: since when it waits
    assert (quest.kind, quest.asked, quest.choices) == (
        "question", "Which database?", (("staging", "local"),)
    )
    assert [shown_state(by_id[s]) for s in ("ses_perm", "ses_quest", "ses_work")] == [
        "waiting", "waiting", "busy"
    ]
    summary = snap.instances[0]
    assert (summary.waiting, summary.running_project) == (2, 3)
    load = instance_load(scans[0], None, False)
    # Still counted (it runs on the moment it is answered), and said in the reason.
    assert load.running_project == 3 and load.waiting == 2
    assert load.reason.endswith("; 2 waiting for a person")
    doc = by_id["ses_perm"].to_json()
    assert doc["waiting"]["request_id"] == "per_aaa1" and by_id["ses_work"].to_json()[
        "waiting"] is None


def test_unreadable_requests_leave_the_runs_running_and_say_why(tmp_path: Path) -> None:
    server = fleet_with_both()
    server.broken = "/question"
    ops = make_ops(tmp_path, server)
    snap, scans = aio.run(scan_fleet(ops.cfg, transport_factory=ops.transport_factory))
    assert scans[0].reachable  # the sessions and their run state were read
    assert all(s.waiting is None and s.running for s in snap.sessions)
    assert "server error (HTTP 500)" in scans[0].waiting_unknown
    assert any("waiting for a person shows as running" in w for w in snap.warnings)
    waiters = aio.run(list_waiting(ops))
    assert waiters.requests == () and waiters.down[0][0] == "lan-a"


def test_an_unknown_run_state_leaves_the_requests_unknown_not_absent(tmp_path: Path) -> None:
    # Without the run state no run is known to wait: `waiting` names the instance as one it
    # could not read rather than answer that nobody waits there.
    server = fleet_with_both()
    server.broken, server.broken_status = "/session/status", 400
    ops = make_ops(tmp_path, server)
    _, scans = aio.run(scan_fleet(ops.cfg, transport_factory=ops.transport_factory))
    assert scans[0].reachable and scans[0].run_state_unknown
    assert all(s.running for s in scans[0].sessions)  # counted as running (fail closed)
    waiters = aio.run(list_waiting(ops))
    assert waiters.requests == ()
    assert [name for name, _ in waiters.down] == ["lan-a"]
    assert "run state unknown" in waiters.down[0][1]


def test_a_request_left_over_from_an_ended_run_is_not_what_a_new_run_waits_on(
    tmp_path: Path,
) -> None:
    # opencode 1.18 keeps listing a request after an abort; the session then runs again. The
    # new run does not wait on it: running, not waiting. A live request of the same session,
    # asked after it, is the one the run waits on.
    server = fleet_with_both()
    server.ended = {"per_aaa1"}
    ops = make_ops(tmp_path, server)
    snap, _ = aio.run(scan_fleet(ops.cfg, transport_factory=ops.transport_factory))
    by_id = {s.id: s for s in snap.sessions}
    assert by_id["ses_perm"].waiting is None and by_id["ses_perm"].running
    assert shown_state(by_id["ses_perm"]) == "busy"
    assert aio.run(list_waiting(ops)).requests[0].waiting.request_id == "que_bbb2"
    server.permissions.append({**PERM, "id": "per_ccc3", "tool": {"callID": "call_p2"}})
    snap, _ = aio.run(scan_fleet(ops.cfg, transport_factory=ops.transport_factory))
    live = {s.id: s for s in snap.sessions}["ses_perm"].waiting
    assert live is not None and live.request_id == "per_ccc3"


def test_a_folder_s_requests_are_asked_as_soon_as_its_run_is_seen(tmp_path: Path) -> None:
    # Asked beside the rest of the run state, not after it all: a folder whose run state is
    # slow to come does not hold back the requests of a folder already seen running.
    server = fleet_with_both()
    server.sessions.append(session("ses_idle", "/srv/p/slow"))
    order: list[str] = []
    asked = asyncio.Event()

    async def route(req: httpx.Request) -> httpx.Response:
        path, directory = req.url.path, req.url.params.get("directory")
        if path == "/session/status" and directory == "/srv/p/slow":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asked.wait(), 3.0)
            order.append("the slow folder's run state")
        elif path in ("/permission", "/question"):
            order.append(f"{path} {directory}")
            asked.set()
        return server.route(req)

    cfg = make_ops(tmp_path, server).cfg
    snap, _ = aio.run(scan_fleet(cfg, transport_factory=lambda _: httpx.MockTransport(route)))
    assert order.index(f"/permission {DIR}") < order.index("the slow folder's run state")
    assert order.index(f"/question {DIR}") < order.index("the slow folder's run state")
    by_id = {s.id: s for s in snap.sessions}
    assert by_id["ses_perm"].waiting is not None and by_id["ses_quest"].waiting is not None
    assert order.count(f"/permission {DIR}") == 1  # asked once, not again after the round


def test_a_request_of_a_session_that_is_not_running_is_not_a_wait(tmp_path: Path) -> None:
    server = fleet_with_both()
    server.busy = {"ses_quest", "ses_work"}  # the permission's run ended meanwhile
    ops = make_ops(tmp_path, server)
    snap, _ = aio.run(scan_fleet(ops.cfg, transport_factory=ops.transport_factory))
    assert {s.id for s in snap.sessions if s.waiting is not None} == {"ses_quest"}


# ----------------------------------------------------------------- the run-state words

W = Waiting("permission", "per_1", "rm -rf build", NOW - 10, "bash")


@pytest.mark.parametrize(
    ("state", "waiting", "updated", "verdict", "klass"),
    [
        # Busy and waiting: never stale, however long nothing moved.
        ("busy", W, NOW - 3 * 3600_000, "waiting", "waiting"),
        ("busy", W, NOW, "waiting", "waiting"),
        # Busy without a request: running, then stale after stale_minutes.
        ("busy", None, NOW, "running", "running"),
        ("busy", None, NOW - 3 * 3600_000, "running", "stale_busy"),
        # A request on an idle session (its run ended): the run's own outcome counts.
        ("idle", W, NOW, "finished", "finished"),
    ],
)
def test_the_waiting_verdict_and_class(
    state: Any, waiting: Waiting | None, updated: int, verdict: str, klass: str
) -> None:
    rec = SessionRecord("a", "ses_1", "t", DIR, NOW, updated, running=state != "idle",
                        run_state=state, waiting=waiting, project=True)
    run = LastRun("succeeded") if state == "idle" else LastRun("running")
    assert judge(rec, run).state == verdict
    assert classify(rec, run, NOW, 30)[0] == klass


def test_counts_say_waiting_for_a_person() -> None:
    assert count_states({"waiting": 1, "running": 2}) == "2 running, 1 waiting for a person"


# ------------------------------------------------------------------------- reading


@pytest.mark.parametrize(
    "entry",
    [
        None, [], "per_x", {"id": "per_x"}, {"id": "ses_x", "sessionID": "ses_1"},
        {"id": 7, "sessionID": "ses_1"}, {"id": "per x", "sessionID": "ses_1"},
        {"id": "per_x", "sessionID": None},
    ],
)
def test_an_unusable_permission_entry_is_skipped(entry: Any) -> None:
    assert wire.waiting_from_permission(entry) is None


def test_hostile_request_text_is_bounded_and_kept_whole_where_it_fits() -> None:
    hostile = {**PERM, "metadata": {"command": "echo \x1b[31mred\x1b[0m\nrm -rf /"},
               "patterns": ["a\nb", 3, None], "always": "not a list"}
    p = wire.waiting_from_permission(hostile)
    assert p is not None
    # Lines and all, for `show`, --json and the audit; views make it safe for a terminal.
    assert p.waiting.asked == "echo \x1b[31mred\x1b[0m\nrm -rf /" and p.waiting.whole
    assert p.waiting.patterns == ("a b",) and p.waiting.always == ()
    huge = wire.waiting_from_permission({**PERM, "metadata": {"command": "x" * 10**6}})
    assert huge is not None and len(huge.waiting.asked) == wire.MAX_ASKED_CHARS
    assert not huge.waiting.whole  # cut: no rule may approve it
    # 1.2.27 and 1.14.41 send no command in metadata: the patterns say what is asked, and a
    # bash request is not whole (its pieces lose what joined them).
    old = wire.waiting_from_permission({**PERM, "metadata": {}})
    assert old is not None and old.waiting.asked == "git push origin main"
    assert not old.waiting.whole
    q = wire.waiting_from_question({**QUESTION, "questions": [{"options": "x"}, 5]})
    assert q is not None and q.waiting.choices == ((), ())


EDIT_PERM = {**PERM, "permission": "edit", "metadata": {}}


@pytest.mark.parametrize(
    ("patterns", "whole"),
    [
        (["src/a.py", "src/b.py"], True),
        ([f"src/f{i}.py" for i in range(wire.MAX_WORDS)], True),
        # more than the hub keeps: the server lists them all (measured: 301 on 1.18.33)
        ([f"src/f{i}.py" for i in range(wire.MAX_WORDS + 1)], False),
        (["src/" + "a" * wire.MAX_WORD_CHARS + "/../../etc/passwd"], False),  # one cut short
        (["src/a.py\n/etc/passwd"], False),  # one on two lines, joined for the view
        (["src/a.py", 7], False),  # one dropped
        ([], False),
        ("src/a.py", False),
    ],
)
def test_a_permission_is_whole_only_when_every_pattern_was_kept(patterns: Any, whole: bool) -> None:
    p = wire.waiting_from_permission({**EDIT_PERM, "patterns": patterns})
    assert p is not None and p.waiting.whole is whole


# ------------------------------------------------------------------------ answering


def test_approve_once_and_always_deny_with_a_message_answer_a_question(tmp_path: Path) -> None:
    server = fleet_with_both()
    ops = make_ops(tmp_path, server)
    done = aio.run(answer_request(ops, "per_aaa1", Reply("approve", always=True)))
    assert (done.instance, done.session_id) == ("lan-a", "ses_perm")
    done = aio.run(answer_request(ops, "que_bbb2", Reply("answer", choices=("local",))))
    assert server.replies == [
        ("/permission/per_aaa1/reply", {"reply": "always"}),
        ("/question/que_bbb2/reply", {"answers": [["local"]]}),
    ]
    lines = audit_lines(ops.cfg)
    assert [(x["command"], x["result"], x["request"], x["by"]) for x in lines] == [
        ("approve", "sent", "per_aaa1", "person"), ("answer", "sent", "que_bbb2", "person")
    ]
    assert all(set(x["who"]) == {"caller", "user", "host"} for x in lines)  # who answered
    server.permissions = [dict(PERM)]
    aio.run(answer_request(ops, "per_aaa1", Reply("deny", message="commit locally instead")))
    assert server.replies[-1] == (
        "/permission/per_aaa1/reply", {"reply": "reject", "message": "commit locally instead"}
    )


def test_an_id_that_no_longer_waits_is_refused_and_nothing_is_sent(tmp_path: Path) -> None:
    server = fleet_with_both()
    ops = make_ops(tmp_path, server)
    with pytest.raises(RequestGone, match="not waiting on any instance"):
        aio.run(answer_request(ops, "per_gone", Reply("approve")))
    with pytest.raises(UsageError, match="not a request id"):
        aio.run(answer_request(ops, "ses_perm", Reply("approve")))
    assert server.replies == [] and audit_lines(ops.cfg) == []


def test_answered_elsewhere_between_the_scan_and_the_reply_sends_nothing(tmp_path: Path) -> None:
    server = fleet_with_both()
    # The scan lists it; the look-up under the lock (another hub answered) no longer does.
    server.on_list = lambda s: s.permissions.clear()
    ops = make_ops(tmp_path, server)
    with pytest.raises(RequestGone, match="no longer waits"):
        aio.run(answer_request(ops, "per_aaa1", Reply("approve")))
    assert server.replies == []


def test_an_unreachable_instance_is_not_gone(tmp_path: Path) -> None:
    server = fleet_with_both()
    server.broken = "/global/health"
    ops = make_ops(tmp_path, server)
    with pytest.raises(UnreachableError, match="may be there"):
        aio.run(answer_request(ops, "per_aaa1", Reply("approve")))


def test_guards_production_and_a_wrong_kind_of_answer(tmp_path: Path) -> None:
    server = fleet_with_both()
    with pytest.raises(ProductionRefused):
        aio.run(answer_request(make_ops(tmp_path, server, True), "per_aaa1", Reply("approve")))
    ops = make_ops(tmp_path, server)
    with pytest.raises(UsageError, match="is a question"):
        aio.run(answer_request(ops, "que_bbb2", Reply("approve")))
    with pytest.raises(UsageError, match="is a permission request"):
        aio.run(answer_request(ops, "per_aaa1", Reply("answer", choices=("yes",))))
    assert server.replies == []
    # deny on a question rejects it
    aio.run(answer_request(ops, "que_bbb2", Reply("deny")))
    assert server.replies == [("/question/que_bbb2/reject", None)]


Q2 = Waiting("question", "que_2", "a / b", choices=(("x", "y"), ("p", "q")))
Q1 = Waiting("question", "que_1", "a", choices=(("x", "y"),))
QC = Waiting("question", "que_c", "db", choices=(("Postgres", "MySQL", "SQLite", "sqlite"),))


@pytest.mark.parametrize(
    ("w", "reply", "expected"),
    [
        (Q1, Reply("answer", choices=("x",)), [["x"]]),
        (Q1, Reply("answer", choices=("x", "y")), [["x", "y"]]),  # several labels, one question
        (Q1, Reply("answer", text="my own"), [["my own"]]),
        (Q2, Reply("answer", choices=("y", "p")), [["y"], ["p"]]),
        (Q1, Reply("answer", choices=("z",)), "not an option"),
        # Case aside: the option as offered is sent; as written wins over a case-alike.
        (QC, Reply("answer", choices=("postgres",)), [["Postgres"]]),
        (QC, Reply("answer", choices=("MYSQL", "sqlite")), [["MySQL", "sqlite"]]),
        (QC, Reply("answer", choices=("SQLite",)), [["SQLite"]]),
        (QC, Reply("answer", choices=("SQLITE",)), "several options"),
        (QC, Reply("answer", choices=("postgre",)), "not an option"),
        (Q1, Reply("answer"), "CHOICE... or --text"),
        (Q1, Reply("answer", choices=("x",), text="t"), "not both"),
        (Q2, Reply("answer", choices=("x",)), "give 2 CHOICEs"),
        (Q2, Reply("answer", text="t"), "one CHOICE per question"),
    ],
)
def test_question_answers(w: Waiting, reply: Reply, expected: Any) -> None:
    if isinstance(expected, str):
        with pytest.raises(UsageError, match=expected):
            question_answers(w, reply)
    else:
        assert question_answers(w, reply) == expected


def test_waiting_json_names_the_request_and_its_age(tmp_path: Path) -> None:
    ops = make_ops(tmp_path, fleet_with_both())
    waiters = aio.run(list_waiting(ops))
    docs = [p.to_json(NOW) for p in waiters.requests]
    perm = next(d for d in docs if d["id"] == "per_aaa1")
    assert (perm["instance"], perm["session_id"], perm["kind"], perm["age_seconds"]) == (
        "lan-a", "ses_perm", "permission", 60
    )
    assert replace(waiters.requests[0].waiting, since=0).since == 0


# ------------------------------------------------------------------------------ policy

def bash(command: str, patterns: tuple[str, ...] = (), whole: bool = True) -> Waiting:
    """A bash request as 1.18.33 lists it: its command whole, its pieces as patterns."""
    return Waiting("permission", "per_b", command, NOW - 60_000, "bash",
                   patterns or (command,), whole=whole)


GIT = bash("git status --short")
PUSH = bash("git push origin main")
EDIT = Waiting("permission", "per_e", "src/a.py, /etc/passwd", NOW - 60_000, "edit",
               ("src/a.py", "/etc/passwd"), whole=True)
ASKS = Waiting("question", "que_q", "Which?", NOW - 60_000, choices=(("a",),))
RULES = PermissionsConfig((
    PermissionRule("bash", "git status*", "allow"),
    PermissionRule("bash", "git push*", "deny"),
    PermissionRule("edit", "src/*", "allow"),
    PermissionRule("bash", "git log*", "allow"),
))
TWENTY = [f"git status -s f{i}" for i in range(1, 21)]
# The attack as opencode 1.18.33 lists it: the hub keeps the first 20 of its patterns.
ATTACK = bash("; ".join([*TWENTY, "touch m_21th"]), tuple(TWENTY))


@pytest.mark.parametrize(
    ("policy", "w", "now", "expected"),
    [
        (RULES, GIT, NOW, ("approve", "permissions.rules[0]")),
        (RULES, PUSH, NOW, ("deny", "permissions.rules[1]")),
        # every part must have an allow rule, each its own; the audit names them all
        (RULES, bash("git status && git log -3 | git log --stat"), NOW,
         ("approve", "permissions.rules[0] bash 'git status*' allow, permissions.rules[3]")),
        (RULES, bash("git status; git status"), NOW,
         ("approve", "rules[0] bash 'git status*' allow")),
        # the attacks: a command after the 20th pattern, a redirection, a second line
        (RULES, ATTACK, NOW, None),
        (RULES, bash("git status > /tmp/x/file"), NOW, None),
        (RULES, bash("git status\ntouch x", ("git status", "touch x")), NOW, None),
        (RULES, bash("git status $(touch x)"), NOW, None),
        (RULES, bash("git status &"), NOW, None),
        (RULES, bash("git status | sh"), NOW, None),  # the other side of a pipe is judged
        # a command the hub could not keep whole, or a release that sends none: a person
        (RULES, bash("git status", whole=False), NOW, None),
        # a deny rule denies on any part it matches, even one a rule could not approve
        (RULES, bash("git status; git push origin main"), NOW, ("deny", "permissions.rules[1]")),
        (RULES, bash("git status > f; git push -f", ("git status > f", "git push -f")), NOW,
         ("deny", "rules[1]")),
        (RULES, bash("git status\ngit push", ("git status",)), NOW, ("deny", "rules[1]")),
        (RULES, replace(PUSH, whole=False), NOW, ("deny", "rules[1]")),
        # the first matching rule decides each part: an earlier allow keeps a later deny off
        (PermissionsConfig((PermissionRule("bash", "git *", "allow"),
                            PermissionRule("bash", "git push*", "deny"))), PUSH, NOW,
         ("approve", "rules[0]")),
        # every pattern must match: one file outside src/ leaves it to a person
        (RULES, EDIT, NOW, None),
        (RULES, replace(EDIT, patterns=("src/a.py",)), NOW, ("approve", "permissions.rules[2]")),
        # a pattern list the hub could not keep whole is for a person
        (RULES, replace(EDIT, patterns=("src/a.py",), whole=False), NOW, None),
        # nothing is allowed unless a rule says so; a question never matches a rule
        (RULES, replace(GIT, permission="webfetch"), NOW, None),
        (PermissionsConfig((PermissionRule("*", "*", "allow"),)), ASKS, NOW, None),
        (PermissionsConfig((PermissionRule("*", "*", "allow"),)), ATTACK, NOW,
         ("approve", "rules[0]")),
        (PermissionsConfig(), GIT, NOW, None),
        # deny_after_minutes: after the time, from the tool call's start; never without one
        (PermissionsConfig(deny_after_minutes=5), PUSH, NOW, None),
        (PermissionsConfig(deny_after_minutes=1), PUSH, NOW, ("deny", "deny_after_minutes")),
        (PermissionsConfig(deny_after_minutes=1), ASKS, NOW, ("deny", "deny_after_minutes")),
        (PermissionsConfig(deny_after_minutes=1), replace(PUSH, since=0), NOW, None),
        (replace(RULES, deny_after_minutes=1), ATTACK, NOW, ("deny", "deny_after_minutes")),
        # a rule's allow wins over the timeout
        (replace(RULES, deny_after_minutes=1), GIT, NOW, ("approve", "rules[0]")),
    ],
)
def test_policy_answer(policy: PermissionsConfig, w: Waiting, now: int, expected: Any) -> None:
    got = policy_answer(policy, w, now)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.reply.action == expected[0] and expected[1] in got.rule


def test_the_timeout_tells_the_agent_to_go_on_without_it() -> None:
    got = policy_answer(PermissionsConfig(deny_after_minutes=1), PUSH, NOW)
    assert got is not None and "Go on without it" in got.reply.message


def test_apply_policy_answers_what_a_rule_decides_and_audits_the_rule(tmp_path: Path) -> None:
    server = fleet_with_both()
    server.permissions[0].update(patterns=["git status"], metadata={"command": "git status"})
    ops = make_ops(tmp_path, server)
    ops = OpsContext(replace(ops.cfg, permissions=RULES), env={},
                     transport_factory=ops.transport_factory)
    waiters = aio.run(list_waiting(ops))
    outcomes = aio.run(apply_policy(ops, waiters.requests, NOW))
    assert [(o.request.waiting.request_id, o.result) for o in outcomes] == [("per_aaa1", "sent")]
    assert server.replies == [("/permission/per_aaa1/reply", {"reply": "once"})]
    [line] = audit_lines(ops.cfg)
    assert line["by"] == "rule permissions.rules[0] bash 'git status*' allow"
    # answered meanwhile: gone, nothing sent; production: refused
    again = aio.run(apply_policy(ops, waiters.requests, NOW))
    assert [o.result for o in again] == ["gone"] and len(server.replies) == 1
    prod = make_ops(tmp_path, fleet_with_both(), production=True)
    prod = OpsContext(replace(prod.cfg, permissions=PermissionsConfig(deny_after_minutes=0.5)),
                      env={}, transport_factory=prod.transport_factory)
    found = pending_of(aio.run(scan_fleet(prod.cfg, transport_factory=prod.transport_factory))[1])
    assert {o.result for o in aio.run(apply_policy(prod, found.requests, NOW))} == {"refused"}
