"""Show one session: state, model, cost, the last prompt and the last answer, and the command
that opens it in opencode's own terminal UI. Without --instance every instance is searched."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xaf_hub.cli.commands._common import SessionTarget
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import opt
from xaf_hub.core import aio
from xaf_hub.core.clock import ago, fmt_time, iso_time
from xaf_hub.core.outcomes import WAITING_WORDS, run_outcome, run_words, stop_applies
from xaf_hub.core.runstate import (
    answer_hint,
    error_text,
    last_error,
    outcome_of,
    refusal_text,
    shown_state,
    waiting_detail,
)
from xaf_hub.errors import UsageError
from xaf_hub.fleet.attach import attach_command, attach_hint
from xaf_hub.ops.decisions import hub_stops
from xaf_hub.ops.interrupt import locate

if TYPE_CHECKING:
    from xaf_hub.config.load import InstanceConfig
    from xaf_hub.core.outcomes import Stop
    from xaf_hub.core.records import Message, SessionRecord

EXAMPLES = """\
examples:
  xaf-hub show ses_abc123
  xaf-hub show ses_abc123 -i lan-248 --json
  xaf-hub show -s ses_abc123
"""


def _text(message: Message) -> str:
    texts = [p.text for p in message.parts if p.type == "text" and not p.synthetic]
    return "\n".join(t for t in texts if t.strip()).strip()


def last_of(messages: Sequence[Message], role: str) -> Message | None:
    """The newest message of ``role`` that has text (or, for answers, an error)."""
    return next((m for m in reversed(messages) if m.role == role
                 and (_text(m) or (role == "assistant" and m.error is not None))), None)


@dataclass(frozen=True, kw_only=True)
class Options(SessionTarget):
    """The options of `show`."""

    limit: int = opt("-n", "--limit", help="read the newest N messages for the prompt and answer "
                     "(default 30)", default=30, metavar="N", minimum=1, maximum=1000)


@dataclass(frozen=True)
class Found:
    """One session as `show` reads it: where it lives and its newest messages."""

    inst: InstanceConfig
    session: SessionRecord
    messages: list[Message]
    stop: Stop | None = None  # the hub's latest recorded stop of it (ops.decisions.hub_stops)

    @property
    def prompt(self) -> Message | None:
        """The last prompt."""
        return last_of(self.messages, "user")

    @property
    def answer(self) -> Message | None:
        """The last answer."""
        return last_of(self.messages, "assistant")


def look(ctx: Context, opts: Options) -> Found:
    """Find the session on the instances asked and read its newest messages."""

    session_id = opts.session_id  # before the config loads
    if opts.limit < 1:
        raise UsageError("--limit must be 1 or more")
    ops = ctx.ops()
    sc, s = aio.run(locate(ops, session_id, opts.instance))

    async def go() -> list[Message]:
        async with ops.client(sc.inst) as client:
            return await client.messages(s.id, limit=opts.limit)

    return Found(sc.inst, s, aio.run(go()), hub_stops(ops).get((sc.inst.name, s.id)))


def _said(msg: Message | None) -> dict[str, Any] | None:
    return None if msg is None else {"text": _text(msg), "at": iso_time(msg.created),
                                     "at_ms": msg.created}


def document(found: Found) -> dict[str, Any]:
    """What `show --json` prints (and the MCP tool answers)."""

    s, messages = found.session, found.messages
    stop = found.stop if stop_applies(found.stop, s.updated) else None
    outcome = run_outcome(outcome_of(messages), running=s.running, stop=stop) or "not_started"
    ended = error_text(last_error(messages))
    if outcome == "denied":
        ended = refusal_text(messages)
    elif stop is not None and outcome in ("ceiling", "interrupted"):
        ended = f"by {stop.who} at {fmt_time(int(stop.at * 1000))}"
    return {
        "instance": found.inst.name,
        "session_id": s.id,
        "title": s.title,
        "directory": s.directory,
        "branch": s.branch or None,
        "project": s.owner or None,  # its project's name, as `sessions --json` says
        "state": shown_state(s),
        "retry_message": s.retry_message,
        "waiting": s.waiting.to_json() if s.waiting is not None else None,
        "last_outcome": outcome,
        "last_error": ended,
        # else provider/model of the newest assistant (or user) message that names one
        "model": s.model or next((m.model for m in reversed(messages) if m.model), ""),
        "cost": s.cost,
        "updated": iso_time(s.updated),
        "updated_ms": s.updated,
        "last_prompt": _said(found.prompt),
        "last_answer": _said(found.answer),
        "attach": attach_command(found.inst, s.id, s.directory),
    }


def run(ctx: Context) -> int:
    """Find the session, read its newest messages, print."""

    opts = ctx.options(Options)
    found = look(ctx, opts)
    doc = document(found)
    s, inst, err = found.session, found.inst, doc["last_error"]
    state = s.run_state + (f" ({s.retry_message})" if s.retry_message else "")
    if s.running and s.waiting is not None:
        since = f" since {fmt_time(s.waiting.since)}" if s.waiting.since else ""
        state = f"{WAITING_WORDS}{since}: {waiting_detail(s.waiting)}"
    rows = [
        ("session", f"{s.id} on {inst.name} ({inst.url})"),
        ("title", s.title),
        ("directory", s.directory + ("" if s.project else "  (not a project session)")),
        *([("branch", f"{s.branch} (its own worktree)")] if s.branch else []),
        ("state", f"{state}; last run: {run_words(doc['last_outcome'])}"
         + (f" ({err})" if err else "")),
        ("model", doc["model"] or "server default"),
        ("cost", "unknown (the server reported none usable)" if s.cost is None
         else f"${s.cost:.4f}"),
        ("updated", f"{fmt_time(s.updated)} ({ago(s.updated, int(time.time() * 1000))})"),
    ]
    if s.running and s.waiting is not None:
        rows.insert(4, ("answer", answer_hint(s.waiting)))
    lines = [f"{key + ':':<11}{value}" for key, value in rows]
    asked = s.waiting.asked.splitlines() if s.running and s.waiting is not None else []
    if len(asked) > 1:  # the state line shows the first: here all of them
        lines += [f"\nasked ({len(asked)} lines):", *(f"  {line}" for line in asked)]
    for label, msg in (("last prompt", found.prompt), ("last answer", found.answer)):
        if msg is None:
            lines.append(f"\n{label}: (none in the newest {opts.limit} messages)")
            continue
        body = _text(msg) or f"(no text: {err})"
        lines += [f"\n{label} ({fmt_time(msg.created)}):", *(f"  {x}" for x in body.splitlines())]
    hint = attach_hint(inst)
    lines += ["\nopen it in opencode:", f"  {doc['attach']}", *([f"  {hint}"] if hint else [])]
    return ctx.answer(doc, *lines)
