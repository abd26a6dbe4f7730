"""Show every configured instance: reachable or why not, version, sessions and running counts."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from xaf_hub.cli.commands._common import (
    INSTANCE,
    add_json,
    add_wide,
    chosen_instances,
    report_missing_passwords,
    scan,
    scan_exit,
)
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import add_options
from xaf_hub.cli.termfit import state_color
from xaf_hub.core.records import Snapshot
from xaf_hub.core.text import dumps

EXAMPLES = """\
examples:
  xaf-hub instances
  xaf-hub instances --json | jq '.[] | select(.reachable | not)'
"""


OPTIONS = (INSTANCE,)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `instances`."""
    add_json(p)
    add_wide(p)
    add_options(p, OPTIONS)


@dataclass(frozen=True)
class Options:
    """What `instances` reads of its options."""

    instance: str | None


def read(ctx: Context, opts: Options) -> tuple[list[dict[str, Any]], Snapshot]:
    """Scan; what `instances --json` prints (and the MCP tool answers), and the scan."""
    snap, _ = scan(ctx, chosen_instances(ctx, opts.instance), progress=True)
    return [i.to_json() for i in snap.instances], snap


def run(ctx: Context) -> int:
    """Scan and print one row per instance."""
    doc, snap = read(ctx, ctx.options(Options))
    if ctx.json:
        ctx.out(dumps(doc))
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
            ("state", 14),
            ("running (all/project)", 7),
            ("instance", 10),
            ("url", 15),
        ],
        keep_end=["url"],  # the host's end and the port tell servers apart
        colors={"state": state_color},
    )
    for w in snap.warnings:
        ctx.warn(w)
    report_missing_passwords(ctx, snap)
    return scan_exit(snap)
