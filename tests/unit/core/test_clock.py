"""One time format in JSON: ISO 8601 in UTC with its offset, the epoch-ms field kept beside."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

from xaf_hub.core.clock import format_instant, instant_ms, iso_time, local_iso, read_instant, to_ms
from xaf_hub.core.records import SessionRecord

ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


def test_iso_time_is_utc_with_offset() -> None:
    assert iso_time(1_700_000_000_000) == "2023-11-14T22:13:20Z"
    assert iso_time(1_700_000_000_999) == "2023-11-14T22:13:20Z"
    assert iso_time(0) is None and iso_time(-5) is None
    stamp = iso_time(1_796_132_429_807)
    assert stamp is not None and ISO.match(stamp)
    # Readable by the standard library as an aware time at the same instant.
    assert datetime.fromisoformat(stamp).timestamp() == 1_796_132_429


def test_session_records_carry_iso_beside_epoch_ms() -> None:
    rec = SessionRecord("a", "ses_1", "t", "/d", created=1_700_000_000_000,
                        updated=1_700_000_060_000, retry_next=0)
    doc = rec.to_json()
    assert doc["created"] == 1_700_000_000_000 and doc["created_at"] == "2023-11-14T22:13:20Z"
    assert doc["updated"] == 1_700_000_060_000 and doc["updated_at"] == "2023-11-14T22:14:20Z"
    assert doc["retry_next"] == 0 and doc["retry_next_at"] is None


def test_stored_times_read_back_aware_or_not_at_all() -> None:
    when = datetime(2026, 12, 1, 14, 5, 9, tzinfo=UTC)
    assert format_instant(when.astimezone(timezone(timedelta(hours=8)))) == (
        "2026-12-01T14:05:09+00:00"
    )
    assert read_instant(format_instant(when)) == when
    assert read_instant("2026-12-01T14:05:09Z") == when
    assert read_instant("2026-12-01 14:05:09") == when  # no offset: UTC
    assert read_instant(to_ms(when)) == when  # epoch milliseconds
    for bad in (None, "", "soon", True, [1], 10**20):
        assert read_instant(bad) is None
    assert instant_ms("2026-12-01T14:05:09Z") == to_ms(when) and instant_ms("x") == 0


def test_a_stored_time_is_shown_on_the_wall_clock_or_as_it_was_written() -> None:
    shanghai = timezone(timedelta(hours=8))
    assert local_iso("2026-12-01T14:05:09+00:00", shanghai) == "2026-12-01 22:05:09"
    assert local_iso("2026-12-01T14:05:09Z", shanghai, seconds=False) == "2026-12-01 22:05"
    assert local_iso("not a time", shanghai) == "not a time"
    assert local_iso("", shanghai) == "-" and local_iso("", shanghai, unknown="?") == "?"
