"""Model policy: error signals, blackout families, the blackout window and model resolution.

Four parts, from pure to stateful:

* **Signals** — ``classify_error`` / ``classify_message`` sort an opencode failure into
  ``rate_limited`` (may black out a family), ``model_unavailable`` (switch model, no blackout),
  ``other`` or ``none``. The pattern lists below are the only place these words live.
* **Families and the clock** — ``family_of`` maps "provider/model" to a blackout family;
  ``next_reset`` finds the next reset hour in a time zone (DST-safe); ``resolve_timezone``
  turns the ``models.timezone`` config value into a ``tzinfo``.
* **Store** — ``ModelState`` over ``.model_state.json``; ``ModelState.mark_blackout`` is the
  one writer of blackouts, ``remember_healed`` the memory behind "never heal twice".
* **Resolution** — ``resolve_dispatch_model`` and ``next_model_in_chain`` pick models that
  are not blacked out (architecture §7).
"""

from __future__ import annotations

import calendar
import io
import json
import os
import re
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from datetime import time as wall_time
from pathlib import Path
from typing import Any, Literal, TypeVar
from zoneinfo import ZoneInfo

from xaf_hub.errors import ConfigError, StateFileError
from xaf_hub.statefile import read_json, update_json

__all__ = [
    "DEFAULT_BLACKOUT_FAMILIES",
    "HEALED_RETENTION",
    "MODEL_STATE_FILE",
    "MODEL_UNAVAILABLE_PATTERNS",
    "RATE_LIMIT_PATTERNS",
    "SCHEMA_VERSION",
    "Blackout",
    "ErrorClass",
    "ModelState",
    "classify_error",
    "classify_message",
    "family_of",
    "next_model_in_chain",
    "next_reset",
    "resolve_dispatch_model",
    "resolve_timezone",
    "to_ms",
]

_T = TypeVar("_T")

ErrorClass = Literal["rate_limited", "model_unavailable", "other", "none"]

SCHEMA_VERSION = 1
MODEL_STATE_FILE = ".model_state.json"
HEALED_RETENTION = timedelta(days=14)
DEFAULT_BLACKOUT_FAMILIES: Mapping[str, Sequence[str]] = {"opencode": ("opencode/", "opencode-go/")}

_WHAT = "model state"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# ---------------------------------------------------------------------------------------------
# Signals

# Rate limits and spent quotas, as providers and opencode word them (API-1.18.33.md §6 and the
# seed's incident notes). A hit here may black out a whole family until the next reset.
RATE_LIMIT_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"free[ _-]?usage[ _-]?(?:limit|exceeded)",
        r"FreeUsageLimitError|GoUsageLimitError",  # opencode zen error types in responseBody
        r"usage[ _-]?limit[ _-]?(?:reached|exceeded)",
        r"\brate[ _-]?limit",  # rate limit, rate_limit_error, rate-limited, ratelimit
        r"too[ _-]?many[ _-]?requests",
        r"quota[ _-]?(?:is[ _-]?)?(?:exhausted|exceeded|reached)",
        r"(?:exceeded|exhausted)[ _-]?(?:your|the)?[ _-]?(?:current[ _-]?)?quota",
        r"insufficient[ _-]?quota",
        r"\brps\b[ _-]?(?:limit[ _-]?)?(?:exhausted|exceeded)",
        r"resource[ _-]?exhausted",  # Google's 429 status name
        r"(?<![\w.])429(?![\w.])",  # bare status code; not part of a port, version or number
        r"限流|请求过于频繁|额度(?:已)?(?:用完|用尽|耗尽)|配额(?:已)?(?:用完|用尽|耗尽)",
    )
)

# The model (or its route) cannot serve at all: switch to the next model, never black out.
MODEL_UNAVAILABLE_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"endpoints?[ _-]?(?:is[ _-]?)?(?:unavailable|not[ _-]?available)",
        r"\bno[ _-]?endpoints?[ _-]?found",
        r"\bno[ _-]?route",  # no route, no-route, no_route
        r"model[ _-]?(?:is[ _-]?)?(?:unavailable|not[ _-]?available)",
        r"model[ _-]?not[ _-]?found",  # model_not_found, Model not found, ProviderModelNotFound
        r"unknown[ _-]?model",
        r"model\b.{0,120}?\bdoes not exist",
        r"provider[ ._-]?internal",  # provider.internal, provider internal error
        r"not[ _-]?available[ _-]?in[ _-]?(?:the[ _-]?|your[ _-]?)?current[ _-]?"
        r"(?:token[ _-]?)?plan",
    )
)

# Errors that are a decision, not a symptom: an abort never heals or blacks out anything.
_NEVER_A_SIGNAL = frozenset({"MessageAbortedError", "ContextOverflowError"})


def _matches(patterns: Sequence[re.Pattern[str]], text: str) -> bool:
    return any(p.search(text) for p in patterns)


def classify_message(text: str) -> ErrorClass:
    """Classify a retry-status or error message; rate limit wins over model-unavailable."""
    if not text or not text.strip():
        return "none"
    if _matches(RATE_LIMIT_PATTERNS, text):
        return "rate_limited"
    if _matches(MODEL_UNAVAILABLE_PATTERNS, text):
        return "model_unavailable"
    return "other"


def _status_code(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    # Some providers hand back a parsed body; search its JSON form like the string form.
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def classify_error(error: Mapping[str, Any] | None) -> ErrorClass:
    """Classify an opencode ``info.error`` / ``session.error`` object ``{name, data}``."""
    if error is None:
        return "none"
    name = error.get("name")
    name = name if isinstance(name, str) else ""
    if name in _NEVER_A_SIGNAL:
        return "other"
    data = error.get("data")
    data = data if isinstance(data, Mapping) else {}
    if _status_code(data.get("statusCode")) == 429:
        return "rate_limited"
    # The name is searched too: "ProviderModelNotFoundError" says enough on its own.
    text = "\n".join(
        part
        for part in (name, _as_text(data.get("message")), _as_text(data.get("responseBody")))
        if part
    )
    verdict = classify_message(text)
    return "other" if verdict == "none" else verdict


# ---------------------------------------------------------------------------------------------
# Families, time zones and the reset clock


def family_of(model: str, families: Mapping[str, Sequence[str]]) -> str | None:
    """Return the blackout family whose provider prefix the model starts with, or None."""
    wanted = model.strip().casefold()
    best: tuple[int, str] | None = None
    for family, prefixes in families.items():
        for prefix in prefixes:
            p = prefix.casefold()
            # Longest prefix wins, so "opencode-go/" can form its own family next to "opencode".
            if p and wanted.startswith(p) and (best is None or len(p) > best[0]):
                best = (len(p), family)
    return best[1] if best else None


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
    wall = datetime.combine(day, wall_time(hour), tzinfo=tz)
    return wall.astimezone(UTC)


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
    key = candidate.strip().lstrip(":")
    if not key or key.startswith("/"):
        return None
    try:
        return ZoneInfo(key)
    except (KeyError, ValueError, OSError):  # ZoneInfoNotFoundError is a KeyError
        return None


def _zone_file(candidate: str) -> ZoneInfo | None:
    """The zone of a TZ naming a file (``/usr/share/zoneinfo/Asia/Shanghai``, ``:/etc/x``)."""
    path = candidate.strip().lstrip(":")
    if not path.startswith("/"):
        return None
    marker = "/zoneinfo/"
    if marker in path:
        zone = _zone_key(path.rsplit(marker, 1)[1])
        if zone is not None:
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
            raise ConfigError(f"models.timezone: unknown time zone {name!r} (use an IANA name)")
        return zone
    env = os.environ if environ is None else environ
    if env.get("TZ"):
        zone = _zone_key(env["TZ"]) or _zone_file(env["TZ"]) or _posix_zone(env["TZ"])
        if zone is not None:
            return zone
        # Unreadable: the C library of this process says what it made of it; for another
        # environment, do as glibc does with a TZ it cannot read (UTC).
        return _SystemLocalZone() if environ is None else ZoneInfo("UTC")
    try:
        target = str(localtime_path.resolve(strict=True))
    except OSError:
        target = ""
    marker = "/zoneinfo/"
    if marker in target:
        zone = _zone_key(target.rsplit(marker, 1)[1])
        if zone is not None:
            return zone
    return _SystemLocalZone()


# ---------------------------------------------------------------------------------------------
# Store


@dataclass(frozen=True)
class Blackout:
    """One family's blackout: unusable until ``until_ms``."""

    family: str
    until_ms: int
    reason: str
    source: str
    marked_at_ms: int


def _default_state() -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "blackouts": {}, "healed": {}}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ModelState:
    """The ``.model_state.json`` store: blackouts per family and the healed-failure memory."""

    def __init__(
        self,
        path: Path,
        reset_hour: int,
        tz: tzinfo,
        families: Mapping[str, Sequence[str]],
        lock_timeout: float = 20,
    ) -> None:
        if not 0 <= reset_hour <= 23:
            raise ValueError(f"reset_hour must be 0..23, got {reset_hour}")
        self.path = path
        self.reset_hour = reset_hour
        self.tz = tz
        self.families = families
        self.lock_timeout = lock_timeout

    # -- reading and checking ------------------------------------------------------------

    def _bad(self, where: str, problem: str) -> StateFileError:
        return StateFileError(f"{_WHAT} {self.path}: {where}: {problem}")

    def _check(self, data: Any) -> dict[str, Any]:
        """Validate the whole document; anything unexpected is an error, never a reset."""
        if not isinstance(data, dict):
            raise self._bad("top level", f"expected an object, found {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise self._bad(
                "schema_version",
                f"expected {SCHEMA_VERSION}, found {version!r} "
                "(written by another xaf-hub version?)",
            )
        for section in ("blackouts", "healed"):
            if not isinstance(data.setdefault(section, {}), dict):
                raise self._bad(section, "expected an object")
        for family, entry in data["blackouts"].items():
            where = f"blackouts.{family}"
            if not isinstance(entry, dict):
                raise self._bad(where, "expected an object")
            for key in ("until_ms", "marked_at_ms"):
                if not _is_int(entry.get(key)):
                    raise self._bad(f"{where}.{key}", "expected an integer (ms since epoch)")
            for key in ("reason", "source"):
                if not isinstance(entry.get(key), str):
                    raise self._bad(f"{where}.{key}", "expected a string")
        for key, entry in data["healed"].items():
            where = f"healed.{key}"
            if not isinstance(entry, dict):
                raise self._bad(where, "expected an object")
            if not _is_int(entry.get("at_ms")):
                raise self._bad(f"{where}.at_ms", "expected an integer (ms since epoch)")
            for field in ("from_model", "to_model"):
                if entry.get(field) is not None and not isinstance(entry.get(field), str):
                    raise self._bad(f"{where}.{field}", "expected a string or null")
        return data

    def _read(self) -> dict[str, Any]:
        # No lock needed: writers replace the file in one step, so a reader sees old or new.
        try:
            return self._check(read_json(self.path, what=_WHAT))
        except FileNotFoundError:
            return _default_state()

    def _update(self, mutate: Callable[[dict[str, Any]], _T]) -> _T:
        def checked(data: Any) -> _T:
            return mutate(self._check(data))

        return update_json(
            self.path, checked, default=_default_state, what=_WHAT, timeout=self.lock_timeout
        )

    # -- blackouts ------------------------------------------------------------------------

    def mark_blackout(self, family: str, reason: str, source: str, now: datetime) -> int:
        """Black out ``family`` until the next reset hour; the only writer of blackouts."""
        if family not in self.families:
            raise ValueError(f"unknown blackout family {family!r}")
        now_ms = to_ms(now)
        until_ms = to_ms(next_reset(now, self.reset_hour, self.tz))

        def mutate(data: dict[str, Any]) -> int:
            current = data["blackouts"].get(family)
            if current is not None and current["until_ms"] > now_ms:
                # A repeat inside the window keeps its end and first cause; it may only pull a
                # later end (e.g. reset hour changed) back to this reset, never push it out.
                if current["until_ms"] > until_ms:
                    current["until_ms"] = until_ms
                return int(current["until_ms"])
            data["blackouts"][family] = {
                "until_ms": until_ms,
                "reason": reason,
                "source": source,
                "marked_at_ms": now_ms,
            }
            return until_ms

        return self._update(mutate)

    def active_blackouts(self, now: datetime) -> dict[str, Blackout]:
        """Return the blackouts still in force at ``now``, by family."""
        now_ms = to_ms(now)
        return {
            family: Blackout(
                family=family,
                until_ms=entry["until_ms"],
                reason=entry["reason"],
                source=entry["source"],
                marked_at_ms=entry["marked_at_ms"],
            )
            for family, entry in self._read()["blackouts"].items()
            if entry["until_ms"] > now_ms
        }

    def blacked_out_families(self, now: datetime) -> set[str]:
        """Return the families blacked out at ``now`` (expired entries are ignored)."""
        return set(self.active_blackouts(now))

    # -- healed-failure memory ------------------------------------------------------------

    def was_healed(self, key: str) -> bool:
        """Return whether the failure identified by ``key`` was already healed."""
        return key in self._read()["healed"]

    def remember_healed(
        self, key: str, from_model: str | None, to_model: str | None, now: datetime
    ) -> None:
        """Record that ``key`` was healed; forget entries older than 14 days while writing."""
        now_ms = to_ms(now)
        horizon_ms = to_ms(now - HEALED_RETENTION)

        def mutate(data: dict[str, Any]) -> None:
            healed: dict[str, Any] = data["healed"]
            for old in [k for k, v in healed.items() if v["at_ms"] < horizon_ms]:
                del healed[old]
            healed[key] = {"at_ms": now_ms, "from_model": from_model, "to_model": to_model}

        self._update(mutate)


# ---------------------------------------------------------------------------------------------
# Resolution


def _usable(
    model: str | None, blacked_out: set[str], families: Mapping[str, Sequence[str]]
) -> bool:
    if not model or not model.strip():
        return False
    family = family_of(model, families)
    return family is None or family not in blacked_out


def resolve_dispatch_model(
    *,
    explicit: str | None,
    chain: Sequence[str],
    default_model: str | None,
    blacked_out: set[str],
    families: Mapping[str, Sequence[str]],
) -> str | None:
    """Pick the dispatch model: explicit, else chain's first usable, else default, else None."""
    if _usable(explicit, blacked_out, families):
        return explicit
    # An explicit model of a blacked-out family falls through like no explicit model at all:
    # the blackout exists precisely so that a pinned free model stops eating 429s.
    for model in chain:
        if _usable(model, blacked_out, families):
            return model
    if _usable(default_model, blacked_out, families):
        return default_model
    return None


def next_model_in_chain(
    current: str | None,
    chain: Sequence[str],
    blacked_out: set[str],
    families: Mapping[str, Sequence[str]],
) -> str | None:
    """Return the next usable model after ``current`` in the chain, or None when none is left."""
    rest: Sequence[str] = chain
    if current is not None and current in chain:
        rest = chain[list(chain).index(current) + 1 :]
    for model in rest:
        if model != current and _usable(model, blacked_out, families):
            return model
    return None
