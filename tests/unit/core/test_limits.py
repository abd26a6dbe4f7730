"""What a rate-limited provider said about its end: labelled messages, headers and next values.

Each case is a real-shaped statement (opencode's retry status, OpenAI / Anthropic / Groq /
opencode-zen wordings) with the end a person reading it would name, and cases where nothing
is said (the hub must then fall back to the reset hour, not invent an end).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from xaf_hub.core.clock import to_ms
from xaf_hub.core.limits import stated_end, stated_in_headers, stated_in_text

NOW = datetime(2026, 12, 3, 13, 0, 0, tzinfo=UTC)


def later(**kw: float) -> datetime:
    return NOW + timedelta(**kw)


STATED_TEXT: list[tuple[str, datetime | None]] = [
    # Said: a duration.
    ("Rate limit reached for gpt-4o. Please try again in 6m0s.", later(minutes=6)),
    ("Rate limit reached. Please try again in 20s.", later(seconds=20)),
    ("Rate limit reached. Please try again in 1.5s.", later(seconds=1.5)),
    ("Please try again in 1h2m3s", later(hours=1, minutes=2, seconds=3)),
    ("Go usage limit reached. It will reset in 3h 20m.", later(hours=3, minutes=20)),
    ("Monthly limit reached. It will reset in 2 days", later(days=2)),
    ("Too many requests, retry after 300 seconds", later(seconds=300)),
    ("429 Too Many Requests (Retry-After: 7200)", later(seconds=7200)),
    ("rate_limit_exceeded; retry-after-ms: 1500", later(milliseconds=1500)),
    ("Quota exceeded. Try again in 2 hours and 15 minutes.", later(hours=2, minutes=15)),
    ("You can retry in about 5 minutes", later(minutes=5)),
    # Said: an instant.
    (
        "Daily quota exhausted; resets at 2026-12-03T20:00:00Z",
        datetime(2026, 12, 3, 20, tzinfo=UTC),
    ),
    (
        '{"error":{"type":"rate_limit","reset_time":"2026-12-04 01:30:00+00:00"}}',
        datetime(2026, 12, 4, 1, 30, tzinfo=UTC),
    ),
    (
        "Limit reached, available again at 2026-12-03T15:00:00+01:00",
        datetime(2026, 12, 3, 14, tzinfo=UTC),
    ),
    # Said nothing usable.
    ("Rate limit exceeded: free usage limit reached. Please try again later.", None),
    ("Free usage exceeded, subscribe to Go", None),
    ("Too many requests", None),
    ("You exceeded your current quota, please check your plan and billing details.", None),
    ("Rate limit: 60 requests per 1 minute", None),  # a rule, not an end
    ("Model gpt-5 released 2026-01-01T00:00:00Z is unavailable", None),  # a date, not a reset
    ("resets at 2026-12-01T08:00:00Z", None),  # already past when said: not a rest's end
    ("try again in 400 days", None),  # further than anyone believes
    ("", None),
]


@pytest.mark.parametrize(("text", "end"), STATED_TEXT, ids=[t[:40] for t, _ in STATED_TEXT])
def test_stated_in_text(text: str, end: datetime | None) -> None:
    assert stated_in_text(text, NOW) == end


HEADERS: list[tuple[dict[str, Any], datetime | None]] = [
    ({"retry-after": "300", "date": "Thu, 03 Dec 2026 12:59:00 GMT"}, later(seconds=240)),
    ({"Retry-After": "7200"}, later(seconds=7200)),  # no date: counts from when it was said
    ({"retry-after-ms": "1500", "retry-after": "9"}, later(milliseconds=1500)),
    ({"retry-after": "Thu, 03 Dec 2026 14:00:00 GMT"}, later(hours=1)),
    ({"retry-after": "soon"}, None),
    ({"content-type": "application/json"}, None),
]


@pytest.mark.parametrize(("headers", "end"), HEADERS)
def test_stated_in_headers(headers: dict[str, Any], end: datetime | None) -> None:
    assert stated_in_headers(headers, NOW) == end


def ms(when: datetime) -> int:
    return to_ms(when)


def api_error(message: str, headers: dict[str, str] | None = None, body: str = "") -> Any:
    data: dict[str, Any] = {"message": message, "statusCode": 429, "isRetryable": True}
    if headers is not None:
        data["responseHeaders"] = headers
    if body:
        data["responseBody"] = body
    return {"name": "APIError", "data": data}


STATED_END: list[tuple[str, dict[str, Any], datetime | None]] = [
    # A retry under way: opencode's next try carries the provider's Retry-After (measured).
    (
        "next 300 s ahead (Retry-After: 300)",
        {"next_ms": ms(later(seconds=300))},
        later(seconds=300),
    ),
    ("next 7200 s ahead", {"next_ms": ms(later(seconds=7200))}, later(seconds=7200)),
    # opencode's own back-off (no Retry-After): 2 s .. 40 s ahead, never a statement.
    ("back-off, attempt 1", {"next_ms": ms(later(seconds=2.4))}, None),
    ("back-off, attempt 5", {"next_ms": ms(later(seconds=39.8))}, None),
    (
        "back-off, retry message says nothing",
        {
            "next_ms": ms(later(seconds=8)),
            "message": "Rate limit exceeded. Please try again later.",
        },
        None,
    ),
    (
        "short next, message states the time",
        {"next_ms": ms(later(seconds=8)), "message": "Please try again in 6m0s."},
        later(minutes=6),
    ),
    ("next past (read late)", {"next_ms": ms(later(seconds=-10))}, None),
    (
        "a short stated wait is no statement (opencode waits it out on each retry)",
        {"next_ms": ms(later(seconds=8)), "message": "Please try again in 20s."},
        None,
    ),
    # A failed run: headers counted from their date, else from when the message began.
    (
        "error header with date",
        {
            "error": api_error(
                "Rate limit", {"retry-after": "900", "date": "Thu, 03 Dec 2026 12:50:00 GMT"}
            )
        },
        later(minutes=5),
    ),
    (
        "error header without date",
        {
            "error": api_error("Rate limit", {"retry-after": "600"}),
            "said_ms": ms(later(minutes=-2)),
        },
        later(minutes=8),
    ),
    (
        "error body states a reset",
        {
            "error": api_error(
                "Rate limit", {}, '{"error":{"message":"resets at 2026-12-03T18:00:00Z"}}'
            )
        },
        datetime(2026, 12, 3, 18, tzinfo=UTC),
    ),
    (
        "error states nothing",
        {
            "error": api_error(
                "Rate limit exceeded: free usage limit reached. Please try again later."
            )
        },
        None,
    ),
    (
        "error stated an end already past (its rest is over)",
        {"error": api_error("Rate limit", {"retry-after": "60"}), "said_ms": ms(later(hours=-1))},
        later(hours=-1, seconds=60),
    ),
    (
        "a run failed after Retry-After: 1 on every retry: the limit outlasted it",
        {"error": api_error("Rate limit", {"retry-after": "1"}), "said_ms": ms(later(seconds=-6))},
        None,
    ),
]


@pytest.mark.parametrize(("case", "given", "end"), STATED_END, ids=[c for c, _, _ in STATED_END])
def test_stated_end(case: str, given: dict[str, Any], end: datetime | None) -> None:
    assert stated_end(now=NOW, **given) == end, case
