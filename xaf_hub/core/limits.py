"""When a rate-limited provider said it will take work again (pure).

``stated_end`` reads a retry's ``next``, a Retry-After or the message's words; None means nothing
was said. A wait shorter than ``BACKOFF_CEILING`` is no statement, no input raises, and an end is
never later than ``longest`` after now (docs/architecture.md §7).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from email.utils import parsedate_to_datetime
from typing import Any

from xaf_hub.core.clock import read_instant

__all__ = ["parse_until", "BACKOFF_CEILING", "stated_end", "stated_in_headers", "stated_in_text"]

# opencode's retry delay without a Retry-After: 2000 * 2**(attempt-1) * (1 + 0.25*rand) ms, at
# most 5 retries, so at most 40 s; anything further off was stated by the provider.
BACKOFF_CEILING = timedelta(seconds=45)
# What a time may be turned from, and the number it reads; ASCII only, so that a unit or a
# digit means what it says ("ſ" folds to "s" under re.I, "٣" is a digit to Unicode).
_FLAGS = re.IGNORECASE | re.ASCII

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
    rf"\b{_LEAD}\s+(?:in|after)\s+(?:about\s+|approximately\s+|~\s*)?(?P<d>{_DURATION})", _FLAGS
)
_RETRY_AFTER = re.compile(
    r"\bretry[-_ ]after(?:[-_ ]ms)?\W{0,3}(?P<n>\d+(?:\.\d+)?)\s*(?P<u>" + _UNIT + r")?\b", _FLAGS
)
_ISO = r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
_AT_INSTANT = re.compile(
    rf"\b(?:{_LEAD}|until|resets?_at|reset[-_ ]?time)\W{{0,3}}(?:at|on|after|:)?\s*"
    rf"(?P<t>{_ISO})",
    _FLAGS,
)
_PIECE = re.compile(rf"(\d+(?:\.\d+)?)\s*({_UNIT})", _FLAGS)
_NUMBER = re.compile(r"\d+(?:\.\d+)?", re.ASCII)


def _seconds(duration: str) -> float:
    """A duration's seconds: ``inf`` for more than a float holds (huge, never an error)."""
    return sum(float(n) * _UNIT_SECONDS[u.lower()] for n, u in _PIECE.findall(duration))


def _after(start: datetime, seconds: float, longest: timedelta) -> datetime:
    """``seconds`` (at most ``longest``) after ``start``; ``start`` itself for no wait."""
    wait = min(seconds, longest.total_seconds()) if seconds > 0 else 0.0  # NaN: no wait
    try:
        return start + timedelta(seconds=wait)
    except OverflowError:  # a start at the end of the calendar (a hostile Date header)
        return start


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _date(text: str) -> datetime | None:
    """An HTTP date, or None for anything else."""
    try:
        return _aware(parsedate_to_datetime(text))
    except (ArithmeticError, LookupError, TypeError, ValueError):
        return None


def stated_in_text(text: str, now: datetime, longest: timedelta) -> datetime | None:
    """The end a message states (a Retry-After, "try again in …", "resets at …"), or None.

    Durations count from ``now`` (when the message was said), at most ``longest``; the first
    statement of an end after ``now`` wins.
    """
    if not text:
        return None
    found: list[tuple[int, datetime]] = []
    if m := _RETRY_AFTER.search(text):
        unit = (m.group("u") or ("ms" if "ms" in m.group(0).lower()[:16] else "s")).lower()
        wait = float(m.group("n")) * _UNIT_SECONDS[unit]
        found.append((m.start(), _after(now, wait, longest)))
    if m := _IN_DURATION.search(text):
        found.append((m.start(), _after(now, _seconds(m.group("d")), longest)))
    if (m := _AT_INSTANT.search(text)) and (when := read_instant(m.group("t"))) is not None:
        found.append((m.start(), when))
    when = next((w for _, w in sorted(found, key=lambda f: f[0]) if w > now), None)
    return None if when is None else min(when, _after(now, math.inf, longest))


def _said_at(headers: Mapping[str, Any], fallback: datetime) -> datetime:
    """When a response was sent: its ``Date`` header, else ``fallback``."""
    date = next((str(v) for k, v in headers.items() if str(k).lower() == "date"), "")
    return (_date(date) if date else None) or fallback


def stated_in_headers(
    headers: Mapping[str, Any], fallback: datetime, longest: timedelta
) -> datetime | None:
    """The end a response's ``Retry-After-Ms`` / ``Retry-After`` header states, or None.

    Seconds count from the response's ``Date`` header when it has one, else ``fallback``, at
    most ``longest``.
    """
    low = {str(k).lower(): str(v) for k, v in headers.items()}
    said = _said_at(headers, fallback)
    ms = low.get("retry-after-ms", "").strip()
    if _NUMBER.fullmatch(ms):
        return _after(said, float(ms) / 1000, longest)
    value = low.get("retry-after", "").strip()
    if _NUMBER.fullmatch(value):
        return _after(said, float(value), longest)
    when = _date(value) if value else None
    return None if when is None else min(when, _after(said, math.inf, longest))


def _error_statement(
    error: Mapping[str, Any], said: datetime, longest: timedelta
) -> tuple[datetime, datetime] | None:
    """(the end, when it was said) an opencode error states, or None."""
    data = error.get("data")
    if not isinstance(data, Mapping):
        return None
    headers = data.get("responseHeaders")
    if isinstance(headers, Mapping):
        when = stated_in_headers(headers, said, longest)
        if when is not None:
            return when, _said_at(headers, said)
    for key in ("message", "responseBody"):
        value = data.get(key)
        if isinstance(value, str):
            when = stated_in_text(value, said, longest)
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
    longest: timedelta,
) -> datetime | None:
    """When the provider said the limit lifts, or None when it said nothing usable.

    A retry under way gives ``next_ms`` (its next try) and its ``message`` (said now); a
    failed run gives its ``error`` (opencode's ``{name, data}``: headers, message, body), said
    at ``said_ms`` (when the failed message began) unless its headers carry a date. Only an
    end more than ``BACKOFF_CEILING`` after it was said counts, and none lies more than
    ``longest`` after ``now``: a longer one ends then. The end may lie in the past (a failure
    read late: its rest is over).
    """
    # The first statement wins: the retry's next try, its message (both said now), the error.
    when = read_instant(next_ms) if next_ms > 0 else None
    if when is None or not _a_statement(when, now):
        when = stated_in_text(message, now, longest)
    found = None if when is None else (when, now)
    if (found is None or not _a_statement(*found)) and error is not None:
        said = (read_instant(said_ms) if said_ms > 0 else None) or now
        found = _error_statement(error, said, longest)
    if found is None or not _a_statement(*found):
        return None
    return min(found[0], _after(now, math.inf, longest))


def _a_statement(end: datetime, said: datetime) -> bool:
    # A wait up to opencode's own back-off is that back-off (``next`` without a Retry-After),
    # or a short wait opencode already honoured on each retry while the limit held.
    return end - said > BACKOFF_CEILING


_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")


def parse_until(text: str, now: datetime, tz: tzinfo) -> datetime:
    """When a person's rest ends: a duration ("90m", "2h 30m"), a local clock time ("18:00",
    the next one) or an instant ("2026-12-04T09:00", local unless it names its offset).

    Raises ValueError naming what was not understood; the end must lie ahead of ``now``.
    """
    value = text.strip()
    when: datetime | None = None
    if re.fullmatch(_DURATION, value, _FLAGS):
        try:
            when = now + timedelta(seconds=_seconds(value))
        except OverflowError:
            raise ValueError(f"{text!r} is further off than a calendar goes") from None
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
