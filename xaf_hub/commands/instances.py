"""Show every configured instance: reachable or why not, version, sessions and running counts."""

from __future__ import annotations

import argparse

from xaf_hub.commands._common import (
    add_json,
    chosen_instances,
    report_missing_passwords,
    scan,
    scan_exit,
)
from xaf_hub.context import Context
from xaf_hub.output import dumps, table

EXAMPLES = """\
examples:
  xaf-hub instances
  xaf-hub instances --json | jq '.[] | select(.reachable | not)'
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `instances`."""
    add_json(p)
    p.add_argument("--instance", metavar="NAME", help="only this instance")


def run(ctx: Context) -> int:
    """Scan and print one row per instance."""
    snap, _ = scan(ctx, chosen_instances(ctx))
    if ctx.json:
        ctx.out(dumps([i.to_json() for i in snap.instances]))
        report_missing_passwords(ctx, snap)
        return scan_exit(snap)
    rows = []
    for i in snap.instances:
        notes = ["production: writes need --allow-prod"] if i.danger else []
        notes += [i.note] if i.note else []
        note = "; ".join(notes)
        rows.append(
            [
                i.name,
                i.url,
                "ok" if i.reachable else f"UNREACHABLE: {i.reason}",
                i.version or "-",
                i.total_sessions if i.reachable else "-",
                i.project_sessions if i.reachable else "-",
                f"{i.running_total}/{i.running_project}" if i.reachable else "-",
                i.limit,
                note,
            ]
        )
    headers = [
        "instance",
        "url",
        "state",
        "version",
        "sessions",
        "project",
        "running (all/project)",
        "limit",
        "note",
    ]
    ctx.out(table(rows, headers))
    for w in snap.warnings:
        ctx.warn(w)
    report_missing_passwords(ctx, snap)
    return scan_exit(snap)
