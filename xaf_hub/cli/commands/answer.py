"""Answer a question a run waits on: option labels (one per question), or your own --text."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from xaf_hub.cli.commands._common import add_answer_target, send_answer
from xaf_hub.cli.context import Context

EXAMPLES = """\
examples:
  xaf-hub answer que_abc123 blue
  xaf-hub answer que_abc123 --text "use the staging database"
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `answer`."""
    add_answer_target(p)
    p.add_argument(
        "choices", nargs="*", metavar="CHOICE", help="option labels (see `waiting`)"
    )
    p.add_argument("-t", "--text", default="", metavar="TEXT", help="your own answer")


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
