"""Notifications, second half: events derived from a cycle, the durable outbox, the zh/en
messages, and doctor's webhook checks."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.notify_capture import TOKEN
from tests.unit.notify.support import EVENT, NOW, URL, hook, parse
from xaf_hub.config.notify import Webhook
from xaf_hub.errors import ExitCode, StateFileError, UnreachableError
from xaf_hub.notify import outbox
from xaf_hub.notify.check import webhook_checks
from xaf_hub.notify.derive import Done, Inputs, Parked, derive
from xaf_hub.notify.events import Event
from xaf_hub.notify.messages import render
from xaf_hub.notify.record import Action, InstanceLine, RoundLog, SessionLine, StepOutcome
from xaf_hub.store.model_state import FileModelState, Healed, HealedSession

# ---------------------------------------------------------------------------------------------
# Events derived from a cycle


def round_log(**kw: Any) -> RoundLog:
    c = RoundLog(started=NOW, finished=NOW)
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def up(name: str, reachable: bool = True, reason: str = "") -> InstanceLine:
    return InstanceLine(name, reachable, reason, 0, 0, 2, False)


def run_derive(c: RoundLog, state: dict[str, Any], **inputs: Any) -> list[Event]:
    inp = Inputs(configured=inputs.pop("configured", ["a", "b"]), **inputs)
    return derive(c, inp, state, now=NOW, tz=UTC, summary_hour=23)


def test_instance_events_compare_with_the_previous_round() -> None:
    state: dict[str, Any] = {}
    assert run_derive(round_log(instances=[up("a"), up("b")]), state) == []  # first round: record
    down = run_derive(round_log(instances=[up("a"), up("b", False, "connection refused")]), state)
    assert [(e.type, e.instance, e.data["reason"]) for e in down] == [
        ("instance_down", "b", "connection refused")
    ]
    assert run_derive(round_log(instances=[up("a"), up("b", False, "refused")]), state) == []
    back = run_derive(round_log(instances=[up("a"), up("b")]), state)
    assert [(e.type, e.instance) for e in back] == [("instance_up", "b")]
    assert back[0].id != down[0].id
    # A step that only quotes the words (another failure's message) says nothing of the fleet.
    exc = UnreachableError.fleet_down("a: refused; b: refused")
    quoted = round_log(steps=[StepOutcome("fill_slots", "failed", 2, f"internal error: {exc}")])
    assert run_derive(quoted, state) == []
    # No instance answered: the cycle has no instance lines, but the step's cause says so.
    down_step = StepOutcome("check_agents", "failed", 2, "reworded", 0, exc.cause)
    fleet_down = round_log(steps=[down_step])
    assert sorted(e.instance for e in run_derive(fleet_down, state)) == ["a", "b"]
    # Steps skipped: nothing known, nothing said.
    assert run_derive(round_log(), state) == []


def healed(
    instance: str, sid: str, title: str = "", at: datetime = NOW, identity: str = "msg_1"
) -> Healed:
    """A heal as the model-state store remembers it."""
    return Healed(
        f"heal:{instance}:{sid}:{identity}",
        int(at.timestamp() * 1000),
        "m1",
        "m2",
        HealedSession(instance, sid, title),
    )


def line(state: str, sid: str = "s1", updated: int = 5) -> SessionLine:
    return SessionLine("a", sid, f"title {sid}", state, f"detail {sid}", "m", updated)


def test_session_events_need_a_reason_a_person_must_act() -> None:
    act = Action
    c = round_log(
        actions=[
            act("fill_slots", "done", "ok", "a", "s9", task="T-9", title="nine"),
            act(
                "fix_free_limit", "heal", "ok", "a", "s2", title="two", model="m2", from_model="m1"
            ),
            act(
                "check_agents",
                "resume",
                "skipped",
                "a",
                "s4",
                detail="interrupted again after the patrol resumed it once; left for a human",
                why="resumed_once",
            ),
            act(
                "check_agents",
                "resume",
                "skipped",
                "a",
                "s5",
                # its words name a human and production, its code none: nobody is called
                detail="may still be starting (a human's production fix)",
            ),
            act("check_agents", "resume", "waiting", "a", "s6", detail="no free slot"),
            # A person's decision about a pool task (the report's "Needs a person").
            act(
                "fill_slots",
                "person",
                "skipped",
                "a",
                "s10",
                task="T-10",
                title="ten",
                detail="interrupted by alice@box at 14:03 UTC",
            ),
        ],
        sessions=[
            line("failed", "s1"),  # nobody took care of it
            line("failed", "s2"),  # healed
            line("failed", "s3"),  # a pool task's session
            line("interrupted", "s4"),  # left for a human
            line("interrupted", "s5"),  # may still be starting
            line("interrupted", "s6"),  # waits for a slot
            line("stale_busy", "s7"),
            line("running", "s8"),
        ],
    )
    pool = frozenset({("a", "s3")})
    events = run_derive(c, {}, pool_sessions=pool, heals=[healed("a", "s2", "two")])
    got = [(e.type, e.session) for e in events]
    assert got == [
        ("task_done", "s9"),
        ("needs_person", "s10"),
        ("needs_person", "s1"),
        ("needs_person", "s4"),
        ("needs_person", "s7"),
        ("healed", "s2"),
    ]
    assert (events[1].task, events[1].data["state"]) == ("T-10", "person")
    assert "left for a human" in events[3].data["detail"]
    assert events[-1].data["from_model"] == "m1" and events[-1].title == "two"
    # Derived again next round (same session update): the same ids, so sent once.
    again = run_derive(c, {}, pool_sessions=pool)
    assert [e.id for e in again if e.type == "needs_person"] == [
        e.id for e in events if e.type == "needs_person"
    ]


def test_parked_tasks_blackouts_and_the_daily_summary() -> None:
    state: dict[str, Any] = {}
    parked = [Parked("T-3", "three", 3, "context too long")]
    blackouts = {"opencode": ("2026-12-02T00:00:00+00:00", "429")}
    events = derive(
        round_log(instances=[up("a")]),
        Inputs(["a"], parked, 2, blackouts=blackouts),
        state,
        now=NOW,
        tz=UTC,
        summary_hour=9,
    )
    assert [e.type for e in events] == ["task_parked", "blackout", "daily_summary"]
    summary = events[-1].data
    assert summary["counts"] == {"task_parked": 1, "blackout": 1}
    assert (summary["waiting"], summary["up"], summary["servers"]) == (2, 1, 1)
    # Same blackout, same day: only the parked task is derived again (its id dedupes it).
    events = derive(
        round_log(instances=[up("a")]),
        Inputs(["a"], parked, 2, blackouts=blackouts),
        state,
        now=NOW + timedelta(hours=1),
        tz=UTC,
        summary_hour=9,
    )
    assert [e.type for e in events] == ["task_parked"]
    # A new blackout time is news; a new day brings a new summary, not before summary_hour.
    later = {"opencode": ("2026-12-03T00:00:00+00:00", "429")}
    early = datetime(2026, 12, 2, 8, 59, tzinfo=UTC)
    events = derive(
        round_log(), Inputs(["a"], blackouts=later), state, now=early, tz=UTC, summary_hour=9
    )
    assert [e.type for e in events] == ["blackout"]
    events = derive(
        round_log(),
        Inputs(["a"], blackouts=later),
        state,
        now=early + timedelta(minutes=2),
        tz=UTC,
        summary_hour=9,
    )
    assert [(e.type, e.data["day"]) for e in events] == [("daily_summary", "2026-12-02")]


def test_a_live_reaction_says_what_it_did_and_leaves_the_fleet_view_to_the_round() -> None:
    state: dict[str, Any] = {}
    run_derive(round_log(instances=[up("a"), up("b")]), state)  # a round saw both up
    live = round_log(
        instances=[up("a"), up("b", False, "refused")],  # ignored: a reaction sees no fleet
        sessions=[line("failed", "s7")],
        actions=[
            Action("fix_free_limit", "heal", "ok", "a", "s2", title="two", model="m2"),
            Action("check_agents", "person", "skipped", "a", "s3", detail="stopped by a person"),
        ],
    )
    blackouts = {"opencode": ("2026-12-02T00:00:00+00:00", "429")}
    events = derive(live, Inputs(["a", "b"], blackouts=blackouts, heals=[healed("a", "s2")]),
                    state, now=NOW, tz=UTC, summary_hour=0, live=True)
    assert [(e.type, e.session) for e in events] == [("healed", "s2"), ("blackout", "")]
    # The next round still reports what needs a full view, and the blackout only once.
    events = derive(round_log(instances=[up("a"), up("b", False, "refused")]),
                    Inputs(["a", "b"], blackouts=blackouts), state, now=NOW, tz=UTC,
                    summary_hour=0)
    assert [e.type for e in events] == ["instance_down", "daily_summary"]


def test_tasks_done_in_a_killed_round_are_caught_up_once() -> None:
    state: dict[str, Any] = {}
    early = Done("T-1", "one", "a", "s1", NOW - timedelta(hours=1))
    in_this_round = Action("fill_slots", "done", "ok", "a", "s1", task="T-1", title="one")
    first = run_derive(round_log(actions=[in_this_round]), state, done=[early])
    assert [e.id for e in first] == ["task_done:T-1:s1"]  # the action and the pool agree
    # The next round was killed after settling T-2; the round after finds it in the pool.
    killed = Done("T-2", "two", "b", "s2", NOW + timedelta(minutes=30))
    later = RoundLog(started=NOW + timedelta(hours=1))
    events = run_derive(later, state, done=[early, killed])
    assert [(e.type, e.task, e.instance, e.session) for e in events] == [
        ("task_done", "T-2", "b", "s2")
    ]


def test_a_task_finished_without_a_repository_is_never_announced_done() -> None:
    """Without project.repository the pool may say done, the chat never: "finished, not
    verified", how to get verification, and the daily summary counts it apart."""
    act = Action("fill_slots", "finished", "ok", "a", "s1", task="T-1", title="one",
                 detail="not verified: no project.repository to check its work")
    later = Done("T-2", "two", "b", "s2", NOW + timedelta(minutes=30), verified=False)
    state: dict[str, Any] = {}
    first = run_derive(round_log(actions=[act]), state)
    caught = run_derive(RoundLog(started=NOW + timedelta(hours=1)), state, done=[later])
    events = [e for e in first + caught if e.type.startswith("task_")]
    assert [(e.type, e.task) for e in events] == [
        ("task_finished", "T-1"), ("task_finished", "T-2"),
    ]
    for lang, head, said in (
        ("en", "Task finished, not verified: one", "Set project.repository"),
        ("zh", "任务已结束,未验证:one", "project.repository"),
    ):
        headline, text = render(events[0], language=lang, project="p", page_url="", tz=UTC)
        assert headline.endswith(head) and said in text and "done" not in headline.lower()
    summary = [e for e in derive(round_log(), Inputs(["a"]), {"history": [
        {"type": "task_finished", "at": NOW.isoformat()}]}, now=NOW, tz=UTC, summary_hour=0)
        if e.type == "daily_summary"]
    _, text = render(summary[0], language="en", project="p", page_url="", tz=UTC)
    assert "0 task(s) done and verified, 1 finished but not verified" in text


# ---------------------------------------------------------------------------------------------
# The outbox


def queue(
    tmp: Path, events: list[Event], hooks: list[Webhook], now: datetime = NOW, limit: int = 100
) -> outbox.Queued:
    return outbox.enqueue(
        tmp, lambda state: events, hooks, now=now, queue_limit=limit, keep_hours=24
    )


def test_outbox_queues_each_event_once_and_forgets_it_once_delivered(tmp_path: Path) -> None:
    done = Webhook("done-only", "H", "json", events=("task_done",), url=URL)
    everything = Webhook("all", "H", "json", url=URL)
    down = Event("instance_down:b:x", "instance_down", NOW.isoformat(), "b")
    q = queue(tmp_path, [EVENT, down], [done, everything])
    assert [(e.webhook, e.event.type) for e in q.pending] == [
        ("done-only", "task_done"),
        ("all", "task_done"),
        ("all", "instance_down"),
    ]
    assert queue(tmp_path, [EVENT, down], [done, everything]).new == []  # seen: not again
    outbox.record(tmp_path, q.pending[0], outcome="delivered", reason="HTTP 200", now=NOW)
    outbox.record(tmp_path, q.pending[1], outcome="retry", reason="connection refused", now=NOW)
    state = outbox.read_state(tmp_path)
    assert state is not None
    assert [(i["webhook"], i["attempts"]) for i in state["outbox"]] == [("all", 1), ("all", 0)]
    assert state["outbox"][0]["last_error"] == "connection refused"
    assert state["outbox"][0]["next_at"] == (NOW + timedelta(seconds=10)).isoformat()
    assert state["last"]["all"]["error"] == "connection refused"
    assert f"done-only:{EVENT.id}" in state["sent"]
    if hasattr(__import__("os"), "geteuid"):
        assert oct(outbox.state_path(tmp_path).stat().st_mode & 0o777) == "0o600"


def test_outbox_is_bounded_by_size_and_age(tmp_path: Path) -> None:
    h = Webhook("all", "H", "json", url=URL)
    many = [Event(f"needs_person:a:s{i}:1", "needs_person", NOW.isoformat()) for i in range(5)]
    q = queue(tmp_path, many, [h], limit=3)
    assert [e.event.id for e in q.pending] == [e.id for e in many[2:]]
    assert len(q.dropped) == 2 and "queue full" in q.dropped[0]
    q = queue(tmp_path, [], [h], now=NOW + timedelta(hours=25))
    assert q.pending == [] and len(q.dropped) == 3 and "more than 24 h" in q.dropped[0]


def test_a_damaged_outbox_is_reported_never_reset(tmp_path: Path) -> None:
    path = outbox.state_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"schema_version": 1, "outbox": [{"event": 3}]}', "utf-8")
    with pytest.raises(StateFileError, match=r"outbox\[0\]"):
        queue(tmp_path, [EVENT], [hook("json")])
    assert path.read_text("utf-8") == '{"schema_version": 1, "outbox": [{"event": 3}]}'


# ---------------------------------------------------------------------------------------------
# Messages


def test_messages_in_both_languages_with_title_instance_and_link() -> None:
    for lang, words in (("en", "finished"), ("zh", "已在")):
        head, text = render(
            EVENT, language=lang, project="商城", page_url="http://127.0.0.1:8/", tz=UTC
        )
        assert head.startswith("[xaf-hub · 商城]") and "登录页" in head
        assert words in text and "lan-b" in text and "http://127.0.0.1:8/" in text
    down = Event(
        "instance_down:b:1",
        "instance_down",
        NOW.isoformat(),
        "lan-b",
        data={"reason": "connection refused"},
    )
    head, text = render(down, language="zh", project="p", page_url="", tz=UTC)
    assert "服务器无响应" in head and "lan-b" in text and "Overview" not in text
    head, text = render(down, language="en", project="p", page_url="", tz=UTC)
    assert head.endswith("Server down: lan-b") and "connection refused" in text
    # Every event type in the catalogue renders in both languages without a missing field.
    from xaf_hub.core.catalogue import LANGS, TEXT

    kinds = [key[5:-5] for key in TEXT if key.startswith("chat.") and key.endswith(".body")]
    assert "task_done" in kinds and "daily_summary" in kinds
    for lang in LANGS:
        for kind in kinds:
            render(
                Event("x", kind, NOW.isoformat()), language=lang, project="p", page_url="", tz=UTC
            )


# ---------------------------------------------------------------------------------------------
# doctor


def test_doctor_checks_env_vars_and_only_resolves_when_online(tmp_path: Path) -> None:
    cfg = parse(
        {
            "webhooks": [
                {"name": "ok", "url_env": "OK_URL", "format": "dingtalk"},
                {"name": "unset", "url_env": "NOPE", "format": "slack"},
                {
                    "name": "nosecret",
                    "url_env": "OK_URL",
                    "format": "feishu",
                    "secret_env": "MISSING",
                },
            ]
        },
        env={"OK_URL": "https://chat.invalid/robot/send?access_token=" + TOKEN},
    )
    asked: list[tuple[str, int]] = []

    def resolver(host: str, port: int) -> Any:
        asked.append((host, port))
        raise OSError(-2, "Name or service not known")

    offline = webhook_checks(cfg, tmp_path, resolver=resolver)
    assert asked == []
    levels = [(c.subject, c.level, c.exit_code) for c in offline]
    assert ("webhook unset", "error", ExitCode.USAGE) in levels
    assert ("webhook nosecret", "error", ExitCode.USAGE) in levels
    assert ("webhook ok", "info", ExitCode.OK) in levels  # dingtalk without signing
    assert not any(TOKEN in c.message + c.fix for c in offline)
    online = webhook_checks(cfg, tmp_path, online=True, resolver=resolver)
    assert asked == [("chat.invalid", 443), ("chat.invalid", 443)]
    bad = [c for c in online if "does not resolve" in c.message]
    assert bad and bad[0].exit_code == ExitCode.UNREACHABLE


def test_a_heal_whose_notice_was_never_queued_is_announced_by_the_next_round(
    tmp_path: Path,
) -> None:
    """The process was killed right after a heal: the healed memory still tells it, once."""
    store = FileModelState(tmp_path / ".model_state.json", 0, UTC, {})
    state: dict[str, Any] = {}
    run_derive(round_log(), state)  # a finished round
    at = NOW + timedelta(minutes=5)
    store.remember_healed(
        "heal:a:s2:msg_9", "opencode/free", "backup/good", at,
        who=HealedSession("a", "s2", "login page"),
    )
    store.remember_healed("resume:a:s3", None, None, at)  # a resume is no heal
    # ... killed here. The next round (or reaction) reads the store:
    later = RoundLog(started=NOW + timedelta(hours=1))
    heals = store.healed_since(NOW - timedelta(hours=24))
    events = run_derive(later, state, heals=heals)
    assert [(e.type, e.id, e.instance, e.session, e.title) for e in events] == [
        ("healed", "healed:a:s2:msg_9", "a", "s2", "login page")
    ]
    models = (events[0].data["from_model"], events[0].data["model"])
    assert models == ("opencode/free", "backup/good")
    # A later round sees it again only as an old heal: nothing new.
    again = RoundLog(started=NOW + timedelta(hours=2))
    assert run_derive(again, state, heals=store.healed_since(NOW - timedelta(hours=24))) == []


def waiting_line(sid: str, request: str, detail: str) -> SessionLine:
    return SessionLine("a", sid, f"title {sid}", "waiting", detail, "m", 5, request,
                       f"xaf-hub approve {request} [--always] | xaf-hub deny {request}")


def test_one_notice_per_request_a_run_waits_on_pool_sessions_included() -> None:
    state: dict[str, Any] = {}
    secret = "permission bash: curl -H 'Authorization: Bearer tok123' https://u:pw@h/x"
    lines = [waiting_line("s1", "per_1", secret), waiting_line("s2", "que_2", "question: Why?"),
             line("running", "s3")]
    first = run_derive(round_log(sessions=lines), state, pool_sessions=frozenset({("a", "s1")}))
    asks = [e for e in first if e.type == "waiting_person"]
    assert [(e.id, e.session) for e in asks] == [
        ("waiting_person:a:per_1", "s1"), ("waiting_person:a:que_2", "s2")
    ]
    assert "tok123" not in asks[0].data["detail"] and "pw@" not in asks[0].data["detail"]
    headline, text = render(asks[0], language="en", project="p", page_url="", tz=UTC)
    assert headline.endswith("Waiting for a person: title s1")
    assert "To answer: xaf-hub approve per_1" in text and "tok123" not in text
    zh = render(asks[1], language="zh", project="p", page_url="", tz=UTC)
    assert "等人回答" in zh[0]
    # The next round sees the same requests: the same ids (the outbox's seen map sends once).
    again = run_derive(round_log(sessions=lines), state)
    assert {e.id for e in again if e.type == "waiting_person"} == {e.id for e in asks}


def test_the_daily_summary_counts_what_waits_for_a_person() -> None:
    c = round_log(sessions=[waiting_line("s1", "per_1", "x"), line("running", "s2")])
    inp = Inputs(configured=["a"])
    late = NOW.replace(hour=23, minute=30)
    events = derive(c, inp, {}, now=late, tz=UTC, summary_hour=23)
    [summary] = [e for e in events if e.type == "daily_summary"]
    assert (summary.data["asking"], summary.data["running"]) == (1, 1)
    _, text = render(summary, language="en", project="p", page_url="", tz=UTC)
    assert "1 running, 1 waiting for a person" in text


def test_a_task_done_notice_says_which_rule_decided() -> None:
    """Issue 37: the chat says why the hub calls it done (new work, check passed)."""
    detail = "verified: commit 0123456 on the repository (new work: 1 commit; check: passed)"
    act = Action("fill_slots", "done", "ok", "lan-b", "s1", task="T-1", title="fix", detail=detail)
    events = run_derive(round_log(actions=[act]), {})
    [done] = [e for e in events if e.type == "task_done"]
    assert done.data == {"judged": detail}
    for lang in ("en", "zh"):
        _, text = render(done, language=lang, project="p", page_url="", tz=UTC)
        assert "check: passed" in text and "new work: 1 commit" in text
    bare = dataclasses.replace(done, data={})
    _, plain = render(bare, language="en", project="p", page_url="", tz=UTC)
    assert plain == "Task T-1 finished in its session on lan-b."


def test_each_session_event_names_its_project() -> None:
    shop = dataclasses.replace(waiting_line("s1", "per_1", "x"), project="shop")
    c = round_log(sessions=[shop, waiting_line("s2", "per_2", "y")])
    asks = {e.session: e for e in run_derive(c, {}) if e.type == "waiting_person"}
    assert (asks["s1"].project, asks["s2"].project) == ("shop", "")
    # the record says it, and keeps it through the outbox
    assert Event.from_json(asks["s1"].to_json()).project == "shop"
    assert asks["s2"].to_json()["project"] == ""
