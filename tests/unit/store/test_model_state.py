"""Tests for xaf_hub.store.model_state: signals, families, reset clock, store and resolution."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xaf_hub.core.clock import next_reset, resolve_timezone, to_ms
from xaf_hub.core.runstate import ErrorClass, classify_error, classify_message
from xaf_hub.errors import ConfigError, StateFileError
from xaf_hub.store.model_state import (
    DEFAULT_BLACKOUT_FAMILIES,
    MODEL_STATE_FILE,
    Blackout,
    FileModelState,
    ModelState,
    family_of,
    next_model_in_chain,
    resolve_dispatch_model,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
FAMILIES = DEFAULT_BLACKOUT_FAMILIES


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC)


def berlin(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, sec, tzinfo=BERLIN)


# ---------------------------------------------------------------------------------------------
# Signals — shapes measured against opencode 1.18.33 (API-1.18.33.md §4.5, §6)

RATE_LIMIT_BODY = (
    '{"error": {"message": "Rate limit exceeded: free usage limit reached. Please try again '
    'later.", "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded"}}'
)
API_ERROR_429 = {
    "name": "APIError",
    "data": {
        "message": "Rate limit exceeded: free usage limit reached. Please try again later.",
        "statusCode": 429,
        "isRetryable": True,
        "responseHeaders": {"content-length": "170", "content-type": "application/json"},
        "responseBody": RATE_LIMIT_BODY,
        "metadata": {"url": "http://127.0.0.1:18080/v1/chat/completions"},
    },
}
FREE_USAGE_429 = {
    "name": "APIError",
    "data": {
        "message": "Free usage exceeded, subscribe to Go",
        "statusCode": 429,
        "isRetryable": True,
        "responseBody": '{"type":"error","error":{"type":"FreeUsageLimitError","message":"x"}}',
    },
}
CANNOT_CONNECT = "Cannot connect to API: Unable to connect. Is the computer able to access the url?"


def api_error(message: str, status: Any = None, body: Any = None) -> dict[str, Any]:
    data: dict[str, Any] = {"message": message, "isRetryable": False}
    if status is not None:
        data["statusCode"] = status
    if body is not None:
        data["responseBody"] = body
    return {"name": "APIError", "data": data}


ERROR_CASES: list[tuple[str, dict[str, Any] | None, ErrorClass]] = [
    ("429 free usage, exact final error", API_ERROR_429, "rate_limited"),
    ("429 FreeUsageLimitError", FREE_USAGE_429, "rate_limited"),
    ("429 with a neutral message", api_error("Bad luck", 429), "rate_limited"),
    ("429 as a string", api_error("Bad luck", "429"), "rate_limited"),
    ("429 wins over model wording", api_error("model not found", 429), "rate_limited"),
    ("no status, Too Many Requests", api_error("Too Many Requests"), "rate_limited"),
    ("quota in a parsed body", api_error("x", 400, {"error": "quota exceeded"}), "rate_limited"),
    ("rps exhausted", api_error("rps exhausted for this key", 403), "rate_limited"),
    ("500 Internal Server Error", api_error("Internal Server Error", 500, "oops"), "other"),
    (
        "404 model_not_found",
        api_error(
            "The model `fake-missing` does not exist",
            404,
            '{"error":{"message":"The model `fake-missing` does not exist",'
            '"type":"invalid_request_error","code":"model_not_found"}}',
        ),
        "model_unavailable",
    ),
    (
        "404, only the body names the code",
        api_error("Not Found", 404, '{"error":{"code":"model_not_found"}}'),
        "model_unavailable",
    ),
    ("404 without a model reason", api_error("Not Found", 404, "no such page"), "other"),
    (
        "UnknownError from prompt_async",
        {"name": "UnknownError", "data": {"message": "Model not found: fake/nope."}},
        "model_unavailable",
    ),
    (
        "ProviderModelNotFoundError by name alone",
        {"name": "ProviderModelNotFoundError", "data": {}},
        "model_unavailable",
    ),
    (
        "token plan",
        api_error("This model is not available in the current token plan", 403),
        "model_unavailable",
    ),
    (
        "provider.internal",
        api_error("provider.internal: upstream failed", 502),
        "model_unavailable",
    ),
    ("401 invalid_api_key", api_error("Invalid API key", 401, "invalid_api_key"), "other"),
    (
        "Cannot connect to API, no statusCode",
        {
            "name": "APIError",
            "data": {
                "message": CANNOT_CONNECT,
                "isRetryable": True,
                "metadata": {"url": "http://127.0.0.1:18099/v1/chat/completions"},
            },
        },
        "other",
    ),
    (
        "MessageAbortedError",
        {"name": "MessageAbortedError", "data": {"message": "Aborted"}},
        "other",
    ),
    (
        "abort beats rate-limit wording",
        {"name": "MessageAbortedError", "data": {"message": "rate limit", "statusCode": 429}},
        "other",
    ),
    ("ContextOverflowError", {"name": "ContextOverflowError", "data": {}}, "other"),
    ("MessageOutputLengthError", {"name": "MessageOutputLengthError", "data": {}}, "other"),
    ("empty object", {}, "other"),
    ("data is not an object", {"name": "APIError", "data": "429?"}, "other"),
    ("statusCode true is not 429", api_error("boom", True), "other"),
    ("None", None, "none"),
]


@pytest.mark.parametrize(
    ("error", "expected"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
def test_classify_error(error: dict[str, Any] | None, expected: ErrorClass) -> None:
    assert classify_error(error) == expected


MESSAGE_CASES: list[tuple[str, ErrorClass]] = [
    ("Rate limit exceeded: free usage limit reached. Please try again later.", "rate_limited"),
    ("Free usage exceeded, subscribe to Go", "rate_limited"),
    ("Go usage limit reached. It will reset in 5h 12m.", "rate_limited"),
    ("Too Many Requests", "rate_limited"),
    ("too_many_requests", "rate_limited"),
    ("rate_limit_error", "rate_limited"),
    ("quota exhausted", "rate_limited"),
    ("Quota exceeded for metric generate_requests", "rate_limited"),
    ("You exceeded your current quota, please check your plan", "rate_limited"),
    ("rps exhausted", "rate_limited"),
    ("RESOURCE_EXHAUSTED", "rate_limited"),
    ("HTTP 429", "rate_limited"),
    ("status code (429)", "rate_limited"),
    ("请求过于频繁,请稍后再试", "rate_limited"),
    ("rate limit hit; also model not found", "rate_limited"),  # both: rate limit wins
    ("Endpoint is unavailable", "model_unavailable"),
    ("No endpoints found for qwen/qwen3-coder:free.", "model_unavailable"),
    ("no route to the requested model", "model_unavailable"),
    ("no-route", "model_unavailable"),
    ("Model unavailable", "model_unavailable"),
    ("The model is not available right now", "model_unavailable"),
    ("Model not found: fake/nope.", "model_unavailable"),
    ("model_not_found", "model_unavailable"),
    ("provider internal error", "model_unavailable"),
    ("This model is not available in the current token plan.", "model_unavailable"),
    (CANNOT_CONNECT, "other"),
    ("connect ECONNREFUSED 127.0.0.1:4290", "other"),  # 429 inside a port is no status
    ("build 1.429.3 failed", "other"),
    ("a moderate limitation applies", "other"),  # "rate limit" inside a word
    ("Internal Server Error", "other"),
    ("Overloaded", "other"),
    ("", "none"),
    ("   ", "none"),
]


@pytest.mark.parametrize(("text", "expected"), MESSAGE_CASES)
def test_classify_message(text: str, expected: ErrorClass) -> None:
    assert classify_message(text) == expected


# ---------------------------------------------------------------------------------------------
# Families

SPLIT_FAMILIES = {"zen": ["opencode/"], "go": ["opencode-go/"], "open": ["open"]}


@pytest.mark.parametrize(
    ("model", "families", "expected"),
    [
        ("opencode/grok-code", FAMILIES, "opencode"),
        ("opencode-go/kimi-k2", FAMILIES, "opencode"),
        ("OpenCode/Big-Pickle", FAMILIES, "opencode"),
        ("anthropic/claude-sonnet-4", FAMILIES, None),
        ("opencodex/foo", FAMILIES, None),  # look-alike provider id
        ("opencode", FAMILIES, None),
        ("", FAMILIES, None),
        ("opencode-go/kimi", SPLIT_FAMILIES, "go"),  # longest prefix wins over "open"
        ("opencode/x", SPLIT_FAMILIES, "zen"),
        ("openai/gpt-5", SPLIT_FAMILIES, "open"),
        ("anything/x", {"empty": [""]}, None),  # an empty prefix never matches everything
    ],
)
def test_family_of(model: str, families: dict[str, list[str]], expected: str | None) -> None:
    assert family_of(model, families) == expected


# ---------------------------------------------------------------------------------------------
# next_reset

RESET_CASES: list[tuple[str, datetime, int, tzinfo, datetime]] = [
    ("one second before", berlin(2026, 11, 30, 7, 59, 59), 8, BERLIN, utc(2026, 11, 30, 7)),
    ("exactly at the reset", berlin(2026, 11, 30, 8), 8, BERLIN, utc(2026, 12, 1, 7)),
    ("one second after", berlin(2026, 11, 30, 8, 0, 1), 8, BERLIN, utc(2026, 12, 1, 7)),
    ("late evening", berlin(2026, 11, 30, 23, 30), 8, BERLIN, utc(2026, 12, 1, 7)),
    ("just after midnight", berlin(2026, 12, 1, 0, 10), 8, BERLIN, utc(2026, 12, 1, 7)),
    ("year end", berlin(2026, 12, 31, 22), 8, BERLIN, utc(2027, 1, 1, 7)),
    # The local date decides, not the UTC date: 23:30 UTC is already tomorrow in Berlin.
    ("now given in UTC", utc(2026, 11, 30, 23, 30), 8, BERLIN, utc(2026, 12, 1, 7)),
    ("UTC zone, hour 0", utc(2026, 11, 30), 0, UTC, utc(2026, 12, 1)),
    # Berlin: spring forward 2026-03-29 02:00 CET -> 03:00 CEST; fall back 2026-10-25.
    ("Berlin spring forward", berlin(2026, 3, 28, 20), 8, BERLIN, utc(2026, 3, 29, 6)),
    ("Berlin fall back", berlin(2026, 10, 24, 20), 8, BERLIN, utc(2026, 10, 25, 7)),
    # New York: spring forward 2026-03-08, fall back 2026-11-01.
    ("New York spring forward", utc(2026, 3, 8, 3), 8, NEW_YORK, utc(2026, 3, 8, 12)),
    ("New York fall back", utc(2026, 10, 31, 13), 8, NEW_YORK, utc(2026, 11, 1, 13)),
    # Reset hour inside the gap: 02:00 does not exist, the reset is the first instant after it.
    ("Berlin gap, before", berlin(2026, 3, 29, 0, 30), 2, BERLIN, utc(2026, 3, 29, 1)),
    ("Berlin gap, after", berlin(2026, 3, 29, 3, 30), 2, BERLIN, utc(2026, 3, 30, 0)),
    ("New York gap, before", utc(2026, 3, 8, 6, 59), 2, NEW_YORK, utc(2026, 3, 8, 7)),
    # Reset hour inside the fold: 02:00 happens twice; only the first one resets.
    ("Berlin fold, before both", berlin(2026, 10, 25, 1, 30), 2, BERLIN, utc(2026, 10, 25, 0)),
    ("Berlin fold, first pass", utc(2026, 10, 25, 0, 30), 2, BERLIN, utc(2026, 10, 26, 1)),
    ("Berlin fold, second pass", utc(2026, 10, 25, 1, 30), 2, BERLIN, utc(2026, 10, 26, 1)),
]


@pytest.mark.parametrize(
    ("now", "hour", "tz", "expected"), [c[1:] for c in RESET_CASES], ids=[c[0] for c in RESET_CASES]
)
def test_next_reset(now: datetime, hour: int, tz: tzinfo, expected: datetime) -> None:
    result = next_reset(now, hour, tz)
    assert result == expected
    assert result.tzinfo is UTC  # local values inside a fold would break == (PEP 495)


def test_next_reset_wall_clock_in_the_gap_reads_three() -> None:
    result = next_reset(berlin(2026, 3, 29, 0, 30), 2, BERLIN).astimezone(BERLIN)
    assert (result.hour, result.minute, result.utcoffset()) == (3, 0, timedelta(hours=2))


@pytest.mark.parametrize(
    ("now", "hour"), [(datetime(2026, 1, 1, 7), 8), (utc(2026, 1, 1), 24), (utc(2026, 1, 1), -1)]
)
def test_next_reset_rejects_bad_input(now: datetime, hour: int) -> None:
    with pytest.raises(ValueError):
        next_reset(now, hour, BERLIN)


@settings(max_examples=300, deadline=None)
@given(
    stamp=st.integers(min_value=to_ms(utc(2020, 1, 1)), max_value=to_ms(utc(2035, 1, 1))),
    hour=st.integers(min_value=0, max_value=23),
    tz=st.sampled_from([BERLIN, NEW_YORK, ZoneInfo("Australia/Lord_Howe"), UTC]),
)
def test_next_reset_is_the_first_reset_after_now(stamp: int, hour: int, tz: tzinfo) -> None:
    now = datetime.fromtimestamp(stamp / 1000, tz=UTC)
    result = next_reset(now, hour, tz)
    assert now < result <= now + timedelta(hours=25)
    # No reset lies between now and the result.
    assert next_reset(result - timedelta(microseconds=1), hour, tz) == result


# ---------------------------------------------------------------------------------------------
# Time zones


def test_resolve_timezone_by_name() -> None:
    assert resolve_timezone("Europe/Berlin") == BERLIN


@pytest.mark.parametrize("name", ["Mars/Olympus_Mons", "", "/etc/localtime", "../etc/passwd"])
def test_resolve_timezone_rejects_unknown_names(name: str) -> None:
    with pytest.raises(ConfigError, match="models.timezone"):
        resolve_timezone(name)


@pytest.mark.parametrize(
    ("tz_env", "expected"), [("America/New_York", NEW_YORK), (":Europe/Berlin", BERLIN)]
)
def test_resolve_local_from_tz_variable(tz_env: str, expected: tzinfo, tmp_path: Path) -> None:
    zone = resolve_timezone("local", environ={"TZ": tz_env}, localtime_path=tmp_path / "none")
    assert zone == expected


def test_resolve_local_from_localtime_link(tmp_path: Path) -> None:
    target = Path("/usr/share/zoneinfo/Asia/Tokyo")
    if not target.exists():
        pytest.skip("no system zoneinfo database")
    link = tmp_path / "localtime"
    link.symlink_to(target)
    assert resolve_timezone("Local", environ={}, localtime_path=link) == ZoneInfo("Asia/Tokyo")


@pytest.mark.parametrize(
    "rule", ["CST-8", "CET-1CEST,M3.5.0,M10.5.0/3", "EST5EDT,M3.2.0,M11.1.0", "<+0545>-5:45"]
)
def test_resolve_local_posix_rule_agrees_with_the_c_library(
    rule: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A POSIX TZ rule means what the C library makes of it (CST-8 is UTC+8), all year."""
    if not hasattr(time, "tzset"):
        pytest.skip("time.tzset is POSIX only")
    zone = resolve_timezone("local", environ={"TZ": rule}, localtime_path=tmp_path / "none")
    monkeypatch.setenv("TZ", rule)
    time.tzset()
    try:
        for day in range(0, 366, 7):
            for hour in (0, 1, 2, 3, 13):
                moment = datetime(2026, 1, 1, hour, tzinfo=UTC) + timedelta(days=day)
                stamp = moment.timestamp()
                offset = moment.astimezone(zone).utcoffset()
                assert offset == timedelta(seconds=time.localtime(stamp).tm_gmtoff), moment
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    if rule == "CST-8":
        assert datetime(2026, 7, 1, 1, tzinfo=UTC).astimezone(zone).hour == 9


def test_resolve_local_from_a_zone_file_path(tmp_path: Path) -> None:
    source = Path("/usr/share/zoneinfo/Asia/Shanghai")
    if not source.exists():
        pytest.skip("no system zoneinfo database")
    for tz in (str(source), ":" + str(source)):
        zone = resolve_timezone("local", environ={"TZ": tz}, localtime_path=tmp_path / "none")
        assert zone == ZoneInfo("Asia/Shanghai")
    # A copy outside any zoneinfo folder is read as a file.
    copy = tmp_path / "my-zone"
    copy.write_bytes(source.read_bytes())
    zone = resolve_timezone("local", environ={"TZ": str(copy)}, localtime_path=tmp_path / "none")
    assert datetime(2026, 7, 1, 1, tzinfo=UTC).astimezone(zone).utcoffset() == timedelta(hours=8)


def test_resolve_local_unreadable_tz_is_utc_like_glibc(tmp_path: Path) -> None:
    for tz in ("not a zone!", str(tmp_path / "missing-file")):
        zone = resolve_timezone("local", environ={"TZ": tz}, localtime_path=tmp_path / "none")
        now = datetime.now(UTC)
        assert now.astimezone(zone).utcoffset() == timedelta(0)


def test_resolve_local_falls_back_to_the_c_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For the process's own $TZ, one nothing else reads is left to the C library."""
    if not hasattr(time, "tzset"):
        pytest.skip("time.tzset is POSIX only")
    monkeypatch.setenv("TZ", "not a zone!")
    time.tzset()
    try:
        zone = resolve_timezone("local", localtime_path=tmp_path / "none")
        assert not isinstance(zone, ZoneInfo)
        now = datetime.now(UTC)
        assert now.astimezone(zone).utcoffset() == timedelta(
            seconds=time.localtime(now.timestamp()).tm_gmtoff
        )
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


@pytest.fixture
def process_tz_berlin() -> Iterator[None]:
    """Point the C library's local zone at Europe/Berlin for one test (POSIX only)."""
    if not hasattr(time, "tzset"):
        pytest.skip("time.tzset is POSIX only")
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Europe/Berlin"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


@pytest.mark.usefixtures("process_tz_berlin")
def test_c_library_zone_agrees_with_zoneinfo_across_transitions(tmp_path: Path) -> None:
    zone = resolve_timezone("local", environ={}, localtime_path=tmp_path / "none")
    assert not isinstance(zone, ZoneInfo)
    # Every quarter hour over both transition days, both directions, both folds.
    for start in (utc(2026, 3, 28, 12), utc(2026, 10, 24, 12)):
        for step in range(4 * 36):
            instant = start + timedelta(minutes=15 * step)
            mine, ref = instant.astimezone(zone), instant.astimezone(BERLIN)
            assert (mine.replace(tzinfo=None), mine.fold) == (ref.replace(tzinfo=None), ref.fold)
            assert mine.utcoffset() == ref.utcoffset()
            for fold in (0, 1):
                wall = ref.replace(tzinfo=None, fold=fold)
                assert (
                    wall.replace(tzinfo=zone).utcoffset() == wall.replace(tzinfo=BERLIN).utcoffset()
                ), (wall, fold)
    assert next_reset(berlin(2026, 3, 29, 0, 30), 2, zone) == utc(2026, 3, 29, 1)


# ---------------------------------------------------------------------------------------------
# Store


@pytest.fixture
def state_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / MODEL_STATE_FILE


@pytest.fixture
def store(state_path: Path) -> ModelState:
    return FileModelState(state_path, 8, BERLIN, FAMILIES)


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def test_mark_blackout_writes_the_documented_shape(store: ModelState, state_path: Path) -> None:
    now = berlin(2026, 11, 30, 10, 15)
    until = store.mark_blackout("opencode", "APIError 429 free usage", "patrol:fix_free_limit", now)
    assert until == to_ms(berlin(2026, 12, 1, 8))
    assert load(state_path) == {
        "schema_version": 1,
        "blackouts": {
            "opencode": {
                "until_ms": until,
                "reason": "APIError 429 free usage",
                "source": "patrol:fix_free_limit",
                "marked_at_ms": to_ms(now),
                "scope": "family",
                "why": "reset_hour",
            }
        },
        "healed": {},
    }


@pytest.mark.parametrize(
    "later",
    [berlin(2026, 11, 30, 18), berlin(2026, 11, 30, 23, 59), berlin(2026, 12, 1, 7, 59, 59)],
)
def test_repeat_inside_the_window_keeps_end_and_first_cause(
    store: ModelState, state_path: Path, later: datetime
) -> None:
    first = berlin(2026, 11, 30, 10)
    until = store.mark_blackout("opencode", "first", "dispatch", first)
    assert store.mark_blackout("opencode", "second", "confirm", later) == until
    entry = load(state_path)["blackouts"]["opencode"]
    assert entry == {
        "until_ms": until,
        "reason": "first",
        "source": "dispatch",
        "marked_at_ms": to_ms(first),
        "scope": "family",
        "why": "reset_hour",
    }


def test_expired_blackout_is_replaced(store: ModelState, state_path: Path) -> None:
    store.mark_blackout("opencode", "old", "patrol", berlin(2026, 11, 30, 10))
    later = berlin(2026, 12, 1, 9)
    until = store.mark_blackout("opencode", "new", "confirm", later)
    assert until == to_ms(berlin(2026, 12, 2, 8))
    entry = load(state_path)["blackouts"]["opencode"]
    assert (entry["reason"], entry["source"], entry["marked_at_ms"]) == (
        "new",
        "confirm",
        to_ms(later),
    )


def test_blackout_never_extends_past_the_next_reset(store: ModelState, state_path: Path) -> None:
    far = to_ms(berlin(2026, 12, 20, 8))
    state_path.parent.mkdir(parents=True)
    doc = {
        "schema_version": 1,
        "blackouts": {
            "opencode": {"until_ms": far, "reason": "r", "source": "s", "marked_at_ms": 0}
        },
        "healed": {},
    }
    state_path.write_text(json.dumps(doc), encoding="utf-8")
    until = store.mark_blackout("opencode", "again", "patrol", berlin(2026, 11, 30, 10))
    assert until == to_ms(berlin(2026, 12, 1, 8))
    assert load(state_path)["blackouts"]["opencode"]["until_ms"] == until


def test_blacked_out_families_ignores_expired(store: ModelState) -> None:
    assert store.blacked_out_families(berlin(2026, 11, 30, 9)) == set()
    store.mark_blackout("opencode", "429", "patrol", berlin(2026, 11, 30, 10))
    assert store.blacked_out_families(berlin(2026, 11, 30, 10)) == {"opencode"}
    assert store.blacked_out_families(berlin(2026, 12, 1, 7, 59, 59)) == {"opencode"}
    assert store.blacked_out_families(berlin(2026, 12, 1, 8)) == set()
    assert store.blacked_out_families(berlin(2026, 12, 3)) == set()


def test_active_blackouts_returns_records(store: ModelState) -> None:
    now = berlin(2026, 11, 30, 10)
    until = store.mark_blackout("opencode", "429", "patrol", now)
    assert store.active_blackouts(now) == {
        "opencode": Blackout("opencode", until, "429", "patrol", to_ms(now))
    }


def test_reading_a_missing_file_creates_nothing(store: ModelState, state_path: Path) -> None:
    assert store.blacked_out_families(utc(2026, 1, 1)) == set()
    assert not store.was_healed("x")
    assert not state_path.exists()


def test_unknown_family_is_refused(store: ModelState, state_path: Path) -> None:
    with pytest.raises(ValueError, match="nope"):
        store.mark_blackout("nope", "r", "s", utc(2026, 1, 1))
    assert not state_path.exists()


def test_store_rejects_a_bad_reset_hour(state_path: Path) -> None:
    with pytest.raises(ValueError):
        FileModelState(state_path, 24, BERLIN, FAMILIES)


def test_healed_memory(store: ModelState, state_path: Path) -> None:
    now = utc(2026, 11, 30, 10)
    assert not store.was_healed("inst1/ses_a/msg_1")
    store.remember_healed("inst1/ses_a/msg_1", "opencode/grok-code", "anthropic/claude", now)
    assert store.was_healed("inst1/ses_a/msg_1")
    assert not store.was_healed("inst1/ses_a/msg_2")
    assert load(state_path)["healed"] == {
        "inst1/ses_a/msg_1": {
            "at_ms": to_ms(now),
            "from_model": "opencode/grok-code",
            "to_model": "anthropic/claude",
        }
    }


def test_healed_memory_prunes_after_fourteen_days(store: ModelState) -> None:
    start = utc(2026, 11, 1)
    store.remember_healed("old", None, "a/b", start)
    store.remember_healed("edge", "a/b", "c/d", start + timedelta(days=1))
    store.remember_healed("new", "a/b", "c/d", start + timedelta(days=15))
    assert not store.was_healed("old")
    assert store.was_healed("edge")  # exactly 14 days old: kept
    assert store.was_healed("new")


def test_blackout_and_healed_writes_keep_each_other(store: ModelState) -> None:
    now = berlin(2026, 11, 30, 10)
    store.remember_healed("k", "opencode/x", "a/b", now)
    store.mark_blackout("opencode", "429", "patrol", now)
    store.remember_healed("k2", "opencode/x", "a/b", now)
    assert store.was_healed("k") and store.was_healed("k2")
    assert store.blacked_out_families(now) == {"opencode"}


GOOD_DOC = json.dumps({"schema_version": 1, "blackouts": {}, "healed": {}}).encode()

CORRUPT_CASES: list[tuple[str, bytes, str]] = [
    ("truncated JSON", b'{"schema_version": 1,\n "blackouts": {', "line 2 column"),
    ("empty file", b"", "line 1 column 1"),
    ("not UTF-8", b'{"schema_version": 1, "x": "\xff"}', "offset 28"),
    ("UTF-16 BOM", b"\xff\xfe{\x00}\x00", "offset 0"),
    ("NUL byte", GOOD_DOC[:5] + b"\x00" + GOOD_DOC[5:], "NUL byte at offset 5"),
    ("top level list", b"[]", "top level"),
    ("newer schema", b'{"schema_version": 2, "blackouts": {}, "healed": {}}', "schema_version"),
    ("no schema", b'{"blackouts": {}, "healed": {}}', "schema_version"),
    ("blackouts list", b'{"schema_version": 1, "blackouts": [], "healed": {}}', "blackouts"),
    (
        "until_ms string",
        b'{"schema_version": 1, "blackouts": {"opencode": {"until_ms": "soon", "reason": "r",'
        b' "source": "s", "marked_at_ms": 1}}, "healed": {}}',
        "blackouts.opencode.until_ms",
    ),
    (
        "healed at_ms missing",
        b'{"schema_version": 1, "blackouts": {}, "healed": {"k": {"to_model": "a/b"}}}',
        "healed.k.at_ms",
    ),
]


@pytest.mark.parametrize(
    ("content", "where"), [c[1:] for c in CORRUPT_CASES], ids=[c[0] for c in CORRUPT_CASES]
)
def test_corrupt_file_is_reported_never_reset(
    store: ModelState, state_path: Path, content: bytes, where: str
) -> None:
    state_path.parent.mkdir(parents=True)
    state_path.write_bytes(content)
    now = berlin(2026, 11, 30, 10)
    for action in (
        lambda: store.blacked_out_families(now),
        lambda: store.was_healed("k"),
        lambda: store.mark_blackout("opencode", "429", "patrol", now),
        lambda: store.remember_healed("k", "a/b", "c/d", now),
    ):
        with pytest.raises(StateFileError) as info:
            action()
        assert MODEL_STATE_FILE in str(info.value)
        assert where in str(info.value)
    assert state_path.read_bytes() == content


def test_utf8_bom_is_accepted(store: ModelState, state_path: Path) -> None:
    now = berlin(2026, 11, 30, 10)
    until = to_ms(berlin(2026, 12, 1, 8))
    doc = {
        "schema_version": 1,
        "blackouts": {
            "opencode": {"until_ms": until, "reason": "r", "source": "s", "marked_at_ms": 1}
        },
        "healed": {},
    }
    state_path.parent.mkdir(parents=True)
    state_path.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc).encode())
    assert store.blacked_out_families(now) == {"opencode"}
    store.remember_healed("k", None, "a/b", now)
    assert load(state_path)["blackouts"] == doc["blackouts"]


WORKERS = 4
ROUNDS = 5


def _hammer(path: str, index: int) -> None:
    """Mark this worker's family and remember heals, many times (runs in a child process)."""
    families = {f"f{i}": [f"p{i}/"] for i in range(WORKERS)}
    store = FileModelState(Path(path), 8, ZoneInfo("Europe/Berlin"), families, lock_timeout=60)
    now = datetime(2026, 11, 30, 10, tzinfo=ZoneInfo("Europe/Berlin"))
    for round_ in range(ROUNDS):
        store.mark_blackout(f"f{index}", f"r{round_}", f"w{index}", now)
        store.remember_healed(f"k{index}-{round_}", None, "a/b", now)


def test_concurrent_writers_lose_nothing(state_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(str(state_path), i)) for i in range(WORKERS)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * WORKERS
    doc = load(state_path)
    assert sorted(doc["blackouts"]) == [f"f{i}" for i in range(WORKERS)]
    assert all(doc["blackouts"][f"f{i}"]["source"] == f"w{i}" for i in range(WORKERS))
    assert sorted(doc["healed"]) == sorted(
        f"k{i}-{r}" for i in range(WORKERS) for r in range(ROUNDS)
    )


# ---------------------------------------------------------------------------------------------
# Resolution

OC = "opencode/grok-code"
GO = "opencode-go/kimi-k2"
CLAUDE = "anthropic/claude-sonnet-4"
QWEN = "qwen/qwen3-coder"
BLACK = {"opencode"}
NONE: set[str] = set()

RESOLVE_CASES: list[tuple[str, str | None, list[str], str | None, set[str], str | None]] = [
    ("explicit usable", OC, [CLAUDE], QWEN, NONE, OC),
    ("explicit of another family while opencode is out", CLAUDE, [OC], QWEN, BLACK, CLAUDE),
    ("explicit blacked out -> chain", OC, [GO, CLAUDE, QWEN], OC, BLACK, CLAUDE),
    ("explicit blacked out, chain all out -> default", GO, [OC, GO], QWEN, BLACK, QWEN),
    ("explicit blacked out, nothing left", OC, [GO], OC, BLACK, None),
    ("explicit blank counts as absent", "", [CLAUDE], QWEN, NONE, CLAUDE),
    ("chain first", None, [OC, CLAUDE], QWEN, NONE, OC),
    ("chain skips blacked out", None, [OC, GO, CLAUDE], QWEN, BLACK, CLAUDE),
    ("chain skips blank entries", None, ["", "  ", CLAUDE], QWEN, NONE, CLAUDE),
    ("empty chain -> default", None, [], QWEN, BLACK, QWEN),
    ("chain out, default blacked out", None, [GO], OC, BLACK, None),
    ("nothing configured", None, [], None, NONE, None),
    ("unknown blackout family name is harmless", None, [OC], None, {"other"}, OC),
]


@pytest.mark.parametrize(
    ("explicit", "chain", "default", "blacked", "expected"),
    [c[1:] for c in RESOLVE_CASES],
    ids=[c[0] for c in RESOLVE_CASES],
)
def test_resolve_dispatch_model(
    explicit: str | None,
    chain: list[str],
    default: str | None,
    blacked: set[str],
    expected: str | None,
) -> None:
    got = resolve_dispatch_model(
        explicit=explicit,
        chain=chain,
        default_model=default,
        blacked_out=blacked,
        families=FAMILIES,
    )
    assert got == expected


NEXT_CASES: list[tuple[str, str | None, list[str], set[str], str | None]] = [
    ("next after current", OC, [OC, CLAUDE, QWEN], NONE, CLAUDE),
    ("skips blacked out", CLAUDE, [CLAUDE, OC, GO, QWEN], BLACK, QWEN),
    ("from a blacked-out current", OC, [OC, GO, CLAUDE], BLACK, CLAUDE),
    ("current is last", QWEN, [OC, CLAUDE, QWEN], NONE, None),
    ("no wrap to an earlier model", CLAUDE, [QWEN, CLAUDE], NONE, None),
    ("rest all blacked out", CLAUDE, [CLAUDE, OC, GO], BLACK, None),
    ("current not in chain", "x/y", [OC, CLAUDE], BLACK, CLAUDE),
    ("current None", None, [OC, CLAUDE], NONE, OC),
    ("duplicates: first occurrence counts", OC, [OC, CLAUDE, OC, QWEN], NONE, CLAUDE),
    ("never returns current itself", OC, [OC, OC], NONE, None),
    ("empty chain", OC, [], NONE, None),
]


@pytest.mark.parametrize(
    ("current", "chain", "blacked", "expected"),
    [c[1:] for c in NEXT_CASES],
    ids=[c[0] for c in NEXT_CASES],
)
def test_next_model_in_chain(
    current: str | None, chain: list[str], blacked: set[str], expected: str | None
) -> None:
    assert next_model_in_chain(current, chain, blacked, FAMILIES) == expected
