"""Find (and when asked, delete) project sessions unused for longer than the TTL.

Only project sessions are considered. Running sessions, sessions whose last update time is
missing, and production instances (without ``allow_prod``) are skipped. A running session
is never deleted, and deletion aborts first in case a run started since the scan. Used by
``xaf-hub cleanup`` and ``dispatch --auto-cleanup``.
"""

from __future__ import annotations

import time
from typing import Any

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.records import SessionRecord
from xaf_hub.errors import HubError
from xaf_hub.fleet.scan import scan_fleet
from xaf_hub.ops.context import OpsContext


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


async def cleanup_fleet(
    ops: OpsContext, *, execute: bool, ttl_days: float, instance: str | None, allow_prod: bool
) -> dict[str, Any]:
    """Scan, pick stale sessions, and delete them when ``execute``; returns a report."""
    cfg = ops.cfg
    targets = [cfg.instance(instance)] if instance else list(cfg.instances)
    snap, scans = await scan_fleet(cfg, targets, transport_factory=ops.transport_factory)
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

        await _delete_all(ops, sc.inst, stale, entry, ttl_days)
    return report


async def _delete_all(
    ops: OpsContext,
    inst: InstanceConfig,
    rows: list[SessionRecord],
    entry: dict[str, Any],
    ttl_days: float,
) -> None:
    async with ops.client(inst) as client:
        for s in rows:
            try:
                await client.abort(s.id, s.directory)
                await client.delete(s.id, s.directory)
            except HubError as exc:
                entry["failed"].append({"id": s.id, "reason": str(exc)})
                ops.audit(
                    "cleanup",
                    instance=inst.name,
                    session=s.id,
                    result="failed",
                    reason=str(exc),
                )
                continue
            entry["deleted"].append(s.id)
            ops.audit(
                "cleanup",
                instance=inst.name,
                session=s.id,
                result="deleted",
                reason=f"idle for more than {ttl_days:g} days",
            )
