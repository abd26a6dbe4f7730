"""Find (and when asked, delete) project sessions unused for longer than the TTL, and the
worktrees of tasks that finished, failed or were abandoned.

A running session, one with no update time and a production instance (without ``allow_prod``)
are skipped, and a delete aborts first; a worktree goes only when nothing of it would be lost
(``rooms.what_stays``) and no run works in it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.records import Room, SessionRecord
from xaf_hub.errors import HubError
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.rooms import close_room, what_stays
from xaf_hub.store.tasks import Task


def stale_sessions(
    sessions: list[SessionRecord], *, now_ms: int, ttl_days: float
) -> tuple[list[SessionRecord], int]:
    """Idle project sessions older than the TTL; also the count skipped for a missing time."""
    cutoff = now_ms - int(ttl_days * 86400 * 1000)
    idle = [s for s in sessions if s.project and not s.running]
    stale = sorted((s for s in idle if 0 < s.updated < cutoff), key=lambda s: s.updated)
    return stale, sum(1 for s in idle if s.updated <= 0)


async def cleanup_fleet(
    ops: OpsContext, *, execute: bool, ttl_days: float, instance: str | None, allow_prod: bool
) -> dict[str, Any]:
    """Scan, pick stale sessions, and delete them when ``execute``; returns a report."""
    snap, scans = await ops.scan_named(instance)
    now = int(time.time() * 1000)
    report: dict[str, Any] = {"ttl_days": ttl_days, "execute": execute, "instances": [],
                              "unreachable": snap.unreachable, "_snap": snap}
    for sc in scans:
        entry: dict[str, Any] = {"instance": sc.inst.name, "skipped": "", "stale": [],
                                 "deleted": [], "failed": [], "missing_time": 0}
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
        entry["worktrees"] = await _rooms(ops, sc.inst, sc.sessions, execute)
        if not execute or not stale:
            continue
        async with ops.client(sc.inst) as client:
            for s in stale:
                try:
                    await client.abort(s.id, s.directory)
                    await client.delete(s.id, s.directory)
                except HubError as exc:
                    entry["failed"].append({"id": s.id, "reason": str(exc)})
                    result, reason = "failed", str(exc)
                else:
                    entry["deleted"].append(s.id)
                    result, reason = "deleted", f"idle for more than {ttl_days:g} days"
                await aio.blocking(ops.audit, "cleanup", instance=sc.inst.name, session=s.id,
                                   result=result, reason=reason)
    return report


def room_verdict(task: Task | None) -> str:
    """Why a worktree may go: "finished", "failed" (its task went back to the pool) or
    "abandoned" (no task has it); "" while its task still works or waits to land (pure)."""
    if task is None:
        return "abandoned"
    if task.landing in ("landed", "dropped") or task.status == "done":
        return "finished"
    return "failed" if task.status == "pending" else ""


async def _rooms(
    ops: OpsContext, inst: InstanceConfig, sessions: list[SessionRecord], execute: bool
) -> list[dict[str, Any]]:
    """The worktrees opencode keeps of the instance's checkout that may go, removed with
    ``execute`` when nothing of theirs would be lost."""
    checkout = inst.default_directory or (inst.roots[0] if inst.roots else "")
    if not checkout:
        return []
    tasks = (await aio.blocking(ops.backlog().load)).tasks
    busy = {s.directory for s in sessions if s.running}
    out: list[dict[str, Any]] = []
    async with ops.client(inst) as client:
        try:
            folders = await client.worktrees(checkout)
        except HubError:
            return []  # a server without worktrees: nothing of this kind to clean
        for folder in folders:
            task = next(
                (t for t in tasks if t.worktree == folder and t.dispatched_to == inst.name), None
            )
            why = room_verdict(task)
            if not why or folder in busy:
                continue
            item: dict[str, Any] = {"directory": folder, "task": task.id if task else None,
                                    "why": why, "action": "would remove", "failed": False}
            out.append(item)
            if not execute:
                continue
            try:
                stays = await what_stays(client, folder)
            except HubError as exc:
                stays = f"could not ask ({exc})"
            if stays:
                item["action"] = f"kept: {stays}"
                continue
            left = await close_room(client, Room(folder, "", checkout))
            if left:
                item["action"], item["failed"] = f"FAILED: {left}", True
                continue
            item["action"] = "removed"
            if task is not None:
                with contextlib.suppress(HubError):
                    await aio.blocking(ops.backlog().revise, task, worktree=None)
            await aio.blocking(ops.audit, "cleanup", instance=inst.name, session="",
                               result="removed", reason=f"worktree {folder} ({item['why']})")
    return out
