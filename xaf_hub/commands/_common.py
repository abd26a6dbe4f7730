"""Pieces several commands share: instance selection, scanning, scan exit codes."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from xaf_hub import aio
from xaf_hub.config import InstanceConfig
from xaf_hub.context import Context
from xaf_hub.errors import ExitCode, HubError, UnreachableError, UsageError
from xaf_hub.records import Snapshot

if TYPE_CHECKING:  # the scanner pulls in httpx; --help must stay light
    from xaf_hub.scan import InstanceScan


def add_json(p: argparse.ArgumentParser) -> None:
    """Add --json."""
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def add_instance(p: argparse.ArgumentParser, what: str = "only this instance") -> None:
    """Add --instance NAME."""
    p.add_argument("--instance", metavar="NAME", help=what)


def chosen_instances(ctx: Context) -> list[InstanceConfig]:
    """All instances, or the one named by --instance (UsageError when unknown)."""
    name = getattr(ctx.args, "instance", None)
    cfg = ctx.config
    if name:
        return [cfg.instance(name)]
    return list(cfg.instances)


def scan(
    ctx: Context,
    instances: list[InstanceConfig],
    *,
    outcomes: bool = False,
    project_only: bool = False,
) -> tuple[Snapshot, list[InstanceScan]]:
    """Scan the given instances; with ``outcomes`` also fetch each project session's last result."""

    from xaf_hub.scan import fill_outcomes, scan_fleet

    async def go() -> tuple[Snapshot, list[InstanceScan]]:
        snap, scans = await scan_fleet(
            ctx.config,
            instances,
            transport_factory=ctx.transport_factory,
            project_only=project_only,
        )
        if outcomes:
            snap = await fill_outcomes(ctx.config, scans, ctx.transport_factory)
        return snap, scans

    return aio.run(go())


def report_unreachable(ctx: Context, snap: Snapshot) -> None:
    """One stderr line per instance that did not answer, and any fail-closed warnings."""
    for item in snap.unreachable:
        ctx.warn(f"{item['instance']} unreachable: {item['reason']}")
    for w in snap.warnings:
        ctx.warn(w)


def session_not_found(
    session_id: str, down: list[tuple[str, str]], instance: str | None = None
) -> HubError:
    """The error for a session no instance answered for; ``down`` = (instance, reason) pairs.

    While any instance did not answer, "not found" is not known: that is exit 2 (unreachable)
    naming where the session may be, not exit 4. ``instance``: the one asked (--instance).
    """
    if not down:
        return UsageError(f"session {session_id} not found on {instance or 'any instance'}")
    names = ", ".join(name for name, _ in down)
    reason = down[0][1] if len(down) == 1 else "; ".join(f"{n}: {r}" for n, r in down)
    return UnreachableError(
        names, f"{reason} (session {session_id} was not found where asked; it may be there)"
    )


def scan_exit(snap: Snapshot) -> int:
    """0 when at least one instance answered, 2 when none did (or the only one asked)."""
    if not snap.instances:
        return int(ExitCode.OK)
    if any(i.reachable for i in snap.instances):
        return int(ExitCode.OK)
    return int(ExitCode.UNREACHABLE)
