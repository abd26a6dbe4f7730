"""The patrol against real opencode servers whose fake model we steer.

Each test drives one acceptance case: heal a rate limit (blackout, next model, once), heal an
unavailable model (no blackout), abort a stuck retry, resume an interrupted run through the
gate (once), design rows into the pool, fill free slots in order and settle finished tasks,
the daemon loop with SIGTERM and a durable pause, and pool writes racing `backlog add`.
"""

from __future__ import annotations

import json
import re
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.e2e.patrol_checks import (
    CONTINUE_HEAD,
    RESUME_HEAD,
    agent_requests,
    answered_by,
    audit_lines,
    children,
    delegating,
    home,
    messages,
    patrol,
    settled,
    use_models,
)
from tests.fleet import Hub
from xaf_hub.config.load import load_config
from xaf_hub.core.clock import next_reset, resolve_timezone, to_ms
from xaf_hub.core.discipline import DISCIPLINE_MARKER, RESUME_PROMPT
from xaf_hub.store.statefile import file_lock

pytestmark = pytest.mark.e2e



def last_info(hub: Hub, name: str, sid: str) -> dict[str, Any]:
    msgs = messages(hub, name, sid)
    return msgs[-1]["info"] if msgs else {}


def abort_busy(hub: Hub, *names: str) -> None:
    for name in names:
        for sid in hub.busy_ids(name):  # the hub aborts where the run lives, on every release
            hub.cli("interrupt", "--session", sid, "--allow-prod")


# ---------------------------------------------------------------------------------------------
# fix_free_limit


def test_rate_limit_heals_once_and_blacks_out_the_family(hub: Hub) -> None:
    use_models(hub, chain=["opencode/free-model", "backup/good-model"])
    hub.llm.set_mode("free-model", "429", retry_after=1)
    sid = hub.session("lan-b", "rate limited work")
    hub.prompt("lan-b", sid, "do the work", "opencode/free-model")
    failed = hub.wait_for(lambda: settled(hub, "lan-b", sid), timeout=90)
    assert failed["info"]["error"]["data"]["statusCode"] == 429

    doc = patrol(hub)
    healed = [a for a in doc["healed"] if a["session"] == sid]
    assert [(a["result"], a["from_model"], a["model"]) for a in healed] == [
        ("ok", "opencode/free-model", "backup/good-model")
    ]
    hub.wait_for(answered_by(hub, "lan-b", sid, "backup/good-model"), timeout=60)
    sent = agent_requests(hub, "good-model", CONTINUE_HEAD)
    assert len(sent) == 1 and DISCIPLINE_MARKER in sent[0]["last_user_text"]

    state = json.loads((home(hub) / ".model_state.json").read_text("utf-8"))
    blackout = state["blackouts"]["opencode"]
    expected = to_ms(next_reset(datetime.now(UTC), 8, resolve_timezone("local")))
    assert blackout["until_ms"] == expected and "429" in blackout["reason"]
    assert "fix_free_limit" in blackout["source"]

    # A second cycle leaves the healed session alone.
    before = (len(messages(hub, "lan-b", sid)), len(agent_requests(hub, "good-model", "")))
    doc = patrol(hub)
    assert doc["healed"] == []
    assert (len(messages(hub, "lan-b", sid)), len(agent_requests(hub, "good-model", ""))) == before
    assert sum(1 for e in audit_lines(hub) if e["command"] == "patrol.heal") == 1

    # New dispatches skip the blacked-out family, an explicit --model included.
    code, plan = hub.cli_json(
        "dispatch", "--new", "--text", "x", "--dry-run", "--model", "opencode/free-model"
    )
    assert code == 0 and plan["model"] and not plan["model"].startswith("opencode/")


def test_model_unavailable_switches_without_blackout(hub: Hub) -> None:
    use_models(
        hub,
        chain=["fake/missing-model", "backup/good-model"],
        blackout_families={"opencode": ["opencode/", "opencode-go/"], "fake": ["fake/"]},
    )
    hub.llm.set_mode("missing-model", "404")
    sid = hub.session("lan-c", "model gone")
    hub.prompt("lan-c", sid, "do the work", "fake/missing-model")
    failed = hub.wait_for(lambda: settled(hub, "lan-c", sid), timeout=60)
    assert failed["info"]["error"]["data"]["statusCode"] == 404

    doc = patrol(hub)
    healed = [a for a in doc["healed"] if a["session"] == sid]
    assert [(a["result"], a["model"]) for a in healed] == [("ok", "backup/good-model")]
    assert "model_unavailable" in healed[0]["detail"] and "blacked out" not in healed[0]["detail"]
    hub.wait_for(answered_by(hub, "lan-c", sid, "backup/good-model"), timeout=60)
    state_file = home(hub) / ".model_state.json"
    assert json.loads(state_file.read_text("utf-8"))["blackouts"] == {}
    assert not any(e["command"] == "patrol.blackout" for e in audit_lines(hub))


@pytest.mark.core
def test_stuck_retry_is_aborted_and_reprompted(hub: Hub) -> None:
    use_models(hub, chain=["opencode/free-model", "backup/good-model"])
    hub.llm.set_mode("free-model", "429", retry_after=3600)
    sid = hub.session("local-a", "stuck in retry")
    hub.prompt("local-a", sid, "do the work", "opencode/free-model")  # no directory, as a TUI

    def run_state() -> str:  # as the hub reads it (on 1.2-1.14 this run shows server-wide only)
        code, data = hub.cli_json("sessions", "--instance", "local-a")
        return next((s["run_state"] for s in data["sessions"] if s["id"] == sid), "")

    hub.wait_for(lambda: run_state() == "retry", timeout=60)

    doc = patrol(hub)
    healed = [a for a in doc["healed"] if a["session"] == sid]
    assert [(a["result"], a["model"]) for a in healed] == [("ok", "backup/good-model")]
    assert "(retry)" in healed[0]["detail"]
    hub.wait_for(answered_by(hub, "local-a", sid, "backup/good-model"), timeout=60)
    assert any(
        e["command"] == "patrol.heal" and e["result"] == "abort+prompt" for e in audit_lines(hub)
    )
    assert "opencode" in json.loads((home(hub) / ".model_state.json").read_text())["blackouts"]


def test_a_heal_judged_before_a_persons_interrupt_sends_nothing(hub: Hub) -> None:
    """The patrol judged a session stuck in a rate-limit retry and read people's decisions;
    then a person interrupts it. The heal asks again under the instance lock (which the
    interrupt holds while it records and aborts) and sends nothing: no abort, no prompt."""
    from xaf_hub.core import aio
    from xaf_hub.notify.record import RoundLog
    from xaf_hub.ops.context import OpsContext
    from xaf_hub.ops.decisions import load_decisions
    from xaf_hub.ops.heal import heal_candidate
    from xaf_hub.patrol.context import Cycle
    from xaf_hub.patrol.jobs.fix_free_limit import heal_item

    use_models(hub, chain=["opencode/free-model", "backup/good-model"])
    hub.llm.set_mode("free-model", "429", retry_after=3600)
    sid = hub.session("lan-b", "stuck, then stopped by a person")
    hub.prompt("lan-b", sid, "do the work", "opencode/free-model")
    cfg = load_config(str(hub.config_path), env=hub.env)
    ops = OpsContext(cfg, env=hub.env)

    def judged() -> Any:
        fleet = aio.run(ops.scan())
        return next(
            ((i, r) for i, r in fleet.work_sessions() if r.id == sid and r.run_state == "retry"),
            None,
        )

    inst, rec = hub.wait_for(judged, timeout=60)
    cycle = Cycle(RoundLog(started=ops.now()))
    run = aio.run(cycle.last_runs(ops, [(inst, rec)])).get((inst.name, sid))
    cand = heal_candidate(rec, run)
    assert cand is not None and cand.state == "retry"
    people = load_decisions(ops)  # read before the person acts
    code, _, err = hub.cli("interrupt", "--session", sid, "--allow-prod")
    assert code == 0, err
    aio.run(heal_item(ops, cycle, inst, rec, run, cand, ops.model_state(), people, lambda: None))
    (action,) = [a for a in cycle.log.actions if a.session == sid]
    assert (action.kind, action.result) == ("heal", "skipped"), action
    assert "interrupted by" in action.detail and "nothing was sent" in action.detail
    heals = [e["result"] for e in audit_lines(hub) if e["command"] == "patrol.heal"]
    assert heals == ["failed"]  # refused under the lock: nothing aborted or sent
    assert agent_requests(hub, "good-model", CONTINUE_HEAD) == []
    assert sid not in hub.busy_ids("lan-b")


# ---------------------------------------------------------------------------------------------
# check_agents


def test_interrupted_session_is_resumed_through_the_gate_once(hub: Hub) -> None:
    hub.set_instance("lan-c", concurrency_limit=1)
    hub.llm.set_mode("slow-model", "slow", delay=60)
    url, pw = hub.server("lan-c").url, hub.password("lan-c")
    a = hub.session("lan-c", "long running job")
    hub.prompt("lan-c", a, "long work", "fake/slow-model")
    hub.wait_for(lambda: agent_requests(hub, "slow-model", "long work"), timeout=30)
    sandbox.abort(url, pw, a)
    hub.wait_for(lambda: (settled(hub, "lan-c", a) or {}).get("info", {}).get("error"), timeout=30)

    # Another run holds the only slot: the resume must wait.
    hub.llm.set_mode("fake-model", "slow", delay=12)
    b = hub.session("lan-c", "other job")
    hub.prompt("lan-c", b, "other work", "fake/fake-model")
    hub.wait_for(lambda: b in hub.busy_ids("lan-c"))
    doc = patrol(hub, "--no-fill", "--no-design")
    states = {s["session"]: s["state"] for s in doc["sessions"]["interrupted"]}
    assert states.get(a) == "interrupted"
    assert [(r["session"], r["result"]) for r in doc["resumed"]] == [(a, "waiting")]
    assert not agent_requests(hub, "slow-model", RESUME_HEAD)
    assert hub.busy_ids("lan-c") == {b}

    hub.wait_for(lambda: not hub.busy_ids("lan-c"), timeout=60)
    doc = patrol(hub, "--no-fill", "--no-design")
    assert [(r["session"], r["result"]) for r in doc["resumed"]] == [(a, "ok")]
    sent = hub.wait_for(lambda: agent_requests(hub, "slow-model", RESUME_HEAD), timeout=30)
    assert DISCIPLINE_MARKER in sent[0]["last_user_text"]
    assert hub.busy_ids("lan-c") == {a}

    # Interrupted again after the resume: left for a human, not resumed a second time.
    sandbox.abort(url, pw, a)
    hub.wait_for(lambda: not hub.busy_ids("lan-c"), timeout=30)
    doc = patrol(hub, "--no-fill", "--no-design")
    assert [(r["session"], r["result"]) for r in doc["resumed"]] == [(a, "skipped")]
    assert "resumed it once" in doc["resumed"][0]["detail"]
    assert len(agent_requests(hub, "slow-model", RESUME_HEAD)) == 1
    report = (home(hub) / "patrol" / "report-latest.md").read_text("utf-8")
    assert "## Resumed (check_agents)" in report and a in report


def test_a_resume_judged_on_a_stopped_session_sends_nothing_once_it_runs_again(hub: Hub) -> None:
    """The race a second daemon or a late prompt opens: judged stopped, running at the send."""
    from xaf_hub.core import aio
    from xaf_hub.errors import RunsAgain
    from xaf_hub.ops.context import OpsContext
    from xaf_hub.ops.planner import plan_reuse
    from xaf_hub.ops.send import send_work

    hub.llm.set_mode("slow-model", "slow", delay=30)
    sid = hub.session("lan-c", "judged, then started")
    cfg = load_config(str(hub.config_path), env=hub.env)
    ops = OpsContext(cfg, env=hub.env)
    fleet = aio.run(ops.scan())
    inst, rec = next((i, s) for i, s in fleet.work_sessions() if s.id == sid)
    assert not rec.running  # what the patrol judged
    hub.prompt("lan-c", sid, "started behind the judge's back", "fake/slow-model")
    hub.wait_for(lambda: sid in hub.busy_ids("lan-c"))

    async def resend() -> None:
        async with ops.client(inst) as client:
            await send_work(
                ops, plan_reuse(inst, rec, via="test"), RESUME_PROMPT, "fake/fake-model",
                client, command="patrol.resume", steer=False,
            )

    with pytest.raises(RunsAgain, match=f"session {sid} on lan-c runs again"):
        aio.run(resend())
    try:
        assert not [r for r in hub.llm.requests() if RESUME_HEAD in r["last_user_text"]]
        audit = (home(hub) / "audit.log").read_text("utf-8").splitlines()
        assert [json.loads(x)["result"] for x in audit if sid in x] == ["failed"]
    finally:
        abort_busy(hub, "lan-c")


def test_a_session_made_after_the_scan_is_looked_up_before_it_is_called_gone(hub: Hub) -> None:
    """Another hub dispatched a task after this round's scan, its clock 5 s behind this one's
    (so its stamp predates the scan): the round must not call that session gone and requeue
    the task (it would be sent twice). A session archived in opencode (lists leave it out) is
    there too: its finished run settles the task. A session really deleted is gone."""
    import time
    from datetime import timedelta

    from xaf_hub.core import aio
    from xaf_hub.notify.record import RoundLog
    from xaf_hub.ops.context import OpsContext
    from xaf_hub.patrol.context import Cycle
    from xaf_hub.patrol.jobs.fill_slots import settle_dispatched

    for tid in ("late", "archived", "gone"):
        code, _, err = hub.cli("backlog", "add", "--title", f"{tid} task", "--id", tid)
        assert code == 0, err
    url, pw = hub.server("lan-c").url, hub.password("lan-c")
    archived = hub.session("lan-c", "finished, then archived by a person")
    hub.prompt("lan-c", archived, "quick work", "fake/fake-model")
    hub.wait_for(lambda: len(sandbox.messages(url, pw, archived)) >= 2, timeout=30)
    hub.wait_for(lambda: archived not in hub.busy_ids("lan-c"), timeout=30)
    with sandbox._client(url, pw) as http:
        got = http.patch(
            f"/session/{archived}",
            params={"directory": str(hub.project_dir("app"))},
            json={"time": {"archived": int(time.time() * 1000)}},
        )
        assert got.status_code == 200, got.text
    cfg = load_config(str(hub.config_path), env=hub.env)
    ops = OpsContext(cfg, env=hub.env)
    cycle = Cycle(RoundLog(started=ops.now()))
    fleet, scanned_at = aio.run(cycle.scan(ops))
    listed = {s.id for sc in fleet.scans for s in sc.sessions}
    assert archived not in listed  # what the scan cannot see
    late = hub.session("lan-c", "made by another hub after the scan")
    gone = hub.session("lan-c", "deleted since")
    inst = next(i for i in cfg.instances if i.name == "lan-c")

    async def delete() -> None:
        async with ops.client(inst) as client:
            await client.delete(gone)

    aio.run(delete())
    behind = scanned_at - timedelta(seconds=5)
    for tid, sid, at in (
        ("late", late, behind),
        ("archived", archived, scanned_at - timedelta(minutes=5)),
        ("gone", gone, behind),
    ):
        ops.backlog().mark_dispatched(tid, sid, "lan-c", "fake/fake-model", at)
    aio.run(settle_dispatched(ops, cycle, fleet, ops.backlog().load().tasks, scanned_at))
    pool = {t.id: t for t in ops.backlog().load().tasks}
    assert (pool["late"].status, pool["late"].session_id) == ("dispatched", late)
    assert pool["archived"].status == "done", pool["archived"]
    assert pool["gone"].status == "pending"
    assert pool["gone"].last_error == "session gone from its instance"
    assert [a.task for a in cycle.log.actions if a.kind == "requeue"] == ["gone"]


# ---------------------------------------------------------------------------------------------
# sync_design_tasks

DESIGN = """# CF 统一方案

| 批次 | 内容 | 状态 |
|---|---|---|
| F-7 旧值迁移 | 迁移 | ✅ 已完成 |
| F-8 清理旧 CF 值 | 王五 | ⏳ 待派发 |
| T3 | 接口联调 | 未派发 |
| 步骤 2:补齐迁移脚本 | — | 待派发 |
| W0.5 文档 | docs | 已派发 |
| 说明 | 无代号 | 待派发 |

Prose with a | pipe | 待派发 F-9 is not a row.

```
| F-10 in a code block | x | 待派发 |
```
"""


def test_design_rows_become_pending_tasks_once(hub: Hub) -> None:
    hub.write_config(patrol={"repo_root": str(hub.root)})
    pool = home(hub) / "tasks_backlog.json"
    only_design = ("--no-freelimit", "--no-check", "--no-fill")
    doc = patrol(hub, *only_design)
    assert doc["design_tasks_added"] == [] and not pool.exists()

    plans = hub.root / "docs" / "superpowers" / "plans"
    plans.mkdir(parents=True)
    (plans / "cf-unify.md").write_text(DESIGN, "utf-8")
    doc = patrol(hub, *only_design)
    added = [(a["task"], a["title"]) for a in doc["design_tasks_added"]]
    assert added == [
        ("F-8", "F-8 清理旧 CF 值"),
        ("T3", "T3 接口联调"),
        ("AUTO-cf-unify-1", "步骤 2:补齐迁移脚本"),
    ]
    tasks = json.loads(pool.read_text("utf-8"))["tasks"]
    assert [(t["id"], t["status"], t["spec"]) for t in tasks] == [
        (i, "pending", "docs/superpowers/plans/cf-unify.md") for i, _ in added
    ]
    assert [e["tasks"] for e in audit_lines(hub) if e["command"] == "patrol.sync_design"] == [
        ["F-8", "T3", "AUTO-cf-unify-1"]
    ]

    stamp = pool.stat().st_mtime_ns
    (hub.root / "lead_backlog.md").write_text(
        "# 待拍板\n- [ ] 是否合并 feature/u3\n- [x] 已定:预算\n", "utf-8"
    )
    doc = patrol(hub, *only_design)
    assert doc["waiting"]["lead_backlog"]["items"] == ["是否合并 feature/u3"]
    assert doc["design_tasks_added"] == []
    assert pool.stat().st_mtime_ns == stamp
    waiting = [t["id"] for t in doc["waiting"]["ready"]]
    assert sorted(waiting) == sorted(i for i, _ in added)


# ---------------------------------------------------------------------------------------------
# fill_slots


def test_fill_slots_dispatches_free_slots_in_order_then_settles(hub: Hub) -> None:
    hub.doc["instances"] = [i for i in hub.doc["instances"] if i["name"] != "lan-c"]
    hub.write_config()
    hub.llm.set_mode("fake-model", "slow", delay=10)
    for title, prio, pin in (
        ("alpha task", "P2", None),
        ("bravo task", "P0", "lan-b"),
        ("charlie task", "P1", None),
        ("delta task", "P3", None),
        ("echo task", "P1", "local-a"),
    ):
        args = ["backlog", "add", "--title", title, "--priority", prio, "--id", title.split()[0]]
        code, out, err = hub.cli(*args, *(("--instance", pin) if pin else ()))
        assert code == 0, err
    try:
        doc = patrol(hub, "--no-design")
        order = [(a["task"], a["instance"]) for a in doc["dispatched"]]
        assert order == [
            ("echo", "local-a"),
            ("charlie", "local-a"),
            ("bravo", "lan-b"),
            ("alpha", "lan-b"),
        ]
        pool = {
            t["id"]: t
            for t in json.loads((home(hub) / "tasks_backlog.json").read_text("utf-8"))["tasks"]
        }
        assert pool["delta"]["status"] == "pending"
        for tid, inst in order:
            task = pool[tid]
            assert (task["status"], task["dispatched_to"], task["model"]) == (
                "dispatched",
                inst,
                "fake/fake-model",
            )
            hub.wait_for(lambda t=task, i=inst: t["session_id"] in hub.busy_ids(i))
        assert [e["task"] for e in audit_lines(hub) if e["command"] == "patrol.backlog"] == [
            t for t, _ in order
        ]
        req = agent_requests(hub, "fake-model", "echo task")
        assert req and DISCIPLINE_MARKER in req[0]["last_user_text"]

        # The overview page tells a reader what the autopilot just did and what waits.
        page_path = home(hub) / "page.html"
        code, _, err = hub.cli("sessions", "--html", str(page_path))
        assert code == 0, err
        page = page_path.read_text("utf-8")
        start = page.index('id="autopilot"')
        panel = page[start : page.index("</section>", start)]
        last = r"<time [^>]*>(just now|\d+ minutes? ago)</time>"
        assert re.search(rf"looked after the servers {last}: everything", panel)
        assert "<li><b>4</b> started from the queue</li>" in panel
        assert re.search(r'<li data-kind="waiting"><b[^>]*>1</b> waiting to start</li>', panel)
        # The four sent are in progress until a round settles them, as `backlog list` says,
        # even one whose session already finished (slow model, busy machine).
        assert re.search(r'<li data-kind="in_progress"><b[^>]*>4</b> in progress</li>', panel)
        assert "delta task" in panel and "alpha task" not in panel

        # Both instances are full: another cycle dispatches nothing.
        doc = patrol(hub, "--no-design")
        assert doc["dispatched"] == []

        def all_idle() -> bool:
            return not hub.busy_ids("local-a") and not hub.busy_ids("lan-b")

        hub.llm.set_mode("fake-model", "ok")
        hub.wait_for(all_idle, timeout=90)
        doc = patrol(hub, "--no-design")
        # No project.repository: finished, not verified (done in the pool file).
        finished = sorted(a["task"] for a in doc["tasks_finished"])
        assert finished == ["alpha", "bravo", "charlie", "echo"] and doc["tasks_done"] == []
        assert [a["task"] for a in doc["dispatched"]] == ["delta"]
        pool = {
            t["id"]: t
            for t in json.loads((home(hub) / "tasks_backlog.json").read_text("utf-8"))["tasks"]
        }
        assert all(
            pool[t]["status"] == "done" and pool[t]["done_at"]
            for t in ("alpha", "bravo", "charlie", "echo")
        )
        assert pool["delta"]["status"] == "dispatched"
    finally:
        abort_busy(hub, "local-a", "lan-b")


# ---------------------------------------------------------------------------------------------
# the runner


def beat(hub: Hub) -> dict[str, Any]:
    path = home(hub) / "patrol" / "daemon.json"
    return json.loads(path.read_text("utf-8")) if path.exists() else {}


def reports(hub: Hub) -> list[Path]:
    return sorted(p for p in (home(hub) / "patrol").glob("report-2*.json"))


def test_daemon_runs_cycles_stops_on_sigterm_and_pause_survives_restart(hub: Hub) -> None:
    flags = ("--interval-seconds", "2", "--no-design", "--no-fill")
    proc = hub.popen("patrol", *flags)
    try:
        hub.wait_for(
            lambda: beat(hub).get("pid") == proc.pid and beat(hub)["ticks"] >= 3, timeout=90
        )
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "patrol daemon stopped" in out and out.count("patrol cycle ok") >= 3
    assert beat(hub)["stopped_at"] and len(reports(hub)) >= 3

    # The cycle lock: a cycle while another holds it is skipped (exit 3).
    with file_lock(home(hub) / "patrol" / "cycle.lock", 1):
        code, out, err = hub.cli("patrol", "--once")
    assert code == 3 and "another patrol cycle" in out

    assert hub.cli("patrol", "pause")[0] == 0
    seen = len(reports(hub))
    proc = hub.popen("patrol", *flags)
    try:
        hub.wait_for(
            lambda: beat(hub).get("pid") == proc.pid and beat(hub)["ticks"] >= 2, timeout=60
        )
        assert beat(hub)["last"] == "paused"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "patrol is paused" in out and len(reports(hub)) == seen
    code, status = hub.cli_json("patrol", "status")
    assert status["state"] == "paused" and status["last_cycle"]["result"] == "ok"
    assert status["daemon"]["alive"] is False
    code, out, _ = hub.cli("patrol", "--once")
    assert code == 0 and "paused" in out
    assert hub.cli("patrol", "resume")[0] == 0
    code, status = hub.cli_json("patrol", "status")
    assert status["state"] == "active"


def test_a_second_daemon_is_refused_and_a_killed_ones_leftovers_do_not_block(hub: Hub) -> None:
    flags = ("--interval-seconds", "3600", "--no-design", "--no-fill", "--no-live")
    first = hub.popen("patrol", *flags)
    second = None
    try:
        hub.wait_for(lambda: beat(hub).get("pid") == first.pid and beat(hub)["ticks"] >= 1,
                     timeout=90)
        second = hub.popen("patrol", *flags)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 3, out + err
        assert f"another patrol daemon is running for this state folder (pid {first.pid}" in err
        assert "patrol daemon started" not in out and beat(hub)["pid"] == first.pid
        # One cycle beside the daemon is allowed: it takes the cycle lock, not the daemon's.
        code, out, _ = hub.cli("patrol", "--once", "--no-design", "--no-fill")
        assert code == 0, out
        first.kill()  # SIGKILL: no clean stop, its pid file stays behind
        first.communicate(timeout=30)
        assert (home(hub) / "patrol" / "daemon.pid").exists()
        second = hub.popen("patrol", *flags)
        hub.wait_for(lambda: beat(hub).get("pid") == second.pid, timeout=90)
        second.send_signal(signal.SIGTERM)
        out, err = second.communicate(timeout=30)
        assert second.returncode == 0, err
        assert "patrol daemon stopped" in out
        assert not (home(hub) / "patrol" / "daemon.pid").exists()
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_patrol_cycle_and_concurrent_backlog_adds_lose_no_task(hub: Hub) -> None:
    hub.write_config(patrol={"repo_root": str(hub.root)})
    plans = hub.root / "docs" / "superpowers" / "plans"
    plans.mkdir(parents=True)
    (plans / "cf-unify.md").write_text(DESIGN, "utf-8")
    procs = [hub.popen("patrol", "--once")]
    procs += [hub.popen("backlog", "add", "--title", f"concurrent {i}") for i in range(5)]
    try:
        results = [(p.communicate(timeout=120), p.returncode) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for (_out, err), code in results:
        assert code == 0, err
    tasks = json.loads((home(hub) / "tasks_backlog.json").read_text("utf-8"))["tasks"]
    titles = sorted(t["title"] for t in tasks)
    assert titles == sorted(
        [f"concurrent {i}" for i in range(5)]
        + ["F-8 清理旧 CF 值", "T3 接口联调", "步骤 2:补齐迁移脚本"]
    )
    assert len({t["id"] for t in tasks}) == 8
    adds = [e for e in audit_lines(hub) if e["command"] == "backlog.add"]
    assert len(adds) == 5
    hub.wait_for(
        lambda: not any(hub.busy_ids(n) for n in ("local-a", "lan-b", "lan-c")), timeout=60
    )


# ---------------------------------------------------------------------------------------------
# run_ceiling


def test_patrol_once_stops_a_run_past_its_ceiling_and_parks_its_task(hub: Hub) -> None:
    """No daemon: a round finds a run whose first step cost $0.02 against a $0.01 ceiling,
    waiting in a 90-second tool call, and stops it; a run within its ceiling is left alone."""
    hub.doc["budget"] = {"run_usd": 0.01}
    hub.set_instance("lan-c", budget_run_usd=1.0)  # the instance's own ceiling wins
    calls = [["bash", {"command": "true", "description": "look"}],
             ["bash", {"command": "sleep 90", "description": "wait"}]]
    hub.llm.set_mode("priced-model", "tools", calls=calls, text="done")
    sids = {}
    for name in ("lan-b", "lan-c"):
        code, doc = hub.cli_json("dispatch", "--new", "--instance", name, "--text",
                                 f"costly {name}", "--model", "fake/priced-model")
        assert code == 0, doc
        sids[name] = doc["session_id"]

    def first_step_costed(name: str) -> bool:
        msgs = messages(hub, name, sids[name])
        return any(m["info"]["role"] == "assistant" and m["info"].get("cost") for m in msgs)

    for name in sids:
        hub.wait_for(lambda n=name: first_step_costed(n), timeout=90)
    try:
        doc = patrol(hub, "--no-fill")
        stopped = doc["over_run_ceiling"]
        assert [(a["instance"], a["session"], a["result"]) for a in stopped] == [
            ("lan-b", sids["lan-b"], "ok")
        ]
        assert "over the run ceiling" in stopped[0]["detail"]
        assert sids["lan-b"] not in hub.busy_ids("lan-b")
        assert sids["lan-c"] in hub.busy_ids("lan-c")  # $0.02 of its $1.00: still running
        last = messages(hub, "lan-b", sids["lan-b"])[-1]["info"]
        assert (last.get("error") or {}).get("name") == "MessageAbortedError"
        code, pool = hub.cli_json("backlog", "list")
        task = next(t for t in pool["tasks"] if t.get("session_id") == sids["lan-b"])
        assert task["status"] == "pending" and "over the run ceiling" in task["parked"]
        rows = [e for e in audit_lines(hub) if e["command"] == "patrol.run_ceiling"]
        assert [(r["session"], r["result"]) for r in rows] == [
            (sids["lan-b"], "stopping"), (sids["lan-b"], "aborted")
        ]
        # The next round leaves the stopped run alone: it is not running any more.
        assert patrol(hub, "--no-fill")["over_run_ceiling"] == []
    finally:
        abort_busy(hub, "lan-c")


def test_a_free_run_that_starts_a_priced_sub_agent_is_stopped_with_it_and_left_stopped(
    hub: Hub,
) -> None:
    """The run's own model is free; it hands the work to a priced sub-agent (a child session,
    opencode's ``task``), whose steps are the run's cost. A round stops the run past its
    ceiling, the parent and the child; the next round does not resume it (the stop is a
    decision, as a person's interrupt); today's spend counts the child's cost once, so new work
    is refused at the daily budget."""
    hub.doc["models"]["timezone"] = "UTC"
    hub.doc["budget"] = {"run_usd": 0.05, "daily_usd": 0.06}
    hub.write_config()
    delegating(hub)
    code, doc = hub.cli_json("dispatch", "--new", "--instance", "lan-b", "--text", "delegate it",
                             "--model", "fake/fake-model")
    assert code == 0, doc
    sid = doc["session_id"]
    app = hub.root / "app"

    def over() -> str:
        kids = [k for k in children(hub, "lan-b", sid) if float(k.get("cost") or 0) > 0.05]
        return str(kids[0]["id"]) if kids else ""

    kid = hub.wait_for(over, timeout=120)
    try:
        assert sid in hub.status("lan-b", app)  # the parent waits on its sub-agent
        stopped = patrol(hub, "--no-fill", "--no-design")["over_run_ceiling"]
        assert [(a["session"], a["result"]) for a in stopped] == [(sid, "ok")], stopped
        assert "aborted with 1 sub-agent session" in stopped[0]["detail"]
        assert not {sid, kid} & set(hub.status("lan-b", app))
        assert (last_info(hub, "lan-b", sid).get("error") or {}).get("name") == (
            "MessageAbortedError"
        )
        # The stopped run is a decision: not resumed, listed for a person.
        doc = patrol(hub, "--no-fill", "--no-design")
        assert doc["over_run_ceiling"] == [] and doc["resumed"] == []
        assert [(a["session"], a["kind"]) for a in doc["needs_person"]] == [(sid, "person")]
        assert "stopped over its run ceiling" in doc["needs_person"][0]["detail"]
        assert not agent_requests(hub, "fake-model", RESUME_HEAD)
        assert not {sid, kid} & set(hub.status("lan-b", app))
        # Today's spend is the child's (the parent's model is free), counted once.
        spent = float(children(hub, "lan-b", sid)[0]["cost"])
        code, status = hub.cli_json("status")
        assert status["spend"]["spent_today_usd"] == pytest.approx(spent)
        code, out, err = hub.cli("dispatch", "--new", "--instance", "lan-c", "--text", "more")
        assert code == 3 and f"daily budget $0.06 reached (${spent:.2f} spent today" in err, err
    finally:
        abort_busy(hub, "lan-b")
