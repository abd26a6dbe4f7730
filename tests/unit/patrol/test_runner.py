"""The patrol runner and report without servers: step isolation, exit codes, pause, the cycle
lock, report files, design sync I/O, the `patrol` and `backlog` commands, lazy imports."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.unit.patrol.runner_support import NOW, make_cfg, pctx_for
from xaf_hub.cli.main import main
from xaf_hub.errors import ExitCode, StateFileError, UnreachableError
from xaf_hub.notify.record import Action, RoundLog, SessionLine, StepOutcome
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.context import CYCLE_LOCK, Cycle
from xaf_hub.patrol.jobs.sync_design import design_markers, sync_design_tasks
from xaf_hub.patrol.report import (
    lead_backlog_items,
    prune,
    render_markdown,
    report_document,
    waiting_tasks,
)
from xaf_hub.patrol.runner import STEP_NAMES, first_run, run_cycle, run_once
from xaf_hub.store.backlog import Backlog
from xaf_hub.store.patrol_state import clear_paused, pause_info, set_paused
from xaf_hub.store.statefile import file_lock
from xaf_hub.store.tasks import Task

REPO = Path(__file__).resolve().parents[3]


def job(name: str, calls: list[str], exc: BaseException | None = None) -> Any:
    async def run(pctx: OpsContext, cycle: Cycle) -> None:
        calls.append(name)
        if exc is not None:
            raise exc

    return run


# --------------------------------------------------------------------------- run_cycle


def test_a_failing_step_does_not_stop_the_others(tmp_path: Path) -> None:
    calls: list[str] = []
    lines: list[str] = []
    steps = (
        ("run_ceiling", job("run_ceiling", calls)),
        ("fix_free_limit", job("fix_free_limit", calls, UnreachableError("fleet", "down"))),
        ("check_agents", job("check_agents", calls, RuntimeError("bug"))),
        ("sync_design_tasks", job("sync_design_tasks", calls)),
        ("fill_slots", job("fill_slots", calls)),
    )
    cycle = __import__("asyncio").run(run_cycle(pctx_for(make_cfg(tmp_path), lines), (), steps))
    assert calls == list(STEP_NAMES)
    assert [(s.name, s.status, s.code) for s in cycle.log.steps] == [
        ("run_ceiling", "ok", 0),
        ("fix_free_limit", "failed", 2),
        ("check_agents", "failed", 1),
        ("sync_design_tasks", "ok", 0),
        ("fill_slots", "ok", 0),
    ]
    assert "RuntimeError: bug" in cycle.log.steps[2].error
    assert any("check_agents: failed (exit 1)" in ln for ln in lines)


def test_skipped_and_stopped_steps(tmp_path: Path) -> None:
    calls: list[str] = []
    steps = tuple((n, job(n, calls)) for n in STEP_NAMES)
    pctx = pctx_for(make_cfg(tmp_path))
    stop = {"now": False}

    async def stopper(p: OpsContext, c: Cycle) -> None:
        calls.append("check_agents")
        stop["now"] = True

    steps = (steps[0], steps[1], ("check_agents", stopper), steps[3], steps[4])
    pctx = OpsContext(pctx.cfg, clock=lambda: NOW, stop_requested=lambda: stop["now"])
    cycle = __import__("asyncio").run(run_cycle(pctx, ["fix_free_limit"], steps))
    assert calls == ["run_ceiling", "check_agents"]
    assert [s.status for s in cycle.log.steps] == ["ok", "skipped", "ok", "not run", "not run"]


@pytest.mark.parametrize(
    ("now", "interval", "offset", "expected"),
    [
        (datetime(2026, 1, 1, 10, 30), 60, 7, datetime(2026, 1, 1, 11, 7)),
        (datetime(2026, 1, 1, 10, 3), 60, 7, datetime(2026, 1, 1, 10, 7)),
        (datetime(2026, 1, 1, 10, 7), 60, 7, datetime(2026, 1, 1, 11, 7)),
        (datetime(2026, 1, 1, 10, 30), 15, 7, datetime(2026, 1, 1, 10, 37)),
        (datetime(2026, 1, 1, 10, 3), 15, 7, datetime(2026, 1, 1, 10, 7)),
        (datetime(2026, 1, 1, 10, 58), 15, 0, datetime(2026, 1, 1, 11, 0)),
        (datetime(2026, 1, 1, 23, 50), 120, 5, datetime(2026, 1, 2, 1, 5)),
    ],
)
def test_first_run_is_on_the_offset_grid(
    now: datetime, interval: int, offset: int, expected: datetime
) -> None:
    assert first_run(now, timedelta(minutes=interval), offset) == expected


# --------------------------------------------------------------------------- run_once


def test_run_once_writes_the_report_and_respects_pause_and_lock(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    pctx = pctx_for(cfg)
    calls: list[str] = []
    steps = tuple((n, job(n, calls)) for n in STEP_NAMES)
    folder = cfg.state_dir / "patrol"

    assert set_paused(folder, "alice", NOW) and not set_paused(folder, "bob", NOW)
    assert pause_info(folder) == {"schema_version": 1, "paused_at": NOW.isoformat(), "by": "alice"}
    result = run_once(pctx, (), steps)
    assert (result.status, result.code, calls) == ("paused", 0, [])
    assert "paused" in result.message and "alice" in result.message
    assert clear_paused(folder) and not clear_paused(folder)

    with file_lock(folder / CYCLE_LOCK, 1):
        result = run_once(pctx, (), steps)
    assert (result.status, result.code, calls) == ("locked", int(ExitCode.BUSY), [])

    result = run_once(pctx, (), steps)
    assert (result.status, result.code) == ("ran", 0) and calls == list(STEP_NAMES)
    latest = json.loads((folder / "report-latest.json").read_text("utf-8"))
    assert latest["result"] == "ok" and [s["name"] for s in latest["steps"]] == list(STEP_NAMES)
    stamped = sorted(folder.glob("report-2*"))
    assert [p.name for p in stamped] == [
        "report-20261130-120000-000.json",
        "report-20261130-120000-000.md",
    ]
    assert (folder / "report-latest.md").read_text("utf-8").startswith("# Patrol report")


def test_a_damaged_pause_flag_still_pauses(tmp_path: Path) -> None:
    folder = tmp_path / "patrol"
    folder.mkdir()
    (folder / "paused.json").write_text("{not json", "utf-8")
    info = pause_info(folder)
    assert info is not None and "invalid JSON" in info["note"]


def test_report_failure_makes_the_cycle_fail(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    cfg.state_dir.mkdir(parents=True)
    (cfg.state_dir / "patrol").mkdir()
    (cfg.state_dir / "patrol" / "report-latest.json").mkdir()  # a folder where a file goes
    steps = tuple((n, job(n, [])) for n in STEP_NAMES)
    result = run_once(pctx_for(cfg), (), steps)
    assert result.code == int(ExitCode.INTERNAL) and result.cycle is not None
    assert any("report not written" in e for e in result.cycle.log.errors)


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    tmp_path = tmp_path / "patrol"
    tmp_path.mkdir()
    for i in range(5):
        for ext in ("json", "md"):
            (tmp_path / f"report-2026113{i}-000000-000.{ext}").write_text("{}")
    (tmp_path / "report-latest.json").write_text("{}")
    prune(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report-20261133-000000-000.json",
        "report-20261133-000000-000.md",
        "report-20261134-000000-000.json",
        "report-20261134-000000-000.md",
        "report-latest.json",
    ]


# --------------------------------------------------------------------------- report


@pytest.mark.parametrize(
    ("text", "items"),
    [
        (
            "# Decisions\n- [ ] pick a DB\n- [x] done already\n* merge feature/u3?\n1. budget\n",
            ["pick a DB", "merge feature/u3?", "budget"],
        ),
        ("plain prose\n\n| a | b |\n", []),
        ("-   spaced item  \n-\n", ["spaced item"]),
    ],
)
def test_lead_backlog_items(text: str, items: list[str]) -> None:
    assert lead_backlog_items(text) == items


def test_waiting_tasks_split_ready_not_ready_and_blocked() -> None:
    later = (NOW + timedelta(hours=1)).isoformat()
    tasks = [
        Task(id="a", title="a", priority="P3"),
        Task(id="b", title="b", priority="P0"),
        Task(id="c", title="c", not_before=later),
        Task(id="d", title="d", attempts=3, last_error="boom"),
        Task(id="e", title="e", status="done"),
    ]
    out = waiting_tasks(tasks, NOW, 3)
    assert [t["id"] for t in out["ready"]] == ["b", "a"]
    assert [t["id"] for t in out["not_ready"]] == ["c"]
    assert "backing off" in out["not_ready"][0]["why"]
    assert [(t["id"], t["last_error"]) for t in out["blocked"]] == [("d", "boom")]


def test_markdown_lists_every_section_and_escapes_cells() -> None:
    log = RoundLog(started=NOW, finished=NOW)
    log.steps = [
        StepOutcome("fix_free_limit", "ok", seconds=0.5),
        StepOutcome("check_agents", "failed", 2, "fleet: unreachable"),
    ]
    log.sessions = [
        SessionLine(
            "lan-a", "ses_1", "a | b", "failed", "APIError: HTTP 429", "opencode/free-model", 0
        )
    ]
    log.actions = [
        Action(
            "fix_free_limit",
            "heal",
            "ok",
            "lan-a",
            "ses_1",
            title="t",
            model="backup/good-model",
            from_model="opencode/free-model",
        ),
        Action("fill_slots", "dispatch", "ok", "lan-a", "ses_2", task="F-8"),
    ]
    waiting = waiting_tasks([Task(id="x", title="x", attempts=5)], NOW, 3)
    doc = report_document(
        log,
        project="demo",
        code=2,
        waiting=waiting,
        lead_path="/r/lead_backlog.md",
        lead_items=["decide"],
    )
    md = render_markdown(doc)
    for heading in (
        "## Steps",
        "### Failed (1)",
        "## Healed (fix_free_limit) (1)",
        "## Dispatched (fill_slots) (1)",
        "### Blocked: attempts used up (1)",
        "### For a human (/r/lead_backlog.md)",
        "- decide",
    ):
        assert heading in md
    assert "a \\| b" in md and "opencode/free-model → backup/good-model" in md
    assert "**failed (exit 2)**" in md
    assert doc["counts"]["failed"] == 1 and doc["healed"][0]["model"] == "backup/good-model"


# --------------------------------------------------------------------------- sync_design I/O

ROWS = "| 批次 | 状态 |\n|---|---|\n| F-8 清理 | ⏳ 待派发 |\n| F-9 done | 已完成 |\n"


def test_sync_design_adds_once_and_never_creates_an_empty_pool(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, patrol={"design_dirs": ["plans"]})
    pctx = pctx_for(cfg)
    pool = cfg.backlog_path
    run = __import__("asyncio").run
    cycle = Cycle(RoundLog(started=NOW))
    run(sync_design_tasks(pctx, cycle))
    assert not pool.exists() and cycle.log.actions == []

    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "p.md").write_text(ROWS, "utf-8")
    # Design docs older than design_max_age_days are ignored.
    old = NOW.timestamp() - 40 * 86400
    os.utime(tmp_path / "plans" / "p.md", (old, old))
    run(sync_design_tasks(pctx, cycle))
    assert not pool.exists()

    os.utime(tmp_path / "plans" / "p.md", (NOW.timestamp(), NOW.timestamp()))
    run(sync_design_tasks(pctx, cycle))
    assert [(a.kind, a.task) for a in cycle.log.actions] == [("add", "F-8")]
    assert [(t.id, t.status, t.spec) for t in Backlog(pool).load().tasks] == [
        ("F-8", "pending", "plans/p.md")
    ]
    stamp = pool.stat().st_mtime_ns
    run(sync_design_tasks(pctx, cycle))
    assert pool.stat().st_mtime_ns == stamp and len(cycle.log.actions) == 1
    audit = [json.loads(ln) for ln in (cfg.state_dir / "audit.log").read_text().splitlines()]
    assert [(e["command"], e["tasks"]) for e in audit] == [("patrol.sync_design", ["F-8"])]


def test_sync_design_reports_a_corrupt_pool(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, patrol={"design_dirs": ["plans"]})
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "p.md").write_text(ROWS, "utf-8")
    os.utime(tmp_path / "plans" / "p.md", (NOW.timestamp(), NOW.timestamp()))
    cfg.backlog_path.parent.mkdir(parents=True, exist_ok=True)
    cfg.backlog_path.write_text('{"tasks": [', "utf-8")
    with pytest.raises(StateFileError, match="line 1"):
        __import__("asyncio").run(sync_design_tasks(pctx_for(cfg), Cycle(RoundLog(started=NOW))))
    assert cfg.backlog_path.read_text("utf-8") == '{"tasks": ['


def test_design_markers_keep_the_chinese_ones() -> None:
    assert design_markers(["ready to ship"])[:4] == ("待派发", "未派发", "⏳", "ready to ship")
    assert "pending dispatch" in design_markers([])


# --------------------------------------------------------------------------- commands


def cli(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(
        ["--config", str(tmp_path / "config.json"), *args],
        stdout=out,
        stderr=err,
        env={"XAF_HUB_HOME": str(tmp_path / "home")},
        cwd=tmp_path,
    )
    return code, out.getvalue(), err.getvalue()


def test_patrol_pause_resume_status(tmp_path: Path) -> None:
    make_cfg(tmp_path)
    code, out, _ = cli(tmp_path, "patrol", "status")
    assert code == 0 and "patrol: active" in out and "last cycle: none yet" in out
    assert cli(tmp_path, "patrol", "pause")[1].startswith("patrol paused")
    assert "already paused" in cli(tmp_path, "patrol", "pause")[1]
    code, out, _ = cli(tmp_path, "patrol", "--once")
    assert code == 0 and "patrol is paused" in out
    code, out, _ = cli(tmp_path, "patrol", "status", "--json")
    doc = json.loads(out)
    assert doc["state"] == "paused" and doc["last_cycle"] is None and doc["daemon"] is None
    assert cli(tmp_path, "patrol", "resume")[1].startswith("patrol resumed")
    assert "patrol: active" in cli(tmp_path, "patrol", "status")[1]
    audit = (tmp_path / "home" / "audit.log").read_text("utf-8")
    assert '"patrol.pause"' in audit and '"patrol.resume"' in audit


def test_patrol_once_against_an_unreachable_fleet_exits_2_and_reports(tmp_path: Path) -> None:
    make_cfg(tmp_path, timeouts={"connect_seconds": 0.5, "read_seconds": 1}, retries=0)
    code, out, err = cli(tmp_path, "patrol", "--once", "--no-design")
    assert code == 2, err
    assert "fix_free_limit: failed (exit 2)" in err and "fill_slots: failed (exit 2)" in err
    doc = json.loads((tmp_path / "home" / "patrol" / "report-latest.json").read_text())
    assert [s["status"] for s in doc["steps"]] == ["ok", "failed", "failed", "skipped", "failed"]
    code, out, _ = cli(tmp_path, "patrol", "status")
    assert "failed" in out and "exit 2" in out
    code, out, _ = cli(tmp_path, "patrol", "--once", "--json", "--no-freelimit", "--no-check",
                       "--no-fill")
    doc = json.loads(out)
    assert (code, doc["status"], doc["exit_code"]) == (0, "ran", 0)
    assert doc["report"]["result"] == "ok" and doc["report"]["waiting"]["ready"] == []


@pytest.mark.parametrize(
    "args",
    [
        ("patrol", "pause", "--once"),
        ("patrol", "--once", "--interval-seconds", "1"),
        ("patrol", "--interval-seconds", "0"),
        ("patrol", "--json"),
        ("patrol", "bogus"),
    ],
)
def test_patrol_usage_errors(tmp_path: Path, args: tuple[str, ...]) -> None:
    make_cfg(tmp_path)
    assert cli(tmp_path, *args)[0] == 4


def test_backlog_add_list_show_set(tmp_path: Path) -> None:
    make_cfg(tmp_path, patrol={"max_attempts": 2})
    code, out, err = cli(
        tmp_path,
        "backlog",
        "add",
        "--title",
        "清理旧 CF 值",
        "--priority",
        "P1",
        "--instance",
        "lan-a",
        "--json",
    )
    assert code == 0, err
    tid = json.loads(out)["id"]
    assert cli(tmp_path, "backlog", "add", "--title", "x", "--instance", "nope")[0] == 4
    assert cli(tmp_path, "backlog", "add", "--title", "dup", "--id", tid)[0] == 4
    code, out, _ = cli(tmp_path, "backlog", "list")
    assert code == 0 and tid in out and "ready" in out
    code, out, _ = cli(tmp_path, "backlog", "show", tid)
    assert "清理旧 CF 值" in out and "state:" in out
    assert cli(tmp_path, "backlog", "show", "nope")[0] == 4

    assert cli(tmp_path, "backlog", "set", tid, "--status", "dispatched")[0] == 4
    code, out, _ = cli(
        tmp_path,
        "backlog",
        "set",
        tid,
        "--status",
        "dispatched",
        "--session",
        "ses_1",
        "--to",
        "lan-a",
        "--json",
    )
    task = json.loads(out)
    assert (task["status"], task["session_id"], task["dispatched_to"]) == (
        "dispatched",
        "ses_1",
        "lan-a",
    )

    pool = Backlog(tmp_path / "home" / "tasks_backlog.json")
    pool.requeue(tid, reason="boom", infrastructure=False, now=NOW)
    pool.requeue(tid, reason="boom", infrastructure=False, now=NOW)
    code, out, _ = cli(tmp_path, "backlog", "list", "--json")
    listed = json.loads(out)["tasks"][0]
    assert (listed["state"], listed["state_detail"]) == ("blocked", "2 of 2 attempts used")
    code, out, _ = cli(tmp_path, "backlog", "set", tid, "--status", "pending", "--reset", "--json")
    task = json.loads(out)
    assert (task["attempts"], task["not_before"], task["last_error"]) == (0, None, None)
    code, out, _ = cli(tmp_path, "backlog", "set", tid, "--status", "done", "--json")
    assert json.loads(out)["done_at"]
    # A person's word: the hub did not look, so it is not called done and verified.
    code, out, _ = cli(tmp_path, "backlog", "show", tid, "--json")
    assert json.loads(out)["state"] == "unverified"
    audit = [json.loads(ln) for ln in (tmp_path / "home" / "audit.log").read_text().splitlines()]
    assert [e["command"] for e in audit] == [
        "backlog.add",
        "backlog.set",
        "backlog.set",
        "backlog.set",
    ]


def test_patrol_help_and_status_do_not_import_apscheduler(tmp_path: Path) -> None:
    make_cfg(tmp_path)
    probe = (
        "import sys, io, json\n"
        "from xaf_hub.cli.main import main\n"
        "code = main(sys.argv[1:], stdout=io.StringIO(), stderr=io.StringIO())\n"
        "heavy = [m for m in ('apscheduler', 'jinja2', 'sklearn') if m in sys.modules]\n"
        "print(json.dumps([code, heavy]))\n"
    )
    env = {**os.environ, "XAF_HUB_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    for args in (
        ["patrol", "--help"],
        ["--config", str(tmp_path / "config.json"), "patrol", "status"],
        ["backlog", "--help"],
    ):
        out = subprocess.run(
            [sys.executable, "-c", probe, *args],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            cwd=tmp_path,
        ).stdout
        code, heavy = json.loads(out.strip().splitlines()[-1])
        assert code == 0 and heavy == [], (args, heavy)


def test_backlog_show_says_which_rule_decided_and_the_checks_output(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    Backlog(cfg.backlog_path).add(
        Task(
            id="T1",
            title="add the export",
            status="dispatched",
            base="b" * 40,
            judged="check: failed",
            check="failed",
            check_commit="c" * 40,
            check_output="collected 3 items\nFAILED test_export - KeyError\n1 failed",
            check_retries=1,
        )
    )
    code, out, _ = cli(tmp_path, "backlog", "show", "T1")
    assert code == 0
    assert "judged:        check: failed" in out and f"base:          {'b' * 40}" in out
    assert out.endswith(
        "check output (its end):\n  | collected 3 items\n  | FAILED test_export - KeyError\n"
        "  | 1 failed\n"
    ), out
    code, out, _ = cli(tmp_path, "backlog", "show", "T1", "--json")
    shown = json.loads(out)
    assert (shown["judged"], shown["check"], shown["check_retries"]) == (
        "check: failed",
        "failed",
        1,
    )


@pytest.mark.skipif(sys.platform == "win32", reason="signal.pthread_kill is POSIX")
def test_the_daemon_stops_on_a_signal_another_thread_took(tmp_path: Path) -> None:
    """A process-wide SIGINT may land in any thread (a worker thread starting as it arrives
    takes it); Python then runs the handler in the main thread only once that thread runs
    again. The daemon stops all the same, not at its next round an hour later."""
    make_cfg(tmp_path, timeouts={"connect_seconds": 0.5, "read_seconds": 1}, retries=0)
    beat = tmp_path / "home" / "patrol" / "daemon.json"
    script = (
        "import json, runpy, signal, sys, threading, time\n"
        "def take_it():\n"
        "    while True:\n"
        "        try:\n"
        f"            if json.loads(open({str(beat)!r}).read())['ticks'] >= 1: break\n"
        "        except (OSError, ValueError, KeyError): pass\n"
        "        time.sleep(0.05)\n"
        "    signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # lands in this thread\n"
        "threading.Thread(target=take_it, daemon=True).start()\n"
        f"sys.argv = ['xaf_hub', '--config', {str(tmp_path / 'config.json')!r}, 'patrol',\n"
        "            '--interval-seconds', '3600', '--no-design']\n"
        "runpy.run_module('xaf_hub', run_name='__main__')\n"
    )
    env = {**os.environ, "XAF_HUB_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=90)  # a daemon that missed the signal never ends
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.rstrip().endswith("patrol daemon stopped"), out
    assert json.loads(beat.read_text("utf-8"))["stopped_at"]
