"""Send a task to the right session: a related one (smart match), a named one, or a new one.

Smart matching compares the task with every project session's title and directory. A related
session that is running is steered at once (no new slot, even on a full instance); a related
idle one is reused only when its instance has a free slot. Otherwise a new session is created
on the least-loaded instance that can take it. New sessions and idle reuse pass the gate:
the instance lock plus slot reservations keep every instance at or under its limit, however
many dispatches run at once.

Dispatch sends and returns: it never waits for the model. `--confirm-wait [SECONDS]` (30 when
given bare) waits after the send until the server shows the run started (the model answers;
still busy without an answer when the window ends: running) or failed. A rate-limit or
model-unavailable failure in that window is healed on the spot exactly as the patrol would
(``xaf_hub.ops.heal``) - blackout through the one writer, next model of the chain, re-send
with the continue prompt - and the command says what happened. The work itself is done by
``xaf_hub.ops.dispatch``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from xaf_hub.cli.commands._common import (
    ALLOW_PROD,
    FORCE,
    FRESH,
    INSTANCE,
    SESSION,
    TEXT,
    wait_exit,
    wait_json,
    wait_text,
)
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import Answers, flag, opt
from xaf_hub.core import aio
from xaf_hub.core.clock import resolve_timezone, to_ms
from xaf_hub.errors import BusyError, UsageError

if TYPE_CHECKING:
    from xaf_hub.ops.dispatch import Dispatched, DispatchOrder, Prepared
    from xaf_hub.ops.planner import Plan
    from xaf_hub.ops.queue import Queued
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
--allow-prod or a bad argument, 5 when the target session or --dir is not the project's (--force
overrides).
With --confirm-wait (the task is sent in every case): 0 when the run was seen going, healed
or not; 1 when it failed and could not be healed, kept retrying, or showed no sign of starting
in the window (`xaf-hub confirm --session ID` looks again later); 2 when the instance stopped
answering while waiting.
"""


@dataclass(frozen=True, kw_only=True)
class Options(Answers):
    """The options of `dispatch` (``project``: the common --project)."""

    text: str = TEXT.field()
    dry_run: bool = flag("--dry-run", help="print the plan, candidates, model and prompt; change "
                         "nothing")
    instance: str | None = INSTANCE.field()
    session: str | None = SESSION.field(help="send to this session")
    directory: str | None = opt("--dir", help="directory for a new session (must lie under the "
                                "instance's roots once '.' and '..' are removed and the server "
                                "has followed its links)", metavar="D", max_length=4096)
    title: str | None = opt("--title", help="reuse the newest project session whose title "
                            "contains K (with --new: the new session's title)", metavar="K")
    new: bool = flag("--new", help="always create a new session")
    no_match: bool = flag("--no-match", help="skip smart matching")
    auto_cleanup: bool = flag("--auto-cleanup", help="run `cleanup --execute` first")
    allow_prod: bool = ALLOW_PROD.field()
    force: bool = FORCE.field(help="allow a non-project target session, or a --dir outside the "
                              "roots")
    model: str | None = opt("--model", help="model as provider/model", metavar="P/M")
    no_record: bool = flag("--no-record", help="do not record this dispatch in the task pool")
    queue: bool = flag("--queue", help="when no eligible instance can take the work now (all "
                       "full, or the lock busy past its wait), put it in the task pool as pending "
                       "instead of failing; the patrol starts it when a slot frees")
    fresh: bool = FRESH.field(help="plan from a scan of every instance, not from the live board")
    confirm_wait: float | None = opt(
        "--confirm-wait", const=30.0, metavar="SECONDS",
        help="after sending, wait up to SECONDS (30 when bare) until the run is seen to start or "
        "fail; heal a rate limit / unavailable model on the spot (default: do not wait)")
    project: str | None = None


def order_from(opts: Options) -> DispatchOrder:
    """The operations layer's typed order from `dispatch`'s options (UsageError for a bad
    combination)."""
    from xaf_hub.ops.dispatch import DispatchOrder  # deferred: start-up, docs/performance.md
    from xaf_hub.ops.planner import DispatchRequest  # deferred: start-up, docs/performance.md

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
        raise UsageError("--queue and --confirm-wait do not go together (a queued task is not "
                         "sent now)")
    # The request's fields are the options of the same names.
    req = DispatchRequest(**{f.name: getattr(opts, f.name) for f in fields(DispatchRequest)})
    return DispatchOrder(req, record=not opts.no_record, auto_cleanup=opts.auto_cleanup,
                         dry_run=opts.dry_run, confirm_wait=opts.confirm_wait, fresh=opts.fresh)


@dataclass(frozen=True)
class Planned:
    """A dry run: the plan, nothing sent."""

    prep: Prepared

    def refuse(self) -> None:
        """Raise the refusal a real run would meet at the gate now (none: it would pass)."""
        plan, view = self.prep.plan, self.prep.view
        if plan.gated and view.free == 0:
            raise BusyError(f"{plan.instance.name} is at its limit ({view.running_project} "
                            f"running + {view.reserved} reserved of "
                            f"{plan.instance.concurrency_limit}): a real run would be refused")


@dataclass(frozen=True)
class Sent:
    """The work went out."""

    plan: Plan
    sent: Dispatched


def carry_out(ctx: Context, opts: Options) -> Planned | Sent | Queued:
    """Plan, then (unless a dry run) send through the gate; with ``queue`` a full fleet queues.
    Warnings go to ``ctx.warn``; a refusal is raised."""
    # deferred: start-up, docs/performance.md
    from xaf_hub.ops.dispatch import prepare, project_for, send_prepared

    order = order_from(opts)
    ctx.choose(project_for(ctx.whole, opts.project, opts.directory, opts.instance, str(ctx.cwd)))
    ops = ctx.ops()
    try:
        prep = aio.run(prepare(ops, order))
    except BusyError as exc:
        if not opts.queue or order.dry_run:
            raise
        return _queue(ctx, opts, exc, instance=opts.instance or "", session=opts.session)
    for w in prep.warnings:
        ctx.warn(w)
    if order.dry_run:
        return Planned(prep)
    plan = prep.plan
    try:
        sent = aio.run(send_prepared(ops, prep, order, ctx.warn))
    except BusyError as exc:  # nothing was sent, and the pool row (if any) was taken back
        if not opts.queue:
            raise
        session = plan.session.id if plan.session is not None else opts.session
        return _queue(ctx, opts, exc, instance=plan.instance.name, session=session)
    for w in sent.warnings:
        ctx.warn(w)
    return Sent(plan, sent)


def document(done: Planned | Sent | Queued, project: str) -> dict[str, Any]:
    """What `dispatch --json` prints (and the MCP tool answers), saying its ``project``; a dry
    run's plan whatever its refusal."""
    if isinstance(done, Planned):  # a dry run: its plan
        prep, plan, view = done.prep, done.prep.plan, done.prep.view
        return {
            "project": project,
            "action": plan.action,
            "instance": plan.instance.name,
            "session_id": plan.session.id if plan.session else None,
            "directory": plan.directory,
            "title": plan.title,
            "via": plan.via,
            "load": {"running_project": view.running_project, "reserved": view.reserved,
                     "limit": plan.instance.concurrency_limit},
            "candidates": [c.to_json() for c in plan.candidates],
            "model": prep.model,
            "prompt": prep.prompt,
            "dry_run": True,
            # where the plan's view of the fleet came from: live, mixed, scan
            "source": prep.source,
        }
    if isinstance(done, Sent):
        # what the match weighed, so a caller that knows better can name the session
        return {**_sent_document(done, project),
                "candidates": [c.to_json() for c in done.plan.candidates]}
    return {**done.to_json(), "project": project}


def _sent_document(done: Sent, project: str) -> dict[str, Any]:
    """What `dispatch --json` says of the work sent (with the candidates, or how it started)."""
    return {**done.sent.result.to_json(), "project": project, "via": done.plan.via,
            "task_id": done.sent.task_id}


def run(ctx: Context) -> int:
    """Plan, then (unless --dry-run) send through the gate; with --queue a full fleet queues."""
    opts = ctx.options(Options)
    done = carry_out(ctx, opts)
    if isinstance(done, Planned):
        ctx.answer(document(done, ctx.config.project_name), *_plan_lines(done.prep))
        done.refuse()
        return 0
    if isinstance(done, Sent) and opts.confirm_wait is not None:
        return _confirm(ctx, done.plan, done.sent, opts.confirm_wait)
    line = _sent_line(done.plan, done.sent.result) if isinstance(done, Sent) else done.line()
    return ctx.answer(document(done, ctx.config.project_name), line)


def _queue(
    ctx: Context, opts: Options, why: BusyError, *, instance: str, session: str | None
) -> Queued:
    """Put the work in the pool instead (``ops.queue``)."""
    from xaf_hub.ops.queue import queue_work  # deferred: start-up, docs/performance.md
    from xaf_hub.store.audit import caller  # deferred: start-up, docs/performance.md

    return queue_work(ctx.ops(), opts.text, reason=str(why), instance=instance,
                      title=opts.title if opts.new else None, session=session,
                      caller=caller(ctx.env) or "cli")


# Each action in a plan's words and in a sent one's.
_ACTION_WORDS = {"steer": ("steer the running session", "steered running session"),
                 "reuse": ("start the idle session", "started idle session"),
                 "create": ("create a new session", "created session")}


def _sent_line(plan: Plan, result: SendResult) -> str:
    verb = _ACTION_WORDS[result.action][1]
    from xaf_hub.fleet.attach import attach_command  # deferred: start-up, docs/performance.md

    # A steer whose session stopped before the lock was taken went through the gate instead.
    stopped = " (it had stopped)" if result.had_stopped else ""
    return (
        f"{verb} {result.session_id}{stopped} on {result.instance} ({plan.via}); "
        f"model: {result.model or 'server default'}; directory: {result.directory}\n"
        f"open it in opencode: {attach_command(plan.instance, result.session_id, result.directory)}"
    )


def _confirm(ctx: Context, plan: Plan, sent: Dispatched, window: float) -> int:
    """Wait for the run to show, heal it on the spot if it fails, and say what happened."""
    from xaf_hub.fleet.client import ServerSession  # deferred: start-up, docs/performance.md
    from xaf_hub.ops.confirm import confirm_run  # deferred: start-up, docs/performance.md
    from xaf_hub.ops.context import utc_now  # deferred: start-up, docs/performance.md

    cfg, result = ctx.config, sent.result
    if not ctx.json:
        ctx.out(_sent_line(plan, result), flush=True)
    session = ServerSession(result.session_id, result.title, result.directory, 0, 0, 0.0, "",
                            result.model or "",
                            checkout=result.room.checkout if result.room is not None else "")
    waited = aio.run(confirm_run(ctx.ops(), plan.instance, session, baseline=sent.baseline,
                                 window=window, origin="dispatch"))
    for healing in waited.heals:
        for note in healing.notes:
            ctx.warn(note)
    line = wait_text(waited, window, resolve_timezone(cfg.models.timezone), to_ms(utc_now()))
    doc = _sent_document(Sent(plan, sent), cfg.project_name)
    ctx.answer({**doc, "confirm": wait_json(waited, window, line)}, f"confirm: {line}")
    return wait_exit(waited)


def _plan_lines(prep: Prepared) -> list[str]:
    """A dry run's plan for a person: what, where, the candidates weighed and the prompt."""
    plan, view, inst = prep.plan, prep.view, prep.plan.instance
    lines = [f"plan: {_ACTION_WORDS[plan.action][0]} on {inst.name} ({plan.via})"]
    if plan.session:
        lines.append(f"  session:   {plan.session.id}  {plan.session.title}")
    lines += [
        f"  directory: {plan.directory}",
        f"  title:     {plan.title}",
        f"  load:      {view.running_project} running + {view.reserved} reserved "
        f"of {inst.concurrency_limit}",
        f"  model:     {prep.model or 'server default'}",
    ]
    lines += ["  candidates:"] if plan.candidates else []
    for c in plan.candidates:
        lines.append(f"    {c.score:.3f} (lead {c.margin:.3f})  {c.session.instance}/"
                     f"{c.session.id}  {c.session.title}  [{c.verdict}]")
        if c.evidence.shared:
            sent = f"; {c.evidence.tasks} task text(s) known" if c.evidence.tasks else ""
            files = f"; in {', '.join(c.evidence.files)}" if c.evidence.files else ""
            named = f"; names {', '.join(c.evidence.named)}" if c.evidence.named else ""
            lines.append(f"        shares: {', '.join(c.evidence.shared)}{sent}{files}{named}")
            # the agent's own todo items, as it wrote them
            lines += [f"        its todo: {' '.join(item.split())[:100]}"
                      for item in c.evidence.todos]
    return [*lines, "  prompt:", *(f"    | {line}" for line in prep.prompt.splitlines())]
