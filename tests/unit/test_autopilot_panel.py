"""The overview page's Autopilot panel: built from the patrol's files, in plain words."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from xaf_hub import report
from xaf_hub.backlog import Backlog, Task
from xaf_hub.config import Config, parse_config
from xaf_hub.ops import autopilot as overview
from xaf_hub.ops.models import model_state
from xaf_hub.records import Snapshot

NOW = datetime(2026, 11, 30, 9, 30, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    doc = {
        "project": {"name": "demo"},
        "state_dir": str(tmp_path / "state"),
        "instances": [{"name": "a", "url": "http://127.0.0.1:9", "roots": ["/srv/demo"]}],
        "patrol": {"interval_minutes": 20, "max_attempts": 2},
    }
    return parse_config(doc, path=tmp_path / "config.json", env={})


def write_report(cfg: Config, **fields: Any) -> None:
    folder = cfg.state_dir / "patrol"
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "started_at": (NOW - timedelta(minutes=12)).isoformat(),
        "finished_at": (NOW - timedelta(minutes=11)).isoformat(),
        "steps": [{"name": "fix_free_limit", "status": "ok"}, {"name": "fill_slots"}],
        **fields,
    }
    (folder / "report-latest.json").write_text(json.dumps(doc), "utf-8")


def test_before_any_cycle_the_panel_says_so(cfg: Config) -> None:
    view = overview.build(cfg, NOW_MS)
    assert view.state == "never"
    assert view.headline == "The autopilot has not run yet."
    assert view.figures == () and view.next_up == () and view.rests == () and view.problems == ()
    assert view.queue[0] == (0, "waiting to start")
    assert "every 20 minutes" in view.details[-1]


def test_last_round_queue_and_resting_providers(cfg: Config) -> None:
    write_report(
        cfg,
        dispatched=[{}, {}, {}],
        healed=[{}],
        tasks_done=[],
        steps=[{"name": "fill_slots", "status": "failed"}, {"name": "check_agents"}],
    )
    pool = Backlog(cfg.backlog_path)
    for tid, prio, status, attempts in [
        ("T1", "P2", "pending", 0),
        ("T2", "P0", "pending", 0),
        ("T3", "P1", "dispatched", 0),
        ("T4", "P1", "pending", 2),  # attempts used up: stuck, not "next"
        ("T5", "P3", "done", 0),
    ]:
        pool.add(Task(id=tid, title=f"task {tid}", priority=prio, status=status, attempts=attempts))
    model_state(cfg).mark_blackout("opencode", "429 rate limit", "test", NOW)

    view = overview.build(cfg, NOW_MS)
    assert view.state == "active"
    assert view.headline == (
        "The autopilot last looked after the servers 11 minutes ago; "
        "some of it did not work: starting queued work."
    )
    assert view.last_exact  # the exact time, for the hover
    assert view.figures == ((3, "started from the queue"), (1, "fixed after a rate limit"))
    assert dict((w, n) for n, w in view.queue) == {
        "waiting to start": 2,
        "in progress": 1,
        "done": 1,
        "stuck after too many failed tries (a person must look)": 1,
    }
    assert view.next_up == (("P0", "task T2"), ("P2", "task T1"))
    [rest] = view.rests
    assert rest.startswith("Models from “opencode” are not used until ")
    assert "too many requests" in rest


def test_paused_says_by_whom_and_how_to_resume(cfg: Config) -> None:
    write_report(cfg)
    folder = cfg.state_dir / "patrol"
    paused_at = (NOW - timedelta(hours=2)).isoformat()
    (folder / "paused.json").write_text(json.dumps({"paused_at": paused_at, "by": "li"}), "utf-8")
    view = overview.build(cfg, NOW_MS)
    assert view.state == "paused"
    assert view.headline.endswith("everything went as planned.")
    assert view.details[0] == (
        "It was paused 2 hours ago by li: it fixes nothing and starts no work until someone "
        "resumes it (xaf-hub patrol resume)."
    )


def test_damaged_files_become_sentences_not_errors(cfg: Config) -> None:
    folder = cfg.state_dir / "patrol"
    folder.mkdir(parents=True)
    (folder / "report-latest.json").write_text("{not json", "utf-8")
    cfg.backlog_path.write_text('{"tasks": [', "utf-8")
    view = overview.build(cfg, NOW_MS)
    assert view.state == "never"
    assert len(view.problems) == 2
    assert view.problems[0].startswith("The last autopilot report could not be read (")
    assert "report-latest.json" in view.problems[0]
    assert view.problems[1].startswith("The work queue could not be read (")
    assert str(cfg.backlog_path) in view.problems[1]
    assert cfg.backlog_path.read_text("utf-8") == '{"tasks": ['  # nothing "repaired"


def test_page_shows_the_panel_escaped(cfg: Config) -> None:
    write_report(cfg, dispatched=[{}])
    Backlog(cfg.backlog_path).add(Task(id="X1", title="<script>alert(1)</script> 修复登录页"))
    view = overview.build(cfg, NOW_MS)
    snap = Snapshot(generated_at=NOW_MS, instances=(), sessions=())
    html = report.render_html(snap, now_ms=NOW_MS, title="demo", autopilot=view)
    assert 'id="autopilot"' in html
    assert "The autopilot last looked after the servers 11 minutes ago" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; 修复登录页" in html
    assert "<script>alert(1)" not in html
    without = report.render_html(snap, now_ms=NOW_MS, title="demo")
    assert 'id="autopilot"' not in without


def test_a_live_daemon_is_mentioned(cfg: Config) -> None:
    import socket

    folder = cfg.state_dir / "patrol"
    folder.mkdir(parents=True)
    beat = {"pid": os.getpid(), "host": socket.gethostname(), "tick_at": NOW.isoformat()}
    (folder / "daemon.json").write_text(json.dumps(beat), "utf-8")
    assert "It runs in the background on this computer." in overview.build(cfg, NOW_MS).details
    (folder / "daemon.json").write_text(json.dumps({**beat, "stopped_at": "x"}), "utf-8")
    assert "It runs in the background on this computer." not in overview.build(cfg, NOW_MS).details


def test_odd_report_contents_and_tasks_not_ready_yet(cfg: Config) -> None:
    write_report(cfg, steps=None, started_at=None, finished_at="not a time", dispatched="x")
    pool = Backlog(cfg.backlog_path)
    later = (NOW + timedelta(hours=1)).isoformat()
    pool.add(Task(id="B1", title="backing off", priority="P0", not_before=later))
    pool.add(Task(id="D1", title="waits for B1", priority="P0", depends_on=("B1",)))
    pool.add(Task(id="R1", title="ready", priority="P3"))
    view = overview.build(cfg, NOW_MS)
    assert view.headline == (
        "The autopilot last looked after the servers at a time its report does not say; "
        "everything went as planned."
    )
    assert view.figures == ()
    assert view.queue[0] == (3, "waiting to start")
    assert view.next_up == (("P3", "ready"),)


def test_a_report_that_is_not_an_object_is_a_problem_line(cfg: Config) -> None:
    folder = cfg.state_dir / "patrol"
    folder.mkdir(parents=True)
    (folder / "report-latest.json").write_text('{"steps": [1, "x", {"name": 3}]}', "utf-8")
    assert overview.build(cfg, NOW_MS).problems == ()  # odd steps are skipped, not fatal
    (folder / "report-latest.json").write_text("[1, 2]", "utf-8")
    assert overview.build(cfg, NOW_MS).state == "never"
