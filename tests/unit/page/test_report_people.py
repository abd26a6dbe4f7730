"""What the patrol report and the Autopilot panel say about people's decisions and parked tasks."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from xaf_hub.config.load import Config, parse_config
from xaf_hub.notify.record import Action, RoundLog
from xaf_hub.page import autopilot as overview
from xaf_hub.patrol.report import render_markdown, report_document, waiting_tasks
from xaf_hub.store.backlog import Backlog
from xaf_hub.store.tasks import Task

NOW = datetime(2026, 11, 30, 9, 30, tzinfo=UTC)
WHO = "interrupted by alice@box at 2026-11-30 09:20 UTC"
PARKED = "4 infrastructure failures in a row; last: HTTP 401"


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    doc = {
        "project": {"name": "demo"},
        "state_dir": str(tmp_path / "state"),
        "instances": [{"name": "a", "url": "http://127.0.0.1:9", "roots": ["/srv/demo"]}],
    }
    return parse_config(doc, path=tmp_path / "config.json", env={})


def _doc() -> dict[str, object]:
    log = RoundLog(started=NOW, finished=NOW)
    # check_agents and fill_slots both name the session: one line, the one with the task.
    log.actions.append(Action("check_agents", "person", "skipped", "a", "ses_1", detail=WHO))
    log.actions.append(
        Action("fill_slots", "person", "skipped", "a", "ses_1", task="T1", title="t", detail=WHO)
    )
    tasks = [
        Task(id="T1", title="t", status="dispatched", session_id="ses_1", dispatched_to="a"),
        Task(id="T2", title="keyed task", infra_failures=4, parked=PARKED),
        Task(id="T3", title="ready task"),
    ]
    waiting = waiting_tasks(tasks, NOW, 3)
    return report_document(
        log, project="demo", code=0, waiting=waiting, lead_path="", lead_items=()
    )


def test_report_lists_needs_a_person_once_and_parked_tasks_apart() -> None:
    doc = _doc()
    [person] = doc["needs_person"]  # type: ignore[misc]
    assert (person["task"], person["detail"]) == ("T1", WHO)
    waiting = doc["waiting"]
    assert [t["id"] for t in waiting["parked"]] == ["T2"]  # type: ignore[index]
    assert waiting["parked"][0]["why"] == f"parked: {PARKED}"  # type: ignore[index]
    assert [t["id"] for t in waiting["ready"]] == ["T3"]  # type: ignore[index]
    md = render_markdown(doc)
    assert "## Needs a person (the patrol leaves these alone) (1)" in md
    assert WHO in md and f"parked: {PARKED}" in md
    assert "xaf-hub backlog set ID --status pending" in md


def test_autopilot_panel_names_what_is_left_for_a_person(cfg: Config) -> None:
    folder = cfg.state_dir / "patrol"
    folder.mkdir(parents=True)
    report = {
        "started_at": (NOW - timedelta(minutes=2)).isoformat(),
        "finished_at": (NOW - timedelta(minutes=1)).isoformat(),
        "steps": [],
        "needs_person": [
            {"session": "ses_1", "title": "build the export", "detail": WHO, "why": "interrupted"},
            {"session": "ses_2", "title": "an older report", "detail": WHO},  # no code in it
        ],
    }
    (folder / "report-latest.json").write_text(json.dumps(report), "utf-8")
    Backlog(cfg.backlog_path).add(Task(id="T2", title="keyed task", parked=PARKED), now=NOW)
    now_ms = int(NOW.timestamp() * 1000)
    view = overview.build(cfg, now_ms)
    said = overview.plain(view, "en", now_ms)
    assert f"Left for a person: build the export: {WHO}" in said
    assert f"Left for a person: keyed task: parked: {PARKED}" in said
    assert view.queue == ((1, "needs a person", "person"),)
    # Never "everything went as planned" above lines left for a person.
    assert not any("as planned" in line for line in said)
    assert said[0].endswith("1 minute ago: 3 thing(s) are left for a person (below).")
    zh = overview.plain(overview.build(cfg, now_ms, "zh"), "zh", now_ms)
    # The hub's own reason is said by its code, its words (who, when) kept and marked; words
    # with no code are marked as English.
    assert f"留给人处理：build the export：有人停止了它的运行（英文原文：{WHO}）" in zh
    assert f"留给人处理：an older report：{WHO}（英文原文）" in zh
    assert f"留给人处理：keyed task：已搁置：{PARKED}（英文原文）" in zh
    assert "一切按计划完成" not in zh[0] and "有 3 件事留给人处理" in zh[0]


def test_the_report_says_outcomes_and_task_states_in_the_one_vocabulary() -> None:
    """A run that ended on a refused request is its own class; a task finished without a
    repository is listed apart from the done ones; the pool's tasks are counted by state,
    as the page and `backlog list` count them."""
    from xaf_hub.core.outcomes import TASK_STATES
    from xaf_hub.notify.record import SessionLine
    from xaf_hub.store.pick import count_states

    log = RoundLog(started=NOW, finished=NOW)
    log.sessions.append(SessionLine("a", "ses_9", "asks", "denied", "refused", "m", 0))
    log.actions.append(Action("fill_slots", "finished", "ok", "a", "ses_2", task="T2", title="x",
                              detail="not verified: no project.repository to check its work"))
    tasks = [Task(id="T1", title="t", status="dispatched"),
             Task(id="T2", title="x", status="done")]
    doc = report_document(log, project="demo", code=0, waiting=waiting_tasks(tasks, NOW, 3),
                          lead_path="", lead_items=(), tasks=count_states(tasks, NOW, 3))
    assert doc["counts"]["denied"] == 1  # type: ignore[index]
    assert doc["tasks_done"] == [] and len(doc["tasks_finished"]) == 1  # type: ignore[arg-type]
    assert doc["tasks"] == {**dict.fromkeys(TASK_STATES, 0), "in_progress": 1, "unverified": 1}
    md = render_markdown(doc)
    assert "### Denied: the run ended on a refused request (a person decides) (1)" in md
    assert "## Tasks finished, not verified: no project.repository to check them" in md
    assert "## Tasks done" not in md
    assert "1 in progress, 1 finished, not verified" in md


def test_every_reason_code_is_said_in_both_languages() -> None:
    from typing import get_args

    from xaf_hub.core.catalogue import TEXT
    from xaf_hub.notify.record import Why

    codes = [c for c in get_args(Why) if c]
    assert codes and all(f"why.{c}" in TEXT and all(TEXT[f"why.{c}"]) for c in codes)
