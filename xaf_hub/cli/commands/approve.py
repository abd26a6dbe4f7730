"""Approve a permission request a run waits on: once, or --always for the patterns it offers."""

from __future__ import annotations

from dataclasses import dataclass

from xaf_hub.cli.commands._common import AnswerTarget, send_answer
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import flag
from xaf_hub.ops.waiting import Reply

EXAMPLES = """\
examples:
  xaf-hub approve per_abc123
  xaf-hub approve per_abc123 --always    # also what it offers ("git *"), for this session
"""


@dataclass(frozen=True, kw_only=True)
class Options(AnswerTarget):
    """The options of `approve`."""

    always: bool = flag("--always", help="allow the patterns the request offers from now on")

    def reply(self) -> Reply:
        """What goes to the server."""

        return Reply("approve", always=self.always)


def run(ctx: Context) -> int:
    """Send it (``ops.waiting``)."""
    return send_answer(ctx, ctx.options(Options))
