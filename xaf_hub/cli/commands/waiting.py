"""List every request a run waits on across the fleet: permission requests and questions.

opencode stops a run to ask a person and keeps calling it busy meanwhile; each such run holds
one of its instance's slots until somebody answers (`approve`, `deny`, `answer`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xaf_hub.cli.commands._common import INSTANCE
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import Answers
from xaf_hub.core import aio
from xaf_hub.core.clock import ago
from xaf_hub.core.runstate import answer_hint, asked_line
from xaf_hub.core.text import shorten
from xaf_hub.errors import ExitCode
from xaf_hub.ops.waiting import list_waiting

if TYPE_CHECKING:
    from xaf_hub.ops.waiting import Waiters

EXAMPLES = """\
examples:
  xaf-hub waiting
  xaf-hub waiting --json
  xaf-hub approve per_abc123            # then: let the tool run once
"""


@dataclass(frozen=True, kw_only=True)
class Options(Answers):
    """The options of `waiting`."""

    instance: str | None = INSTANCE.field()


def look(ctx: Context, opts: Options) -> Waiters:
    """Scan and list the requests (``ops.waiting.list_waiting``)."""

    return aio.run(list_waiting(ctx.ops(), opts.instance))


def document(found: Waiters, now: int) -> dict[str, Any]:
    """What `waiting --json` prints (and the MCP tool answers)."""
    return {"waiting": [p.to_json(now) for p in found.requests],
            "unknown": [{"instance": n, "reason": r} for n, r in found.down]}


def run(ctx: Context) -> int:
    """Scan, list the requests, name who could not say."""

    ctx.see_every_project()
    found = look(ctx, ctx.options(Options))
    now = int(time.time() * 1000)
    for name, reason in found.down:
        ctx.warn(f"{name}: {reason}")
    code = int(ExitCode.UNREACHABLE if found.down else ExitCode.OK)
    if ctx.json:
        return ctx.answer(document(found, now), code=code)
    if found.requests:
        ctx.columns(found.requests, {
            "id": lambda p: p.waiting.request_id,
            "instance": lambda p: p.instance,
            "project": lambda p: p.session.owner or "other",
            "session": lambda p: p.session.id,
            "title": lambda p: shorten(p.session.title, 30),
            "kind": lambda p: p.waiting.permission or p.waiting.kind,
            "asked": lambda p: shorten(asked_line(p.waiting.asked), 60),
            "options": lambda p: " / ".join(",".join(c) for c in p.waiting.choices)
            or ",".join(p.waiting.always),
            "since": lambda p: ago(p.waiting.since, now) if p.waiting.since else "?",
        }, flexible=[("asked", 16), ("title", 10), ("options", 8)], keep={"id": None})
        ctx.info(f"answer: {answer_hint(found.requests[0].waiting)}")
    ctx.info(f"{len(found.requests)} request(s) waiting for a person")
    return code
