"""Show every configured instance: reachable or why not, version, sessions and running counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xaf_hub.cli.commands._common import INSTANCE, chosen_instances, scan, scan_said
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import Tables
from xaf_hub.cli.termfit import state_color
from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.records import InstanceSummary, Snapshot
from xaf_hub.errors import HubError

EXAMPLES = """\
examples:
  xaf-hub instances
  xaf-hub instances --json | jq '.[] | select(.reachable | not)'
"""


@dataclass(frozen=True, kw_only=True)
class Options(Tables):
    """The options of `instances`."""

    instance: str | None = INSTANCE.field()


def read(ctx: Context, opts: Options) -> tuple[list[dict[str, Any]], Snapshot]:
    """Scan; what `instances --json` prints (and the MCP tool answers), and the scan. With
    ``project.isolation: "worktree"`` each answering server also says whether it gives tasks
    worktrees of their own (``worktrees``) and why not."""
    ctx.see_every_project()
    chosen = chosen_instances(ctx, opts.instance)
    snap, _ = scan(ctx, chosen, progress=True)
    doc = [i.to_json() for i in snap.instances]
    if ctx.config.repository.isolation == "worktree":
        up = [inst for inst, i in zip(chosen, snap.instances, strict=True) if i.reachable]
        why = aio.run(_room_support(ctx, up))
        for row in doc:
            if (note := why.get(row["name"])) is not None:
                row.update(worktrees=not note, worktrees_note=note or None)
    return doc, snap


async def _room_support(ctx: Context, instances: list[InstanceConfig]) -> dict[str, str]:
    from xaf_hub.ops.rooms import room_support  # deferred: start-up, docs/performance.md

    ops = ctx.ops()

    async def one(inst: InstanceConfig) -> tuple[str, str]:
        async with ops.client(inst) as client:
            try:
                return inst.name, await room_support(client, inst)
            except HubError as exc:
                return inst.name, f"could not ask ({exc})"

    return dict(await aio.gather(*(one(i) for i in instances)))


def run(ctx: Context) -> int:
    """Scan and print one row per instance."""
    doc, snap = read(ctx, ctx.options(Options))
    if ctx.json:
        ctx.answer(doc)
        return scan_said(ctx, snap, unreachable=False)
    rooms = {row["name"]: row.get("worktrees_note") for row in doc if "worktrees" in row}

    def note(i: InstanceSummary) -> str:
        notes = ["production: writes need --allow-prod"] if i.danger else []
        notes += [i.note] if i.note else []
        if rooms.get(i.name):
            notes.append(f"no worktrees ({rooms[i.name]}): tasks share its checkout")
        return "; ".join(notes)

    ctx.columns(snap.instances, {
        "instance": lambda i: i.name,
        "url": lambda i: i.url,
        "state": lambda i: "ok" if i.reachable else f"UNREACHABLE: {i.reason}",
        "version": lambda i: i.version or "-",
        "sessions": lambda i: i.total_sessions if i.reachable else "-",
        "project": lambda i: i.project_sessions if i.reachable else "-",
        "running (all/project)":
            lambda i: f"{i.running_total}/{i.running_project}" if i.reachable else "-",
        "limit": lambda i: i.limit,
        "note": note,
    }, flexible=[("note", 8), ("state", 14), ("running (all/project)", 7), ("instance", 10),
                 ("url", 15)],
        keep_end=["url"],  # the host's end and the port tell servers apart
        colors={"state": state_color})
    for w in snap.warnings:
        ctx.warn(w)
    return scan_said(ctx, snap, unreachable=False)
