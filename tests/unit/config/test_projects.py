"""A config of several projects: its shape, its checks and how a project is chosen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.config.projects_support import INSTANCES, load, projects
from xaf_hub.errors import ConfigError, UsageError
from xaf_hub.ops.budget import run_ceiling
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.send import pool_discipline


def test_several_projects_load_with_none_chosen_and_each_can_be_chosen(tmp_path: Path) -> None:
    cfg = load(tmp_path, projects())
    assert [p.name for p in cfg.projects] == ["shop", "blog"] and not cfg.chosen
    assert not any(i.rules.is_project("/src/shop/x") for i in cfg.instances)
    with pytest.raises(UsageError, match=r"several projects.*--project NAME.*shop, blog"):
        cfg.one_project()
    shop = cfg.choose("shop")
    dev, lan = shop.instances
    assert (shop.project_name, shop.chosen, dev.project, dev.share) == ("shop", True, "shop", 1)
    assert dev.roots == ("/src/shop",) and dev.default_directory == "/src/shop/app"
    assert lan.roots == ("/srv/shop",) and lan.default_directory == ""
    assert dev.rules.is_project("/src/shop/a") and not dev.rules.is_project("/src/shop/vendor/x")
    assert not dev.rules.is_project("/src/blog/a")
    # every project's sessions are known to each instance, the chosen one's first
    assert (dev.owner("/src/blog/a"), dev.owner("/src/shop/a"), dev.owner("/tmp")) == (
        "blog", "shop", "")
    blog = cfg.choose("blog")
    assert blog.repository.url == "/git/blog.git" and blog.instances[0].share is None
    assert shop.repository.url == ""
    with pytest.raises(UsageError, match=r"unknown project 'wiki' \(configured: shop, blog\)"):
        cfg.choose("wiki")


def test_one_project_is_chosen_whichever_way_it_is_written(tmp_path: Path) -> None:
    one = load(tmp_path, projects(projects={"shop": {"roots": {"dev": ["/src/shop"]}}}))
    assert one.chosen and one.project_name == "shop" and one.one_project() is one
    old = load(tmp_path, {"project": {"name": "demo"},
                          "instances": [{**INSTANCES[0], "roots": ["/src/demo"]}]})
    assert old.chosen and old.project_name == "demo" and [p.name for p in old.projects] == ["demo"]
    inst = old.instances[0]
    assert (inst.project, inst.share, inst.owner("/src/demo/x")) == ("demo", None, "demo")
    assert old.choose("demo").instances == old.instances


def test_each_project_has_its_own_budget(tmp_path: Path) -> None:
    doc = projects()
    doc["projects"]["blog"]["budget_daily_usd"] = 2.5
    cfg = load(tmp_path, doc)
    assert (cfg.project_budget_usd, cfg.choose("blog").project_budget_usd) == (None, 2.5)
    assert cfg.choose("shop").project_budget_usd is None


def test_each_project_has_its_own_design_documents_and_base_branch(tmp_path: Path) -> None:
    doc = projects(patrol={"base_branch": "trunk", "design_dirs": ["plans"], "interval_minutes": 5})
    doc["projects"]["blog"].update(
        repo_root="blog", design_dirs=["docs/blog"], design_max_age_days=7,
        pending_markers=["todo"], batch_patterns=["^B-"], base_branch="develop",
    )
    cfg = load(tmp_path, doc)
    shop, blog = cfg.choose("shop").patrol, cfg.choose("blog").patrol
    assert (shop.base_branch, shop.design_dirs, shop.repo_root) == ("trunk", ("plans",), None)
    assert (blog.base_branch, blog.design_dirs, blog.repo_root) == (
        "develop", ("docs/blog",), tmp_path / "blog")  # beside the config, like patrol's
    assert (blog.design_max_age_days, blog.pending_markers, blog.batch_patterns) == (
        7, ("todo",), ("^B-",))
    assert blog.interval_minutes == shop.interval_minutes == 5  # the daemon's keys stay one
    assert cfg.patrol.base_branch == "trunk"  # seen as every project: the config's
    one = load(tmp_path, {"project": {"name": "demo"}, "patrol": {"base_branch": "trunk"},
                          "instances": [{**INSTANCES[0], "roots": ["/src/demo"]}]})
    assert one.patrol.base_branch == "trunk" and one.projects[0].patrol == one.patrol


@pytest.mark.parametrize(("changes", "message"), [
    ({"project": {"name": "x"}}, "key 'projects': give either project"),
    ({"projects": {}}, "key 'projects': must name at least one project"),
    ({"projects": []}, "key 'projects': expected an object, got a list"),
    ({"projects": {"my shop": {}}}, "key 'projects.my shop': a project's name is a short"),
    ({"projects": {"a" * 33: {}}}, "a project's name is a short identifier"),
    ({"projects": {"shop": 3}}, "projects.shop must be an object"),
    ({"projects": {"shop": {"name": "Shop"}}}, "key 'projects.shop.name': the project's key"),
    ({"projects": {"shop": {"roots": {"nope": ["/a"]}}}},
     "key 'projects.shop.roots.nope': no such instance (configured: dev, lan)"),
    ({"projects": {"shop": {"roots": {"dev": "/a"}}}},
     "key 'projects.shop.roots.dev': expected a list"),
    ({"projects": {"shop": {"roots": {"dev": ["src"]}}}},
     "key 'projects.shop.roots.dev[0]': must be an absolute path"),
    ({"projects": {"shop": {"default_directory": {"dev": 5}}}},
     "key 'projects.shop.default_directory.dev': expected a string"),
    ({"projects": {"shop": {"share": 0}}},
     "key 'projects.shop.share': must be a whole number, at least 1"),
    ({"projects": {"shop": {"share": 1.5}}}, "key 'projects.shop.share': must be a whole number"),
    ({"projects": {"shop": {"shares": 1}}}, "key 'projects.shop.shares': unknown key"),
    ({"projects": {"shop": {"budget_daily_usd": 0}}},
     "key 'projects.shop.budget_daily_usd': must be an amount of US dollars above 0, got 0"),
    ({"projects": {"shop": {"budget_daily_usd": "5"}}},
     "key 'projects.shop.budget_daily_usd': expected a number"),
    ({"projects": {"shop": {"check_command": "make"}}},
     "key 'projects.shop.check_command': needs project.repository"),
    ({"projects": {"shop": {"base_branch": "feature/x"}}},
     "key 'projects.shop.base_branch': must name the integration branch"),
    ({"projects": {"shop": {"batch_patterns": ["("]}}},
     "key 'projects.shop.batch_patterns[0]': invalid regular expression"),
    ({"projects": {"shop": {"branch_policy": "trunk"}}},
     "key 'projects.shop.branch_policy': must be 'branch' or 'mainline', got 'trunk'"),
    ({"projects": {"shop": {"branch_policy": True}}},
     "key 'projects.shop.branch_policy': expected a string"),
    ({"projects": {"shop": {"interval_minutes": 5}}},
     "key 'projects.shop.interval_minutes': unknown key"),
    ({"instances": [{**INSTANCES[0], "roots": ["/a"]}]},
     "key 'instances[0].roots': with projects, each project names its roots per instance"),
])
def test_a_bad_shape_is_one_line_saying_where(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, projects(**changes))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_each_project_has_its_own_run_ceiling_and_discipline(tmp_path: Path) -> None:
    doc = projects(budget={"run_usd": 1.0}, patrol={"backlog_path": "pool.json"})
    doc["projects"]["blog"].update(budget_run_usd=0.25, discipline="Commit on trunk only.")
    doc["instances"][1]["budget_run_usd"] = 3.0
    cfg = load(tmp_path, doc)
    cfg.backlog_path.write_text(
        json.dumps({"schema_version": 1, "discipline": "The pool's rules.", "tasks": []}),
        encoding="utf-8")
    shop, blog = cfg.choose("shop"), cfg.choose("blog")
    # the instance's own ceiling, else the project's, else budget.run_usd
    assert [run_ceiling(blog, i) for i in blog.instances] == [0.25, 3.0]
    assert [run_ceiling(shop, i) for i in shop.instances] == [1.0, 3.0]
    assert run_ceiling(cfg, cfg.instances[0]) == 1.0  # seen as every project: the config's
    assert pool_discipline(OpsContext(blog)) == ("Commit on trunk only.", "")
    assert pool_discipline(OpsContext(shop)) == ("The pool's rules.", "")
    assert (blog.discipline_or("x"), shop.discipline_or("x"), cfg.discipline_or("x")) == (
        "Commit on trunk only.", "x", "x")
    assert cfg.choose("shop").choose("blog") == blog  # a view chosen from a view is the same
    one = load(tmp_path, {"project": {"name": "demo", "budget_run_usd": 0.5, "discipline": "d"},
                          "instances": [{**INSTANCES[0], "roots": ["/src/demo"]}]})
    assert (run_ceiling(one, one.instances[0]), one.discipline_or(None)) == (0.5, "d")


def test_each_project_may_set_the_branch_policy_an_instance_does_not(tmp_path: Path) -> None:
    doc = projects()
    doc["instances"].append({"name": "local-box", "url": "http://127.0.0.1:4098"})
    doc["projects"]["blog"]["branch_policy"] = "mainline"
    doc["projects"]["shop"]["branch_policy"] = "branch"
    doc["instances"][1]["branch_policy"] = "branch"
    cfg = load(tmp_path, doc)
    policies = {p: [i.branch_policy for i in cfg.choose(p).instances] for p in ("shop", "blog")}
    # the instance's own key, else the project's, else by the instance's name
    assert policies == {"shop": ["branch", "branch", "branch"],
                        "blog": ["mainline", "branch", "mainline"]}
    assert [i.branch_policy for i in cfg.instances] == ["branch", "branch", "mainline"]
    assert cfg.choose("shop").choose("blog") == cfg.choose("blog")
    one = load(tmp_path, {"project": {"name": "demo", "branch_policy": "mainline"},
                          "instances": [{**INSTANCES[0], "roots": ["/src/demo"]}]})
    assert one.instances[0].branch_policy == "mainline"
