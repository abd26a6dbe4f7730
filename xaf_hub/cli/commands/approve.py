"""Approve a permission request a run waits on: once, or --always for the patterns it offers."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from xaf_hub.cli.commands._common import ANSWER_TARGET, add_answer_target, send_answer
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import Opt

EXAMPLES = """\
examples:
  xaf-hub approve per_abc123
  xaf-hub approve per_abc123 --always    # also what it offers ("git *"), for this session
"""


ALWAYS = Opt("always", ("--always",), "allow the patterns the request offers from now on",
             kind=bool, default=False)
OPTIONS = (*ANSWER_TARGET, ALWAYS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `approve`."""
    add_answer_target(p)
    ALWAYS.add_to(p)


@dataclass(frozen=True)
class Options:
    """What `approve` reads of its options."""

    request: str
    instance: str | None
    allow_prod: bool
    force: bool
    always: bool


def run(ctx: Context) -> int:
    """Send the approval (``ops.waiting``)."""
    from xaf_hub.ops.waiting import Reply

    o = ctx.options(Options)
    reply = Reply("approve", always=o.always)
    return send_answer(ctx, o.request, reply, o.instance, o.allow_prod, o.force)
