"""Find (and with --execute delete) project sessions unused for longer than the TTL.

Only project sessions are considered. Running sessions, sessions whose last update time is
missing, and production instances (without --allow-prod) are skipped. Without --execute
nothing is deleted; a running session is never deleted, and deletion aborts first in case
a run started since the scan.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from xaf_hub import aio
from xaf_hub.commands._common import add_json, report_unreachable, scan, scan_exit
from xaf_hub.context import Context
from xaf_hub.output import ago, dumps, shorten, shorten_left, table
from xaf_hub.records import SessionRecord

EXAMPLES = """\
examples:
  xaf-hub cleanup                      # preview: what would be deleted
  xaf-hub cleanup --ttl-days 30
  xaf-hub cleanup --execute            # really delete (cannot be undone)
  xaf-hub cleanup --instance lan-189 --execute
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `cleanup`."""
    add_json(p)
    p.add_argument(
        "--ttl-days",
        type=float,
        metavar="N",
        help="stale after N days without an update (default: session_ttl_days)",
    )
    p.add_argument("--execute", action="store_true", help="really delete (default: preview)")
    p.add_argument("--instance", metavar="NAME", help="only this instance")
    p.add_argument("--allow-prod", action="store_true", help="include production instances")


def stale_sessions(
    sessions: list[SessionRecord], *, now_ms: int, ttl_days: float
) -> tuple[list[SessionRecord], int]:
    """Idle project sessions older than the TTL; also the count skipped for a missing time."""
    cutoff = now_ms - int(ttl_days * 86400 * 1000)
    stale, missing = [], 0
    for s in sessions:
        if not s.project or s.running:
            continue
        if s.updated <= 0:
            missing += 1
            continue
        if s.updated < cutoff:
            stale.append(s)
    return sorted(stale, key=lambda s: s.updated), missing


def cleanup_fleet(
    ctx: Context, *, execute: bool, ttl_days: float, instance: str | None, allow_prod: bool
) -> dict[str, Any]:
    """Scan, pick stale sessions, and delete them when ``execute``; returns a report."""
    from xaf_hub import audit
    from xaf_hub.errors import HubError
    from xaf_hub.scan import make_client

    cfg = ctx.config
    targets = [cfg.instance(instance)] if instance else list(cfg.instances)
    snap, scans = scan(ctx, targets)
    now = int(time.time() * 1000)
    report: dict[str, Any] = {
        "ttl_days": ttl_days,
        "execute": execute,
        "instances": [],
        "unreachable": snap.unreachable,
        "_snap": snap,
    }
    for sc in scans:
        entry: dict[str, Any] = {
            "instance": sc.inst.name,
            "skipped": "",
            "stale": [],
            "deleted": [],
            "failed": [],
            "missing_time": 0,
        }
        report["instances"].append(entry)
        if not sc.reachable:
            entry["skipped"] = f"unreachable: {sc.reason}"
            continue
        if sc.inst.production and not allow_prod:
            entry["skipped"] = "production instance (needs --allow-prod)"
            continue
        stale, missing = stale_sessions(sc.sessions, now_ms=now, ttl_days=ttl_days)
        entry["missing_time"] = missing
        entry["stale"] = [s.to_json() for s in stale]
        if not execute or not stale:
            continue

        async def delete_all(
            inst: Any = sc.inst, rows: list[SessionRecord] = stale, entry: dict[str, Any] = entry
        ) -> None:
            transport = ctx.transport_factory(inst) if ctx.transport_factory else None
            async with make_client(cfg, inst, transport) as client:
                for s in rows:
                    try:
                        await client.abort(s.id)
                        await client.delete(s.id)
                    except HubError as exc:
                        entry["failed"].append({"id": s.id, "reason": str(exc)})
                        audit.append(
                            cfg.state_dir,
                            command="cleanup",
                            instance=inst.name,
                            session=s.id,
                            result="failed",
                            reason=str(exc),
                            env=ctx.env,
                        )
                        continue
                    entry["deleted"].append(s.id)
                    audit.append(
                        cfg.state_dir,
                        command="cleanup",
                        instance=inst.name,
                        session=s.id,
                        result="deleted",
                        reason=f"idle for more than {ttl_days:g} days",
                        env=ctx.env,
                    )

        aio.run(delete_all())
    return report


def run(ctx: Context) -> int:
    """Preview or execute the cleanup."""
    from xaf_hub.errors import UsageError

    args = ctx.args
    ttl = ctx.config.session_ttl_days if args.ttl_days is None else args.ttl_days
    if ttl < 0:
        raise UsageError("--ttl-days must be 0 or more")
    report = cleanup_fleet(
        ctx, execute=args.execute, ttl_days=ttl, instance=args.instance, allow_prod=args.allow_prod
    )
    snap = report.pop("_snap")
    if ctx.json:
        ctx.out(dumps(report))
    else:
        now = int(time.time() * 1000)
        rows = []
        for entry in report["instances"]:
            for s in entry["stale"]:
                state = (
                    "deleted"
                    if s["id"] in entry["deleted"]
                    else "FAILED"
                    if any(f["id"] == s["id"] for f in entry["failed"])
                    else "would delete"
                )
                rows.append(
                    [
                        entry["instance"],
                        s["id"],
                        ago(s["updated"], now),
                        shorten(s["title"], 36),
                        shorten_left(s["directory"], 40),
                        state,
                    ]
                )
        if rows:
            ctx.out(table(rows, ["instance", "session", "updated", "title", "directory", "action"]))
        total = sum(len(e["stale"]) for e in report["instances"])
        deleted = sum(len(e["deleted"]) for e in report["instances"])
        for entry in report["instances"]:
            if entry["skipped"] and not entry["skipped"].startswith("unreachable"):
                ctx.info(f"{entry['instance']}: skipped: {entry['skipped']}")
            if entry["missing_time"]:
                ctx.info(
                    f"{entry['instance']}: {entry['missing_time']} session(s) with no "
                    "update time skipped (never deleted)"
                )
        if args.execute:
            ctx.out(f"deleted {deleted} of {total} stale project session(s) (idle > {ttl:g} days)")
        else:
            ctx.out(
                f"{total} stale project session(s) (idle > {ttl:g} days); "
                "nothing deleted - add --execute to delete them"
            )
    report_unreachable(ctx, snap)
    failed = any(e["failed"] for e in report["instances"])
    code = scan_exit(snap)
    if args.instance and snap.unreachable:
        code = 2
    return code if not failed else max(code, 1)
