"""List the project's sessions on every instance, newest first; export JSON, CSV or HTML."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from xaf_hub.cli.commands._common import FRESH, INSTANCE, chosen_instances, read_fleet, scan_said
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import Tables, flag, opt
from xaf_hub.cli.termfit import state_color, tone_painter
from xaf_hub.core import aio
from xaf_hub.core.clock import ago
from xaf_hub.core.outcomes import RUNS, run_words, tone
from xaf_hub.core.records import Snapshot, prefix_width
from xaf_hub.core.text import shorten, shorten_left
from xaf_hub.errors import UsageError
from xaf_hub.page import export as report
from xaf_hub.page.words import pick_language

EXAMPLES = """\
examples:
  xaf-hub sessions
  xaf-hub sessions --instance lan-189 --keyword 登录 --limit 20
  xaf-hub sessions --json > sessions.json
  xaf-hub sessions --out out/sessions.csv      # UTF-8 with BOM, opens in Excel
  xaf-hub sessions --html overview.html        # one self-contained page for colleagues
  xaf-hub sessions --html 概览.html --lang zh    # the page in Chinese (default: page.language)
  xaf-hub sessions --fresh                     # scan every instance, even with a live board
--limit only shortens the screen listing; --json, --out and --html always hold everything.
A patrol daemon or `serve` that follows the fleet publishes what it sees (the live board);
sessions takes each instance from it when it is at most patrol.live_board_seconds old
(default 15) and scans the others, and says so ("source").
"""


@dataclass(frozen=True, kw_only=True)
class Options(Tables):
    """The options of `sessions`."""

    instance: str | None = INSTANCE.field()
    keyword: str | None = opt("-k", "--keyword", help="only sessions whose title contains K",
                              metavar="K")
    limit: int | None = opt("-n", "--limit", help="show at most N rows on screen", metavar="N",
                            minimum=0, maximum=10_000, tool_help="at most this many sessions")
    out: str | None = opt("--out", help="export everything to FILE (.json or .csv)",
                          metavar="FILE")
    html: str | None = opt("--html", help="write the HTML overview page to FILE", metavar="FILE")
    lang: Literal["en", "zh"] | None = opt(
        "--lang", help="language of the --html page (default: config page.language; English "
        "for auto)")
    outcomes: bool = flag("--outcomes", help="also fetch each session's last result (one "
                          "request per idle session; implied by --html)")
    fresh: bool = FRESH.field()


def filter_keyword(snap: Snapshot, keyword: str | None) -> Snapshot:
    """Keep only project sessions whose title contains ``keyword`` (case-insensitive)."""
    if not keyword:
        return snap
    k = keyword.lower()
    kept = tuple(s for s in snap.sessions if not s.project or k in s.title.lower())
    return replace(snap, sessions=kept)


def write_page(ctx: Context, snap: Snapshot, path: Path, lang: str | None) -> None:
    """Write the overview page: Autopilot panel, task chips and links to each session."""
    from xaf_hub.fleet.web_ui import probe_all  # deferred: start-up, docs/performance.md
    from xaf_hub.page import autopilot as overview  # deferred: start-up, docs/performance.md

    cfg = ctx.config
    # Nobody's browser to ask: "auto" is English unless --lang says otherwise.
    chosen = pick_language(lang or cfg.page_language, None)
    now = int(time.time() * 1000)
    reachable = {i.name for i in snap.instances if i.reachable}
    links = aio.run(
        probe_all([i for i in cfg.instances if i.name in reachable], ctx.transport_factory)
    )
    report.write_html(
        snap, path, now_ms=now, title=cfg.project_name or cfg.project_names(),
        autopilot=overview.build(cfg, now, chosen, snap), lang=chosen, links=links,
        tasks=overview.task_ids_by_session(cfg), redact=ctx.redact,
        projects=cfg.shown_projects(),
    )


def read(ctx: Context, opts: Options) -> Snapshot:
    """Read the instances asked as `status` does (the live board where fresh, else a scan;
    --fresh scans), with each session's last result for --outcomes or --html (as every view
    shows it: ``ops.decisions.shown_outcomes``), and keep the titles with the keyword."""
    outcomes = bool(opts.outcomes or opts.html)
    snap, _ = read_fleet(ctx, chosen_instances(ctx, opts.instance), fresh=opts.fresh,
                         progress=True, outcomes=outcomes)
    if outcomes:
        # deferred: start-up, docs/performance.md
        from xaf_hub.ops.decisions import hub_stops, shown_outcomes

        snap = shown_outcomes(snap, hub_stops(ctx.ops()))
    return filter_keyword(snap, opts.keyword)


def run(ctx: Context) -> int:
    """Scan, then print or export."""

    ctx.see_every_project()
    opts = ctx.options(Options)
    if opts.limit is not None and opts.limit < 0:
        raise UsageError("--limit must be 0 or more")
    if opts.out and Path(opts.out).suffix.lower() not in (".json", ".csv"):
        raise UsageError(f"unsupported export format {Path(opts.out).suffix or opts.out!r}: "
                         "use a .json or .csv file name (or --html FILE for the page)")
    snap = read(ctx, opts)
    if opts.out:
        report.export(snap, Path(opts.out), redact=ctx.redact)
        ctx.info(f"wrote {opts.out}")
    if opts.html:
        write_page(ctx, snap, Path(opts.html), opts.lang)
        ctx.info(f"wrote {opts.html}")
    if ctx.json:
        ctx.answer(report.snapshot_document(snap))
        return scan_said(ctx, snap)
    from xaf_hub.core.runstate import shown_state  # deferred: start-up, docs/performance.md

    rows_all = snap.project_sessions()
    rows = rows_all if opts.limit is None else rows_all[: opts.limit]
    now = int(time.time() * 1000)
    wide = ctx.common.wide
    ctx.columns(rows, {
        **({"project": lambda s: s.owner or "other"} if len(ctx.config.projects) > 1 else {}),
        "instance": lambda s: s.instance,
        "session": lambda s: s.id,
        "state": shown_state,
        "updated": lambda s: ago(s.updated, now),
        "title": lambda s: s.title.replace("\n", " ") if wide else shorten(s.title, 40),
        "directory": lambda s: s.directory if wide else shorten_left(s.directory, 48),
        # tasks in worktrees of their own
        **({"branch": lambda s: s.branch or "-"} if any(s.branch for s in rows) else {}),
        **({"last result": lambda s: run_words(s.outcome) if s.outcome else "not checked"}
           if opts.outcomes else {}),
    }, flexible=[("directory", 10), ("branch", 12), ("last result", 10), ("instance", 10),
                 ("title", 12)],
        keep_end=["directory"],
        keep={"session": prefix_width((s.id for s in snap.sessions), (s.id for s in rows))},
        colors={"state": state_color,
                "last result": tone_painter({run_words(r): tone(r) for r in RUNS})})
    shown = f"{len(rows)} of {len(rows_all)}" if len(rows) < len(rows_all) else str(len(rows))
    ctx.info(f"{shown} project session(s)")
    other = sum(1 for s in snap.sessions if s.running and not s.owner)
    if other:
        ctx.info(f"{other} other session(s) running, of no configured project")
    if snap.live:
        ctx.info(f"source: {snap.source_words()} (--fresh scans)")
    return scan_said(ctx, snap)
