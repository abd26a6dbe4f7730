"""Answer a question a run waits on: option labels (one per question), or your own --text."""

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
from xaf_hub.cli.options import MAX_TEXT, Opt, add_options
from xaf_hub.ops.waiting import Reply

if TYPE_CHECKING:
    from xaf_hub.ops.waiting import Reply

EXAMPLES = """\
examples:
  xaf-hub answer que_abc123 blue
  xaf-hub answer que_abc123 --text "use the staging database"
"""


CHOICES = Opt("choices", (), "option labels, one per question (see `waiting`)",
              kind=list[str], default=(), metavar="CHOICE", max_items=64)
TEXT = Opt("text", ("-t", "--text"), "your own answer", default="", metavar="TEXT",
           max_length=MAX_TEXT)
OPTIONS = (*ANSWER_TARGET, CHOICES, TEXT)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `answer`."""
    add_answer_target(p)
    add_options(p, (CHOICES, TEXT))


@dataclass(frozen=True)
class Options(AnswerTarget):
    """What `answer` reads of its options."""

    choices: tuple[str, ...]
    text: str

    def reply(self) -> Reply:
        """What goes to the server."""

        return Reply("answer", choices=tuple(self.choices), text=self.text.strip())


def run(ctx: Context) -> int:
    """Send it (``ops.waiting``)."""
    return send_answer(ctx, ctx.options(Options))
