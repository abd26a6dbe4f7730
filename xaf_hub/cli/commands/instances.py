"""Show every configured instance: reachable or why not, version, sessions and running counts."""

from __future__ import annotations

import argparse

from xaf_hub.cli.commands._common import (
    add_json,
    add_wide,
    chosen_instances,
    report_missing_passwords,
    scan,
    scan_exit,
)
from xaf_hub.cli.context import Context
from xaf_hub.cli.termfit import state_color
from xaf_hub.core.text import dumps

EXAMPLES = """\
examples:
  xaf-hub instances
  xaf-hub instances --json | jq '.[] | select(.reachable | not)'
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `instances`."""
    add_json(p)
    add_wide(p)
    p.add_argument("-i", "--instance", metavar="NAME", help="only this instance")


def run(ctx: Context) -> int:
    """Scan and print one row per instance."""
    snap, _ = scan(ctx, chosen_instances(ctx), progress=True)
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
    ctx.table(
        rows,
        headers,
        flexible=[
            ("note", 8),
            ("running (all/project)", 7),
            ("url", 12),
            ("state", 14),
            ("instance", 10),
        ],
        colors={"state": state_color},
    )
    for w in snap.warnings:
        ctx.warn(w)
    report_missing_passwords(ctx, snap)
    return scan_exit(snap)
