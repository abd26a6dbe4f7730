"""Answer a question a run waits on: option labels (one per question), or your own --text."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from xaf_hub.cli.commands._common import ANSWER_TARGET, add_answer_target, send_answer
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import MAX_TEXT, Opt, add_options

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
class Options:
    """What `answer` reads of its options."""

    request: str
    instance: str | None
    allow_prod: bool
    force: bool
    choices: tuple[str, ...]
    text: str


def run(ctx: Context) -> int:
    """Send the answer (``ops.waiting``)."""
    from xaf_hub.ops.waiting import Reply

    o = ctx.options(Options)
    reply = Reply("answer", choices=tuple(o.choices), text=o.text.strip())
    return send_answer(ctx, o.request, reply, o.instance, o.allow_prod, o.force)
