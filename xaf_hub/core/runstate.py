"""The one vocabulary for a session's run state (pure): the server's run state, a run's outcome
(``outcome_of``), the last run, a verdict (``judge``) and a patrol class (``classify``);
docs/architecture.md §4 defines each.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from xaf_hub.core.outcomes import WAITING_WORDS, Run, waiting_count
from xaf_hub.core.records import Message, Part, SessionRecord, Waiting

RunVerdict = Literal[
    "running", "waiting", "retrying", "finished", "failed", "denied", "aborted", "interrupted",
    "pending", "idle",
]
# The patrol's classes, in the order reports list them.
STATES = ("running", "waiting", "stale_busy", "finished", "failed", "denied", "interrupted", "idle")

def shown_state(rec: SessionRecord) -> str:
    """The state word a table shows: the server's run state, or ``waiting`` when the run waits
    for a person (the server still says busy)."""
    return "waiting" if rec.running and rec.waiting is not None else rec.run_state


def answer_hint(w: Waiting) -> str:
    """How a person answers ``w`` from the command line."""
    if w.kind == "permission":
        return f"xaf-hub approve {w.request_id} [--always] | xaf-hub deny {w.request_id}"
    return f"xaf-hub answer {w.request_id} CHOICE... | --text TEXT"


def asked_line(asked: str) -> str:
    """What a request asks on one line: its first line, led by "[N lines]" when it has more
    (a view that shows one line says so; `show`, `waiting --json` and the audit show all)."""
    lines = asked.splitlines()
    first = " ".join(next((line for line in lines if line.strip()), "").split())
    return f"[{len(lines)} lines] {first}" if len(lines) > 1 else first


def waiting_detail(w: Waiting) -> str:
    """What a waiting session waits on, in one line: 'permission bash: echo hi'."""
    if w.kind == "permission":
        return f"permission {w.permission or '?'}: {asked_line(w.asked)}".rstrip(": ")
    return f"question: {asked_line(w.asked)}".rstrip(": ")


def _last_assistant_message(messages: Sequence[Message]) -> Message | None:
    return next((m for m in reversed(messages) if m.role == "assistant"), None)


def last_error(messages: Sequence[Message]) -> Mapping[str, Any] | None:
    """The error object the last assistant message ended with, if any."""
    msg = _last_assistant_message(messages)
    return msg.error if msg else None


def refused_tool(message: Message) -> Part | None:
    """A tool call of ``message`` that ended in an error, if any."""
    refused = (p for p in message.parts if p.type == "tool" and p.state.get("status") == "error")
    return next(refused, None)


def refusal_text(messages: Sequence[Message]) -> str:
    """What the server said of the refused request a denied run ended on: 'bash: The user
    rejected permission to use this specific tool call.' ("" when there is none)."""
    msg = _last_assistant_message(messages)
    part = refused_tool(msg) if msg is not None else None
    if part is None:
        return ""
    said = " ".join(str(part.state.get("error") or "").split())[:200]
    return f"{part.tool}: {said}" if part.tool and said else part.tool or said


def outcome_of(messages: Sequence[Message]) -> Run:
    """How the last run ended, from its newest assistant message (its error names a failure).

    A step that ended on tool calls, with one of them in error, and no step after it: the
    server stopped the run because a request of it was refused (a permission denied or a
    question dismissed: opencode ends the loop there; any other tool error goes back to the
    model), so ``denied``. While a run goes on, ``running`` may be read too early: a caller
    that knows the session is idle asks ``core.outcomes.run_outcome``.
    """
    msg = _last_assistant_message(messages)
    if msg is None:
        return "not_started"
    if msg.error is not None:
        if msg.error.get("name") == "MessageAbortedError":
            return "interrupted"
        return "rate_limited" if classify_error(msg.error) == "rate_limited" else "failed"
    if not msg.completed:
        return "running"
    if msg.finish == "tool-calls" and refused_tool(msg) is not None:
        return "denied"
    if msg.finish:
        return "succeeded"
    # Completed with neither finish nor error: an abort during a retry wait looks like this.
    return "interrupted"


def error_text(err: Mapping[str, Any] | None) -> str:
    """A one-line description of an opencode error object."""
    if not err:
        return ""
    data = err.get("data")
    data = data if isinstance(data, Mapping) else {}
    code = data.get("statusCode")
    said = next(iter(str(data.get("message") or "").strip().splitlines()), "")[:200]
    parts = (str(err.get("name") or "Error"), f"HTTP {code}" if code else "", said)
    return ": ".join(part for part in parts if part)


@dataclass(frozen=True)
class LastRun:
    """What a session's newest message says.

    ``outcome`` is ``outcome_of``'s value for an assistant message (its error in ``error``),
    ``pending`` when the newest message is a prompt with no answer yet, ``not_started``
    without messages.
    """

    outcome: Run | Literal["pending"]
    message_id: str = ""
    model: str = ""
    error: Mapping[str, Any] | None = None
    created_ms: int = 0
    answer: str = ""  # the text of the newest assistant message (its final answer)


def answer_text(message: Message) -> str:
    """The text parts of one message, joined: what the agent said (tool output aside)."""
    return "\n".join(p.text for p in message.parts if p.type == "text")[-ANSWER_CHARS:]


# The end of a final answer is what is kept: a report of the commit comes last.
ANSWER_CHARS = 20_000


def last_run(messages: Sequence[Message]) -> LastRun:
    """Read the newest message (``messages`` oldest first, as the server returns them)."""
    if not messages:
        return LastRun("not_started")
    m = messages[-1]
    if m.role != "assistant":
        # A prompt nobody answered yet: just sent, or refused before any reply (unknown model).
        return LastRun("pending", m.id, m.model, None, m.created)
    return LastRun(outcome_of([m]), m.id, m.model, m.error, m.created, answer_text(m))


@dataclass(frozen=True)
class Verdict:
    """What a session's state means, in words a person can act on."""

    state: RunVerdict
    model: str
    detail: str = ""
    signal: ErrorClass = "none"  # classification of the retry message or the error
    next_ms: int = 0  # a retry's next try, ms since the epoch
    attempt: int = 0


def judge(
    rec: SessionRecord, run: LastRun | None, *, answered: bool = False, attempt: int = 0
) -> Verdict:
    """Say what a session's run state and last run mean (pure).

    ``run`` None means its messages could not be read. ``answered``: the model has begun
    answering the newest run (its assistant message has parts).
    """
    model = (run.model if run is not None else "") or rec.model
    if rec.running and rec.waiting is not None:
        # The server says busy, but nothing moves until a person answers.
        return Verdict("waiting", model, f"{WAITING_WORDS}: {waiting_detail(rec.waiting)}")
    if rec.run_state == "retry":
        said = rec.retry_message
        return Verdict("retrying", model, said, classify_message(said), rec.retry_next, attempt)
    if rec.run_state == "busy":
        detail = "the model is answering" if answered else "busy; no answer from the model yet"
        return Verdict("running", model, detail)
    if run is None:
        return Verdict("idle", model, "last run could not be read")
    outcome = run.outcome
    if outcome in ("rate_limited", "failed"):
        return Verdict("failed", model, error_text(run.error) or outcome, classify_error(run.error))
    state, detail = _BY_OUTCOME.get(outcome, ("idle", "no run yet"))
    return Verdict(state, model, detail)


# A last run's outcome -> the verdict and words ``judge`` gives it (failures aside).
_BY_OUTCOME: dict[str, tuple[RunVerdict, str]] = {
    "succeeded": ("finished", "the last run finished"),
    "denied": ("denied", "the last run ended on a refused request"),
    "interrupted": ("aborted", "the last run was aborted"),
    "running": ("interrupted", "the last run stopped without finishing"),
    "pending": ("pending",
                "the last prompt has no answer yet (just sent, or refused before any reply)"),
}


def classify(
    rec: SessionRecord, run: LastRun | None, now_ms: int, stale_minutes: float
) -> tuple[str, str]:
    """The patrol's (class, detail) for one session, from its verdict (pure)."""
    v = judge(rec, run)
    if v.state == "waiting":
        # Never stale, never healed or resumed: the run goes on the moment it is answered.
        return "waiting", v.detail
    if v.state == "retrying":
        return "running", f"retrying: {rec.retry_message[:160]}".rstrip(": ")
    if v.state == "running":
        quiet_ms = now_ms - rec.updated if rec.updated > 0 else 0
        if quiet_ms > stale_minutes * 60_000:
            return "stale_busy", f"busy with no update for {quiet_ms // 60_000} min"
        return "running", "busy"
    if v.state in ("failed", "denied"):
        return v.state, v.detail
    return _CLASSES.get(v.state) or ("idle", v.detail if run is None else "never ran")


# A verdict -> the patrol's class and words for it (those ``classify`` does not work out).
_CLASSES: dict[str, tuple[str, str]] = {
    "finished": ("finished", ""),
    "aborted": ("interrupted", "the run was aborted"),
    "interrupted": ("interrupted", "the run stopped without finishing (server restart?)"),
    "pending": ("idle", "the last prompt has no answer yet"),
}


def count_states(lines: Mapping[str, int]) -> str:
    """'2 running, 1 failed' from a class -> count map, in the fixed class order."""
    return ", ".join(
        waiting_count(lines[s]) if s == "waiting" else f"{lines[s]} {s.replace('_', '-')}"
        for s in STATES
        if lines.get(s)
    )


ErrorClass = Literal["rate_limited", "model_unavailable", "other", "none"]


def _any_case(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.IGNORECASE) for p in patterns)


# Rate limits and spent quotas, as providers and opencode word them (API-1.18.33.md §6 and the
# seed's incident notes). A hit here may black out a whole family until the next reset.
RATE_LIMIT_PATTERNS: tuple[re.Pattern[str], ...] = _any_case(
    r"free[ _-]?usage[ _-]?(?:limit|exceeded)",
    r"FreeUsageLimitError|GoUsageLimitError",  # opencode zen error types in responseBody
    r"usage[ _-]?limit[ _-]?(?:reached|exceeded)",
    r"\brate[ _-]?limit",  # rate limit, rate_limit_error, rate-limited, ratelimit
    r"too[ _-]?many[ _-]?requests",
    r"quota[ _-]?(?:is[ _-]?)?(?:exhausted|exceeded|reached)",
    r"(?:exceeded|exhausted)[ _-]?(?:your|the)?[ _-]?(?:current[ _-]?)?quota",
    r"insufficient[ _-]?quota",
    r"\brps\b[ _-]?(?:limit[ _-]?)?(?:exhausted|exceeded)",
    r"resource[ _-]?exhausted",  # Google's 429 status name
    r"(?<![\w.])429(?![\w.])",  # bare status code; not part of a port, version or number
    r"限流|请求过于频繁|额度(?:已)?(?:用完|用尽|耗尽)|配额(?:已)?(?:用完|用尽|耗尽)",
)


# The model (or its route) cannot serve at all: switch to the next model, never black out.
MODEL_UNAVAILABLE_PATTERNS: tuple[re.Pattern[str], ...] = _any_case(
    r"endpoints?[ _-]?(?:is[ _-]?)?(?:unavailable|not[ _-]?available)",
    r"\bno[ _-]?endpoints?[ _-]?found",
    r"\bno[ _-]?route",  # no route, no-route, no_route
    r"model[ _-]?(?:is[ _-]?)?(?:unavailable|not[ _-]?available)",
    r"model[ _-]?not[ _-]?found",  # model_not_found, Model not found, ProviderModelNotFound
    r"unknown[ _-]?model",
    r"model\b.{0,120}?\bdoes not exist",
    r"provider[ ._-]?internal",  # provider.internal, provider internal error
    r"not[ _-]?available[ _-]?in[ _-]?(?:the[ _-]?|your[ _-]?)?current[ _-]?"
    r"(?:token[ _-]?)?plan",
)


# Errors that are a decision, not a symptom: an abort never heals or blacks out anything.
_NEVER_A_SIGNAL = frozenset({"MessageAbortedError", "ContextOverflowError"})


def classify_message(text: str) -> ErrorClass:
    """Classify a retry-status or error message; rate limit wins over model-unavailable."""
    if not text or not text.strip():
        return "none"
    if any(p.search(text) for p in RATE_LIMIT_PATTERNS):
        return "rate_limited"
    if any(p.search(text) for p in MODEL_UNAVAILABLE_PATTERNS):
        return "model_unavailable"
    return "other"


def _as_text(value: Any) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    # Some providers hand back a parsed body; search its JSON form like the string form.
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def classify_error(error: Mapping[str, Any] | None) -> ErrorClass:
    """Classify an opencode ``info.error`` / ``session.error`` object ``{name, data}``."""
    if error is None:
        return "none"
    name = error.get("name")
    name = name if isinstance(name, str) else ""
    if name in _NEVER_A_SIGNAL:
        return "other"
    data = error.get("data")
    data = data if isinstance(data, Mapping) else {}
    code = data.get("statusCode")  # a number, or one written as text
    if isinstance(code, str) and code.strip().isdigit():
        code = int(code)
    if type(code) is int and code == 429:
        return "rate_limited"
    # The name is searched too: "ProviderModelNotFoundError" says enough on its own.
    parts = (name, _as_text(data.get("message")), _as_text(data.get("responseBody")))
    verdict = classify_message("\n".join(part for part in parts if part))
    return "other" if verdict == "none" else verdict
