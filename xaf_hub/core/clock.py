"""Time, one place for it: epoch milliseconds, the ISO and local forms every output uses,
"ago", the configured time zone (an IANA key, a zone file or a POSIX rule) and the next
reset hour that ends a blackout."""

from __future__ import annotations

import calendar
import io
import os
import struct
import time
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta, tzinfo
from datetime import time as wall_time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from xaf_hub.errors import ConfigError

if TYPE_CHECKING:  # zoneinfo (and the sysconfig it loads) only when a zone is resolved
    from zoneinfo import ZoneInfo


def local_time(
    ms: int,
    tz: tzinfo | None = None,
    *,
    seconds: bool = True,
    zone: Literal["offset", "name"] | None = None,
    unknown: str = "",
) -> str:
    """The one local wall-time form: epoch ms as "YYYY-MM-DD HH:MM[:SS]" in ``tz`` (this
    machine's zone when None), with its UTC offset ("UTC+08:00") or zone name when asked;
    ``unknown`` for 0 or a time beyond what anyone can read (a hostile server's year 300000)."""
    if not 0 < ms <= MAX_TIME_MS:
        return unknown
    shape = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    try:
        if tz is None:
            # time.localtime/strftime: several times cheaper than datetime for thousands of rows.
            moment = time.localtime(ms / 1000)
            stamp = time.strftime(shape, moment)
            offset, name = moment.tm_gmtoff or 0, moment.tm_zone or ""
        else:
            when = datetime.fromtimestamp(ms / 1000, tz)
            stamp = when.strftime(shape)
            delta = when.utcoffset()
            offset = int(delta.total_seconds()) if delta is not None else 0
            name = when.tzname() or ""
    except (OverflowError, OSError, ValueError):  # beyond what the C library can show
        return unknown
    if zone == "name":
        return f"{stamp} {name}".rstrip()
    if zone == "offset":
        sign = "-" if offset < 0 else "+"
        hours, minutes = divmod(abs(offset) // 60, 60)
        return f"{stamp} UTC{sign}{hours:02d}:{minutes:02d}"
    return stamp


def fmt_time(ms: int) -> str:
    """Local 'YYYY-MM-DD HH:MM' or '-' for an unknown time (tables)."""
    return local_time(ms, seconds=False, unknown="-")


def iso_time(ms: int) -> str | None:
    """ISO 8601 in UTC with its offset ('2026-12-01T14:05:09Z'), the one time format of every
    JSON document; None for an unknown time (0)."""
    if ms <= 0:
        return None
    # time.gmtime/strftime: several times cheaper than datetime for thousands of records.
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def ago(ms: int, now_ms: int) -> str:
    """'3h ago' style, compact for tables."""
    if not 0 < ms <= MAX_TIME_MS:
        return "-"
    secs = max(0, (now_ms - ms) // 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit} ago"
    return f"{secs}s ago"


def local_iso(
    iso: str, tz: tzinfo | None = None, *, seconds: bool = True, unknown: str = "-"
) -> str:
    """A stored ISO time in local_time's form; the text itself (``unknown`` when empty) when
    it is no time."""
    when = read_instant(iso)
    if when is None:
        return iso or unknown
    return local_time(to_ms(when), tz, seconds=seconds, unknown=unknown)


def format_instant(when: datetime) -> str:
    """The ISO form the hub's state files store, in UTC to the second ("...T14:05:09+00:00")."""
    return when.astimezone(UTC).isoformat(timespec="seconds")


def parse_instant(value: str | int | float | None) -> datetime | None:
    """An ISO 8601 text (one without an offset stays naive) or epoch milliseconds; None for
    None or blank text; anything else: ValueError."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a boolean is not a time")
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value / 1000, tz=UTC)
    text = value.strip()
    return datetime.fromisoformat(text) if text else None


def read_instant(value: object) -> datetime | None:
    """A time from a file or a message anyone may have written: aware (no offset: UTC), or
    None for nothing or anything unreadable."""
    try:
        when = parse_instant(value if isinstance(value, int | float) else str(value))
    except (ValueError, OverflowError, OSError):
        return None
    return when if when is None or when.tzinfo else when.replace(tzinfo=UTC)


def instant_ms(value: object) -> int:
    """Epoch milliseconds of read_instant's time; 0 when there is none."""
    when = read_instant(value)
    return 0 if when is None else to_ms(when)


# 9999-12-31T23:59:59.999Z: a later "time" from a server is nonsense, and the C library's
# time functions fail on it (OverflowError, ValueError) or print a year no one can read.
MAX_TIME_MS = 253_402_300_799_999


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _require_aware(now: datetime) -> None:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime")


def to_ms(moment: datetime) -> int:
    """Return milliseconds since the epoch for an aware datetime, exactly (no float rounding)."""
    _require_aware(moment)
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def _wall_to_instant(day: date, hour: int, tz: tzinfo) -> datetime:
    """Return the first instant the clock in ``tz`` shows ``hour``:00 on ``day``."""
    # fold=0 picks the first of two equal wall times (DST fall-back) and, for a wall time that
    # does not exist (spring-forward gap), the pre-transition offset — which lands exactly on
    # the first real instant after the gap (02:00 in a 02:00-03:00 gap is 03:00 new time).
    return datetime.combine(day, wall_time(hour), tzinfo=tz).astimezone(UTC)


def day_start(now: datetime, tz: tzinfo) -> datetime:
    """The first instant of ``now``'s day on the clock of ``tz`` (aware, UTC).

    Midnight that a DST change skips is the first real instant after the gap.
    """
    _require_aware(now)
    return _wall_to_instant(now.astimezone(tz).date(), 0, tz)


def next_reset(now: datetime, reset_hour: int, tz: tzinfo) -> datetime:
    """Return the next reset_hour:00 in ``tz`` strictly after ``now`` (at it exactly: tomorrow).

    The result is an aware datetime in UTC. Convert with ``.astimezone(tz)`` for display only:
    a local time inside a DST fold never compares equal to another zone's datetime (PEP 495),
    so handing out local values would make ``==`` lie to callers.
    """
    _require_aware(now)
    if not 0 <= reset_hour <= 23:
        raise ValueError(f"reset_hour must be 0..23, got {reset_hour}")
    today = now.astimezone(tz).date()
    for day in (today, today + timedelta(days=1), today + timedelta(days=2)):
        instant = _wall_to_instant(day, reset_hour, tz)
        # Strictly after: a limit hit at the reset instant belongs to the new day's quota.
        if instant > now:
            return instant
    # Unreachable for real zones (consecutive resets are about 24 h apart); guard anyway.
    raise ValueError(f"no reset at {reset_hour}:00 found after {now.isoformat()}")


class _SystemLocalZone(tzinfo):
    """The C library's local zone, DST-aware, for systems where no IANA key can be found."""

    @staticmethod
    def _gmtoff(stamp: float) -> int:
        return time.localtime(stamp).tm_gmtoff

    def utcoffset(self, dt: datetime | None) -> timedelta:
        if dt is None:
            return timedelta(seconds=self._gmtoff(time.time()))
        naive = calendar.timegm(dt.replace(tzinfo=None).timetuple())
        # Transitions are more than a day apart and shift by less than a day, so the offsets a
        # day either side are the only candidates; keep those that map back to this wall time.
        before, after = self._gmtoff(naive - 86400), self._gmtoff(naive + 86400)
        valid = sorted({o for o in (before, after) if self._gmtoff(naive - o) == o}, reverse=True)
        if len(valid) == 1:
            return timedelta(seconds=valid[0])
        if len(valid) == 2:  # ambiguous (fall back): fold 0 is the earlier instant
            return timedelta(seconds=valid[dt.fold])
        return timedelta(seconds=before if dt.fold == 0 else after)  # gap (PEP 495)

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str:
        stamp = time.time() if dt is None else to_ms(dt.replace(tzinfo=self)) / 1000
        return time.localtime(stamp).tm_zone

    def fromutc(self, dt: datetime) -> datetime:
        stamp = calendar.timegm(dt.replace(tzinfo=None).timetuple())
        offset = self._gmtoff(stamp)
        wall = dt.replace(tzinfo=None) + timedelta(seconds=offset)
        local = wall.replace(tzinfo=self)
        if self.utcoffset(local) != timedelta(seconds=offset):
            local = local.replace(fold=1)
        return local

    def __repr__(self) -> str:
        return "_SystemLocalZone()"


def _zone_key(candidate: str) -> ZoneInfo | None:
    from zoneinfo import ZoneInfo  # deferred: start-up, docs/performance.md

    key = candidate.strip().lstrip(":")
    if not key or key.startswith("/"):
        return None
    try:
        return ZoneInfo(key)
    except (KeyError, ValueError, OSError):  # ZoneInfoNotFoundError is a KeyError
        return None


def _zoneinfo_key(path: str) -> ZoneInfo | None:
    """The zone a path names by its part after ``/zoneinfo/`` (``/usr/share/zoneinfo/UTC``)."""
    marker = "/zoneinfo/"
    return _zone_key(path.rsplit(marker, 1)[1]) if marker in path else None


def _zone_file(candidate: str) -> ZoneInfo | None:
    """The zone of a TZ naming a file (``/usr/share/zoneinfo/Asia/Shanghai``, ``:/etc/x``)."""
    from zoneinfo import ZoneInfo  # deferred: start-up, docs/performance.md

    path = candidate.strip().lstrip(":")
    if not path.startswith("/"):
        return None
    if (zone := _zoneinfo_key(path)) is not None:
        return zone
    try:
        with open(path, "rb") as handle:
            return ZoneInfo.from_file(handle, key=path)
    except (OSError, ValueError):
        return None


def _posix_zone(rule: str) -> ZoneInfo | None:
    """The zone of a POSIX TZ rule (``CST-8``: UTC+8), as the C library reads it; else None.

    zoneinfo reads such a rule from the footer of a TZif file, so build the smallest one: no
    transitions, one placeholder type, and the rule that then applies at all times.
    """
    from zoneinfo import ZoneInfo  # deferred: start-up, docs/performance.md

    text = rule.strip()
    if not text or text.startswith((":", "/")) or "\n" in text or not text.isascii():
        return None
    header = b"TZif2" + b"\0" * 15 + struct.pack(">6l", 0, 0, 0, 0, 1, 4)
    block = header + struct.pack(">lbb", 0, 0, 0) + b"UTC\0"
    data = block + block + b"\n" + text.encode("ascii") + b"\n"
    try:
        return ZoneInfo.from_file(io.BytesIO(data), key=text)
    except ValueError:  # not a rule zoneinfo (nor the C library) can read
        return None


def resolve_timezone(
    name: str,
    *,
    environ: Mapping[str, str] | None = None,
    localtime_path: Path = Path("/etc/localtime"),
) -> tzinfo:
    """Turn a ``models.timezone`` value (IANA key or "local") into a tzinfo; bad key: ConfigError.

    "local" is the zone the C library uses, found without extra packages. ``$TZ``, when set,
    decides as it does for the C library: an IANA key, a zone file path (``:/path`` or
    ``/path``), or a POSIX rule such as ``CST-8`` or ``EST5EDT,M3.2.0,M11.1.0``. Without it,
    the key ``/etc/localtime`` links to, else a tzinfo that asks the C library for every
    offset (Windows, odd setups). Never a fixed offset, so a long-running patrol stays right
    across DST changes.
    """
    if name.strip().casefold() != "local":
        zone = _zone_key(name)
        if zone is None:
            raise ConfigError(
                f"models.timezone: unknown time zone {name!r} (use an IANA name)", "bad_timezone"
            )
        return zone
    env = os.environ if environ is None else environ
    if env.get("TZ"):
        zone = _zone_key(env["TZ"]) or _zone_file(env["TZ"]) or _posix_zone(env["TZ"])
        if zone is not None:
            return zone
        # Unreadable: the C library of this process says what it made of it; for another
        # environment, do as glibc does with a TZ it cannot read (UTC).
        if environ is None:
            return _SystemLocalZone()
        from zoneinfo import ZoneInfo  # deferred: start-up, docs/performance.md

        return ZoneInfo("UTC")
    try:
        target = str(localtime_path.resolve(strict=True))
    except OSError:
        target = ""
    return _zoneinfo_key(target) or _SystemLocalZone()
