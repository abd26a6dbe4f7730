"""The overview page's Autopilot panel: built from the patrol's files, in plain words."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.config.load import Config, parse_config
from xaf_hub.core.records import SessionRecord, Snapshot
from xaf_hub.page import autopilot as overview
from xaf_hub.page import export as report
from xaf_hub.page.words import Lang
from xaf_hub.store.backends import Stores
from xaf_hub.store.backlog import Backlog
from xaf_hub.store.tasks import Task

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


def words(view: overview.AutopilotView, lang: Lang = "en") -> list[str]:
    return overview.plain(view, lang, NOW_MS)


def queue(view: overview.AutopilotView) -> dict[str, int]:
    return {kind: n for n, _, kind in view.queue}


def test_before_any_cycle_the_panel_says_so(cfg: Config) -> None:
    view = overview.build(cfg, NOW_MS)
    assert view.state == "never"
    assert words(view) == ["The autopilot has never run."]
    assert view.figures == () and view.next_up == () and view.rests == () and view.problems == ()
    assert view.queue[0] == (0, "waiting to start", "waiting")
    zh = overview.build(cfg, NOW_MS, "zh")
    assert words(zh, "zh") == ["自动巡检还从未运行过。"]
    assert zh.queue[0] == (0, "等待开始", "waiting")


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
    Stores(cfg).model_state().mark_blackout("opencode", "429 rate limit", "test", NOW)

    view = overview.build(cfg, NOW_MS)
    assert view.state == "off"  # a report, but no daemon: it ran once, it is not "on"
    assert words(view)[0] == (
        "The autopilot is not running in the background. It last looked after the servers "
        "11 minutes ago: some of it did not work: starting queued work."
    )
    assert view.headline.ms == int((NOW - timedelta(minutes=11)).timestamp() * 1000)
    assert view.figures == ((3, "started from the queue"), (1, "fixed after a rate limit"))
    assert dict((w, n) for n, w, _ in view.queue) == {
        "waiting to start": 2,
        "in progress": 1,
        "blocked after too many failed tries": 1,
        "finished, not verified": 1,  # no project.repository: never called done
    }
    assert any("without project.repository" in line for line in words(view))
    assert view.next_up == (("P0", "task T2"), ("P2", "task T1"))
    rest = words(view)[-1]
    assert rest.startswith("Models from “opencode” are not used until ")
    assert "too many requests" in rest
    zh = words(overview.build(cfg, NOW_MS, "zh"), "zh")
    assert zh[0] == (
        "自动巡检没有在后台运行。它上次检查服务器是在11 分钟前：有些步骤没有成功：开始排队的工作。"
    )
    assert zh[-1].startswith("“opencode” 的模型在 ")


def test_resting_panel_says_why_each_rest_ends_when_it_does(cfg: Config) -> None:
    state = Stores(cfg).model_state()
    end = int((NOW + timedelta(minutes=5)).timestamp() * 1000)
    state.mark_rest("fake/a", scope="model", until_ms=end, why="stated", reason="429",
                    source="t", now=NOW)
    state.mark_rest("fake/b", scope="model", until_ms=end + 1000, why="person", reason="",
                    source="t", now=NOW)
    state.mark_blackout("opencode", "429 rate limit", "test", NOW)
    rests = [line.text for line in overview.build(cfg, NOW_MS).rests]
    assert len(rests) == 3  # soonest end first
    assert rests[0].startswith("“fake/a” is not used until ") and "said when" in rests[0]
    assert rests[1].startswith("“fake/b” is not used until ") and "a person" in rests[1]
    assert rests[2].startswith("Models from “opencode”")


def test_paused_says_by_whom_and_how_to_resume(cfg: Config) -> None:
    write_report(cfg)
    folder = cfg.state_dir / "patrol"
    paused_at = (NOW - timedelta(hours=2)).isoformat()
    (folder / "paused.json").write_text(json.dumps({"paused_at": paused_at, "by": "li"}), "utf-8")
    view = overview.build(cfg, NOW_MS)
    assert view.state == "paused"
    assert words(view)[0].endswith("everything went as planned.")
    assert words(view)[1] == (
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
    # The time of the last round is a live <time> the page's script keeps current.
    live = f'<time class="ago" data-ms="{view.headline.ms}"'
    assert f"It last looked after the servers {live}" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; 修复登录页" in html
    assert "<script>alert(1)" not in html
    without = report.render_html(snap, now_ms=NOW_MS, title="demo")
    assert 'id="autopilot"' not in without


def beat_at(when: datetime, **extra: Any) -> dict[str, Any]:
    import socket

    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": (when - timedelta(hours=5)).isoformat(),
        "tick_at": when.isoformat(),
        "interval_seconds": 1200.0,
        "stopped_at": "",
        **extra,
    }


def test_on_only_while_the_daemon_heartbeat_is_fresh(cfg: Config) -> None:
    write_report(cfg)
    folder = cfg.state_dir / "patrol"
    daemon = folder / "daemon.json"
    daemon.write_text(json.dumps(beat_at(NOW - timedelta(minutes=11))), "utf-8")
    view = overview.build(cfg, NOW_MS)
    assert view.state == "on"
    assert words(view)[0] == (
        "The autopilot is on: it looks after the servers every 20 minutes. Last round "
        "11 minutes ago: everything went as planned."
    )
    # Stopped, silent for too long, or its process gone: off.
    for beat in (
        beat_at(NOW, stopped_at=NOW.isoformat()),
        beat_at(NOW - timedelta(hours=2)),
        beat_at(NOW, pid=2**22 + 12345),
    ):
        daemon.write_text(json.dumps(beat), "utf-8")
        assert overview.build(cfg, NOW_MS).state == "off", beat
    # Another host's daemon cannot be asked about its process: its heartbeat's age decides.
    daemon.write_text(json.dumps(beat_at(NOW, host="elsewhere", pid=1)), "utf-8")
    assert overview.build(cfg, NOW_MS).state == "on"
    assert overview.heartbeat_fresh(None, NOW_MS) is False
    assert overview.heartbeat_fresh({"tick_at": NOW.isoformat()}, NOW_MS) is False


def test_the_queue_counts_the_pools_states_never_a_sessions_word(cfg: Config) -> None:
    """A dispatched task whose session finished is still in progress until the patrol settles
    it (the page once called it done while `backlog list` said dispatched); a task left to a
    person, or finished without a repository, is counted as such, never as done."""
    write_report(cfg)
    pool = Backlog(cfg.backlog_path)
    states = {"T1": "succeeded", "T2": "running", "T3": "failed", "T4": "not_started"}
    for tid in [*states, "T5"]:
        pool.add(Task(id=tid, title=f"task {tid}"))
        pool.mark_dispatched(tid, f"ses_{tid}", "a", None, NOW)
    sessions = Snapshot(NOW_MS, (), tuple(
        SessionRecord(
            "a", f"ses_{tid}", f"{tid} task", "/srv/demo", outcome=outcome,
            running=outcome == "running", run_state="busy" if outcome == "running" else "idle",
            project=True,
        )
        for tid, outcome in states.items()
    ))
    before = queue(overview.build(cfg, NOW_MS))
    assert before == {"in_progress": 5}
    assert queue(overview.build(cfg, NOW_MS, "en", sessions)) == before
    t5 = pool.load().require("T5")
    pool.note_check(t5, person="not verified: no claim")
    pool.mark_done("T1", NOW)  # no repository: the agent's word
    assert queue(overview.build(cfg, NOW_MS, "en", sessions)) == {
        "in_progress": 3, "person": 1, "unverified": 1,
    }
    assert overview.task_ids_by_session(cfg) == {f"ses_{t}": t for t in [*states, "T5"]}


def test_odd_report_contents_and_tasks_not_ready_yet(cfg: Config) -> None:
    write_report(cfg, steps=None, started_at=None, finished_at="not a time", dispatched="x")
    pool = Backlog(cfg.backlog_path)
    later = (NOW + timedelta(hours=1)).isoformat()
    pool.add(Task(id="B1", title="backing off", priority="P0", not_before=later))
    pool.add(Task(id="D1", title="waits for B1", priority="P0", depends_on=("B1",)))
    pool.add(Task(id="R1", title="ready", priority="P3"))
    view = overview.build(cfg, NOW_MS)
    assert words(view)[0] == (
        "The autopilot is not running in the background. It last looked after the servers "
        "at a time its report does not say: everything went as planned."
    )
    assert view.figures == ()
    assert view.queue[0] == (3, "waiting to start", "waiting")
    assert view.next_up == (("P3", "ready"),)


def test_a_report_that_is_not_an_object_is_a_problem_line(cfg: Config) -> None:
    folder = cfg.state_dir / "patrol"
    folder.mkdir(parents=True)
    (folder / "report-latest.json").write_text('{"steps": [1, "x", {"name": 3}]}', "utf-8")
    assert overview.build(cfg, NOW_MS).problems == ()  # odd steps are skipped, not fatal
    (folder / "report-latest.json").write_text("[1, 2]", "utf-8")
    assert overview.build(cfg, NOW_MS).state == "never"


def test_done_tasks_link_verified_commits_and_say_not_verified(tmp_path: Path) -> None:
    doc = {
        "project": {
            "name": "demo",
            "repository": "https://git.example/shop.git",
            "commit_url": "https://git.example/shop/commit/{commit}?from=hub&x=<b>",
        },
        "state_dir": str(tmp_path / "state"),
        "instances": [{"name": "a", "url": "http://127.0.0.1:9", "roots": ["/srv/demo"]}],
    }
    cfg = parse_config(doc, path=tmp_path / "config.json", env={})
    write_report(cfg)
    full = "0123456789abcdef0123456789abcdef01234567"
    pool = Backlog(cfg.backlog_path)
    for task in (
        Task(id="V", title="verified <b>one</b>", status="done", done_at="2026-11-30T09:00:00Z",
             commit=full, verified=True, judged="new work: 1 commit; check: passed"),
        Task(id="N", title="on its word", status="done", done_at="2026-11-30T09:10:00Z"),
        Task(id="P", title="still pending"),
    ):
        pool.add(task)
    view = overview.build(cfg, NOW_MS)
    assert view.done == (
        overview.DoneTask("on its word", state="unverified"),
        overview.DoneTask(
            "verified <b>one</b>",
            "0123456",
            f"https://git.example/shop/commit/{full}?from=hub&x=<b>",
            True,
            "new work: 1 commit; check: passed",
            "verified",
        ),
    )
    snap = Snapshot(generated_at=NOW_MS, instances=(), sessions=())
    html = report.render_html(snap, now_ms=NOW_MS, title="demo", autopilot=view)
    link = f'<a href="https://git.example/shop/commit/{full}?from=hub&amp;x=&lt;b&gt;"'
    assert link in html and "verified &lt;b&gt;one&lt;/b&gt;" in html
    assert '<span class="muted judged">new work: 1 commit; check: passed</span>' in html
    done = html.split('id="done"')[1].split("</ul>")[0]
    # Green only for the verified one; the agent's word is a person's to look at.
    assert '<span class="badge ok" data-verified="true"' in done
    assert '<span class="badge warn" data-verified="false"' in done
    assert ">finished, not verified</span>" in done and ">done and verified</span>" in done
    assert "still pending" not in html.split('id="done"')[1].split("</ul>")[0]


@pytest.fixture
def ha_cfg(redis_server: Any, tmp_path: Path) -> Config:
    from tests.redis_fixture import RedisServer

    doc = {
        "project": {"name": "demo"},
        "state_dir": str(tmp_path / "state"),
        "instances": [{"name": "a", "url": "http://127.0.0.1:9", "roots": ["/srv/demo"]}],
        "lock": {
            "backend": "redis",
            "redis_url": redis_server.url,
            "redis_prefix": RedisServer.prefix(),
        },
        "patrol": {"lease_seconds": 30},
    }
    return parse_config(doc, path=tmp_path / "config.json", env=redis_server.env())


def test_the_panel_names_the_host_holding_the_ha_lease(ha_cfg: Config) -> None:
    from xaf_hub.store.redis.client import connect
    from xaf_hub.store.redis.lease import PatrolLease

    prefix = ha_cfg.lock.redis_prefix
    # Nobody holds the lease yet: the panel says nothing is looked after.
    view = overview.build(ha_cfg, NOW_MS)
    assert view.active_host == ""
    assert "No patrol daemon holds the lease now" in words(view)[1]
    held = PatrolLease(connect(ha_cfg.lock), prefix, "host-<b>", 30)
    standby = PatrolLease(connect(ha_cfg.lock), prefix, "host-c", 30)
    try:
        assert held.acquire() and not standby.acquire()
        now = datetime.now(UTC)
        held.beat("active", now)
        standby.beat("standby", now)
        view = overview.build(ha_cfg, int(now.timestamp() * 1000))
        assert view.active_host == "host-<b>"
        assert words(view)[1] == (
            "The patrol runs on host host-<b>; 1 other daemon(s) stand by to take over."
        )
        zh = overview.build(ha_cfg, int(now.timestamp() * 1000), "zh")
        assert words(zh, "zh")[1] == "巡检正在主机 host-<b> 上运行；另有 1 个守护进程待命接管。"
        snap = Snapshot(generated_at=NOW_MS, instances=(), sessions=())
        html = report.render_html(snap, now_ms=NOW_MS, title="demo", autopilot=view)
        assert 'id="active-host" data-host="host-&lt;b&gt;"' in html
        assert "The patrol runs on host host-&lt;b&gt;;" in html
    finally:
        held.release()


def test_no_lease_no_ha_line_and_redis_down_is_a_problem_line(
    cfg: Config, ha_cfg: Config
) -> None:
    view = overview.build(cfg, NOW_MS)  # file gate: one host, no lease, nothing said
    assert view.ha is None and view.active_host == ""
    snap = Snapshot(generated_at=NOW_MS, instances=(), sessions=())
    assert 'id="active-host"' not in report.render_html(
        snap, now_ms=NOW_MS, title="demo", autopilot=view
    )
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lock = replace(ha_cfg.lock, redis_url=f"redis://127.0.0.1:{port}/0")
    view = overview.build(replace(ha_cfg, lock=lock), NOW_MS)
    assert view.ha is None
    assert any(
        p.startswith("Which host runs the patrol could not be read (") and f":{port}/0" in p
        for p in view.problems
    ), view.problems
    secret = ha_cfg.lock.redis_password
    assert secret and not any(secret in p for p in view.problems)
