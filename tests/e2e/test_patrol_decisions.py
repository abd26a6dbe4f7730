"""The patrol respects what people decided; the pool keeps one row per piece of work.

Against real opencode servers and the fake model: an operator's interrupt is never undone
(no new session, no prompt, one row), one dispatch + two steers make one row with three
prompts, a provider 401 moves the task along the model chain and then backs off and parks it,
a task marked done while the patrol is filling slots is never sent, and `backlog set --status
pending` refuses while the task's session still runs.
"""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.e2e.faulty import StepProxy
from tests.fleet import NAMES, Hub
from xaf_hub.store.backlog import Backlog
from xaf_hub.store.tasks import BacklogData, format_instant, parse_instant

pytestmark = pytest.mark.e2e

ONLY_FILL = ("--no-freelimit", "--no-check", "--no-design")
# patrol.just_dispatched_seconds (10 by default): a pool row this young is not judged yet. Short
# here: every test waits for the session to finish, then for the row to be past it.
YOUNG = 2.0


def home(hub: Hub) -> Path:
    return Path(hub.env["XAF_HUB_HOME"])


def audit_lines(hub: Hub) -> list[dict[str, Any]]:
    path = home(hub) / "audit.log"
    return [json.loads(ln) for ln in path.read_text("utf-8").splitlines()]


def pool(hub: Hub) -> list[dict[str, Any]]:
    code, doc = hub.cli_json("backlog", "list")
    assert code == 0
    return list(doc["tasks"])


def patrol(hub: Hub, *flags: str) -> dict[str, Any]:
    code, out, err = hub.cli("patrol", "--once", *flags)
    assert code == 0, err + out
    doc = json.loads((home(hub) / "patrol" / "report-latest.json").read_text("utf-8"))
    assert not any(pw in json.dumps(doc) + out + err for pw in hub.secrets())
    return doc


def agent_requests(hub: Hub, needle: str = "") -> list[dict[str, Any]]:
    return [r for r in hub.llm.requests() if not r["title_call"] and needle in r["last_user_text"]]


def project_sessions(hub: Hub) -> set[tuple[str, str]]:
    found = set()
    for name in NAMES:
        code, data = hub.cli_json("sessions", "--instance", name)
        assert code == 0
        found |= {(name, s["id"]) for s in data["sessions"] if s.get("project", True)}
    return found


def abort_all(hub: Hub) -> None:
    for name in NAMES:
        for sid in hub.busy_ids(name):
            sandbox.abort(hub.server(name).url, hub.password(name), sid)


def wait_judgeable(hub: Hub, task_id: str, timeout: float = 90) -> dict[str, Any]:
    """Wait until the task's session stopped and its row is older than YOUNG."""

    def ready() -> dict[str, Any] | None:
        [row] = [t for t in pool(hub) if t["id"] == task_id]
        if row["status"] != "dispatched":
            return row
        if row["session_id"] in hub.busy_ids(row["dispatched_to"]):
            return None
        at = parse_instant(row["dispatched_at"])
        assert at is not None
        if datetime.now(UTC) - at <= timedelta(seconds=YOUNG + 1):
            return None
        msgs = sandbox.messages(
            hub.server(row["dispatched_to"]).url,
            hub.password(row["dispatched_to"]),
            row["session_id"],
        )
        done = msgs and msgs[-1]["info"]["role"] == "assistant"
        return row if done and msgs[-1]["info"].get("time", {}).get("completed") else None

    return dict(hub.wait_for(ready, timeout=timeout, step=1))


# ---------------------------------------------------------------------------------------------
# An operator's interrupt; one row per piece of work


def test_an_interrupt_is_never_undone_and_steers_stay_one_row(hub: Hub) -> None:
    hub.llm.set_mode("slow-model", "slow", delay=120)
    hub.doc["models"]["default_dispatch_model"] = "fake/slow-model"
    hub.write_config(patrol={"no_answer_grace_seconds": 1, "just_dispatched_seconds": YOUNG})
    try:
        code, sent = hub.cli_json(
            "dispatch", "--new", "--instance", "lan-b", "--text", "build the export\nas CSV"
        )
        assert code == 0, sent
        sid, task_id = sent["session_id"], sent["task_id"]
        hub.wait_for(lambda: agent_requests(hub, "build the export"), timeout=60)
        for text in ("另外加上重试", "and a progress bar"):
            code, steer = hub.cli_json("dispatch", "--session", sid, "--text", text)
            assert code == 0, steer
            assert (steer["action"], steer["task_id"]) == ("steer", task_id)

        # One dispatch + two steers: one row holding the three prompts, titled by the task.
        [row] = pool(hub)
        assert row["id"] == task_id and row["title"] == "build the export"
        assert row["prompts"] == ["build the export\nas CSV", "另外加上重试", "and a progress bar"]
        assert row["status"] == "dispatched" and row["steered_at"]

        # Its session still runs: back to the pool would run the work twice.
        code, out, err = hub.cli("backlog", "set", task_id, "--status", "pending")
        assert code == 4 and "still running" in err and "--force" in err, err
        assert pool(hub)[0]["status"] == "dispatched"

        code, out, err = hub.cli("interrupt", "--session", sid)
        assert code == 0, err
        hub.wait_for(lambda: sid not in hub.busy_ids("lan-b"), timeout=30)
        time.sleep(YOUNG + 2)  # past the grace and the young-row rule

        before_sessions = project_sessions(hub)
        before_requests = len(agent_requests(hub))
        audit_mark = len(audit_lines(hub))
        doc = patrol(hub, "--no-freelimit", "--no-design")

        # Nothing was sent, created or started; the row is still the one row, still dispatched.
        assert project_sessions(hub) == before_sessions
        assert len(agent_requests(hub)) == before_requests
        assert all(not hub.busy_ids(name) for name in NAMES)
        writes = [e for e in audit_lines(hub)[audit_mark:] if e["instance"]]
        assert writes == [], writes  # no prompt, create, abort or delete by the patrol
        assert doc["dispatched"] == [] and doc["tasks_requeued"] == [] and doc["resumed"] == []
        [row] = pool(hub)
        assert (row["id"], row["status"], row["session_id"]) == (task_id, "dispatched", sid)

        # The report says who stopped it, under "needs a person", and the session is interrupted.
        [person] = doc["needs_person"]
        assert (person["session"], person["task"]) == (sid, task_id)
        assert person["detail"].startswith("interrupted by ")
        lines = {s["session"]: s for s in doc["sessions"]["interrupted"]}
        assert lines[sid]["detail"].startswith("interrupted by ")
        md = (home(hub) / "patrol" / "report-latest.md").read_text("utf-8")
        assert "Needs a person" in md and "interrupted by " in md

        # The overview page's Autopilot panel says it too.
        page = home(hub) / "page.html"
        code, _, err = hub.cli("sessions", "--html", str(page))
        assert code == 0, err
        assert "Left for a person: build the export: interrupted by " in page.read_text("utf-8")

        # A person acts: back to the pool; the patrol sends the whole piece of work once.
        code, out, err = hub.cli("backlog", "set", task_id, "--status", "pending")
        assert code == 0, err
        doc = patrol(hub, *ONLY_FILL)
        [go] = doc["dispatched"]
        assert go["task"] == task_id and go["result"] == "ok"
        [row] = pool(hub)
        assert row["status"] == "dispatched" and row["session_id"] != sid
        assert row["steered_at"] is None and len(row["prompts"]) == 3
        resent = hub.wait_for(lambda: agent_requests(hub, "另外加上重试"), timeout=60)
        text = resent[-1]["last_user_text"]
        assert "build the export" in text and "and a progress bar" in text
    finally:
        abort_all(hub)


# ---------------------------------------------------------------------------------------------
# Failures that name the model, infrastructure back-off and parking

CHAIN = ["opencode/free-model", "backup/good-model"]


def _two_model_chain(hub: Hub, **patrol_cfg: Any) -> None:
    hub.doc["models"] = {"chain": CHAIN, "default_dispatch_model": "backup/good-model"}
    hub.write_config(patrol={"just_dispatched_seconds": YOUNG, **patrol_cfg})
    code, _, err = hub.cli(
        "backlog", "add", "--id", "K-1", "--title", "keyed task", "--instance", "lan-b",
        "--prompt", "keyed task body",
    )  # fmt: skip
    assert code == 0, err


def test_a_provider_401_moves_the_task_to_the_next_model(hub: Hub) -> None:
    _two_model_chain(hub)
    hub.llm.set_mode("free-model", "401")
    hub.llm.set_mode("good-model", "ok")
    try:
        doc = patrol(hub, "--no-design")
        assert [(a["task"], a["model"]) for a in doc["dispatched"]] == [("K-1", CHAIN[0])]
        wait_judgeable(hub, "K-1")
        doc = patrol(hub, "--no-design")
        [requeued] = doc["tasks_requeued"]
        assert "next model backup/good-model" in requeued["detail"]
        assert [(a["task"], a["model"]) for a in doc["dispatched"]] == [("K-1", CHAIN[1])]
        [row] = pool(hub)
        assert row["avoid_models"] == [CHAIN[0]] and row["attempts"] == 0
        assert row["infra_failures"] == 0 and row["model"] == CHAIN[1]
        wait_judgeable(hub, "K-1")
        doc = patrol(hub, "--no-design")
        assert [a["task"] for a in doc["tasks_finished"]] == ["K-1"]  # no repository
    finally:
        abort_all(hub)


def _let_the_back_off_pass(hub: Hub, task_id: str) -> None:
    """Move the task's not_before into the past, as if the back-off had been waited out."""
    cfg_home = home(hub)

    def mutate(data: BacklogData) -> None:
        task = data.require(task_id)
        assert task.not_before is not None
        past = format_instant(datetime.now(UTC) - timedelta(seconds=1))
        data.replace(dataclasses.replace(task, not_before=past))

    Backlog(cfg_home / "tasks_backlog.json").update(mutate)


def test_401_on_every_model_backs_off_then_parks(hub: Hub) -> None:
    _two_model_chain(hub, max_infra_failures=2)
    hub.llm.set_mode("free-model", "401")
    hub.llm.set_mode("good-model", "401")
    attempts: list[int] = []

    def cycle() -> dict[str, Any]:
        before = len(agent_requests(hub, "keyed task body"))
        doc = patrol(hub, "--no-design")
        attempts.append(len(doc["dispatched"]))
        assert len(agent_requests(hub, "keyed task body")) - before <= 1
        return doc

    try:
        cycle()  # on the first model
        wait_judgeable(hub, "K-1")
        doc = cycle()  # the 401 names the model: the second one gets it at once
        assert [a["model"] for a in doc["dispatched"]] == [CHAIN[1]]
        wait_judgeable(hub, "K-1")
        doc = cycle()  # every model failed: an infrastructure failure, backing off
        assert doc["dispatched"] == []
        [row] = pool(hub)
        assert (row["status"], row["infra_failures"], row["attempts"]) == ("pending", 1, 0)
        wait = parse_instant(row["not_before"])
        assert wait is not None and wait > datetime.now(UTC) + timedelta(minutes=3)
        assert "401" in row["last_error"] or "API key" in row["last_error"]
        doc = cycle()  # inside the back-off: nothing
        assert doc["dispatched"] == []

        _let_the_back_off_pass(hub, "K-1")
        cycle()
        wait_judgeable(hub, "K-1")
        doc = cycle()  # the second infrastructure failure in a row parks it
        [row] = pool(hub)
        assert row["status"] == "pending" and row["parked"]
        assert row["parked"].startswith("2 infrastructure failures in a row; last: ")
        assert "parked: " in doc["tasks_requeued"][0]["detail"]
        doc = cycle()  # parked: never sent again, listed with its reason
        assert doc["dispatched"] == []
        [parked] = doc["waiting"]["parked"]
        assert parked["id"] == "K-1" and parked["why"].startswith("parked: ")
        md = (home(hub) / "patrol" / "report-latest.md").read_text("utf-8")
        assert "parked: 2 infrastructure failures in a row" in md
        assert attempts == [1, 1, 0, 0, 1, 0, 0]
        assert len(agent_requests(hub, "keyed task body")) == 3
    finally:
        abort_all(hub)


# ---------------------------------------------------------------------------------------------
# A person's change while a round fills slots


def _create(m: str, p: str) -> bool:
    return m == "POST" and p.startswith("/session?")


def test_a_task_marked_done_while_the_patrol_fills_slots_is_never_sent(hub: Hub) -> None:
    code, _, err = hub.cli(
        "backlog", "add", "--id", "T-5", "--title", "cancelled task", "--instance", "lan-c",
        "--prompt", "cancelled task body",
    )  # fmt: skip
    assert code == 0, err
    before = {s for _, s in project_sessions(hub)}
    hub.doc["instances"] = [i for i in hub.doc["instances"] if i["name"] == "lan-c"]
    target = hub.server("lan-c").url
    with StepProxy(target, pause=_create) as proxy:
        hub.set_instance("lan-c", url=proxy.url)
        proc = hub.popen("patrol", "--once", *ONLY_FILL)
        try:
            assert proxy.held.wait(90), "the patrol never reached the create"
            code, out, err = hub.cli("backlog", "set", "T-5", "--status", "done")
            assert code == 0 and "now done" in out, err
        finally:
            proxy.release()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        writes = proxy.writes()
    hub.set_instance("lan-c", url=target)

    assert not any(p.split("?")[0].endswith("/prompt_async") for _, p in writes)
    assert not agent_requests(hub, "cancelled task body")
    [row] = pool(hub)
    assert (row["status"], row["session_id"]) == ("done", None)
    doc = json.loads((home(hub) / "patrol" / "report-latest.json").read_text("utf-8"))
    [skipped] = doc["dispatched"]
    assert skipped["result"] == "skipped" and "changed meanwhile (now done)" in skipped["detail"]
    assert "empty session was deleted" in skipped["detail"]
    # The session created for it is gone again.
    code, data = hub.cli_json("sessions", "--instance", "lan-c")
    assert {s["id"] for s in data["sessions"]} <= before
