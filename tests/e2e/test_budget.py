"""Daily budgets end to end: real opencode servers report what each run cost, the hub refuses
new work once today's spend reaches a budget, across racing processes and instances.

The shared fleet's ``fake/priced-model`` has a price in the servers' own config ($1000 / $2000
per million input / output tokens, ``tests.fleet.PRICES``); the fake model reports 10 + 5 tokens
per call, so opencode 1.18 records $0.02 for each run (measured: the session's ``cost``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.fleet import Hub
from tests.notify_capture import Capture

pytestmark = pytest.mark.e2e

PRICED = "fake/priced-model"
RUN_USD = 0.02  # 10 * 1000 / 1e6 + 5 * 2000 / 1e6


def budgets(hub: Hub, daily: float | None, **per_instance: float) -> None:
    hub.doc["models"]["timezone"] = "UTC"
    if daily is None:
        hub.doc.pop("budget", None)
    else:
        hub.doc["budget"] = {"daily_usd": daily}
    for inst in hub.doc["instances"]:
        key = inst["name"].replace("-", "_")
        if key in per_instance:
            inst["budget_daily_usd"] = per_instance[key]
    hub.write_config()


def status(hub: Hub) -> dict[str, Any]:
    code, doc = hub.cli_json("status")
    assert code == 0, doc
    assert isinstance(doc, dict)
    return doc


def spent(hub: Hub) -> dict[str, float | None]:
    doc = status(hub)
    out = {i["instance"]: i["spent_today_usd"] for i in doc["instances"]}
    out["project"] = doc["spend"]["spent_today_usd"]
    return out


def priced_run(hub: Hub, name: str, text: str = "priced work") -> str:
    """Dispatch one priced run to ``name`` and wait until the server has recorded its cost."""
    before = spent(hub)[name] or 0.0
    code, doc = hub.cli_json(
        "dispatch", "--new", "--instance", name, "--text", text, "--model", PRICED, "--no-record"
    )
    assert code == 0, doc
    hub.wait_for(lambda: (spent(hub)[name] or 0.0) >= before + RUN_USD - 1e-9, timeout=90)
    return str(doc["session_id"])


def session_cost(hub: Hub, name: str, sid: str) -> float:
    with sandbox._client(hub.server(name).url, hub.password(name)) as c:
        got = c.get(f"/session/{sid}").json()
    return float(got["cost"])


def project_sessions(hub: Hub) -> int:
    code, doc = hub.cli_json("sessions")
    assert code == 0
    return len(doc["sessions"])


# ---------------------------------------------------------------------------------------------


# Not core: releases before 1.18 report no cost on the session, so the budget is shown there
# but cannot hold (test_releases checks that such sessions are 'cost unknown', never $0).
def test_spend_is_what_the_servers_report_and_new_work_stops_at_the_budget(hub: Hub) -> None:
    budgets(hub, 0.03)
    assert spent(hub) == {"local-a": 0.0, "lan-b": 0.0, "lan-c": 0.0, "project": 0.0}
    sid_b = priced_run(hub, "lan-b")
    assert session_cost(hub, "lan-b", sid_b) == pytest.approx(RUN_USD)  # what opencode says
    doc = status(hub)
    assert doc["spend"] == {
        "spent_today_usd": pytest.approx(RUN_USD),
        "budget_daily_usd": 0.03,
        "cost_unknown_sessions": 0,
    }
    sid_c = priced_run(hub, "lan-c")  # $0.02 < $0.03: room
    assert session_cost(hub, "lan-c", sid_c) == pytest.approx(RUN_USD)
    code, out, err = hub.cli("dispatch", "--new", "--instance", "local-a", "--text", "more")
    assert code == 3, err
    assert "daily budget $0.03 reached ($0.04 spent today)" in err
    # Table: spend against budget, the instance not dispatchable, the project's line.
    code, out, err = hub.cli("status")
    assert code == 0, err
    assert "$0.02" in out and "project spend: $0.04 of $0.03 today (133 %)" in out
    assert "daily budget $0.03 reached" in out
    # The page: spend against budget in the Autopilot panel.
    page = hub.root.parent / "page.html"
    code, out, err = hub.cli("sessions", "--html", str(page))
    assert code == 0, err
    html = page.read_text("utf-8")
    assert "Spent today: $0.04 of the daily budget $0.03 (133 %)." in html
    assert "The budget is reached: no new work starts until tomorrow." in html
    # A steer of a running session is the same run: it passes over budget.
    hub.llm.set_mode("slow-model", "slow", delay=20)
    budgets(hub, None)
    code, doc = hub.cli_json(
        "dispatch", "--new", "--instance", "local-a", "--text", "long", "--model", "fake/slow-model"
    )
    assert code == 0, doc
    running = str(doc["session_id"])
    try:
        hub.wait_for(lambda: running in hub.busy_ids("local-a"), timeout=60)
        budgets(hub, 0.03)
        code, out, err = hub.cli("dispatch", "--session", running, "--text", "also this")
        assert code == 0, err
        code, out, err = hub.cli("dispatch", "--new", "--instance", "local-a", "--text", "x")
        assert code == 3 and "daily budget $0.03 reached" in err
    finally:
        hub.cli("interrupt", "--session", running, "--allow-prod")


def test_an_instance_budget_refuses_that_instance_only(hub: Hub) -> None:
    budgets(hub, None, lan_b=0.02)
    priced_run(hub, "lan-b")
    code, out, err = hub.cli("dispatch", "--new", "--instance", "lan-b", "--text", "x")
    assert code == 3 and "lan-b: daily budget $0.02 reached ($0.02 spent today)" in err
    doc = status(hub)
    b = next(i for i in doc["instances"] if i["instance"] == "lan-b")
    assert (b["dispatchable"], b["budget_daily_usd"]) == (False, 0.02)
    assert doc["spend"]["budget_daily_usd"] is None
    code, doc = hub.cli_json(
        "dispatch", "--new", "--instance", "lan-c", "--text", "ok", "--no-record"
    )
    assert code == 0, doc
    # Without --instance the planner passes lan-b by: the work goes elsewhere, not refused.
    for i in range(3):
        code, doc = hub.cli_json("dispatch", "--new", "--text", f"anywhere {i}", "--no-record")
        assert code == 0 and doc["instance"] != "lan-b", doc


def test_the_fill_sends_tasks_past_an_instance_over_its_budget(hub: Hub) -> None:
    budgets(hub, None, lan_b=0.02)
    priced_run(hub, "lan-b")
    code, out, err = hub.cli("backlog", "add", "--title", "pinned to lan-b", "-i", "lan-b")
    assert code == 0, err
    code, out, err = hub.cli("patrol", "--once", "--no-design")
    assert code == 0, err
    doc = report(hub)
    sent = [a for a in doc["dispatched"] if a["result"] == "ok"]
    assert len(sent) == 1 and sent[0]["instance"] != "lan-b", doc["dispatched"]
    assert any("lan-b: daily budget $0.02 reached ($0.02 spent today)" in n for n in doc["notes"])


def race(hub: Hub, names: list[str]) -> list[tuple[int, str]]:
    procs = [
        hub.popen("dispatch", "--new", "--instance", name, "--text", f"race {i}",
                  "--model", PRICED, "--no-record")
        for i, name in enumerate(names)
    ]
    out = []
    for p in procs:
        _, err = p.communicate(timeout=180)
        out.append((p.returncode, err))
    return out


def test_racing_dispatches_across_two_instances_stop_at_the_project_budget(hub: Hub) -> None:
    budgets(hub, 0.05)
    priced_run(hub, "lan-b")
    priced_run(hub, "lan-c")  # $0.04 of $0.05: room for new work
    sessions_before = project_sessions(hub)
    # Several processes at once, both instances: each sees room, so each may start a run (up
    # to the limit); none can know the cost of a run that has not been made yet.
    first = race(hub, ["lan-b", "lan-c"] * 3)
    started = [code for code, _ in first if code == 0]
    for code, err in first:
        assert code in (0, 3), err
        if code == 3:  # full, or a run of this race already finished and reached the budget
            reasons = ("at its limit", "dispatch lock", "daily budget $0.05 reached")
            assert any(r in err for r in reasons), err
    assert 1 <= len(started) <= 4  # two instances, limit 2 each
    expected = 0.04 + RUN_USD * len(started)
    hub.wait_for(lambda: (spent(hub)["project"] or 0) >= expected - 1e-9, timeout=120)
    # Overspent by exactly the runs already started, no more.
    assert spent(hub)["project"] == pytest.approx(expected)
    assert project_sessions(hub) == sessions_before + len(started)
    # Now over budget: every racing dispatch is refused with the message; nothing is created.
    second = race(hub, ["lan-b", "lan-c"] * 4)
    total = f"${expected:.2f} spent today"
    for code, err in second:
        assert code == 3, err
        assert f"daily budget $0.05 reached ({total})" in err, err
    assert project_sessions(hub) == sessions_before + len(started)
    # A refused dispatch took no reservation: only the started runs' ("sent"/"accepted") remain.
    slots = (Path(hub.env["XAF_HUB_HOME"]) / "slots").glob("*.slot")
    assert all(json.loads(p.read_text("utf-8"))["prompt"] for p in slots)


def report(hub: Hub) -> dict[str, Any]:
    path = Path(hub.env["XAF_HUB_HOME"]) / "patrol" / "report-latest.json"
    doc = json.loads(path.read_text("utf-8"))
    assert isinstance(doc, dict)
    return doc


def test_the_patrol_leaves_pool_tasks_pending_with_the_reason(hub: Hub) -> None:
    budgets(hub, 0.02)
    priced_run(hub, "lan-b")
    for title in ("first waiting task", "second waiting task"):
        code, out, err = hub.cli("backlog", "add", "--title", title)
        assert code == 0, err
    sessions_before = project_sessions(hub)
    code, out, err = hub.cli("patrol", "--once", "--no-design")
    assert code == 0, err
    doc = report(hub)
    why = "daily budget $0.02 reached ($0.02 spent today)"
    held = [a for a in doc["dispatched"] if a["result"] == "waiting"]
    assert len(held) == 2 and all(a["detail"] == why for a in held), doc["dispatched"]
    assert [t["why"] for t in doc["waiting"]["not_ready"]] == [why, why]
    assert doc["waiting"]["ready"] == []
    code, tasks = hub.cli_json("backlog", "list")
    assert code == 0 and {t["status"] for t in tasks["tasks"]} == {"pending"}
    assert project_sessions(hub) == sessions_before
    md = (Path(hub.env["XAF_HUB_HOME"]) / "patrol" / "report-latest.md").read_text("utf-8")
    assert why in md


@pytest.fixture
def capture() -> Iterator[Capture]:
    cap = Capture("json")
    cap.start()
    yield cap
    cap.stop()


def budget_posts(cap: Capture) -> list[tuple[str, int]]:
    return [
        (e["instance"], int(e["data"]["level"])) for e in cap.events() if e["type"] == "budget"
    ]


def test_the_80_and_100_percent_notices_are_sent_once_each(hub: Hub, capture: Capture) -> None:
    hub.env["HOOK_TEAM"] = capture.url
    hub.write_config(
        notify={"webhooks": [{"name": "team", "url_env": "HOOK_TEAM", "format": "json"}]}
    )
    budgets(hub, 0.05)
    priced_run(hub, "lan-b")
    priced_run(hub, "lan-c")  # $0.04 = 80 %
    patrol = ("patrol", "--once", "--no-design")
    for _ in range(2):
        code, out, err = hub.cli(*patrol)
        assert code == 0, err
    assert budget_posts(capture) == [("", 80)]
    priced_run(hub, "local-a")  # $0.06: over
    for _ in range(2):
        code, out, err = hub.cli(*patrol)
        assert code == 0, err
    assert budget_posts(capture) == [("", 80), ("", 100)]


def audit_lines(hub: Hub) -> list[dict[str, Any]]:
    path = Path(hub.env["XAF_HUB_HOME"]) / "audit.log"
    return [json.loads(ln) for ln in path.read_text("utf-8").splitlines()] if path.exists() else []


def run_state(hub: Hub, name: str, sid: str) -> str:
    code, data = hub.cli_json("sessions", "--instance", name)
    return next((s["run_state"] for s in data["sessions"] if s["id"] == sid), "")


def test_a_heal_re_send_is_new_work_and_waits_for_the_budget(hub: Hub) -> None:
    hub.doc["models"]["chain"] = ["opencode/free-model", "backup/good-model"]
    budgets(hub, 0.02)
    priced_run(hub, "local-a")
    # A failed run (rate limit): its heal would send again through send_work.
    hub.llm.set_mode("free-model", "429", retry_after=1)
    failed = hub.session("lan-b", "rate limited work")
    hub.prompt("lan-b", failed, "do the work", "opencode/free-model")
    hub.wait_for(lambda: run_state(hub, "lan-b", failed) == "idle" and any(
        m["info"].get("error") for m in sandbox.messages(
            hub.server("lan-b").url, hub.password("lan-b"), failed)
    ), timeout=90)
    # A run stuck in retry: its heal aborts and re-sends under the lock (abort_and_prompt).
    hub.llm.set_mode("free-model", "429", retry_after=3600)
    stuck = hub.session("local-a", "stuck in retry")
    hub.prompt("local-a", stuck, "do the work", "opencode/free-model")
    try:
        hub.wait_for(lambda: run_state(hub, "local-a", stuck) == "retry", timeout=60)
        code, out, err = hub.cli("patrol", "--once", "--no-design", "--no-fill")
        assert code == 0, err
        doc = report(hub)
        heals = {a["session"]: a for a in doc["healed"]}
        why = "daily budget $0.02 reached ($0.02 spent today)"
        for sid in (failed, stuck):
            assert heals[sid]["result"] == "waiting", heals[sid]
            assert "daily budget reached" in heals[sid]["detail"] and why in heals[sid]["detail"]
        assert run_state(hub, "local-a", stuck) == "retry"  # not aborted: nothing was sent
        assert not any(e["command"] == "patrol.heal" and e["result"] != "failed"
                       for e in audit_lines(hub))
        assert not [r for r in hub.llm.requests() if r["model"] == "good-model"]
    finally:
        hub.cli("interrupt", "--session", stuck, "--allow-prod")


def test_ten_racing_dispatches_overspend_a_daily_budget_by_at_most_one_run_ceiling(
    hub: Hub,
) -> None:
    """With a run ceiling, runs in flight count at it: ten dispatches racing for one
    instance's $0.05 stop once the runs started could spend it (measured before: ten such
    dispatches against $0.01 spent $0.20)."""
    budgets(hub, None, lan_b=0.05)
    hub.doc["budget"] = {"run_usd": RUN_USD}
    hub.set_instance("lan-b", concurrency_limit=10)  # the budget, not the limit, must hold
    sessions_before = project_sessions(hub)
    results = race(hub, ["lan-b"] * 10)
    started = [code for code, _ in results if code == 0]
    for code, err in results:
        # 3: the budget, the lock; 2: a scan that timed out on a loaded machine (nothing sent)
        assert code in (0, 2, 3), err
    assert 1 <= len(started) <= 3
    refusals = [err for code, err in results if code == 3 and "daily budget" in err]
    assert all("in flight" in e or "spent today)" in e for e in refusals), refusals
    hub.wait_for(lambda: not hub.busy_ids("lan-b"), timeout=120)
    final = spent(hub)["lan-b"] or 0.0
    assert final == pytest.approx(RUN_USD * len(started))
    assert final <= 0.05 + RUN_USD + 1e-9  # the stated bound: one run's ceiling over
    assert project_sessions(hub) == sessions_before + len(started)


def test_the_overall_budget_holds_every_projects_spend_together(hub: Hub) -> None:
    hub.doc.pop("project")
    for inst in hub.doc["instances"]:
        inst.pop("roots"), inst.pop("default_directory")
    hub.write_config(projects={
        p: {"roots": {"lan-c": [str(app.parent)]}, "default_directory": {"lan-c": str(app)}}
        for p, app in ((p, hub.project_dir(p, "app")) for p in ("shop", "blog"))
    })
    budgets(hub, 0.02)
    code, doc = hub.cli_json(
        "dispatch", "--new", "--project", "shop", "--instance", "lan-c", "--text", "priced",
        "--model", PRICED, "--no-record",
    )
    assert code == 0, doc
    hub.wait_for(lambda: (status(hub)["fleet"]["spent_today_usd"] or 0) >= RUN_USD - 1e-9,
                 timeout=90)
    # Blog has spent nothing, yet shop's run took the whole overall budget.
    code, out, err = hub.cli(
        "dispatch", "--new", "--project", "blog", "--instance", "lan-c", "--text", "x"
    )
    assert code == 3 and "all projects: daily budget $0.02 reached ($0.02 spent today)" in err
    code, out, err = hub.cli("status")
    assert code == 0 and "spend, all projects: $0.02 of $0.02 today (100 %)" in out, out
    code, doc = hub.cli_json("status", "--project", "blog")
    assert code == 0 and doc["spend"]["spent_today_usd"] == 0.0 and doc["fleet"] is None
