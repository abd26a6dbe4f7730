"""Patrol job 3: add pending tasks found in design documents to the pool (architecture §8).

``design_scan.scan_dirs`` reads ``patrol.design_dirs`` under ``patrol.repo_root`` (default:
the config file's folder); ``merge_design_tasks`` keeps only rows the pool does not know yet.
Only ``pending`` tasks are added, none is ever closed, and the pool file is written only when
something was added — when nothing is found it is not even created.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from xaf_hub.core import aio
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.context import Cycle
from xaf_hub.patrol.design_scan import (
    DEFAULT_BATCH_PATTERNS,
    DEFAULT_ENGLISH_MARKERS,
    DEFAULT_PENDING_MARKERS,
    DesignTask,
    merge_design_tasks,
    scan_dirs,
)
from xaf_hub.store.tasks import Task, of_project

STEP = "sync_design_tasks"


def design_markers(configured: Sequence[str]) -> tuple[str, ...]:
    """The Chinese/⏳ markers always, plus the configured English ones (default set if none)."""
    extra = tuple(configured) if configured else DEFAULT_ENGLISH_MARKERS
    return tuple(dict.fromkeys(DEFAULT_PENDING_MARKERS + extra))


async def sync_design_tasks(pctx: OpsContext, cycle: Cycle) -> None:
    """Scan the design folders and add the new pending rows to the task pool."""
    cfg = pctx.cfg
    now = pctx.now()
    root = pctx.repo_root

    def unreadable(path: Path, exc: OSError) -> None:
        cycle.log.error(pctx, STEP, f"cannot read {path}: {exc.strerror or exc}")

    found: list[DesignTask] = scan_dirs(
        [Path(d) for d in cfg.patrol.design_dirs],
        root,
        now,
        cfg.patrol.design_max_age_days,
        design_markers(cfg.patrol.pending_markers),
        tuple(cfg.patrol.batch_patterns) or DEFAULT_BATCH_PATTERNS,  # the configured, else these
        on_error=unreadable,
    )
    if not found:
        return
    backlog = pctx.backlog()
    names = [p.name for p in cfg.projects]

    def merged(tasks: list[Task]) -> list[Task]:
        return merge_design_tasks(tasks, found, now, project=cfg.project_name,
                                  mine=lambda t: bool(of_project([t], cfg.project_name, names)))

    # A cheap unlocked look first: update_json would create the file even with nothing to add.
    if not merged((await aio.blocking(backlog.load)).tasks):
        return

    added = await aio.blocking(backlog.update, lambda data: data.extend(merged(data.tasks)))
    if not added:
        return
    await aio.blocking(
        pctx.audit,
        "patrol.sync_design",
        result="added",
        reason=f"{len(added)} task(s) from design docs",
        extra={"tasks": [t.id for t in added]},
    )
    for task in added:
        cycle.log.add(pctx, STEP, "add", "ok", task, detail=task.spec)
