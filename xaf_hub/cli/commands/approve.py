"""Approve a permission request a run waits on: once, or --always for the patterns it offers."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xaf_hub.cli.commands._common import (
    ANSWER_TARGET,
    AnswerTarget,
    add_answer_target,
    send_answer,
)
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import Opt
from xaf_hub.ops.waiting import Reply

if TYPE_CHECKING:
    from xaf_hub.ops.waiting import Reply

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
class Options(AnswerTarget):
    """What `approve` reads of its options."""

    always: bool

    def reply(self) -> Reply:
        """What goes to the server."""

        return Reply("approve", always=self.always)


def run(ctx: Context) -> int:
    """Send it (``ops.waiting``)."""
    return send_answer(ctx, ctx.options(Options))
