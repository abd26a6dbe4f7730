"""Stop a running session (abort its run). Without --instance every instance is searched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xaf_hub.cli.commands._common import ALLOW_PROD, FORCE, SessionTarget
from xaf_hub.cli.context import Context
from xaf_hub.core import aio
from xaf_hub.ops.interrupt import interrupt_session

if TYPE_CHECKING:
    from xaf_hub.ops.interrupt import Interrupted

EXAMPLES = """\
examples:
  xaf-hub interrupt ses_abc123 --instance lan-248
  xaf-hub interrupt -s ses_abc123                 # searches every instance
"""

@dataclass(frozen=True, kw_only=True)
class Options(SessionTarget):
    """The options of `interrupt`."""

    allow_prod: bool = ALLOW_PROD.field()
    force: bool = FORCE.field()


def document(done: Interrupted) -> dict[str, Any]:
    """What `interrupt --json` prints (and the MCP tool answers)."""
    return {"instance": done.instance, "session_id": done.session_id, "was": done.was,
            "result": "aborted", "warnings": [done.note] if done.note else []}


def carry_out(ctx: Context, opts: Options) -> Interrupted:
    """Stop the session (``ops.interrupt``); a note for the person goes to ``ctx.warn``."""
    session = opts.session_id  # before the config loads
    done = aio.run(interrupt_session(ctx.ops(), session, instance=opts.instance,
                                     allow_prod=opts.allow_prod, force=opts.force))
    if done.note:
        ctx.warn(done.note)
    return done


def run(ctx: Context) -> int:
    """Stop the session and say so."""
    done = carry_out(ctx, ctx.options(Options))
    note = "" if done.running else " (it was not running)"
    return ctx.answer(document(done), f"interrupted {done.session_id} on {done.instance}{note}")
