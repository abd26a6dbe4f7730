"""Land a task's verified branch on the base branch now, send it back, or drop it.

For a task that worked in a worktree of its own (``project.isolation: "worktree"``): with
``project.integrate: "review"`` a person lands each verified task; whatever the mode, a task
whose conflicts used up ``project.conflict_retries`` waits for one (docs/worktrees.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xaf_hub.cli.context import Context
from xaf_hub.cli.options import MAX_TEXT, Answers, flag, opt
from xaf_hub.core import aio
from xaf_hub.errors import UsageError
from xaf_hub.ops.land import drop, land, send_back_by_person

if TYPE_CHECKING:
    from xaf_hub.ops.land import Landed

EXAMPLES = """\
examples:
  xaf-hub land T-20261206-ab12                      # land its verified branch now
  xaf-hub land T-20261206-ab12 --send-back "rebase onto main, keep both fixes"
  xaf-hub land T-20261206-ab12 --drop               # give it up: branch and worktree go
"""

@dataclass(frozen=True, kw_only=True)
class Options(Answers):
    """The options of `land`."""

    task_id: str = opt(help="the task id (T-...)", required=True, metavar="ID")
    send_back: str | None = opt("--send-back", help="send TEXT to the task's session instead "
                                "(it works on and is judged again)", metavar="TEXT",
                                max_length=MAX_TEXT)
    drop: bool = flag("--drop", help="give the task's work up: its branch and worktree are "
                      "removed and the task is parked")


def carry_out(ctx: Context, opts: Options) -> Landed:
    """Land, send back or drop the task (``ops.land``)."""

    if opts.drop and opts.send_back is not None:
        raise UsageError("--drop and --send-back: choose one")
    ops = ctx.ops()
    if opts.drop:
        return aio.run(drop(ops, opts.task_id))
    if opts.send_back is not None:
        return aio.run(send_back_by_person(ops, opts.task_id, opts.send_back))
    return aio.run(land(ops, opts.task_id, person=True))


def document(done: Landed) -> dict[str, Any]:
    """What `land --json` prints (and the MCP tool answers)."""
    return {"task": done.task, "result": done.result, "detail": done.detail,
            "commit": done.commit or None}


def run(ctx: Context) -> int:
    """Carry the person's decision out and say what happened."""
    done = carry_out(ctx, ctx.options(Options))
    ctx.answer(document(done), f"{done.task}: {done.detail}")
    return 0 if done.result in ("landed", "sent_back", "dropped") else 3
