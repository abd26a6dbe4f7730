"""Send a task to the right session: a related one (smart match), a named one, or a new one.

Smart matching compares the task with every project session's title and directory. A related
session that is running is steered at once (no new slot, even on a full instance); a related
idle one is reused only when its instance has a free slot. Otherwise a new session is created
on the least-loaded instance that can take it. New sessions and idle reuse pass the gate:
the instance lock plus slot reservations keep every instance at or under its limit, however
many dispatches run at once.

Dispatch sends and returns: it never waits for the model. `--confirm-wait [SECONDS]` (30 when
given bare) waits after the send until the server shows the run started (the model answers,
or the session stays busy) or failed. A rate-limit or model-unavailable failure in that window
is healed on the spot exactly as the patrol would (``xaf_hub.ops.heal``) - blackout through
the one writer, next model of the chain, re-send with the continue prompt - and the command
says what happened. The work itself is done by ``xaf_hub.ops.dispatch``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xaf_hub.cli.commands._common import add_json
from xaf_hub.cli.context import Context
from xaf_hub.core import aio
from xaf_hub.core.text import dumps
from xaf_hub.errors import BusyError, UsageError

if TYPE_CHECKING:
    from xaf_hub.ops.dispatch import Dispatched, DispatchOrder
    from xaf_hub.ops.planner import InstanceView, Plan
    from xaf_hub.ops.send import SendResult

EXAMPLES = """\
examples:
  xaf-hub dispatch --text "修复登录页样式" --dry-run      # show the plan and the full prompt
  xaf-hub dispatch --text "Fix the login page styles"
  xaf-hub dispatch --text "continue" --session ses_abc --instance lan-189
  xaf-hub dispatch --text "rework the check-in page" --instance lan-189 --dir /srv/shop/book --new
  xaf-hub dispatch --text "docs only" --instance prod-edge --allow-prod --dry-run
  xaf-hub dispatch --text "Fix the login page styles" --confirm-wait      # wait up to 30 s
  xaf-hub dispatch --text "Add the export button" --queue   # a full fleet queues it in the pool
exit codes: 3 when the instance is full, a daily budget is reached ("daily budget $3.00
reached ($3.00 spent today)") or its dispatch lock is busy (with --queue: 0, the task waits in
the pool), 4 for production without
--allow-prod or a bad argument, 5 when the target is not a project session (--force overrides).
With --confirm-wait (the task is sent in every case): 0 when the run was seen going, healed
or not; 1 when it failed and could not be healed, kept retrying, or showed no sign of starting
in the window (`xaf-hub confirm --session ID` looks again later); 2 when the instance stopped
answering while waiting.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `dispatch`."""
    add_json(p)
    p.add_argument("-t", "--text", required=True, help="what the agent should do")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan, candidates, model and prompt; change nothing",
    )
    p.add_argument("-i", "--instance", metavar="NAME", help="only this instance")
    p.add_argument("-s", "--session", metavar="ID", help="send to this session")
    p.add_argument(
        "--dir",
        dest="directory",
        metavar="D",
        help="directory for a new session (must lie under the instance's roots)",
    )
    p.add_argument(
        "--title",
        metavar="K",
        help="reuse the newest project session whose title contains K "
        "(with --new: the new session's title)",
    )
    p.add_argument("--new", action="store_true", help="always create a new session")
    p.add_argument("--no-match", action="store_true", help="skip smart matching")
    p.add_argument("--auto-cleanup", action="store_true", help="run `cleanup --execute` first")
    p.add_argument("--allow-prod", action="store_true", help="allow writes to production")
    p.add_argument("--force", action="store_true", help="allow a non-project target session")
    p.add_argument("--model", metavar="P/M", help="model as provider/model")
    p.add_argument(
        "--no-record", action="store_true", help="do not record this dispatch in the task pool"
    )
    p.add_argument(
        "--queue",
        action="store_true",
        help="when no eligible instance can take the work now (all full, or the lock busy past "
        "its wait), put it in the task pool as pending instead of failing; the patrol starts it "
        "when a slot frees",
    )
    p.add_argument(
        "--confirm-wait",
        nargs="?",
        const=30.0,
        type=float,
        default=None,
        metavar="SECONDS",
        help="after sending, wait up to SECONDS (30 when bare) until the run is seen to start "
        "or fail; heal a rate limit / unavailable model on the spot (default: do not wait)",
    )


@dataclass(frozen=True)
class Options:
    """What `dispatch` reads of its options."""

    text: str
    dry_run: bool
    instance: str | None
    session: str | None
    directory: str | None
    title: str | None
    new: bool
    no_match: bool
    auto_cleanup: bool
    allow_prod: bool
    force: bool
    model: str | None
    no_record: bool
    queue: bool
    confirm_wait: float | None


def order_from(opts: Options) -> DispatchOrder:
    """The operations layer's typed order from `dispatch`'s options (UsageError for a bad
    combination)."""
    from xaf_hub.ops.dispatch import DispatchOrder
    from xaf_hub.ops.planner import DispatchRequest

    if not opts.text.strip():
        raise UsageError("--text is empty: say what the agent should do")
    if opts.model and "/" not in opts.model:
        raise UsageError(f"--model must be provider/model, got {opts.model!r}")
    if opts.confirm_wait is not None:
        if opts.dry_run:
            raise UsageError("--confirm-wait makes no sense with --dry-run (nothing is sent)")
        if not opts.confirm_wait > 0:
            raise UsageError(f"--confirm-wait must be more than 0 seconds, got {opts.confirm_wait}")
    if opts.queue and opts.confirm_wait is not None:
        raise UsageError(
            "--queue and --confirm-wait do not go together (a queued task is not sent now)"
        )
    req = DispatchRequest(
        text=opts.text,
        instance=opts.instance,
        session=opts.session,
        directory=opts.directory,
        title=opts.title,
        new=opts.new,
        no_match=opts.no_match,
        allow_prod=opts.allow_prod,
        force=opts.force,
        model=opts.model,
    )
    return DispatchOrder(
        req,
        record=not opts.no_record,
        auto_cleanup=opts.auto_cleanup,
        dry_run=opts.dry_run,
        confirm_wait=opts.confirm_wait,
    )


def run(ctx: Context) -> int:
    """Plan, then (unless --dry-run) send through the gate; with --queue a full fleet queues."""
    from xaf_hub.ops.dispatch import prepare, send_prepared

    opts = ctx.options(Options)
    order = order_from(opts)
    ops = ctx.ops()
    try:
        prep = aio.run(prepare(ops, order))
    except BusyError as exc:
        if not opts.queue or order.dry_run:
            raise
        return _queue(ctx, opts, exc, instance=opts.instance or "", session=opts.session)
    for w in prep.warnings:
        ctx.warn(w)
    plan, view = prep.plan, prep.view
    if order.dry_run:
        _print_plan(ctx, plan, view, prep.model, prep.prompt)
        if plan.gated and view.free == 0:
            raise BusyError(
                f"{plan.instance.name} is at its limit "
                f"({view.running_project} running + {view.reserved} reserved of "
                f"{plan.instance.concurrency_limit}): a real run would be refused"
            )
        return 0
    try:
        sent = aio.run(send_prepared(ops, prep, order, ctx.warn))
    except BusyError as exc:  # nothing was sent, and the pool row (if any) was taken back
        if not opts.queue:
            raise
        session = plan.session.id if plan.session is not None else opts.session
        return _queue(ctx, opts, exc, instance=plan.instance.name, session=session)
    for w in sent.warnings:
        ctx.warn(w)
    if order.confirm_wait is not None:
        return _confirm(ctx, plan, sent, order.confirm_wait)
    if ctx.json:
        ctx.out(dumps({**sent.result.to_json(), "via": plan.via, "task_id": sent.task_id}))
    else:
        ctx.out(_sent_line(plan, sent.result))
    return 0


def _queue(
    ctx: Context, opts: Options, why: BusyError, *, instance: str, session: str | None
) -> int:
    """Put the work in the pool instead (``ops.queue``) and say where it stands."""
    from xaf_hub.ops.queue import queue_work
    from xaf_hub.store.audit import caller

    queued = queue_work(
        ctx.ops(),
        opts.text,
        reason=str(why),
        instance=instance,
        title=opts.title if opts.new else None,
        session=session,
        caller=caller(ctx.env) or "cli",
    )
    if ctx.json:
        ctx.out(dumps(queued.to_json()))
    else:
        ctx.out(queued.line())
    return 0


def _sent_line(plan: Plan, result: SendResult) -> str:
    verb = {
        "steer": "steered running session",
        "reuse": "started idle session",
        "create": "created session",
    }[result.action]
    from xaf_hub.fleet.attach import attach_command

    # A steer whose session stopped before the lock was taken went through the gate instead.
    stopped = " (it had stopped)" if result.had_stopped else ""
    return (
        f"{verb} {result.session_id}{stopped} on {result.instance} ({plan.via}); "
        f"model: {result.model or 'server default'}; directory: {result.directory}\n"
        f"open it in opencode: {attach_command(plan.instance, result.session_id, result.directory)}"
    )


def _confirm(ctx: Context, plan: Plan, sent: Dispatched, window: float) -> int:
    """Wait for the run to show, heal it on the spot if it fails, and say what happened."""
    from xaf_hub.cli.commands._common import wait_exit, wait_json, wait_text
    from xaf_hub.core.clock import resolve_timezone, to_ms
    from xaf_hub.fleet.client import ServerSession
    from xaf_hub.ops.confirm import confirm_run
    from xaf_hub.ops.context import utc_now

    cfg, result = ctx.config, sent.result
    if not ctx.json:
        ctx.out(_sent_line(plan, result))
        ctx.stdout.flush()
    session = ServerSession(
        result.session_id, result.title, result.directory, 0, 0, 0.0, "", result.model or ""
    )
    waited = aio.run(
        confirm_run(
            ctx.ops(),
            plan.instance,
            session,
            baseline=sent.baseline,
            window=window,
            origin="dispatch",
        )
    )
    for healing in waited.heals:
        for note in healing.notes:
            ctx.warn(note)
    line = wait_text(waited, window, resolve_timezone(cfg.models.timezone), to_ms(utc_now()))
    if ctx.json:
        doc = {**result.to_json(), "via": plan.via, "task_id": sent.task_id}
        ctx.out(dumps({**doc, "confirm": wait_json(waited, window, line)}))
    else:
        ctx.out(f"confirm: {line}")
    return wait_exit(waited)


def _print_plan(
    ctx: Context, plan: Plan, view: InstanceView, model: str | None, prompt: str
) -> None:
    inst = plan.instance
    doc = {
        "action": plan.action,
        "instance": inst.name,
        "session_id": plan.session.id if plan.session else None,
        "directory": plan.directory,
        "title": plan.title,
        "via": plan.via,
        "load": {
            "running_project": view.running_project,
            "reserved": view.reserved,
            "limit": inst.concurrency_limit,
        },
        "candidates": [c.to_json() for c in plan.candidates],
        "model": model,
        "prompt": prompt,
        "dry_run": True,
    }
    if ctx.json:
        ctx.out(dumps(doc))
        return
    what = {
        "steer": "steer the running session",
        "reuse": "start the idle session",
        "create": "create a new session",
    }[plan.action]
    ctx.out(f"plan: {what} on {inst.name} ({plan.via})")
    if plan.session:
        ctx.out(f"  session:   {plan.session.id}  {plan.session.title}")
    ctx.out(f"  directory: {plan.directory}")
    ctx.out(f"  title:     {plan.title}")
    ctx.out(
        f"  load:      {view.running_project} running + {view.reserved} reserved "
        f"of {inst.concurrency_limit}"
    )
    ctx.out(f"  model:     {model or 'server default'}")
    if plan.candidates:
        ctx.out("  candidates:")
        for c in plan.candidates:
            ctx.out(
                f"    {c.score:.3f} (lead {c.margin:.3f})  {c.session.instance}/{c.session.id}  "
                f"{c.session.title}  [{c.verdict}]"
            )
            if c.evidence.shared:
                sent = (
                    f"; {c.evidence.tasks} task text(s) from the pool" if c.evidence.tasks else ""
                )
                ctx.out(f"        shares: {', '.join(c.evidence.shared)}{sent}")
    ctx.out("  prompt:")
    for line in prompt.splitlines():
        ctx.out(f"    | {line}")
