"""Show load and whether each instance can take new work (running, reserved, limit)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xaf_hub.commands._common import (
    add_json,
    chosen_instances,
    report_unreachable,
    scan,
    scan_exit,
)
from xaf_hub.config import Config
from xaf_hub.context import Context
from xaf_hub.errors import UnreachableError
from xaf_hub.gate import Gate, make_gate
from xaf_hub.output import dumps, table

if TYPE_CHECKING:
    from xaf_hub.scan import InstanceScan

EXAMPLES = """\
examples:
  xaf-hub status
  xaf-hub status --json
  xaf-hub status --allow-prod     # count production instances as dispatchable
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `status`."""
    add_json(p)
    p.add_argument("--instance", metavar="NAME", help="only this instance")
    p.add_argument(
        "--allow-prod",
        action="store_true",
        help="treat production instances as dispatchable (display only)",
    )


@dataclass(frozen=True)
class Load:
    """The gate's view of one instance."""

    instance: str
    reachable: bool
    running_total: int
    running_project: int
    reserved: int | None  # None: the shared gate (Redis) could not be read
    project_sessions: int
    limit: int
    dispatchable: bool
    reason: str

    def to_json(self) -> dict[str, Any]:
        """Export form."""
        return dict(self.__dict__)


def instance_load(cfg: Config, gate: Gate | None, sc: InstanceScan, allow_prod: bool) -> Load:
    """Apply the dispatchable rule to one scanned instance (``gate`` None: reservations unknown)."""
    summary = sc.summary()
    running_ids = {s.id for s in sc.sessions if s.running}
    reserved: int | None = 0
    if sc.reachable:
        reserved = None if gate is None else len(gate.pending(sc.inst.name, running_ids))
    used = summary.running_project + (reserved or 0)
    if not sc.reachable:
        ok, reason = False, f"unreachable: {sc.reason}"
    elif sc.inst.production and not allow_prod:
        ok, reason = False, "production instance (needs --allow-prod)"
    elif used >= summary.limit:
        shown = "?" if reserved is None else reserved
        ok, reason = False, f"full ({summary.running_project} running + {shown} reserved)"
    elif reserved is None:
        ok, reason = False, "reservations unknown (the shared gate is unreachable)"
    else:
        ok, reason = True, f"{summary.limit - used} free slot(s)"
    return Load(
        sc.inst.name,
        sc.reachable,
        summary.running_total,
        summary.running_project,
        reserved,
        summary.project_sessions,
        summary.limit,
        ok,
        reason,
    )


def run(ctx: Context) -> int:
    """Scan and print the load table."""
    cfg = ctx.config
    snap, scans = scan(ctx, chosen_instances(ctx))
    gate = make_gate(cfg)
    try:
        loads = [instance_load(cfg, gate, sc, ctx.args.allow_prod) for sc in scans]
    except UnreachableError as exc:
        # status only reads: without the shared gate, show the rest with reservations unknown.
        ctx.warn(f"reservations unknown: {exc}")
        loads = [instance_load(cfg, None, sc, ctx.args.allow_prod) for sc in scans]
    if ctx.json:
        ctx.out(
            dumps({"generated_at": snap.generated_at, "instances": [x.to_json() for x in loads]})
        )
        return scan_exit(snap)
    rows = [
        [
            x.instance,
            x.running_total if x.reachable else "-",
            x.running_project if x.reachable else "-",
            "?" if x.reserved is None else x.reserved,
            x.project_sessions if x.reachable else "-",
            x.limit,
            "yes" if x.dispatchable else "no",
            x.reason,
        ]
        for x in loads
    ]
    ctx.out(
        table(
            rows,
            [
                "instance",
                "running",
                "running project",
                "reserved",
                "project sessions",
                "limit",
                "dispatchable",
                "reason",
            ],
        )
    )
    report_unreachable(ctx, snap)
    return scan_exit(snap)
