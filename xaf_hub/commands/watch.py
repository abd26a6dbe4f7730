"""Print only what changes: new sessions, runs starting or stopping (with outcome), sessions gone.

Polls the fleet every --interval seconds (a poll costs one listing and one status call per
directory per instance). --once prints the current running state and exits. Ctrl+C exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

from xaf_hub import aio
from xaf_hub.commands._common import add_json, chosen_instances, scan, scan_exit
from xaf_hub.context import Context
from xaf_hub.output import dumps, shorten
from xaf_hub.records import SessionRecord, Snapshot

EXAMPLES = """\
examples:
  xaf-hub watch                  # every 10 s
  xaf-hub watch --interval 5 --instance lan-189 --verbose
  xaf-hub watch --once           # current running sessions, then exit
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `watch`."""
    add_json(p)
    p.add_argument(
        "--interval", type=float, default=10.0, metavar="S", help="seconds between polls"
    )
    p.add_argument("--once", action="store_true", help="print the current state and exit")
    p.add_argument("-i", "--instance", metavar="NAME", help="only this instance")
    p.add_argument("--verbose", action="store_true", help="also print a line for every poll")
    p.add_argument("--max-polls", type=int, default=0, help=argparse.SUPPRESS)


def diff(
    before: dict[str, SessionRecord], after: dict[str, SessionRecord]
) -> list[tuple[str, SessionRecord]]:
    """Changes between two polls: new, started, stopped, gone (pure)."""
    events: list[tuple[str, SessionRecord]] = []
    for key, s in after.items():
        old = before.get(key)
        if old is None:
            events.append(("new", s))
            if s.running:
                events.append(("started", s))
        elif s.running and not old.running:
            events.append(("started", s))
        elif old.running and not s.running:
            events.append(("stopped", s))
        elif s.run_state != old.run_state:
            events.append((s.run_state, s))
    for key, s in before.items():
        if key not in after:
            events.append(("gone", s))
    return events


def _index(snap: Snapshot) -> dict[str, SessionRecord]:
    return {f"{s.instance}/{s.id}": s for s in snap.sessions if s.project}


def _outcomes(ctx: Context, sessions: Sequence[SessionRecord]) -> dict[str, str]:
    from xaf_hub.errors import HubError
    from xaf_hub.ops.runstate import outcome_of
    from xaf_hub.scan import make_client

    cfg = ctx.config

    async def one(s: SessionRecord) -> tuple[str, str]:
        inst = cfg.instance(s.instance)
        transport = ctx.transport_factory(inst) if ctx.transport_factory else None
        async with make_client(cfg, inst, transport) as client:
            try:
                return s.id, outcome_of(await client.messages(s.id, limit=3))
            except HubError:
                return s.id, "unknown"

    async def all_() -> list[tuple[str, str]]:
        return list(await asyncio.gather(*(one(s) for s in sessions)))

    return dict(aio.run(all_())) if sessions else {}


def _line(kind: str, s: SessionRecord, outcome: str = "") -> str:
    stamp = time.strftime("%H:%M:%S")
    extra = f" -> {outcome}" if outcome else ""
    if kind == "retry" and s.retry_message:
        extra = f" ({shorten(s.retry_message, 60)})"
    return f"{stamp} {kind:<8} {s.instance}/{s.id}  {shorten(s.title, 40)}{extra}"


def run(ctx: Context) -> int:
    """Poll until Ctrl+C (or once)."""
    from xaf_hub.errors import UsageError

    args = ctx.args
    if args.interval <= 0:
        raise UsageError("--interval must be more than 0")
    instances = chosen_instances(ctx)
    snap, _ = scan(ctx, instances)
    if args.once:
        running = [s for s in snap.project_sessions() if s.running]
        if ctx.json:
            ctx.out(
                dumps({"running": [s.to_json() for s in running], "unreachable": snap.unreachable})
            )
        else:
            for s in running:
                ctx.out(_line(s.run_state, s))
            ctx.out(f"{len(running)} project session(s) running")
            for u in snap.unreachable:
                ctx.warn(f"{u['instance']} unreachable: {u['reason']}")
        return scan_exit(snap)
    before = _index(snap)
    ctx.info(
        f"watching {len(instances)} instance(s), {len(before)} project session(s); Ctrl+C to stop"
    )
    down = {u["instance"] for u in snap.unreachable}
    polls = 0
    try:
        while True:
            time.sleep(args.interval)
            snap, _ = scan(ctx, instances)
            now_down = {u["instance"]: u["reason"] for u in snap.unreachable}
            for name in sorted(set(now_down) - down):
                ctx.out(f"{time.strftime('%H:%M:%S')} unreachable {name}: {now_down[name]}")
            for name in sorted(down - set(now_down)):
                ctx.out(f"{time.strftime('%H:%M:%S')} back     {name}")
            # An unreachable instance's sessions are not "gone": keep the last view of them.
            after = _index(snap)
            after.update({k: v for k, v in before.items() if v.instance in now_down})
            events = diff(before, after)
            stopped = [s for kind, s in events if kind == "stopped"]
            outcomes = _outcomes(ctx, stopped)
            for kind, s in events:
                if ctx.json:
                    ctx.out(
                        dumps(
                            {
                                "event": kind,
                                "session": s.to_json(),
                                "outcome": outcomes.get(s.id, ""),
                            }
                        )
                    )
                else:
                    ctx.out(_line(kind, s, outcomes.get(s.id, "") if kind == "stopped" else ""))
            if args.verbose and not events:
                ctx.info(f"{time.strftime('%H:%M:%S')} no change")
            ctx.stdout.flush()
            before, down = after, set(now_down)
            polls += 1
            if args.max_polls and polls >= args.max_polls:
                return 0
    except KeyboardInterrupt:
        return 0
