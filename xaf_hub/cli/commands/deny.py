"""Deny a permission request (or reject a question) a run waits on; the run goes on without it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from xaf_hub.cli.commands._common import ANSWER_TARGET, add_answer_target, send_answer
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import MAX_TEXT, Opt

EXAMPLES = """\
examples:
  xaf-hub deny per_abc123
  xaf-hub deny per_abc123 --message "do not push; commit locally and report"
"""


MESSAGE = Opt("message", ("-m", "--message"), "tell the agent why, or what instead", default="",
              metavar="TEXT", max_length=MAX_TEXT)
OPTIONS = (*ANSWER_TARGET, MESSAGE)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `deny`."""
    add_answer_target(p)
    MESSAGE.add_to(p)


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
