"""Stop a running session (abort its run). Without --instance every instance is searched."""

from __future__ import annotations

import argparse

from xaf_hub import aio
from xaf_hub.commands._common import add_json
from xaf_hub.context import Context
from xaf_hub.output import dumps

EXAMPLES = """\
examples:
  xaf-hub interrupt --session ses_abc123 --instance lan-248
  xaf-hub interrupt --session ses_abc123          # searches every instance
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `interrupt`."""
    add_json(p)
    p.add_argument("--session", required=True, metavar="ID", help="the session to stop")
    p.add_argument("--instance", metavar="NAME", help="where it runs (default: search all)")
    p.add_argument("--allow-prod", action="store_true", help="allow writes to production")
    p.add_argument("--force", action="store_true", help="allow a non-project session")


def run(ctx: Context) -> int:
    """Find the session, apply the production and project guards, abort it."""
    from xaf_hub import audit
    from xaf_hub.commands._common import chosen_instances, scan, session_not_found
    from xaf_hub.errors import NotProjectSession, ProductionRefused
    from xaf_hub.scan import make_client

    args = ctx.args
    cfg = ctx.config
    snap, scans = scan(ctx, chosen_instances(ctx))
    hit = next(((sc, s) for sc in scans for s in sc.sessions if s.id == args.session), None)
    if hit is None:
        raise session_not_found(
            args.session,
            [(sc.inst.name, sc.reason) for sc in scans if not sc.reachable],
            args.instance,
        )
    sc, session = hit
    if sc.inst.production and not args.allow_prod:
        raise ProductionRefused(
            f"{sc.inst.name} is a production instance: writes need --allow-prod"
        )
    if not session.project and not args.force:
        raise NotProjectSession(
            f"session {session.id} on {sc.inst.name} is not a project "
            f"session ({session.directory}); --force overrides"
        )

    async def go() -> None:
        transport = ctx.transport_factory(sc.inst) if ctx.transport_factory else None
        async with make_client(cfg, sc.inst, transport) as client:
            await client.abort(session.id)

    try:
        aio.run(go())
    except Exception as exc:
        audit.append(
            cfg.state_dir,
            command="interrupt",
            instance=sc.inst.name,
            session=session.id,
            result="failed",
            reason=str(exc),
            env=ctx.env,
        )
        raise
    audit.append(
        cfg.state_dir,
        command="interrupt",
        instance=sc.inst.name,
        session=session.id,
        result="aborted",
        reason="was " + session.run_state,
        env=ctx.env,
    )
    if ctx.json:
        ctx.out(
            dumps(
                {
                    "instance": sc.inst.name,
                    "session_id": session.id,
                    "was": session.run_state,
                    "result": "aborted",
                }
            )
        )
    else:
        note = "" if session.running else " (it was not running)"
        ctx.out(f"interrupted {session.id} on {sc.inst.name}{note}")
    return 0
