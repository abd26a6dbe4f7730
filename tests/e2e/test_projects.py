"""Several projects on one server under one limit, against a real opencode server: dispatches of
both projects race, and the server itself never runs more than the limit, nor more of the
project with a share than its share."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.e2e.daemon import _daemon
from tests.e2e.dispatch_checks import slow
from tests.fleet import Hub
from tests.notify_capture import Capture
from tests.redis_fixture import write_redis_config

pytestmark = pytest.mark.e2e

NAME = "lan-c"
PRICED = "fake/priced-model"  # $0.02 a run (tests/e2e/test_budget.py)


def two_projects(hub: Hub) -> dict[str, Path]:
    """Turn the hub's config into projects shop and blog on NAME (limit 2, blog's share 1)."""
    apps = {p: hub.project_dir(p, "app") for p in ("shop", "blog")}
    hub.doc.pop("project")
    for inst in hub.doc["instances"]:
        inst.pop("roots"), inst.pop("default_directory")
    hub.set_instance(NAME, concurrency_limit=2)
    hub.write_config(projects={
        p: {"roots": {NAME: [str(app.parent)]}, "default_directory": {NAME: str(app)}}
        for p, app in apps.items()
    })
    hub.doc["projects"]["blog"]["share"] = 1
    hub.write_config()
    return apps


def busy(hub: Hub, app: Path) -> int:
    status = sandbox.status(hub.server(NAME).url, hub.password(NAME), str(app))
    return sum(1 for v in status.values() if v.get("type") != "idle")


@pytest.mark.parametrize("gate", ["file", "redis"])
def test_one_limit_for_every_project_and_a_share_for_one(
    hub: Hub, gate: str, request: pytest.FixtureRequest
) -> None:
    if gate == "redis":
        server = request.getfixturevalue("redis_server")
        write_redis_config(hub.doc, server, server.prefix())
        hub.env.update(server.env())
    apps = two_projects(hub)
    slow(hub)  # runs stay busy past the race
    samples: list[tuple[int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:  # runs only start here: a later reading of blog never undercounts the sum
                samples.append((busy(hub, apps["shop"]), busy(hub, apps["blog"])))
            except Exception:  # noqa: BLE001 - a missed sample is taken again, never invented
                continue
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        # shop named, blog found from the folder it is sent to
        procs = [
            hub.popen("dispatch", "--new", "--instance", NAME, "--text", f"task {i}", "--json",
                      "--no-record", *where)
            for i in range(3)
            for where in (("--project", "shop"), ("--dir", str(apps["blog"])))
        ]
        results = [(p.communicate(timeout=180), p.returncode) for p in procs]
        hub.wait_for(lambda: len(samples) >= 10)  # the state after the race counts too
        stop.set()
        sampler.join(timeout=30)
        for (_out, err), code in results:
            assert code in (0, 3), err
            assert code == 0 or "at its limit" in err or "dispatch lock" in err, err
        sent = [json.loads(out) for (out, _), code in results if code == 0]
        assert len(sent) == 2, results
        assert all(d["project"] == ("shop" if "/shop/" in d["directory"] else "blog")
                   for d in sent), sent
        assert len(samples) >= 10, "too few samples to judge"
        assert max(s + b for s, b in samples) <= 2, f"over the limit: {samples}"
        assert max(b for _, b in samples) <= 1, f"over blog's share: {samples}"
        assert samples[-1][0] + samples[-1][1] == 2, samples  # the limit was reached
        # `sessions --project` lists one project's sessions, each row saying which
        for p, app in apps.items():
            code, doc = hub.cli_json("sessions", "--project", p, "--instance", NAME)
            rows = {(s["project"], str(Path(s["directory"]).parent)) for s in doc["sessions"]}
            ran = any(d["project"] == p for d in sent)
            assert code == 0 and rows == ({(p, str(app.parent))} if ran else set()), doc
    finally:
        stop.set()
        for p in apps:
            code, doc = hub.cli_json("sessions", "--project", p, "--instance", NAME)
            for s in doc.get("sessions", []) if code == 0 else []:
                if s["running"]:
                    hub.cli("interrupt", "--project", p, "--session", s["id"], "--allow-prod")


def test_one_daemon_gives_a_quiet_projects_task_the_first_free_slot(hub: Hub) -> None:
    """One patrol daemon serves both projects: shop's long queue fills the server, blog queues
    one task, and the slot that frees next is blog's; the server never runs more than its
    limit, nor blog more than its share."""
    apps = two_projects(hub)
    slow(hub, 600)  # runs stay busy until interrupted
    for i in range(5):
        assert hub.cli("backlog", "add", "--project", "shop", "--title", f"shop task {i}")[0] == 0

    def pool() -> dict[str, dict[str, Any]]:
        code, doc = hub.cli_json("backlog", "list")
        assert code == 0, doc
        return {t["id"]: t for t in doc["tasks"]}

    def sent(project: str) -> list[dict[str, Any]]:
        return [t for t in pool().values() if t["project"] == project and t["dispatched_at"]]

    daemon = _daemon(hub)
    samples: list[tuple[int, int]] = []
    stop = threading.Event()
    try:
        hub.wait_for(lambda: len(sent("shop")) == 2, timeout=120)
        code, doc = hub.cli_json("backlog", "add", "--project", "blog", "--title", "blog task")
        assert code == 0 and doc["project"] == "blog", doc

        def sample() -> None:
            while not stop.is_set():
                try:
                    samples.append((busy(hub, apps["shop"]), busy(hub, apps["blog"])))
                except Exception:  # noqa: BLE001 - a missed sample is taken again
                    continue
                stop.wait(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        first = sent("shop")[0]
        hub.cli("interrupt", "--project", "shop", "--session", first["session_id"], "--allow-prod")
        hub.wait_for(lambda: sent("blog"), timeout=60)
        # the task is marked sent when its prompt is accepted; the run shows busy a little later
        hub.wait_for(lambda: samples and samples[-1] == (1, 1), timeout=60)
        hub.wait_for(lambda: len(samples) >= 10)
        stop.set()
        sampler.join(timeout=30)
        assert len(sent("shop")) == 2, "a shop task took the slot freed for blog's"
        assert len(samples) >= 10, "too few samples to judge"
        assert max(s + b for s, b in samples) <= 2, f"over the limit: {samples}"
        assert max(b for _, b in samples) <= 1, f"over blog's share: {samples}"
        assert samples[-1] == (1, 1), samples
    finally:
        stop.set()
        daemon.stop()
        for p in apps:
            code, doc = hub.cli_json("sessions", "--project", p, "--instance", NAME)
            for s in doc.get("sessions", []) if code == 0 else []:
                if s["running"]:
                    hub.cli("interrupt", "--project", p, "--session", s["id"], "--allow-prod")
def test_the_views_show_every_project_without_project(hub: Hub, tmp_path: Path) -> None:
    apps = two_projects(hub)
    sid = {p: hub.session(NAME, f"{p} work", directory=app) for p, app in apps.items()}
    hub.session(NAME, "elsewhere", directory=hub.project_dir("elsewhere"))
    # status: one row per server, and each project's runs and share on it
    code, doc = hub.cli_json("status", "--instance", NAME)
    (inst,) = doc["instances"]
    assert code == 0 and inst["project"] is None, doc
    assert [(p["project"], p["share"]) for p in inst["projects"]] == [
        ("shop", None), ("blog", 1)], inst
    code, out, err = hub.cli("status", "--instance", NAME)
    assert code == 0 and "shop" in out and "blog" in out, err
    # sessions: both projects' sessions, each naming its project; --project keeps one
    code, doc = hub.cli_json("sessions", "--instance", NAME)
    assert code == 0 and {(s["project"], s["id"]) for s in doc["sessions"]} == {
        (p, s) for p, s in sid.items()}, doc
    code, doc = hub.cli_json("sessions", "--instance", NAME, "--project", "blog")
    assert code == 0 and [s["id"] for s in doc["sessions"]] == [sid["blog"]], doc
    code, doc = hub.cli_json("status", "--instance", NAME, "--project", "blog")
    assert code == 0 and doc["instances"][0]["project"] == "blog", doc
    assert doc["instances"][0]["projects"] == [], doc
    # the page: a line per project, a project filter, a label on each row
    page = tmp_path / "page.html"
    code, _, err = hub.cli("sessions", "--instance", NAME, "--html", str(page))
    html = page.read_text("utf-8")
    assert code == 0, err
    for p in apps:
        assert f'data-pick="{p}"' in html and f'<option value="{p}">' in html
        assert html.count(f'data-p="{p}"') == 1, html


def test_three_projects_on_two_servers_hold_each_limit_and_share(hub: Hub) -> None:
    """Three projects on two servers (limit 2 each; docs on one of them, share 1), three clients
    of each dispatching at once: sampled from both servers, neither runs more than 2, nor more
    than one of docs' runs."""
    servers = ("lan-b", "lan-c")
    names = ("shop", "blog", "docs")
    apps = {p: hub.project_dir(p, "app") for p in names}
    hub.doc.pop("project")
    for inst in hub.doc["instances"]:
        inst.pop("roots"), inst.pop("default_directory")
        inst["concurrency_limit"] = 2
    hub.write_config(projects={
        p: {"roots": {s: [str(app.parent)] for s in servers},
            "default_directory": {s: str(app) for s in servers}}
        for p, app in apps.items()
    })
    docs = hub.doc["projects"]["docs"]  # on lan-c only, so its clients press on its share
    docs.update(share=1, roots={"lan-c": docs["roots"]["lan-c"]},
                default_directory={"lan-c": docs["default_directory"]["lan-c"]})
    hub.write_config()
    slow(hub)
    samples: list[dict[tuple[str, str], int]] = []
    stop = threading.Event()

    def count(server: str, app: Path) -> int:
        status = sandbox.status(hub.server(server).url, hub.password(server), str(app))
        return sum(1 for v in status.values() if v.get("type") != "idle")

    def sample() -> None:
        while not stop.is_set():
            try:
                samples.append({(s, p): count(s, app) for s in servers for p, app in apps.items()})
            except Exception:  # noqa: BLE001 - a missed sample is taken again, never invented
                continue
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        procs = [hub.popen("dispatch", "--new", "--text", f"{p} task {i}", "--json",
                           "--no-record", "--project", p)
                 for i in range(3) for p in names]
        results = [(p.communicate(timeout=240), p.returncode) for p in procs]
        hub.wait_for(lambda: len(samples) >= 10)
        stop.set()
        sampler.join(timeout=30)
        for (_out, err), code in results:
            assert code in (0, 3), err
        sent = [json.loads(out) for (out, _), code in results if code == 0]
        assert 2 <= len(sent) <= 4, results
        assert {d["instance"] for d in sent} <= set(servers), sent
        assert all(f"/{d['project']}/" in d["directory"] for d in sent), sent
        assert len(samples) >= 10, "too few samples to judge"
        for s in servers:
            runs = [sum(v for (srv, _), v in one.items() if srv == s) for one in samples]
            assert max(runs) <= 2, f"{s} over its limit: {samples}"
            assert max(one[(s, "docs")] for one in samples) <= 1, f"docs over its share on {s}"
    finally:
        stop.set()
        for p in names:
            code, doc = hub.cli_json("sessions", "--project", p)
            for s in doc.get("sessions", []) if code == 0 else []:
                if s["running"]:
                    hub.cli("interrupt", "--project", p, "--session", s["id"], "--allow-prod")


def test_each_project_syncs_its_own_design_documents_and_names_its_own_base_branch(
    hub: Hub,
) -> None:
    """One patrol round over two projects, each with its design folder, batch codes and base
    branch: each pending row becomes its project's task and is sent with a discipline that
    names that project's base branch."""
    apps = two_projects(hub)
    rows = {"shop": ("F-1 shop plan", "trunk", []),
            "blog": ("B-1 blog plan", "develop", [r"B-\d+"])}
    for p, (row, base, codes) in rows.items():
        (apps[p].parent / "plans").mkdir()
        (apps[p].parent / "plans" / "p.md").write_text(
            f"| 批次 | 状态 |\n|---|---|\n| {row} | ⏳ 待派发 |\n", "utf-8")
        hub.doc["projects"][p].update(repo_root=str(apps[p].parent), design_dirs=["plans"],
                                      base_branch=base, batch_patterns=codes)
    hub.write_config()
    code, _, err = hub.cli("patrol", "--once", "--no-freelimit", "--no-check")
    assert code == 0, err
    code, doc = hub.cli_json("backlog", "list")
    assert code == 0 and {(t["id"], t["project"], bool(t["session_id"])) for t in doc["tasks"]} == {
        ("F-1", "shop", True), ("B-1", "blog", True)}, doc

    def prompts() -> dict[str, str]:
        said = {r["last_user_text"] for r in hub.llm.requests()}
        return {p: t for p, (row, _, _) in rows.items() for t in said if row in t}

    said = hub.wait_for(lambda: len(prompts()) == 2 and prompts(), timeout=60)
    assert "origin/trunk" in said["shop"] and "develop" not in said["shop"], said["shop"]
    assert "origin/develop" in said["blog"] and "trunk" not in said["blog"], said["blog"]


def test_one_round_over_two_projects_notices_each_projects_budget_and_the_overall_one(
    hub: Hub,
) -> None:
    """One priced run in each project, then one round serving both: the chat hears each
    project's budget and the overall one (before, only the last project's)."""
    two_projects(hub)
    capture = Capture("json")
    capture.start()
    try:
        hub.env["HOOK_TEAM"] = capture.url
        hub.doc["models"]["timezone"] = "UTC"
        hub.doc["budget"] = {"daily_usd": 0.05}  # $0.04 of both: 80 %
        hub.doc["projects"]["shop"]["budget_daily_usd"] = 0.02  # $0.02: 100 %
        hub.doc["projects"]["blog"]["budget_daily_usd"] = 0.025  # $0.02: 80 %
        hub.write_config(
            notify={"webhooks": [{"name": "team", "url_env": "HOOK_TEAM", "format": "json"}]})
        for p in ("shop", "blog"):
            code, doc = hub.cli_json("dispatch", "--new", "--project", p, "--instance", NAME,
                                     "--text", "priced work", "--model", PRICED, "--no-record")
            assert code == 0, doc

            def spent(p: str = p) -> bool:
                code, doc = hub.cli_json("status", "--project", p)
                return code == 0 and (doc["spend"]["spent_today_usd"] or 0) >= 0.02 - 1e-9

            hub.wait_for(spent, timeout=90)
        code, out, err = hub.cli("patrol", "--once", "--no-design")
        assert code == 0, err
        got = sorted((e["project"], e["instance"], int(e["data"]["level"]),
                      e["data"].get("every_project")) for e in capture.events()
                     if e["type"] == "budget")
        assert got == [("", "", 80, True), ("blog", "", 80, False),
                       ("shop", "", 80, False), ("shop", "", 100, False)], got
    finally:
        capture.stop()
