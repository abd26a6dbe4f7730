"""What the planner's tests share (tests/unit/ops/test_planner.py, test_dispatch_match.py):
instances, a config of them and session records."""

from __future__ import annotations

from pathlib import Path

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core.records import SessionRecord, running_project
from xaf_hub.core.rules import ProjectRules
from xaf_hub.ops.load import free
from xaf_hub.ops.planner import InstanceView


def inst(
    name: str,
    *,
    limit: int = 2,
    danger: bool = False,
    roots: tuple[str, ...] = ("/srv/demo",),
    aliases: tuple[tuple[str, str], ...] = (),
) -> InstanceConfig:
    return InstanceConfig(
        name=name,
        url="http://127.0.0.1:1",
        roots=roots,
        danger=danger,
        concurrency_limit=limit,
        default_directory=roots[0] if roots else "",
        dir_aliases=aliases,
        rules=ProjectRules.build(roots=roots),
    )


def sess(
    instance: str,
    sid: str,
    title: str,
    *,
    running: bool = False,
    updated: int = 1,
    directory: str = "/srv/demo/app",
    project: bool = True,
) -> SessionRecord:
    return SessionRecord(
        instance=instance,
        id=sid,
        title=title,
        directory=directory,
        updated=updated,
        running=running,
        run_state="busy" if running else "idle",
        project=project,
    )


def view(
    i: InstanceConfig, *sessions: SessionRecord, reachable: bool = True, reserved: int = 0
) -> InstanceView:
    slots = free(i.concurrency_limit, running_project(sessions), reserved)
    return InstanceView(i, reachable, "" if reachable else "connection refused", sessions, reserved,
                        free=slots)


def config(*instances: InstanceConfig) -> Config:
    return Config(path=None, home=Path("/h"), state_dir=Path("/h"), instances=instances)


A, B, P = inst("lan-a"), inst("lan-b"), inst("prod-p", danger=True)
CFG = config(A, B, P)
