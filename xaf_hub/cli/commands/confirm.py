"""Say whether one session is really running, and with --fix heal it the patrol's way.

The session is looked up on every instance (or the one named by --instance). The answer is
one of: running, retrying (with the provider's message and the next try), finished, failed
(with the error), aborted, interrupted, pending (a prompt with no answer yet) or idle.

`--fix` heals a session that the patrol's fix_free_limit would heal - still retrying on a
rate limit, or idle after a rate-limit or model-unavailable error - with the same code: the
blackout (rate limit on a blackout family only) through the one writer, the next usable model
of the instance's chain, abort of a stuck retry, and the continue prompt with the discipline
block, through the gate. A failure is healed once, whoever heals it first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xaf_hub.cli.commands._common import (
    ALLOW_PROD,
    FORCE,
    SessionTarget,
    chosen_instances,
    healing_text,
    verdict_text,
)
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import flag
from xaf_hub.core import aio
from xaf_hub.core.clock import iso_time, resolve_timezone, to_ms
from xaf_hub.errors import ExitCode, HubError, SessionNotFound, UnreachableError, UsageError
from xaf_hub.ops.confirm import heal_candidate, judge, look
from xaf_hub.ops.context import utc_now
from xaf_hub.ops.heal import heal_session
from xaf_hub.ops.interrupt import locate, session_not_found
from xaf_hub.ops.planner import check_write

if TYPE_CHECKING:
    from xaf_hub.config.load import InstanceConfig
    from xaf_hub.ops.confirm import Sighting

EXAMPLES = """\
examples:
  xaf-hub confirm ses_abc123                         # searches every instance
  xaf-hub confirm --session ses_abc123 --instance lan-189 --json
  xaf-hub confirm --session ses_abc123 --fix         # heal a rate limit now, as the patrol would
exit codes: 0 when the session runs, finished, or is idle (or --fix healed it); 1 when it is
retrying or its last run failed (and --fix did not heal it); 2 unreachable; 3 when --fix found
no free slot for the re-send; 4 unknown session, or --fix on production without --allow-prod;
5 --fix on a non-project session without --force.
"""

async def _find(
    ctx: Context, instances: list[InstanceConfig], session_id: str
) -> tuple[list[tuple[InstanceConfig, Sighting]], list[UnreachableError]]:
    """Every instance that knows the session (with a look at it), and those that did not answer."""

    ops = ctx.ops()

    async def one(inst: InstanceConfig) -> Sighting | UnreachableError | None:
        async with ops.client(inst) as client:
            try:
                return await look(client, inst, await client.get_session(session_id))
            except SessionNotFound:
                return None
            except UnreachableError as exc:
                return exc
            except HubError as exc:
                return inst.unreachable(str(exc), "other")

    seen = list(zip(instances, await aio.gather(*(one(i) for i in instances)), strict=True))
    down = [what for _, what in seen if isinstance(what, UnreachableError)]
    return [(i, w) for i, w in seen if w is not None and not isinstance(w, UnreachableError)], down


@dataclass(frozen=True, kw_only=True)
class Options(SessionTarget):
    """The options of `confirm`."""

    fix: bool = flag("--fix", help="heal a rate-limited / model-unavailable session now, exactly "
                     "as the patrol would")
    allow_prod: bool = ALLOW_PROD.field(help="allow --fix on production")
    force: bool = FORCE.field(help="allow --fix on a non-project session")


def run(ctx: Context) -> int:
    """Find the session, judge it, and with --fix heal it."""

    opts = ctx.options(Options)
    session_id = opts.session_id
    instances = chosen_instances(ctx, opts.instance)
    found, down = aio.run(_find(ctx, instances, session_id))
    if not found:  # not a whole id: the one session whose id starts with it, if any
        session_id = aio.run(locate(ctx.ops(), session_id, opts.instance))[1].id
        found, down = aio.run(_find(ctx, instances, session_id))
    if not found:
        raise session_not_found(session_id, down, opts.instance)
    # Servers sharing one database all know the session; only the one running it says so.
    inst, seen = next(((i, s) for i, s in found if s.rec.running), found[0])
    if len(found) > 1:
        names = ", ".join(i.name for i, _ in found)
        ctx.warn(f"{session_id} is known to {names} (a shared database?); using {inst.name}")
    tz = resolve_timezone(ctx.config.models.timezone)
    verdict = judge(seen)
    cand = heal_candidate(seen)
    rec = seen.rec
    line = (f"{rec.id} on {inst.name} ({rec.title or 'untitled'}): "
            f"{verdict_text(verdict, tz, to_ms(utc_now()))}")
    code = int(ExitCode.INTERNAL if verdict.state in ("retrying", "failed") else ExitCode.OK)
    fix: dict[str, Any] | None = None
    fix_line = ""
    if opts.fix:
        if cand is None:
            fix = {"healed": False, "reason": "nothing the patrol would heal"}
            fix_line = "nothing to fix: " + (
                "not a rate limit or an unavailable model; --fix heals only those"
                if verdict.state in ("retrying", "failed") else f"the session is {verdict.state}")
        else:
            check_write(inst, rec, allow_prod=opts.allow_prod, force=opts.force)
            if rec.parent_id:
                raise UsageError(f"{rec.id} is a sub-agent session of {rec.parent_id}: its "
                                 "parent owns it; confirm the parent instead")
            try:
                healing = aio.run(heal_session(ctx.ops(), inst, rec, cand, origin="confirm"))
            except HubError as exc:
                fix = {"healed": False, "error": str(exc)}
                fix_line = f"fix failed: {exc}"
                code = int(exc.exit_code)
            else:
                for note in healing.notes:
                    ctx.warn(note)
                healed = healing.to_model is not None and not healing.already
                fix = {"healed": healed, **healing.to_json()}
                fix_line = "fix: " + healing_text(healing, tz)
                code = int(ExitCode.OK if healed or healing.already else ExitCode.INTERNAL)
    hint = f"hint: the patrol heals this; `xaf-hub confirm --session {rec.id} --fix` does it now"
    tail = [fix_line] if fix_line else [hint] if cand is not None else []
    retry = {"attempt": verdict.attempt, "message": verdict.detail,
             "next_ms": verdict.next_ms or None, "next": iso_time(verdict.next_ms)}
    return ctx.answer({
        "instance": inst.name,
        "session_id": rec.id,
        "title": rec.title,
        "directory": rec.directory,
        "project": rec.owner or None,
        "state": verdict.state,
        "model": verdict.model or None,
        "detail": verdict.detail,
        "signal": verdict.signal,
        "retry": retry if verdict.state == "retrying" else None,
        "healable": cand is not None,
        "fix": fix,
        "message": line,
        "fix_message": fix_line or None,
    }, line, *tail, code=code)
