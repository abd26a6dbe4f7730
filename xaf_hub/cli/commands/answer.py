"""Answer a question a run waits on: option labels (one per question), or your own --text."""

from __future__ import annotations

from dataclasses import dataclass

from xaf_hub.cli.commands._common import TEXT, AnswerTarget, send_answer
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import opt
from xaf_hub.ops.waiting import Reply

EXAMPLES = """\
examples:
  xaf-hub answer que_abc123 blue
  xaf-hub answer que_abc123 --text "use the staging database"
"""


@dataclass(frozen=True, kw_only=True)
class Options(AnswerTarget):
    """The options of `answer`."""

    choices: tuple[str, ...] = opt(help="option labels, one per question (see `waiting`)",
                                   default=(), metavar="CHOICE", max_items=64)
    text: str = TEXT.field(help="your own answer", default="", required=False)

    def reply(self) -> Reply:
        """What goes to the server."""

        return Reply("answer", choices=tuple(self.choices), text=self.text.strip())


def run(ctx: Context) -> int:
    """Send it (``ops.waiting``)."""
    return send_answer(ctx, ctx.options(Options))
