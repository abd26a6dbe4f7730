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
is healed on the spot exactly as the patrol's fix_free_limit would - blackout through the one
writer, next model of the chain, re-send with the continue prompt - and the command says
what happened.
"""

from __future__ import annotations

import argparse
from typing import Any

from xaf_hub import aio
from xaf_hub.commands._common import add_json
from xaf_hub.context import Context
from xaf_hub.errors import BusyError, UsageError
from xaf_hub.output import dumps

EXAMPLES = """\
examples:
  xaf-hub dispatch --text "修复登录页样式" --dry-run      # show the plan and the full prompt
  xaf-hub dispatch --text "Fix the login page styles"
  xaf-hub dispatch --text "continue" --session ses_abc --instance lan-189
  xaf-hub dispatch --text "rework the check-in page" --instance lan-189 --dir /srv/shop/book --new
  xaf-hub dispatch --text "docs only" --instance prod-edge --allow-prod --dry-run
  xaf-hub dispatch --text "Fix the login page styles" --confirm-wait      # wait up to 30 s
exit codes: 3 when the instance is full or its dispatch lock is busy, 4 for production without
--allow-prod or a bad argument, 5 when the target is not a project session (--force overrides).
With --confirm-wait (the task is sent in every case): 0 when the run was seen going, healed
or not; 1 when it failed and could not be healed, kept retrying, or showed no sign of starting
in the window (`xaf-hub confirm --session ID` looks again later); 2 when the instance stopped
answering while waiting.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `dispatch`."""
    add_json(p)
    p.add_argument("--text", required=True, help="what the agent should do")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan, candidates, model and prompt; change nothing",
    )
    p.add_argument("--instance", metavar="NAME", help="only this instance")
    p.add_argument("--session", metavar="ID", help="send to this session")
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
        "--confirm-wait",
        nargs="?",
        const=30.0,
        type=float,
        default=None,
        metavar="SECONDS",
        help="after sending, wait up to SECONDS (30 when bare) until the run is seen to start "
        "or fail; heal a rate limit / unavailable model on the spot (default: do not wait)",
    )


def _scores(ctx: Context, scans: list[Any], text: str) -> list[tuple[Any, float]]:
    from xaf_hub.matcher import document_text, rank

    pool, docs = {}, []
    for sc in scans:
        if not sc.reachable:
            continue
        relative: dict[str, str] = {}  # many sessions share a directory
        for s in sc.sessions:
            if s.project:
                key = f"{s.instance}\x00{s.id}"
                pool[key] = s
                if s.directory not in relative:
                    relative[s.directory] = sc.inst.rules.relative(s.directory)
                docs.append((key, document_text(s.title, relative[s.directory])))
    return [(pool[c.key], c.score) for c in rank(text, docs, top=5)]


def run(ctx: Context) -> int:
    """Plan, then (unless --dry-run) execute through the gate."""
    from xaf_hub.commands._common import chosen_instances, scan
    from xaf_hub.dispatcher import build_prompt, choose_model, execute
    from xaf_hub.gate import make_gate
    from xaf_hub.planner import DispatchRequest, InstanceView, plan_dispatch
    from xaf_hub.scan import make_client

    args = ctx.args
    if not args.text.strip():
        raise UsageError("--text is empty: say what the agent should do")
    if args.model and "/" not in args.model:
        raise UsageError(f"--model must be provider/model, got {args.model!r}")
    if args.confirm_wait is not None:
        if args.dry_run:
            raise UsageError("--confirm-wait makes no sense with --dry-run (nothing is sent)")
        if not args.confirm_wait > 0:
            raise UsageError(f"--confirm-wait must be more than 0 seconds, got {args.confirm_wait}")
    cfg = ctx.config
    if args.auto_cleanup and not args.dry_run:
        from xaf_hub.commands.cleanup import cleanup_fleet

        cleanup_fleet(
            ctx,
            execute=True,
            ttl_days=cfg.session_ttl_days,
            instance=args.instance,
            allow_prod=args.allow_prod,
        )
    req = DispatchRequest(
        text=args.text,
        instance=args.instance,
        session=args.session,
        directory=args.directory,
        title=args.title,
        new=args.new,
        no_match=args.no_match,
        allow_prod=args.allow_prod,
        force=args.force,
        model=args.model,
    )
    smart = not (args.session or args.title or args.new or args.no_match) and cfg.auto_match
    if smart:
        from xaf_hub.matcher import preload

        preload()  # the numpy import overlaps the network scan
    snap, scans = scan(ctx, chosen_instances(ctx), project_only=True)
    gate = make_gate(cfg)
    views = []
    for sc in scans:
        running = {s.id for s in sc.sessions if s.running}
        reserved = len(gate.pending(sc.inst.name, running)) if sc.reachable else 0
        views.append(InstanceView(sc.inst, sc.reachable, sc.reason, tuple(sc.sessions), reserved))
    scores = _scores(ctx, scans, args.text) if smart else []
    plan = plan_dispatch(cfg, views, req, scores)
    for w in plan.warnings + snap.warnings:
        ctx.warn(w)

    from xaf_hub.backlog import Backlog

    backlog = Backlog(cfg.backlog_path, lock_timeout=cfg.lock.lock_timeout_seconds)
    override = backlog.load().discipline
    model = choose_model(cfg, plan.instance, args.model)
    if args.model and model != args.model:
        ctx.warn(
            f"model {args.model} is blacked out (rate limit); using {model or 'server default'}"
        )
    prompt = build_prompt(cfg, plan.instance, args.text, plan.title, override)
    view = next(v for v in views if v.inst.name == plan.instance.name)

    if args.dry_run:
        _print_plan(ctx, plan, view, model, prompt)
        if plan.gated and view.free == 0:
            raise BusyError(
                f"{plan.instance.name} is at its limit "
                f"({view.running_project} running + {view.reserved} reserved of "
                f"{plan.instance.concurrency_limit}): a real run would be refused"
            )
        return 0

    from xaf_hub.dispatcher import now_utc

    recorded: list[str] = []

    def record(session_id: str) -> None:
        # Recorded before the prompt goes out (as the patrol does): a crash in between leaves
        # a pool row for work not yet sent, which the patrol settles, never work running
        # without a row.
        if not args.no_record:
            task = backlog.record_manual_dispatch(
                plan.title, args.text, session_id, plan.instance.name, model, now_utc()
            )
            recorded.append(task.id)

    async def go() -> tuple[Any, str | None]:
        async with make_client(
            cfg,
            plan.instance,
            ctx.transport_factory(plan.instance) if ctx.transport_factory else None,
        ) as client:
            baseline = None
            if args.confirm_wait is not None and plan.session is not None:
                # The newest message before the send: what comes after it is this run.
                newest = await client.messages(plan.session.id, limit=1)
                baseline = str((newest[-1].get("info") or {}).get("id") or "") if newest else ""
            result = await execute(
                cfg, plan, prompt, model, client, gate, env=ctx.env, before_prompt=record
            )
            return result, baseline

    try:
        result, baseline = aio.run(go())
    except BaseException as exc:
        for task_id in recorded:
            _take_back(ctx, backlog, task_id, exc)
        raise
    for w in gate.warnings:
        ctx.warn(w)
    task_id = recorded[0] if recorded else ""
    if args.confirm_wait is not None:
        return _confirm(ctx, plan, result, baseline, task_id)
    if ctx.json:
        ctx.out(dumps({**result.__dict__, "via": plan.via, "task_id": task_id}))
    else:
        ctx.out(_sent_line(plan, result))
    return 0


def _take_back(ctx: Context, backlog: Any, task_id: str, exc: BaseException) -> None:
    """After a failed send, drop the task's pool row unless the prompt may have arrived.

    The command fails and says so; a row for work that never arrived would make the patrol
    send it later behind the user's back. A row for work that may have arrived stays: the
    patrol settles it from what the session shows.
    """
    from xaf_hub.client import ApiError
    from xaf_hub.errors import UnreachableError

    refused = isinstance(exc, ApiError) or (
        isinstance(exc, UnreachableError) and not exc.maybe_delivered
    )
    if not refused:
        ctx.warn(
            f"task {task_id} stays in the task pool: the prompt may have reached the server, "
            "and the patrol will settle it from what the session shows "
            f"(xaf-hub backlog set {task_id} --status done keeps it from being sent again)"
        )
        return
    try:
        backlog.discard(task_id)
    except Exception as problem:  # noqa: BLE001 - the original failure is what gets raised
        ctx.warn(
            f"task {task_id} could not be taken back from the task pool ({problem}); "
            f"xaf-hub backlog set {task_id} --status done keeps the patrol from sending it"
        )


def _sent_line(plan: Any, result: Any) -> str:
    verb = {
        "steer": "steered running session",
        "reuse": "started idle session",
        "create": "created session",
    }[result.action]
    return (
        f"{verb} {result.session_id} on {result.instance} ({plan.via}); "
        f"model: {result.model or 'server default'}; directory: {result.directory}"
    )


def _confirm(ctx: Context, plan: Any, result: Any, baseline: str | None, task_id: str) -> int:
    """Wait for the run to show, heal it on the spot if it fails, and say what happened."""
    from xaf_hub.client import ServerSession
    from xaf_hub.commands.confirm import wait_exit, wait_json, wait_text
    from xaf_hub.model_state import resolve_timezone, to_ms
    from xaf_hub.patrol.confirm import confirm_run
    from xaf_hub.patrol.context import PatrolContext, utc_now

    cfg = ctx.config
    window = float(ctx.args.confirm_wait)
    if not ctx.json:
        ctx.out(_sent_line(plan, result))
        ctx.stdout.flush()
    pctx = PatrolContext(cfg, env=ctx.env, transport_factory=ctx.transport_factory)
    session = ServerSession(
        result.session_id, result.title, result.directory, 0, 0, 0.0, "", result.model or ""
    )
    waited = aio.run(
        confirm_run(
            pctx, plan.instance, session, baseline=baseline, window=window, origin="dispatch"
        )
    )
    for healing in waited.heals:
        for note in healing.notes:
            ctx.warn(note)
    line = wait_text(waited, window, resolve_timezone(cfg.models.timezone), to_ms(utc_now()))
    if ctx.json:
        doc = {**result.__dict__, "via": plan.via, "task_id": task_id}
        ctx.out(dumps({**doc, "confirm": wait_json(waited, window, line)}))
    else:
        ctx.out(f"confirm: {line}")
    return wait_exit(waited)


def _print_plan(ctx: Context, plan: Any, view: Any, model: str | None, prompt: str) -> None:
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
        "candidates": [
            {
                "instance": c.session.instance,
                "session_id": c.session.id,
                "title": c.session.title,
                "running": c.session.running,
                "similarity": round(c.score, 4),
                "verdict": c.verdict,
            }
            for c in plan.candidates
        ],
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
                f"    {c.score:.3f}  {c.session.instance}/{c.session.id}  "
                f"{c.session.title}  [{c.verdict}]"
            )
    ctx.out("  prompt:")
    for line in prompt.splitlines():
        ctx.out(f"    | {line}")
