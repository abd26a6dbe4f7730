"""Deny a permission request (or reject a question) a run waits on; the run goes on without it."""

from __future__ import annotations

from dataclasses import dataclass

from xaf_hub.cli.commands._common import AnswerTarget, send_answer
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import MAX_TEXT, opt
from xaf_hub.ops.waiting import Reply

EXAMPLES = """\
examples:
  xaf-hub deny per_abc123
  xaf-hub deny per_abc123 --message "do not push; commit locally and report"
"""


@dataclass(frozen=True, kw_only=True)
class Options(AnswerTarget):
    """The options of `deny`."""

    message: str = opt("-m", "--message", help="tell the agent why, or what instead", default="",
                       metavar="TEXT", max_length=MAX_TEXT)

    def reply(self) -> Reply:
        """What goes to the server."""

        return Reply("deny", message=self.message.strip())


def run(ctx: Context) -> int:
    """Send it (``ops.waiting``)."""
    return send_answer(ctx, ctx.options(Options))
