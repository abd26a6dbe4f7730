"""Stop a running session (abort its run). Without --instance every instance is searched."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from xaf_hub.cli.commands._common import add_json
from xaf_hub.cli.context import Context
from xaf_hub.core import aio
from xaf_hub.core.text import dumps

EXAMPLES = """\
examples:
  xaf-hub interrupt --session ses_abc123 --instance lan-248
  xaf-hub interrupt --session ses_abc123          # searches every instance
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `interrupt`."""
    add_json(p)
    p.add_argument("-s", "--session", required=True, metavar="ID", help="the session to stop")
    p.add_argument("-i", "--instance", metavar="NAME", help="where it runs (default: search all)")
    p.add_argument("--allow-prod", action="store_true", help="allow writes to production")
    p.add_argument("--force", action="store_true", help="allow a non-project session")


@dataclass(frozen=True)
class Options:
    """What `interrupt` reads of its options."""

    session: str
    instance: str | None
    allow_prod: bool
    force: bool


def run(ctx: Context) -> int:
    """Stop the session (``ops.interrupt``) and say so."""
    from xaf_hub.ops.interrupt import interrupt_session

    opts = ctx.options(Options)
    done = aio.run(
        interrupt_session(
            ctx.ops(),
            opts.session,
            instance=opts.instance,
            allow_prod=opts.allow_prod,
            force=opts.force,
        )
    )
    if done.note:
        ctx.warn(done.note)
    if ctx.json:
        ctx.out(
            dumps(
                {
                    "instance": done.instance,
                    "session_id": done.session_id,
                    "was": done.was,
                    "result": "aborted",
                    "warnings": [done.note] if done.note else [],
                }
            )
        )
    else:
        note = "" if done.running else " (it was not running)"
        ctx.out(f"interrupted {done.session_id} on {done.instance}{note}")
    return 0
