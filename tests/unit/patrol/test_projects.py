"""One patrol for several projects: free slots shared fairly, one pool whose ids never collide,
each task read as its project's."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.unit.config.projects_support import load, projects
from tests.unit.patrol.run_support import NOW as RUN_NOW
from tests.unit.patrol.run_support import NOW_MS, FakeFleet, assistant, round_at
from xaf_hub.core import aio
from xaf_hub.core.clock import to_ms
from xaf_hub.core.records import SessionRecord
from xaf_hub.errors import UsageError
from xaf_hub.fleet.instance_scan import InstanceScan
from xaf_hub.notify.derive import Inputs, derive
from xaf_hub.notify.messages import render
from xaf_hub.notify.record import RoundLog
from xaf_hub.ops.context import Fleet, OpsContext
from xaf_hub.ops.send import build_prompt
from xaf_hub.patrol.context import Cycle, every_project, project_views
from xaf_hub.patrol.design_scan import DesignTask, merge_design_tasks
from xaf_hub.patrol.jobs.fill_slots import fair_slots
from xaf_hub.patrol.jobs.sync_design import sync_design_tasks
from xaf_hub.patrol.report import write_report
from xaf_hub.store.tasks import BacklogData, Task, of_project, project_of

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_a_quiet_projects_task_takes_the_one_free_slot_whatever_the_busy_queue() -> None:
    # shop runs 2 of dev's 3 and has 50 tasks planned; blog runs none and has one.
    given = fair_slots({"dev": 1}, {"shop": {"dev": (2, 1, 50)}, "blog": {"dev": (0, 1, 1)}})
    assert given == {"shop": {}, "blog": {"dev": 1}}


def test_slots_go_one_at_a_time_to_the_project_with_the_fewest_runs_there() -> None:
    given = fair_slots(
        {"dev": 4, "lan": 2},
        {
            "shop": {"dev": (1, 4, 9), "lan": (0, 2, 9)},
            "blog": {"dev": (0, 4, 9), "lan": (0, 2, 9)},
        },
    )
    # dev: blog (0) then a tie at 1 goes to the earlier project, then one more each.
    assert given == {"shop": {"dev": 2, "lan": 1}, "blog": {"dev": 2, "lan": 1}}


def test_a_project_at_its_share_or_without_work_takes_nothing_and_leaves_the_rest() -> None:
    given = fair_slots(
        {"dev": 3},
        {"shop": {"dev": (1, 0, 9)}, "blog": {"dev": (0, 3, 1)}, "docs": {"dev": (0, 3, 0)}},
    )
    assert given == {"shop": {}, "blog": {"dev": 1}, "docs": {}}  # two slots stay free


def test_a_task_names_its_project_and_an_old_row_reads_as_the_first_project() -> None:
    names = ["shop", "blog"]
    old = Task.from_json({"id": "T-1", "title": "old"})
    new = Task.from_json({"id": "T-2", "title": "new", "project": "blog"})
    assert "project" not in old.to_json() and new.to_json()["project"] == "blog"
    assert (project_of(old, names), project_of(new, names)) == ("shop", "blog")
    assert of_project([old, new], "shop", names) == [old]
    assert of_project([old, new], "blog", names) == [new]
    assert of_project([old, new], "shop", ["shop"]) == [old, new]  # one project: all its


def test_task_ids_are_unique_across_projects_in_the_one_pool() -> None:
    data = BacklogData()
    data.append(Task("T-1", "a shop task", project="shop"))
    with pytest.raises(UsageError, match="already exists"):
        data.append(Task("T-1", "a blog task", project="blog"))


def test_a_design_row_of_another_project_is_added_under_an_id_of_its_own() -> None:
    shop = Task("F-1", "add search", spec="docs/plans/p.md", project="shop")
    row = DesignTask("F-1", "add search", "docs/plans/p.md", 1, "F-1 add search", False)
    added = merge_design_tasks([shop], [row], NOW, project="blog",
                               mine=lambda t: t.project == "blog")
    assert [(t.id, t.project) for t in added] == [("F-1@p", "blog")]
    assert merge_design_tasks([shop], [row], NOW, project="shop",
                              mine=lambda t: t.project == "shop") == []


def test_the_patrol_of_a_config_of_several_projects_serves_each(tmp_path: Path) -> None:
    cfg = load(tmp_path, projects())
    views = project_views(OpsContext(cfg))
    assert [(v.cfg.project_name, v.cfg.chosen) for v in views] == [("shop", True), ("blog", True)]
    assert [v.cfg.project_name for v in project_views(OpsContext(cfg.choose("blog")))] == ["blog"]


def test_each_project_syncs_its_own_design_documents_into_the_one_pool(tmp_path: Path) -> None:
    doc = projects(patrol={"design_dirs": ["plans"]}, state_dir=str(tmp_path / "state"))
    doc["projects"]["blog"].update(repo_root="blog", design_dirs=["notes"])
    rows = "| 批次 | 状态 |\n|---|---|\n| F-8 清理 | ⏳ 待派发 |\n"
    for folder in (tmp_path / "plans", tmp_path / "blog" / "notes"):
        folder.mkdir(parents=True)
        (folder / "p.md").write_text(rows, "utf-8")
        os.utime(folder / "p.md", (NOW.timestamp(), NOW.timestamp()))
    cfg = load(tmp_path, doc)
    aio.run(every_project(sync_design_tasks)(
        OpsContext(cfg, clock=lambda: NOW, env={}), Cycle(RoundLog(started=NOW))))
    tasks = OpsContext(cfg, env={}).backlog().load().tasks
    assert [(t.id, t.project, t.spec) for t in tasks] == [
        ("F-8", "shop", "plans/p.md"), ("F-8@p", "blog", "notes/p.md")]


def test_each_projects_prompts_name_its_own_base_branch(tmp_path: Path) -> None:
    doc = projects(patrol={"base_branch": "trunk"})
    doc["projects"]["blog"]["base_branch"] = "develop"
    shop, blog = project_views(OpsContext(load(tmp_path, doc), env={}))
    said = {v.cfg.project_name: build_prompt(v, v.cfg.instances[0], "do x", "x")
            for v in (shop, blog)}
    assert "origin/trunk" in said["shop"] and "develop" not in said["shop"]
    assert "origin/develop" in said["blog"] and "trunk" not in said["blog"]


def test_a_round_over_several_projects_scans_the_fleet_once_and_each_sees_its_own(
    tmp_path: Path,
) -> None:
    fleet = FakeFleet(0)
    for i in range(3):
        fleet.add("lan-a", f"ses_{i}", NOW_MS - 3_600_000, assistant(f"m{i}", NOW_MS - 3_600_000))
    cfg = load(tmp_path, {
        "projects": {n: {"roots": {"lan-a": [f"/srv/{n}"]}} for n in ("p", "q", "r")},
        "instances": [{"name": "lan-a", "url": "http://127.0.0.1:9"}],
        "state_dir": str(tmp_path / "state"),
    })
    result, _ = round_at(cfg, fleet, RUN_NOW)
    assert result.cycle is not None and fleet.lists == 1  # one scan for every step and project
    lines = result.cycle.log.sessions
    assert sorted((s.session, s.project) for s in lines) == [
        ("ses_0", "p"), ("ses_1", "p"), ("ses_2", "p")], lines


def test_the_report_reads_each_projects_decision_list_and_counts_every_projects_runs(
    tmp_path: Path,
) -> None:
    doc = projects(state_dir=str(tmp_path / "state"))
    doc["projects"]["shop"]["repo_root"] = "shop"
    doc["projects"]["blog"]["repo_root"] = "blog"
    cfg = load(tmp_path, doc)
    for name, line in (("shop", "- merge feature/a"), ("blog", "- [ ] publish the post")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "lead_backlog.md").write_text(line + "\n", encoding="utf-8")
    inst = cfg.instances[0]
    runs = [SessionRecord("dev", f"s{i}", "t", d, running=True, run_state="busy",
                          project=inst.claims(d), owner=inst.owner(d))
            for i, d in enumerate(("/src/shop/a", "/src/blog/b"))]
    whole = Fleet([InstanceScan(inst, reachable=True, sessions=runs)])
    cycle = Cycle(RoundLog(started=NOW), _scan=(whole, NOW, 0))
    blog = cfg.choose("blog")
    cycle.note_instances(OpsContext(blog), whole.seen_as(blog))  # a project's job notes them
    assert [(i.name, i.running_project) for i in cycle.log.instances] == [("dev", 2)]
    report = json.loads(write_report(OpsContext(cfg), cycle.log, 0)[0].read_text("utf-8"))
    lead = report["waiting"]["lead_backlog"]
    assert lead["items"] == ["shop: merge feature/a", "blog: publish the post"]
    assert lead["path"] == f"{tmp_path / 'shop' / 'lead_backlog.md'}, " \
        f"{tmp_path / 'blog' / 'lead_backlog.md'}"


def test_a_round_over_several_projects_notices_each_projects_budget_and_the_overall_one(
    tmp_path: Path,
) -> None:
    doc = projects(budget={"daily_usd": 10.0})
    doc["projects"]["shop"]["budget_daily_usd"] = 2.0
    doc["projects"]["blog"]["budget_daily_usd"] = 5.0
    doc["instances"][0]["budget_daily_usd"] = 2.5
    cfg = load(tmp_path, doc)
    inst = cfg.instances[0]
    spent = (("/src/shop/a", 2.0), ("/src/blog/b", 4.0), ("/src/blog/c", 2.0))
    recs = [SessionRecord("dev", f"s{i}", "t", d, updated=to_ms(NOW), cost=usd,
                          project=inst.claims(d), owner=inst.owner(d))
            for i, (d, usd) in enumerate(spent)]
    whole = Fleet([InstanceScan(inst, reachable=True, sessions=recs)])
    cycle = Cycle(RoundLog(started=NOW), _scan=(whole, NOW, 0))
    for view in project_views(OpsContext(cfg, clock=lambda: NOW)):  # as each job notes them
        cycle.note_instances(view, whole.seen_as(view.cfg))
    events = derive(cycle.log, Inputs(configured=["dev", "lan"], spend=cycle.log.spend), {},
                    now=NOW, tz=UTC, summary_hour=23)
    day = NOW.date().isoformat()
    got = sorted((e.id, e.project, e.data.get("every_project")) for e in events
                 if e.type == "budget")
    assert got == [  # shop $2 of $2, blog $6 of $5 (and $6 of dev's $2.50), all $8 of $10
        (f"budget:*:80:{day}", "", True),
        (f"budget:blog/*:100:{day}", "blog", False), (f"budget:blog/*:80:{day}", "blog", False),
        (f"budget:blog/dev:100:{day}", "blog", False), (f"budget:blog/dev:80:{day}", "blog", False),
        (f"budget:shop/*:100:{day}", "shop", False), (f"budget:shop/*:80:{day}", "shop", False),
        (f"budget:shop/dev:80:{day}", "shop", False),
    ]
    overall = next(e for e in events if e.data.get("every_project"))
    assert render(overall, language="en", project="", page_url="", tz=UTC)[0].endswith(
        "Daily budget 80 % spent: All projects")


def test_a_projects_branch_policy_shapes_its_prompts(tmp_path: Path) -> None:
    doc = projects()
    doc["projects"]["blog"]["branch_policy"] = "mainline"
    shop, blog = project_views(OpsContext(load(tmp_path, doc), env={}))
    said = {v.cfg.project_name: build_prompt(v, v.cfg.instances[0], "do x", "x")
            for v in (shop, blog)}
    assert "Branch policy: branch" in said["shop"] and "Branch policy: mainline" in said["blog"]
