"""Print only what changes: new sessions, runs starting or stopping (with outcome), sessions
gone, instances down and up.

Follows each instance's event stream: a change shows as soon as the server reports it, and
nothing is polled on an interval; after every (re)connect the instance is rescanned once so
nothing that happened meanwhile is missed. --poll rescans each instance every --interval
seconds instead (the follower's polling, as for a server without an event stream). With
--json each change is one line of JSON (the same form either way). --once prints the current running
state and exits. Ctrl+C exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xaf_hub.cli.commands._common import INSTANCE, chosen_instances, scan, scan_exit
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import HIDDEN, Answers, flag, opt
from xaf_hub.core import aio
from xaf_hub.core.records import SessionRecord
from xaf_hub.core.runstate import shown_state, waiting_detail
from xaf_hub.core.text import dumps_line, shorten
from xaf_hub.errors import UsageError
from xaf_hub.fleet.events import following_words
from xaf_hub.fleet.follow import FleetFollower

if TYPE_CHECKING:  # the follower pulls in httpx; --help must stay light
    from xaf_hub.config.load import InstanceConfig
    from xaf_hub.fleet.events import FleetEvent

EXAMPLES = """\
examples:
  xaf-hub watch                  # follow the servers' event streams
  xaf-hub watch --instance lan-189 --json
  xaf-hub watch --poll --interval 5   # rescan every 5 s instead of following events
  xaf-hub watch --once           # current running sessions, then exit
"""


@dataclass(frozen=True, kw_only=True)
class Options(Answers):
    """The options of `watch`."""

    poll: bool = flag("--poll", help="rescan every --interval seconds instead of following event "
                      "streams")
    interval: float = opt("--interval", default=10.0, metavar="S", help="seconds between polls "
                          "(with --poll, or for servers without an event stream)")
    once: bool = flag("--once", help="print the current state and exit")
    instance: str | None = INSTANCE.field()
    verbose: bool = flag("--verbose", help="also say how each instance is followed")
    # Tests stop the loop after a while: N x --interval seconds.
    max_polls: int = opt("--max-polls", default=0, help=HIDDEN)


def _line(kind: str, s: SessionRecord, outcome: str = "") -> str:
    stamp = time.strftime("%H:%M:%S")
    extra = f" -> {outcome}" if outcome else ""
    if kind == "retry" and s.retry_message:
        extra = f" ({shorten(s.retry_message, 60)})"
    if kind in ("asked", "answered") and s.waiting is not None:
        extra = f" ({shorten(waiting_detail(s.waiting), 80)}; {s.waiting.request_id})"
    where = f"{s.instance}/{s.id}" + (f" [{s.owner}]" if s.owner else "")
    return f"{stamp} {kind:<8} {where}  {shorten(s.title, 40)}{extra}"


def _event_line(ev: FleetEvent) -> str:
    stamp = time.strftime("%H:%M:%S")
    if ev.session is None:
        tail = f": {ev.detail}" if ev.kind == "down" and ev.detail else ""
        return f"{stamp} {ev.kind:<8} {ev.instance}{tail}"
    if ev.kind == "error":
        return f"{_line(ev.kind, ev.session)} ({shorten(ev.detail, 60)})"
    if ev.kind == "answered" and ev.answer:
        return f"{_line(ev.kind, ev.session)} -> {ev.answer}"
    return _line(ev.kind, ev.session, ev.outcome)


def follow(
    ctx: Context, instances: Sequence[InstanceConfig], *, poll_seconds: float,
    max_seconds: float, verbose: bool = False, polled: bool = False,
) -> int:
    """Print each change the fleet's event streams report until Ctrl+C (or ``max_seconds``);
    ``polled``: rescan every ``poll_seconds`` instead of following the streams."""

    sessions = [0]
    pending = {i.name for i in instances}

    def show(ev: FleetEvent) -> None:
        if ev.kind in ("ready", "polling"):
            if ev.kind == "polling" and not polled:
                ctx.warn(f"{following_words(ev)} every {poll_seconds:g} s")
            elif verbose:
                ctx.info(str(following_words(ev)))
            if ev.kind == "ready" and ev.instance in pending:
                pending.discard(ev.instance)
                sessions[0] += len(follower.boards[ev.instance].sessions)
                if not pending:
                    ctx.info(f"watching {len(instances)} instance(s), {sessions[0]} project "
                             "session(s); Ctrl+C to stop")
            return
        if ev.kind == "down":
            pending.discard(ev.instance)
        # An event's `--json` line names its project: its session's, else the one read as.
        mine = {"project": ev.session.owner or None} if ev.session is not None else {}
        ctx.out(dumps_line(ctx.named({**ev.to_json(), **mine})) if ctx.json else _event_line(ev),
                flush=True)

    follower = FleetFollower(ctx.config, instances, emit=show, force_polling=polled,
                             transport_factory=ctx.transport_factory, poll_seconds=poll_seconds)

    async def main() -> None:
        if max_seconds:
            asyncio.get_running_loop().call_later(max_seconds, follower.stop)
        await follower.run()

    with contextlib.suppress(KeyboardInterrupt):
        aio.run(main())
    return 0


def run(ctx: Context) -> int:
    """Follow (or poll) until Ctrl+C, or print once."""

    ctx.see_every_project()
    opts = ctx.options(Options)
    if opts.interval <= 0:
        raise UsageError("--interval must be more than 0")
    instances = chosen_instances(ctx, opts.instance)
    if not opts.once:
        limit = opts.max_polls * opts.interval if opts.max_polls else 0.0
        return follow(ctx, instances, poll_seconds=opts.interval, max_seconds=limit,
                      verbose=opts.verbose, polled=opts.poll)
    snap, _ = scan(ctx, instances)
    running = [s for s in snap.project_sessions() if s.running]
    ctx.answer({"running": [s.to_json() for s in running], "unreachable": snap.unreachable},
               *(_line(shown_state(s), s) for s in running),
               f"{len(running)} project session(s) running")
    if not ctx.json:
        for u in snap.unreachable:
            ctx.warn(f"{u['instance']} unreachable: {u['reason']}")
    return scan_exit(snap)
