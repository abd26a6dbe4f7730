"""When a rate-limited provider said it will take work again (pure).

A provider that answers 429 often says for how long: a ``Retry-After`` header (opencode turns
it into the ``retry`` status's ``next``, measured on 1.18.33: ``Retry-After: 300`` gives a
``next`` 300 s ahead), a sentence in the message ("Please try again in 6m0s", "It will reset
in 3h 20m"), or a reset instant ("resets at 2026-12-03T15:00:00Z"). ``stated_end`` reads
those; None means nothing was said and the caller falls back to the reset hour.

opencode's own back-off also fills ``next`` (2 s doubling per attempt, at most about 40 s at
the fifth attempt; architecture §7): a ``next`` closer than ``BACKOFF_CEILING`` is that
back-off, not the provider's word, and is ignored. So is any stated wait that short: opencode
honours it on each of its retries, and a run that still failed shows the limit outlasted it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from email.utils import parsedate_to_datetime
from typing import Any

__all__ = [
    "parse_until",
    "BACKOFF_CEILING",
    "LONGEST_STATED",
    "stated_end",
    "stated_in_headers",
    "stated_in_text",
]

# opencode's retry delay without a Retry-After: 2000 * 2**(attempt-1) * (1 + 0.25*rand) ms, at
# most 5 retries, so at most 40 s; anything further off was stated by the provider.
BACKOFF_CEILING = timedelta(seconds=45)
# A stated time further off than this is a misreading (a year in a message): not believed.
LONGEST_STATED = timedelta(days=8)

_UNIT_SECONDS = {
    "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}  # fmt: skip
_UNIT = r"(?:milliseconds?|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d)"
_PART = rf"\d+(?:\.\d+)?\s*{_UNIT}\b"
_PART_TIGHT = rf"\d+(?:\.\d+)?{_UNIT}"  # "6m0s": parts with no space and no word boundary
_DURATION = rf"(?:{_PART}(?:\s*(?:,|and)?\s*{_PART})*|{_PART_TIGHT}(?:{_PART_TIGHT})*\b)"
_LEAD = r"(?:try\s+again|retry|reset|resets|be\s+reset|available(?:\s+again)?|lifted|wait)"
_IN_DURATION = re.compile(
    rf"\b{_LEAD}\s+(?:in|after)\s+(?:about\s+|approximately\s+|~\s*)?(?P<d>{_DURATION})", re.I
)
_RETRY_AFTER = re.compile(
    r"\bretry[-_ ]after(?:[-_ ]ms)?\W{0,3}(?P<n>\d+(?:\.\d+)?)\s*(?P<u>" + _UNIT + r")?\b", re.I
)
_ISO = r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
_AT_INSTANT = re.compile(
    rf"\b(?:{_LEAD}|until|resets?_at|reset[-_ ]?time)\W{{0,3}}(?:at|on|after|:)?\s*"
    rf"(?P<t>{_ISO})",
    re.I,
)
_PIECE = re.compile(rf"(\d+(?:\.\d+)?)\s*({_UNIT})", re.I)


def _seconds(duration: str) -> float:
    return sum(float(n) * _UNIT_SECONDS[u.lower()] for n, u in _PIECE.findall(duration))


def _instant(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text.replace(" ", "T").replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _believable(when: datetime, said: datetime) -> bool:
    return said < when <= said + LONGEST_STATED


def stated_in_text(text: str, now: datetime) -> datetime | None:
    """The end a message states (a Retry-After, "try again in …", "resets at …"), or None.

    Durations count from ``now`` (when the message was said); the first statement wins.
    """
    if not text:
        return None
    found: list[tuple[int, datetime]] = []
    m = _RETRY_AFTER.search(text)
    if m:
        unit = (m.group("u") or ("ms" if "ms" in m.group(0).lower()[:16] else "s")).lower()
        found.append(
            (m.start(), now + timedelta(seconds=float(m.group("n")) * _UNIT_SECONDS[unit]))
        )
    m = _IN_DURATION.search(text)
    if m:
        found.append((m.start(), now + timedelta(seconds=_seconds(m.group("d")))))
    m = _AT_INSTANT.search(text)
    if m:
        when = _instant(m.group("t"))
        if when is not None:
            found.append((m.start(), when))
    for _, when in sorted(found, key=lambda f: f[0]):
        if _believable(when, now):
            return when
    return None


def _said_at(headers: Mapping[str, Any], fallback: datetime) -> datetime:
    """When a response was sent: its ``Date`` header, else ``fallback``."""
    date = next((str(v) for k, v in headers.items() if str(k).lower() == "date"), "")
    try:
        said = parsedate_to_datetime(date) if date else fallback
    except (TypeError, ValueError):
        said = fallback
    return said if said.tzinfo else said.replace(tzinfo=UTC)


def stated_in_headers(headers: Mapping[str, Any], fallback: datetime) -> datetime | None:
    """The end a response's ``Retry-After-Ms`` / ``Retry-After`` header states, or None.

    Seconds count from the response's ``Date`` header when it has one, else ``fallback``.
    """
    low = {str(k).lower(): str(v) for k, v in headers.items()}
    said = _said_at(headers, fallback)
    ms = low.get("retry-after-ms", "").strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", ms):
        return said + timedelta(milliseconds=float(ms))
    value = low.get("retry-after", "").strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return said + timedelta(seconds=float(value))
    if value:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return when if when.tzinfo else when.replace(tzinfo=UTC)
    return None


def _error_statement(error: Mapping[str, Any], said: datetime) -> tuple[datetime, datetime] | None:
    """(the end, when it was said) an opencode error states, or None."""
    data = error.get("data")
    if not isinstance(data, Mapping):
        return None
    headers = data.get("responseHeaders")
    if isinstance(headers, Mapping):
        when = stated_in_headers(headers, said)
        if when is not None:
            return when, _said_at(headers, said)
    for key in ("message", "responseBody"):
        value = data.get(key)
        if isinstance(value, str):
            when = stated_in_text(value, said)
            if when is not None:
                return when, said
    return None


def stated_end(
    *,
    now: datetime,
    next_ms: int = 0,
    message: str = "",
    error: Mapping[str, Any] | None = None,
    said_ms: int = 0,
) -> datetime | None:
    """When the provider said the limit lifts, or None when it said nothing usable.

    A retry under way gives ``next_ms`` (its next try) and its ``message`` (said now); a
    failed run gives its ``error`` (opencode's ``{name, data}``: headers, message, body), said
    at ``said_ms`` (when the failed message began) unless its headers carry a date. Only an
    end more than ``BACKOFF_CEILING`` and at most ``LONGEST_STATED`` after it was said counts.
    The end may lie in the past (a failure read late: its rest is over).
    """
    found: tuple[datetime, datetime] | None = None
    if next_ms > 0:
        found = (datetime.fromtimestamp(next_ms / 1000, UTC), now)
    if found is None or not _a_statement(*found):
        when = stated_in_text(message, now)
        found = None if when is None else (when, now)
    if (found is None or not _a_statement(*found)) and error is not None:
        said = datetime.fromtimestamp(said_ms / 1000, UTC) if said_ms > 0 else now
        found = _error_statement(error, said)
    return found[0] if found is not None and _a_statement(*found) else None


def _a_statement(end: datetime, said: datetime) -> bool:
    # A wait up to opencode's own back-off is that back-off (``next`` without a Retry-After),
    # or a short wait opencode already honoured on each retry while the limit held.
    return BACKOFF_CEILING < end - said <= LONGEST_STATED


_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")


def parse_until(text: str, now: datetime, tz: tzinfo) -> datetime:
    """When a person's rest ends: a duration ("90m", "2h 30m"), a local clock time ("18:00",
    the next one) or an instant ("2026-12-04T09:00", local unless it names its offset).

    Raises ValueError naming what was not understood; the end must lie ahead of ``now``.
    """
    value = text.strip()
    when: datetime | None = None
    if re.fullmatch(_DURATION, value, re.I):
        when = now + timedelta(seconds=_seconds(value))
    elif m := _CLOCK.fullmatch(value):
        hour, minute = int(m.group(1)), int(m.group(2))
        if hour > 23 or minute > 59:
            raise ValueError(f"{text!r} is not a clock time (HH:MM)")
        local = now.astimezone(tz)
        when = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if when <= now:
            when = (local + timedelta(days=1)).replace(
                hour=hour, minute=minute, second=0, microsecond=0
            )
    else:
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"{text!r} is not a time: give a duration (90m, 2h), a clock time (18:00) "
                "or an ISO time (2026-12-04T09:00)"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=tz)
    if when <= now:
        raise ValueError(f"{text!r} is not in the future")
    return when
