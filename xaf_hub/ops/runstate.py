"""What the last run of a session came to, read from its newest messages (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from xaf_hub.model_state import classify_error


def last_assistant(messages: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest assistant message's ``info``, if any."""
    for msg in reversed(messages):
        info = msg.get("info") if isinstance(msg.get("info"), Mapping) else msg
        if isinstance(info, Mapping) and info.get("role") == "assistant":
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
