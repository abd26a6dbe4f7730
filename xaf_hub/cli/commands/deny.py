"""Deny a permission request (or reject a question) a run waits on; the run goes on without it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from xaf_hub.cli.commands._common import add_answer_target, send_answer
from xaf_hub.cli.context import Context

EXAMPLES = """\
examples:
  xaf-hub deny per_abc123
  xaf-hub deny per_abc123 --message "do not push; commit locally and report"
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `deny`."""
    add_answer_target(p)
    p.add_argument(
        "-m", "--message", default="", metavar="TEXT", help="tell the agent why, or what instead"
    )


@dataclass(frozen=True)
class Options:
    """What `deny` reads of its options."""

    request: str
    instance: str | None
    allow_prod: bool
    force: bool
    message: str


def run(ctx: Context) -> int:
    """Send the refusal (``ops.waiting``)."""
    from xaf_hub.ops.waiting import Reply

    o = ctx.options(Options)
    reply = Reply("deny", message=o.message.strip())
    return send_answer(ctx, o.request, reply, o.instance, o.allow_prod, o.force)
