"""Find (and with --execute delete) project sessions unused for longer than the TTL.

Only project sessions are considered. Running sessions, sessions whose last update time is
missing, and production instances (without --allow-prod) are skipped. Without --execute
nothing is deleted; a running session is never deleted, and deletion aborts first in case
a run started since the scan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from xaf_hub.cli.commands._common import ALLOW_PROD, INSTANCE, scan_said
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import Tables, flag, opt
from xaf_hub.core import aio
from xaf_hub.core.clock import ago
from xaf_hub.core.records import prefix_width
from xaf_hub.core.text import shorten, shorten_left
from xaf_hub.errors import UsageError
from xaf_hub.ops.cleanup import cleanup_fleet

EXAMPLES = """\
examples:
  xaf-hub cleanup                      # preview: what would be deleted
  xaf-hub cleanup --ttl-days 30
  xaf-hub cleanup --execute            # really delete (cannot be undone)
  xaf-hub cleanup --instance lan-189 --execute
"""


def _worktrees(ctx: Context, report: dict[str, Any], execute: bool) -> None:
    """The worktrees of finished, failed and abandoned tasks: a table, then a line."""
    rows = [
        [e["instance"], w["task"] or "-", w["why"], shorten_left(w["directory"], 48), w["action"]]
        for e in report["instances"] for w in e.get("worktrees", ())
    ]
    if not rows:
        return
    ctx.table(rows, ["instance", "task", "why", "worktree", "action"],
              flexible=[("worktree", 12), ("action", 12)], keep_end=["worktree"])
    if not execute:
        ctx.out(f"{len(rows)} worktree(s) of tasks that are over; add --execute to remove them "
                "(one holding work no remote has is kept)")


def _action(entry: dict[str, Any], stale: dict[str, Any]) -> str:
    """What became of one stale session: deleted, FAILED or (a preview) would delete."""
    if stale["id"] in entry["deleted"]:
        return "deleted"
    return "FAILED" if any(f["id"] == stale["id"] for f in entry["failed"]) else "would delete"


@dataclass(frozen=True, kw_only=True)
class Options(Tables):
    """The options of `cleanup`."""

    ttl_days: float | None = opt("--ttl-days", help="stale after N days without an update "
                                 "(default: session_ttl_days)", metavar="N")
    execute: bool = flag("--execute", help="really delete (default: preview)")
    instance: str | None = INSTANCE.field()
    allow_prod: bool = ALLOW_PROD.field(help="include production instances")


def run(ctx: Context) -> int:
    """Preview or execute the cleanup."""

    opts = ctx.options(Options)
    ttl = ctx.config.session_ttl_days if opts.ttl_days is None else opts.ttl_days
    if ttl < 0:
        raise UsageError("--ttl-days must be 0 or more")

    report = aio.run(cleanup_fleet(ctx.ops(), execute=opts.execute, ttl_days=ttl,
                                   instance=opts.instance, allow_prod=opts.allow_prod))
    snap = report.pop("_snap")
    if ctx.json:
        ctx.answer(report)
    else:
        now = int(time.time() * 1000)
        stale = [{**s, "action": _action(e, s)} for e in report["instances"] for s in e["stale"]]
        if stale:
            ctx.columns(stale, {
                "instance": lambda s: s["instance"],
                "session": lambda s: s["id"],
                "updated": lambda s: ago(s["updated"], now),
                "title": lambda s: shorten(s["title"], 36),
                "directory": lambda s: shorten_left(s["directory"], 40),
                "action": lambda s: s["action"],
            }, flexible=[("directory", 10), ("instance", 10), ("title", 12)],
                keep_end=["directory"],
                keep={"session": prefix_width((s.id for s in snap.sessions),
                                              (s["id"] for s in stale))})
        total = len(stale)
        deleted = sum(len(e["deleted"]) for e in report["instances"])
        down = {u["instance"] for u in report["unreachable"]}
        for entry in report["instances"]:
            if entry["skipped"] and entry["instance"] not in down:
                ctx.info(f"{entry['instance']}: skipped: {entry['skipped']}")
            if entry["missing_time"]:
                ctx.info(f"{entry['instance']}: {entry['missing_time']} session(s) with no "
                         "update time skipped (never deleted)")
        if opts.execute:
            ctx.out(f"deleted {deleted} of {total} stale project session(s) (idle > {ttl:g} days)")
        else:
            ctx.out(f"{total} stale project session(s) (idle > {ttl:g} days); "
                    "nothing deleted - add --execute to delete them")
        _worktrees(ctx, report, opts.execute)
    code = scan_said(ctx, snap)
    if opts.instance and snap.unreachable:
        code = 2
    rooms = [w for e in report["instances"] for w in e.get("worktrees", ())]
    failed = any(e["failed"] for e in report["instances"]) or any(w["failed"] for w in rooms)
    return code if not failed else max(code, 1)
