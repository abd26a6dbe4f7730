"""One time format in JSON: ISO 8601 in UTC with its offset, the epoch-ms field kept beside."""

from __future__ import annotations

import re
from datetime import datetime

from xaf_hub.core.clock import iso_time
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
