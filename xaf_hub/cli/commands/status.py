"""Show load, spend today against the daily budgets, and whether each instance can take new work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from xaf_hub.cli.commands._common import (
    ALLOW_PROD,
    FRESH,
    INSTANCE,
    chosen_instances,
    read_fleet,
    scan_said,
)
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import Tables
from xaf_hub.cli.termfit import yes_no_color
from xaf_hub.core.clock import iso_time
from xaf_hub.core.records import SessionRecord, Snapshot, Tally
from xaf_hub.errors import HubError, UnreachableError
from xaf_hub.ops import budget
from xaf_hub.ops.load import Load, instance_load
from xaf_hub.ops.queue import queue_length

if TYPE_CHECKING:  # a type only: `status --help` loads no HTTP client
    from xaf_hub.fleet.scan import InstanceScan

EXAMPLES = """\
examples:
  xaf-hub status
  xaf-hub status --json
  xaf-hub status --allow-prod     # count production instances as dispatchable
  xaf-hub status --fresh          # scan every instance, even with a live board

A patrol daemon or `serve` that follows the fleet publishes what it sees (the live
board); status takes each instance from it when it is at most
patrol.live_board_seconds old (default 15) and scans the others.
"""


@dataclass(frozen=True, kw_only=True)
class Options(Tables):
    """The options of `status`."""

    instance: str | None = INSTANCE.field()
    allow_prod: bool = ALLOW_PROD.field(
        help="treat production instances as dispatchable (display only)")
    fresh: bool = FRESH.field()


@dataclass(frozen=True)
class Measured:
    """The fleet's load and spend as `status` reads them."""

    snap: Snapshot
    loads: list[Load]
    spends: list[budget.BudgetLine]
    project: budget.BudgetLine
    queued: int | None
    whole: bool  # every instance asked: the project's spend is known
    every: bool  # seen as every project, or the config's one project
    overall: float | None = None  # budget.daily_usd

    @property
    def fleet(self) -> bool:
        """The spend seen is every configured project's on every instance (one project: its)."""
        return self.whole and self.every


def measure(ctx: Context, opts: Options) -> Measured:
    """Scan, count load and reservations, spend against the budgets and the pool's queue."""
    cfg = ctx.config
    # From the board's summaries: the running sessions and each instance's tally, not the
    # idle sessions, so a large fleet reads fast.
    snap, scans = read_fleet(
        ctx, chosen_instances(ctx, opts.instance), fresh=opts.fresh, progress=True, summary=True
    )
    gate = ctx.stores.gate()
    # Seen as every project: each one's runs on each server, and its share.
    shares = [] if cfg.chosen else [(p.name, p.share) for p in cfg.projects]
    try:
        loads = [instance_load(sc, gate, opts.allow_prod, shares=shares) for sc in scans]
    except UnreachableError as exc:
        # status only reads: without the shared gate, show the rest with reservations unknown.
        ctx.warn(f"reservations unknown: {exc}")
        loads = [instance_load(sc, None, opts.allow_prod, shares=shares) for sc in scans]
    now = datetime.now(UTC)
    # Pending pool tasks ready to start (None, with a warning, when the pool is unreadable).
    # The pool alone: no operations context, so `status` from the live board loads no client.
    try:
        queued: int | None = queue_length(ctx.stores.pool().load(), now)
    except HubError as exc:
        ctx.warn(f"queue unknown: {exc}")
        queued = None
    project, spends = budget.budget_lines(cfg, [(sc.inst, _spent_from(sc)) for sc in scans], now)
    loads = [_over_budget(ctx, x, sc, line, project)
             for x, sc, line in zip(loads, scans, spends, strict=True)]
    return Measured(snap, loads, spends, project, queued, opts.instance is None,
                    not cfg.chosen or len(cfg.projects) == 1, cfg.budget.daily_usd)


def document(m: Measured) -> dict[str, Any]:
    """What `status --json` prints (and the MCP tool answers)."""
    return {
        "generated_at": iso_time(m.snap.generated_at),
        "generated_at_ms": m.snap.generated_at,
        "instances": [
            {**x.to_json(), **line.to_json()} for x, line in zip(m.loads, m.spends, strict=True)
        ],
        "queue": {"pending": m.queued},
        # The project's spend (null: the view does not see the whole fleet); "project" is its
        # name, as in every record (Context.named).
        "spend": m.project.to_json() if m.whole else None,
        # Every configured project's spend against budget.daily_usd (null: not seen here).
        "fleet": {**m.project.to_json(), "budget_daily_usd": m.overall} if m.fleet else None,
        "warnings": list(m.snap.warnings),
        # Where the numbers come from: the live board (with its age) or a scan just now.
        **m.snap.source_json(),
    }


def run(ctx: Context) -> int:
    """Scan and print the load table."""
    ctx.see_every_project()
    m = measure(ctx, ctx.options(Options))
    if ctx.json:
        ctx.answer(document(m))
        return scan_said(ctx, m.snap, unreachable=False)
    spent = {x.instance: _spent_cell(line) for x, line in zip(m.loads, m.spends, strict=True)}
    ctx.columns(m.loads, {
        "instance": lambda x: x.instance,
        "running": lambda x: x.running_total if x.reachable else "-",
        "running project": lambda x: x.running_project if x.reachable else "-",
        "reserved": lambda x: "?" if x.reserved is None else x.reserved,
        "project sessions": lambda x: x.project_sessions if x.reachable else "-",
        "limit": lambda x: x.limit,
        "spent today": lambda x: spent[x.instance],
        "takes work": lambda x: "yes" if x.dispatchable else "no",
        "reason": lambda x: x.reason,
    }, flexible=[("reason", 16), ("project sessions", 8), ("running project", 8)],
        colors={"takes work": yes_no_color})
    projects = [(x, p) for x in m.loads for p in x.projects]
    if projects:
        ctx.table(
            [[x.instance, p.project or "other", p.running,
              "?" if x.reserved is None else p.reserved, "-" if p.share is None else p.share,
              "-" if not p.project else "yes" if x.dispatchable and not p.full else "no"]
             for x, p in projects],
            ["instance", "project", "running", "reserved", "share", "takes work"],
            colors={"takes work": yes_no_color},
        )
    if m.fleet and len(ctx.config.projects) > 1:
        ctx.out(f"spend, all projects: {replace(m.project, budget=m.overall).text()}")
    elif m.whole:
        ctx.out(f"project spend: {m.project.text()}")
    if m.queued:
        ctx.out(f"queue: {m.queued} task(s) waiting in the pool for a free slot")
    if m.snap.live:
        ctx.out(f"source: {m.snap.source_words()} (--fresh scans)")
    return scan_said(ctx, m.snap)


def _spent_from(sc: InstanceScan) -> Sequence[SessionRecord] | Tally | None:
    """What today's spend of one instance is counted from: its tally (the board's summary),
    its sessions (a scan), or nothing (it did not answer)."""
    return None if not sc.reachable else sc.tally if sc.tally is not None else sc.sessions


def _spent_cell(line: budget.BudgetLine) -> str:
    """ "$1.20", "$1.20/$3.00", "-" (did not answer), with "+N?" for unknown costs."""
    if not line.known:
        return "-"
    cell = budget.money(line.spent.usd)
    if line.budget is not None:
        cell += f"/{budget.money(line.budget)}"
    return cell + (f" +{line.spent.unknown}?" if line.spent.unknown else "")


def _over_budget(
    ctx: Context, load: Load, sc: InstanceScan, line: budget.BudgetLine,
    project: budget.BudgetLine,
) -> Load:
    """``load``, not dispatchable when a daily budget is reached (the refusal as its reason)."""
    if not line.known or not load.dispatchable:
        return load
    others = budget.Spend(project.spent.usd - line.spent.usd)
    refused = budget.refusal(ctx.config, sc.inst, line.spent, others)
    return load if refused is None else replace(load, dispatchable=False, reason=str(refused))
