"""What a rate-limited provider said about its end: labelled messages, headers and next values.

Each case is a real-shaped statement (opencode's retry status, OpenAI / Anthropic / Groq /
opencode-zen wordings) with the end a person reading it would name, and cases where nothing
is said (the hub must then fall back to the reset hour, not invent an end).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xaf_hub.core.clock import to_ms
from xaf_hub.core.limits import stated_end, stated_in_headers, stated_in_text

NOW = datetime(2026, 12, 3, 13, 0, 0, tzinfo=UTC)
WEEK = timedelta(days=7)  # models.max_rest_hours' default


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
    ("try again in 400 days", later(days=7)),  # further than the longest rest: that long
    ("try again in 99999999999999 days", later(days=7)),
    ("Retry-After: " + "9" * 400, later(days=7)),  # more than a float holds
    ("resets at 9999-12-31T23:59:59Z", later(days=7)),
    ("try again in 5ſ", None),  # "ſ" is no unit, though re.I folds it to "s"
    ("try again in ٣ hours", None),  # digits of other scripts are not read
    ("", None),
]


@pytest.mark.parametrize(("text", "end"), STATED_TEXT, ids=[t[:40] for t, _ in STATED_TEXT])
def test_stated_in_text(text: str, end: datetime | None) -> None:
    assert stated_in_text(text, NOW, WEEK) == end


HEADERS: list[tuple[dict[str, Any], datetime | None]] = [
    ({"retry-after": "300", "date": "Thu, 03 Dec 2026 12:59:00 GMT"}, later(seconds=240)),
    ({"Retry-After": "7200"}, later(seconds=7200)),  # no date: counts from when it was said
    ({"retry-after-ms": "1500", "retry-after": "9"}, later(milliseconds=1500)),
    ({"retry-after": "Thu, 03 Dec 2026 14:00:00 GMT"}, later(hours=1)),
    ({"retry-after": "soon"}, None),
    ({"content-type": "application/json"}, None),
    ({"retry-after": "9" * 30}, later(days=7)),
    ({"retry-after-ms": "9" * 400}, later(days=7)),
    ({"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"}, later(days=7)),
    ({"retry-after": "100", "date": "Fri, 31 Dec 9999 23:59:59 GMT"},
     datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),  # said then; stated_end bounds it
    ({"retry-after": "Mon, 99 Foo 1 1:1:1"}, None),
]


@pytest.mark.parametrize(("headers", "end"), HEADERS)
def test_stated_in_headers(headers: dict[str, Any], end: datetime | None) -> None:
    assert stated_in_headers(headers, NOW, WEEK) == end


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
    # Never further off than the longest rest, whoever said it and when.
    ("next in the year 9999", {"next_ms": ms(datetime(9999, 1, 1, tzinfo=UTC))}, later(days=7)),
    (
        "a header dated at the end of the calendar: no wait fits after it, nothing said",
        {"error": api_error("Rate limit", {"retry-after": "100",
                                           "date": "Fri, 31 Dec 9999 23:59:59 GMT"})},
        None,
    ),
    (
        "a header dated late in the calendar",
        {"error": api_error("Rate limit", {"retry-after": "100",
                                           "date": "Fri, 01 Jan 9000 00:00:00 GMT"})},
        later(days=7),
    ),
    (
        "the message of the issue",
        {"message": "Rate limit exceeded. Please try again in 99999999999999 days."},
        later(days=7),
    ),
    ("a start no clock reads", {"error": api_error("try again in 1h"), "said_ms": 10**30},
     later(hours=1)),
]


@pytest.mark.parametrize(("case", "given", "end"), STATED_END, ids=[c for c, _, _ in STATED_END])
def test_stated_end(case: str, given: dict[str, Any], end: datetime | None) -> None:
    assert stated_end(now=NOW, longest=WEEK, **given) == end, case


def test_a_shorter_longest_rest_bounds_every_statement() -> None:
    hour = timedelta(hours=1)
    assert stated_end(now=NOW, message="try again in 3h", longest=hour) == later(hours=1)
    assert stated_end(now=NOW, next_ms=ms(later(days=2)), longest=hour) == later(hours=1)


# ------------------------------------------------------------------ hostile text and headers

LEADS = ("try again in ", "retry after ", "Retry-After: ", "retry-after-ms: ", "resets at ",
         "It will reset in ", "available again at ", "until ", "reset_time: ", "wait ")
NUMBERS = st.one_of(
    st.text("0123456789", min_size=1, max_size=400),
    st.integers(-(10**40), 10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["NaN", "nan", "inf", "Infinity", "-1", "1e400", "٣", "１２", "𝟗", "0.5.5",
                     "99999999999999", "9" * 5000]),
)
UNITS = st.sampled_from(["", "s", "ms", "m", "min", "h", "hours", "d", "days", "ſ", "K", "S"])
INSTANTS = st.builds(
    "{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:00{}".format,
    st.integers(0, 9999), st.integers(0, 13), st.integers(0, 32), st.integers(0, 25),
    st.integers(0, 61), st.sampled_from(["", "Z", "+23:59", "-23:59", "+99:99"]),
)
STATEMENTS = st.builds(lambda lead, n, u: f"{lead}{n}{u}", st.sampled_from(LEADS), NUMBERS, UNITS)
TEXTS = st.one_of(
    st.text(),
    STATEMENTS,
    st.builds(lambda lead, t: lead + t, st.sampled_from(LEADS), INSTANTS),
    st.lists(st.one_of(STATEMENTS, st.text(max_size=20)), max_size=8).map(" ".join),
)
HEADER_KEYS = st.sampled_from(
    ["retry-after", "Retry-After", "retry-after-ms", "RETRY-AFTER-MS", "date", "Date",
     "x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]
) | st.text(max_size=10)
HTTP_DATES = st.builds(
    "{}, {:02d} {} {} {:02d}:{:02d}:{:02d} GMT".format,
    st.sampled_from(["Mon", "Fri", "Xyz"]), st.integers(0, 99),
    st.sampled_from(["Jan", "Dec", "Foo"]), st.integers(-1, 99999), st.integers(0, 99),
    st.integers(0, 99), st.integers(0, 99),
)
HEADER_VALUES = st.one_of(TEXTS, NUMBERS, HTTP_DATES, st.integers(), st.floats(), st.none(),
                          st.lists(st.integers(), max_size=3))
HEADERS = st.dictionaries(HEADER_KEYS, HEADER_VALUES, max_size=6)
LONGEST = st.sampled_from([timedelta(days=7), timedelta(hours=1), timedelta(minutes=1)])


def well_formed(end: datetime | None, now: datetime, longest: timedelta) -> None:
    """An end, when there is one: an aware time no later than ``longest`` after ``now``."""
    if end is not None:
        assert end.tzinfo is not None and end <= now + longest
        assert to_ms(end) >= 0 and end.isoformat()


@settings(max_examples=300, deadline=None)
@given(text=TEXTS, longest=LONGEST)
def test_no_text_raises_or_states_more_than_the_longest_rest(
    text: str, longest: timedelta
) -> None:
    end = stated_in_text(text, NOW, longest)
    well_formed(end, NOW, longest)
    assert end is None or end > NOW


@settings(max_examples=300, deadline=None)
@given(headers=HEADERS, longest=LONGEST)
def test_no_header_raises(headers: dict[str, Any], longest: timedelta) -> None:
    end = stated_in_headers(headers, NOW, longest)
    assert end is None or end.tzinfo is not None


@settings(max_examples=300, deadline=None)
@given(
    headers=HEADERS, message=TEXTS, body=TEXTS, longest=LONGEST,
    next_ms=st.integers(-(10**20), 10**20), said_ms=st.integers(-(10**20), 10**20),
)
def test_no_statement_ends_later_than_the_longest_rest(
    headers: dict[str, Any], message: str, body: str, longest: timedelta, next_ms: int,
    said_ms: int,
) -> None:
    error = {"name": "APIError",
             "data": {"message": message, "responseBody": body, "responseHeaders": headers}}
    for given_ in ({"next_ms": next_ms, "message": message}, {"error": error, "said_ms": said_ms}):
        well_formed(stated_end(now=NOW, longest=longest, **given_), NOW, longest)


MEGABYTE = 1_000_000
HUGE: list[tuple[str, str]] = [
    ("digits", "try again in " + "9" * MEGABYTE + " days"),
    ("digits with no unit", "try again in " + "1" * MEGABYTE),
    ("spaces before no unit", "try again in 1" + " " * MEGABYTE + "x"),
    ("statements", "try again in 1s and " * (MEGABYTE // 20)),
    ("leads", "retry after " * (MEGABYTE // 12)),
    ("instants", "resets at 2026-12-03T20:00:00Z " * (MEGABYTE // 32)),
    ("noise", "ſ٣𝟗\x00\u2028" * (MEGABYTE // 5)),
]


@pytest.mark.parametrize(("case", "text"), HUGE, ids=[c for c, _ in HUGE])
def test_a_megabyte_of_text_or_header_is_read_without_error(case: str, text: str) -> None:
    well_formed(stated_in_text(text, NOW, WEEK), NOW, WEEK)
    headers = {"retry-after": text, "retry-after-ms": "9" * MEGABYTE, "date": text}
    error = api_error(text, headers, text)
    well_formed(stated_end(now=NOW, message=text, error=error, longest=WEEK), NOW, WEEK)
