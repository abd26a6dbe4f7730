"""The one count of an instance's load: every configured project's runs against the limit,
the chosen project's own against its share."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from xaf_hub.config.load import Config, LockConfig, load_config
from xaf_hub.core.records import SessionRecord
from xaf_hub.errors import UsageError
from xaf_hub.fleet.instance_scan import InstanceScan
from xaf_hub.ops.dispatch import project_for
from xaf_hub.ops.load import instance_load
from xaf_hub.store.gate import FileGate


def config(tmp_path: Path, limit: int = 3, share: int | None = 1) -> Config:
    shop: dict[str, object] = {"roots": {"dev": ["/src/shop"]}}
    if share is not None:
        shop["share"] = share
    doc = {
        "concurrency_limit": limit,
        "projects": {"shop": shop, "blog": {"roots": {"dev": ["/src/blog"], "lan": ["/srv/b"]}}},
        "instances": [
            {"name": "dev", "url": "http://127.0.0.1:1", "dir_aliases": {"/mnt/dev": "/src"}},
            {"name": "lan", "url": "http://127.0.0.1:2"},
        ],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return load_config(str(path), env={}, cwd=tmp_path)


def running(sid: str, directory: str, cfg: Config) -> SessionRecord:
    """A running session as the scan records it under ``cfg``'s chosen project."""
    inst = cfg.instances[0]
    return SessionRecord("dev", sid, sid, directory, running=True, run_state="busy",
                         project=inst.rules.is_project(directory), owner=inst.owner(directory))


def scan(cfg: Config, *directories: str) -> InstanceScan:
    sessions = [running(f"s{i}", d, cfg) for i, d in enumerate(directories)]
    return InstanceScan(cfg.instances[0], reachable=True, sessions=sessions)


def test_the_limit_counts_the_runs_of_every_configured_project(tmp_path: Path) -> None:
    blog = config(tmp_path, share=None).choose("blog")
    gate = FileGate(tmp_path, LockConfig())
    # two shop runs and one blog run on a server of limit 3: blog's dispatch finds it full
    load = instance_load(scan(blog, "/src/shop/a", "/src/shop/b", "/src/blog/x"), gate, True)
    assert (load.running_project, load.running_others, load.free) == (1, 2, 0)
    assert not load.dispatchable and load.reason == "full (3 running + 0 reserved)"
    # a session in no project's folder never counts
    load = instance_load(scan(blog, "/src/shop/a", "/tmp/elsewhere"), gate, True)
    assert (load.running_others, load.free, load.dispatchable) == (1, 2, True)
    # a run state read only as a guess counts the instance full
    guess = replace(scan(blog, "/src/blog/x"), run_state_unknown="version 'local'")
    assert instance_load(guess, gate, True).free == 0
    # another project's reservation takes a slot too
    gate.reserve("dev", project="shop")
    load = instance_load(scan(blog, "/src/shop/a"), gate, True)
    assert (load.reserved, load.reserved_own, load.free) == (1, 0, 1)


def test_a_share_caps_one_project_and_counts_its_reservations(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    shop, blog = cfg.choose("shop"), cfg.choose("blog")
    gate = FileGate(tmp_path, LockConfig())
    load = instance_load(scan(shop, "/src/shop/a"), gate, True)
    assert (load.share, load.free, load.dispatchable) == (1, 0, False)
    assert load.reason == "shop's share is used (1 of 1)"
    # the share leaves the other slots to blog
    assert instance_load(scan(blog, "/src/shop/a"), gate, True).free == 2
    # shop's reservation uses its share; blog's does not
    gate.reserve("dev", project="blog")
    assert instance_load(scan(shop), gate, True).free == 1
    gate.reserve("dev", project="shop")
    load = instance_load(scan(shop), gate, True)
    assert (load.reserved, load.reserved_own, load.free) == (2, 1, 0)


def test_seen_as_every_project_each_ones_runs_are_counted_apart(tmp_path: Path) -> None:
    cfg = config(tmp_path)  # several projects, none chosen
    gate = FileGate(tmp_path, LockConfig())
    gate.reserve("dev", project="shop")
    shares = [(p.name, p.share) for p in cfg.projects]
    sc = scan(cfg, "/src/shop/a", "/src/blog/x", "/src/blog/y", "/tmp/elsewhere")
    load = instance_load(sc, gate, True, shares=shares)
    rows = [(p.project, p.running, p.reserved, p.share, p.full) for p in load.projects]
    assert rows == [("shop", 1, 1, 1, True), ("blog", 2, 0, None, False), ("", 1, 0, None, False)]
    assert [p["project"] for p in load.to_json()["projects"]] == ["shop", "blog", None]
    # no runs of another folder: no "other" row; without shares, no rows at all
    assert [p.project for p in instance_load(scan(cfg), gate, True, shares=shares).projects] == [
        "shop", "blog"]
    assert instance_load(sc, gate, True).projects == ()


def test_a_dispatch_finds_its_project(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert project_for(cfg, "blog", None, None, "/") == "blog"
    assert project_for(cfg, None, "/src/blog/app", None, "/src/shop") == "blog"  # --dir first
    assert project_for(cfg, None, None, None, "/src/shop/app") == "shop"
    assert project_for(cfg, None, None, None, "/mnt/dev/shop/app") == "shop"  # dir_aliases
    assert project_for(cfg, None, None, "lan", "/srv/b/x") == "blog"
    assert project_for(cfg.choose("shop"), None, None, None, "/elsewhere") is None  # chosen
    with pytest.raises(UsageError, match=r"--dir \(/tmp\) is under no project's roots.*"
                       r"--project NAME \(configured: shop, blog\)"):
        project_for(cfg, None, "/tmp", None, "/src/shop")
    with pytest.raises(UsageError, match=r"the folder it is run from \(/src\) is under no"):
        project_for(cfg, None, None, None, "/src")
    with pytest.raises(UsageError, match="unknown instance 'nope'"):
        project_for(cfg, None, None, "nope", "/src/shop")
