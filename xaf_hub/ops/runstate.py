"""The one vocabulary for a session's run state (pure).

Every command, patrol job and page names run states with the words defined here
(docs/architecture.md, "Run state"):

* the server's **run state** of a session: ``busy``, ``retry``, ``idle``
  (``records.RunState``, read by the scanner);
* the **outcome** of its last run, from its newest assistant message (``outcome_of``):
  ``succeeded``, ``failed:<error name>``, ``failed:model_unavailable``, ``rate_limited``,
  ``aborted``, ``running`` (never completed), ``unknown``;
* the **last run** (``LastRun``, ``last_run``): the outcome of the newest message, plus
  ``pending`` (a prompt with no answer yet) and ``none`` (no message at all);
* a **verdict** (``Verdict``, ``judge``) a person acts on: running, retrying, finished,
  failed, aborted, interrupted, pending, idle;
* a patrol **class** (``classify``): running, stale_busy, finished, failed, interrupted,
  idle, derived from the verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from xaf_hub.model_state import ErrorClass, classify_error, classify_message
from xaf_hub.records import SessionRecord

RunVerdict = Literal[
    "running", "retrying", "finished", "failed", "aborted", "interrupted", "pending", "idle"
]
# The patrol's classes, in the order reports list them.
STATES = ("running", "stale_busy", "finished", "failed", "interrupted", "idle")


def _info(message: Mapping[str, Any]) -> Mapping[str, Any]:
    info = message.get("info")
    return info if isinstance(info, Mapping) else message


def last_assistant(messages: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest assistant message's ``info``, if any."""
    for msg in reversed(messages):
        info = _info(msg)
        if info.get("role") == "assistant":
            return info
    return None


def last_error(messages: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The error object the last assistant message ended with, if any."""
    info = last_assistant(messages)
    err = info.get("error") if info else None
    return err if isinstance(err, Mapping) else None


def outcome_of(messages: Sequence[Mapping[str, Any]]) -> str:
    """succeeded | failed:<name> | rate_limited | aborted | running | unknown, from messages."""
    info = last_assistant(messages)
    if info is None:
        return "unknown"
    err = info.get("error")
    if isinstance(err, Mapping):
        name = str(err.get("name") or "Error")
        if name == "MessageAbortedError":
            return "aborted"
        kind = classify_error(err)
        if kind == "rate_limited":
            return "rate_limited"
        if kind == "model_unavailable":
            return "failed:model_unavailable"
        return f"failed:{name}"
    t = info.get("time") or {}
    if not isinstance(t, Mapping) or not t.get("completed"):
        return "running"
    if info.get("finish"):
        return "succeeded"
    # Completed with neither finish nor error: an abort during a retry wait looks like this.
    return "aborted"


def error_text(err: Mapping[str, Any] | None) -> str:
    """A one-line description of an opencode error object."""
    if not err:
        return ""
    data = err.get("data") if isinstance(err.get("data"), Mapping) else {}
    assert isinstance(data, Mapping)
    code = data.get("statusCode")
    msg = str(data.get("message") or "").strip().splitlines()
    parts = [str(err.get("name") or "Error")]
    if code:
        parts.append(f"HTTP {code}")
    if msg:
        parts.append(msg[0][:200])
    return ": ".join(parts)


@dataclass(frozen=True)
class LastRun:
    """What a session's newest message says.

    ``outcome`` is ``outcome_of``'s word for an assistant message (succeeded, failed:<name>,
    rate_limited, failed:model_unavailable, aborted, running = never completed), ``pending``
    when the newest message is a prompt with no answer yet, ``none`` without messages.
    """

    outcome: str
    message_id: str = ""
    model: str = ""
    error: Mapping[str, Any] | None = None
    created_ms: int = 0


def _model_of(info: Mapping[str, Any]) -> str:
    provider, model = info.get("providerID"), info.get("modelID")
    if not (provider and model):
        ref = info.get("model")
        if isinstance(ref, Mapping):
            provider, model = ref.get("providerID"), ref.get("modelID") or ref.get("id")
    return f"{provider}/{model}" if provider and model else ""


def last_run(messages: Sequence[Mapping[str, Any]]) -> LastRun:
    """Read the newest message (``messages`` oldest first, as the server returns them)."""
    if not messages:
        return LastRun("none")
    info = _info(messages[-1])
    times = info.get("time")
    created = int((times.get("created") if isinstance(times, Mapping) else 0) or 0)
    message_id, model = str(info.get("id") or ""), _model_of(info)
    if info.get("role") != "assistant":
        # A prompt nobody answered yet: just sent, or refused before any reply (unknown model).
        return LastRun("pending", message_id, model, None, created)
    err = info.get("error")
    return LastRun(
        outcome_of([messages[-1]]),
        message_id,
        model,
        err if isinstance(err, Mapping) else None,
        created,
    )


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
    if rec.run_state == "retry":
        return Verdict(
            "retrying",
            model,
            rec.retry_message,
            classify_message(rec.retry_message),
            rec.retry_next,
            attempt,
        )
    if rec.run_state == "busy":
        detail = "the model is answering" if answered else "busy; no answer from the model yet"
        return Verdict("running", model, detail)
    if run is None:
        return Verdict("idle", model, "last run could not be read")
    outcome = run.outcome
    if outcome == "succeeded":
        return Verdict("finished", model, "the last run finished")
    if outcome == "aborted":
        return Verdict("aborted", model, "the last run was aborted")
    if outcome == "running":
        return Verdict("interrupted", model, "the last run stopped without finishing")
    if outcome == "rate_limited" or outcome.startswith("failed:"):
        return Verdict("failed", model, error_text(run.error) or outcome, classify_error(run.error))
    if outcome == "pending":
        return Verdict(
            "pending",
            model,
            "the last prompt has no answer yet (just sent, or refused before any reply)",
        )
    return Verdict("idle", model, "no run yet")


def classify(
    rec: SessionRecord, run: LastRun | None, now_ms: int, stale_minutes: float
) -> tuple[str, str]:
    """The patrol's (class, detail) for one session, from its verdict (pure)."""
    v = judge(rec, run)
    if v.state == "retrying":
        return "running", f"retrying: {rec.retry_message[:160]}".rstrip(": ")
    if v.state == "running":
        quiet_ms = now_ms - rec.updated if rec.updated > 0 else 0
        if quiet_ms > stale_minutes * 60_000:
            return "stale_busy", f"busy with no update for {quiet_ms // 60_000} min"
        return "running", "busy"
    if v.state == "finished":
        return "finished", ""
    if v.state == "aborted":
        return "interrupted", "the run was aborted"
    if v.state == "interrupted":
        return "interrupted", "the run stopped without finishing (server restart?)"
    if v.state == "failed":
        return "failed", v.detail
    if v.state == "pending":
        return "idle", "the last prompt has no answer yet"
    return "idle", v.detail if run is None else "never ran"


def count_states(lines: Mapping[str, int]) -> str:
    """'2 running, 1 failed' from a class -> count map, in the fixed class order."""
    return ", ".join(f"{lines[s]} {s.replace('_', '-')}" for s in STATES if lines.get(s))
