"""One vocabulary of outcomes, against real opencode: a run that ended on a denied permission is
``denied`` in `show`, `sessions` and the page (never a green "succeeded"), a person's stop is
``interrupted``, and every count the page shows equals what `backlog list --json` and
`sessions --json` say of the same pool and fleet."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape

from sandbox import fleet as sandbox
from tests.fleet import Hub
from xaf_hub.core.outcomes import run_words
from xaf_hub.page.words import text
from xaf_hub.store.tasks import BacklogData, Task

pytestmark = pytest.mark.e2e

ASK_BASH = [{"permission": "bash", "pattern": "*", "action": "ask"}]
INSTANCE = "local-a"


def start(hub: Hub, title: str, permission: Any = None, model: str = "") -> str:
    """A session of its own rules on INSTANCE, prompted with ``model`` ("": none)."""
    d, url, pw = hub.project_dir("app"), hub.server(INSTANCE).url, hub.password(INSTANCE)
    sid = str(sandbox.create_session(url, pw, str(d), title, permission)["id"])
    if model:
        sandbox.prompt_async(url, pw, sid, "go", model, d)
    return sid


def request_of(hub: Hub, sid: str) -> str | None:
    """The id of the request ``sid``'s run waits on, from `sessions --json`."""
    code, data = hub.cli_json("sessions", "--instance", INSTANCE)
    assert code == 0, data
    return next((s["waiting"]["request_id"] for s in data["sessions"]
                 if s["id"] == sid and s["waiting"]), None)


def _pool(hub: Hub, finished: str, denied: str) -> None:
    """A pool with a task in each state, two of them on the sessions of the fleet."""
    on = {"dispatched_to": INSTANCE, "dispatched_at": "2026-12-01T10:00:00Z"}
    tasks = [
        Task("T-20261201-0001", "waits for a slot"),
        Task("T-20261201-0002", "failed too often", attempts=9),
        Task("T-20261201-0003", "parked by the hub", parked="the provider refused the key"),
        # Its session finished, the patrol has not settled it yet: still in progress.
        Task("T-20261201-0004", "its session finished", status="dispatched",
             session_id=finished, **on),
        Task("T-20261201-0005", "its run was denied", status="dispatched", session_id=denied,
             person="its last run ended on a refused request", **on),
        Task("T-20261201-0006", "done on the agent's word", status="done"),
        Task("T-20261201-0007", "done and verified", status="done", verified=True,
             commit="a" * 40, commits=("a" * 40,)),
        Task("T-20261201-0008", "verified, to land", status="done", verified=True,
             commit="b" * 40, landing="ready"),
        Task("T-20261201-0009", "landed", status="done", verified=True, commit="c" * 40,
             landing="landed", landed="d" * 40),
    ]
    path = Path(hub.env["XAF_HUB_HOME"]) / "tasks_backlog.json"
    path.write_text(json.dumps(BacklogData(tasks=tasks).to_json()), "utf-8")


def _page(hub: Hub) -> str:
    path = hub.root.parent / "outcomes.html"
    code, _, err = hub.cli("sessions", "--html", str(path))
    assert code == 0, err
    return path.read_text("utf-8")


def _results(html: str) -> dict[str, tuple[str, str]]:
    """session id -> (its last result's words, the badge's class) as the page shows them."""
    label = text("en", "col.result")
    rows = {}
    for row in html.split('<tr data-k="')[1:]:
        sid = re.search(r'<span class="session-id">([^<]+)</span>', row)
        badge = re.search(
            rf'data-label="{re.escape(label)}"><span class="badge (\w+)"[^>]*>([^<]+)</span>', row
        )
        assert sid and badge, row
        rows[sid.group(1)] = (badge.group(2), badge.group(1))
    return rows


def test_a_denied_run_is_denied_and_the_page_counts_as_the_command_line(hub: Hub) -> None:
    hub.set_instance(INSTANCE, concurrency_limit=3)
    hub.llm.set_mode("good-model", "tools", text="Done:",
                     calls=[["bash", {"command": "echo hi", "description": "say hi"}]])
    hub.llm.set_mode("slow-model", "slow", delay=120)
    denied = start(hub, "will be denied", ASK_BASH, model="backup/good-model")
    finished = start(hub, "finishes", model="fake/fake-model")
    stopped = start(hub, "stopped by a person", model="fake/slow-model")
    fresh = start(hub, "never prompted")

    request = hub.wait_for(lambda: request_of(hub, denied), timeout=90, step=0.5)
    code, _, err = hub.cli("deny", request)
    assert code == 0, err
    hub.wait_for(lambda: stopped in hub.busy_ids(INSTANCE), timeout=60, step=0.5)
    code, _, err = hub.cli("interrupt", "--session", stopped)
    assert code == 0, err

    def settled() -> bool:  # every prompted run answered and over
        code, doc = hub.cli_json("sessions", "--outcomes", "--instance", INSTANCE)
        said = {s["id"]: (s["running"], s["outcome"]) for s in doc["sessions"]}
        return code == 0 and all(
            not said[sid][0] and said[sid][1] not in ("", "running", "not_started")
            for sid in (denied, finished, stopped)
        )

    hub.wait_for(settled, timeout=60, step=0.5)

    # show: the denied run says so, with what the server said of the refusal.
    code, doc = hub.cli_json("show", denied)
    assert code == 0 and doc["last_outcome"] == "denied", doc
    assert doc["last_error"].startswith("bash: ")
    code, out, _ = hub.cli("show", denied)
    assert code == 0 and "state:     idle; last run: denied (bash: " in out
    code, doc = hub.cli_json("show", stopped)
    assert code == 0 and doc["last_outcome"] == "interrupted", doc

    # sessions: the same values.
    code, listed = hub.cli_json("sessions", "--outcomes", "--instance", INSTANCE)
    assert code == 0, listed
    outcome = {s["id"]: s["outcome"] for s in listed["sessions"]}
    assert outcome == {denied: "denied", finished: "succeeded", stopped: "interrupted",
                       fresh: "not_started"}
    code, out, _ = hub.cli("sessions", "--outcomes", "--instance", INSTANCE)
    row = next(line for line in out.splitlines() if "will be denied" in line)
    assert code == 0 and "denied" in row and "succeeded" not in row

    # The page: each session's result in the same words; only the finished run is green.
    _pool(hub, finished, denied)
    html = _page(hub)
    results = _results(html)
    assert {sid: words for sid, (words, _) in results.items()} == {
        sid: run_words(value) for sid, value in outcome.items()
    }
    assert [sid for sid, (_, css) in results.items() if css == "ok"] == [finished]

    # Every count on the page is what the command line says of the same state.
    code, sessions = hub.cli_json("sessions")
    assert code == 0
    card = {name: int(n) for name, n in re.findall(
        r'id="card-(\w+)">.*?<span class="value">(\d+)</span>', html, re.S)}
    assert card["sessions"] == len(sessions["sessions"]) == 4
    assert card["running"] == sum(s["running"] for s in sessions["sessions"]) == 0
    code, pool = hub.cli_json("backlog", "list", "--json")
    assert code == 0, pool
    queue = {kind: int(n) for kind, n in re.findall(
        r'<li data-kind="(\w+)"><b[^>]*>(\d+)</b>', html)}
    states = Counter(t["state"] for t in pool["tasks"])
    assert queue == states
    assert set(states) == {"waiting", "blocked", "person", "in_progress", "unverified",
                           "verified", "ready_to_land", "landed"}
    # Nothing green a person still has to look at; no "as planned" above lines for a person.
    done = dict(re.findall(r'<li data-state="(\w+)">.*?<span class="badge (\w+)"', html))
    assert done == {"unverified": "warn", "verified": "ok", "ready_to_land": "muted",
                    "landed": "ok"}
    assert str(escape(text("en", "ap.no_repository", n=1))) in html
    assert text("en", "ap.all_ok") not in html
