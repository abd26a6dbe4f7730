"""Deny a permission request (or reject a question) a run waits on; the run goes on without it."""

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
from xaf_hub.cli.options import MAX_TEXT, Opt
from xaf_hub.ops.waiting import Reply

if TYPE_CHECKING:
    from xaf_hub.ops.waiting import Reply

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
class Options(AnswerTarget):
    """What `deny` reads of its options."""

    message: str

    def reply(self) -> Reply:
        """What goes to the server."""

        return Reply("deny", message=self.message.strip())


def run(ctx: Context) -> int:
    """Send it (``ops.waiting``)."""
    return send_answer(ctx, ctx.options(Options))
