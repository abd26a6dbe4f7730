"""The overview page's way with words: its language, relative times, the live-time mark.

The words themselves live in ``core.catalogue`` (shared with the chat). Relative times ("3 hours
ago" / "3 小时前") are built here, and ``clock_words`` hands the same words to the page's script,
so the browser keeps them current with the very phrasing the server used.
"""

from __future__ import annotations

from dataclasses import dataclass

from xaf_hub.core import clock
from xaf_hub.core.catalogue import LANGS, Lang, text
from xaf_hub.core.clock import MAX_TIME_MS

# Marks where a live relative time goes inside a sentence (never in user text: see clean); the
# page's template splits a sentence there.
WHEN = "\x00"

_MINUTE = 60_000
_HOUR = 60 * _MINUTE
_DAY = 24 * _HOUR

# (unit key, size in ms, counts below this use the unit), largest unit last.
_UNITS: tuple[tuple[str, int, int], ...] = (
    ("unit.minute", _MINUTE, 60),
    ("unit.hour", _HOUR, 24),
    ("unit.day", _DAY, 60),
    ("unit.month", 30 * _DAY, 12),
)
_YEAR = 365 * _DAY


def pick_language(setting: str, accept_language: str | None) -> Lang:
    """The page language: a fixed ``setting``, or for "auto" the browser's first zh/en choice.

    ``accept_language`` is an HTTP Accept-Language header ("zh-CN,zh;q=0.9,en;q=0.8"); a
    header that names neither language, or none at all, gives English.
    """
    if setting in LANGS:
        return setting
    choices: list[tuple[float, int, Lang]] = []
    for index, part in enumerate((accept_language or "").split(",")):
        tag, _, params = part.strip().partition(";")
        quality = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        primary = tag.strip().lower().split("-")[0]
        if quality > 0 and primary in ("zh", "en"):
            choices.append((-quality, index, "zh" if primary == "zh" else "en"))
    return min(choices)[2] if choices else "en"


def _unit(lang: Lang, key: str, count: int) -> str:
    forms = text(lang, key).split("|")  # Chinese has one form for every count
    return f"{count} {forms[0] if count == 1 or lang == 'zh' else forms[-1]}"


def span(lang: Lang, ms: int) -> str:
    """``ms`` (at least a minute) as "N units" with the largest unit that fits."""
    for key, size, upto in _UNITS:
        count = ms // size
        if count < upto:
            return _unit(lang, key, count)
    return _unit(lang, "unit.year", ms // _YEAR)


def ago(lang: Lang, ms: int, now_ms: int) -> str:
    """How long ago ``ms`` was, seen at ``now_ms`` ("3 hours ago", "3 小时前")."""
    if not 0 < ms <= MAX_TIME_MS:  # 0 or absurd (a hostile server's year 300000)
        return text(lang, "time.unknown")
    delta = now_ms - ms
    if abs(delta) < _MINUTE:
        return text(lang, "time.now")
    # A time ahead of "now" is clock skew between machines; say so rather than hide it.
    key = "time.ago" if delta > 0 else "time.ahead"
    return text(lang, key, span=span(lang, abs(delta)))


def clock_words(lang: Lang) -> dict[str, object]:
    """The words the page's script needs to say relative times exactly as ``ago`` does."""
    return {
        "now": text(lang, "time.now"),
        "unknown": text(lang, "time.unknown"),
        "ago": text(lang, "time.ago"),
        "ahead": text(lang, "time.ahead"),
        "zh": lang == "zh",
        "units": [[size, upto, text(lang, key).split("|")] for key, size, upto in _UNITS]
        + [[_YEAR, 0, text(lang, "unit.year").split("|")]],
        "updated": text(lang, "page.updated_ago"),
        "updatedNow": text(lang, "page.updated_now"),
        "following": text(lang, "page.following"),
        "shown": text(lang, "filter.shown"),
        "lost": text(lang, "page.lost_hub"),
    }


@dataclass(frozen=True)
class Line:
    """A sentence that may hold one live relative time: ``WHEN`` in ``text`` marks where
    the time of ``ms`` goes."""

    text: str
    ms: int = 0


def clean(value: str) -> str:
    """User text safe to put into a sentence that may carry the time mark."""
    return value.replace(WHEN, "")


def local_time_with_zone(ms: int) -> str:
    """``ms`` as local time with its UTC offset ("... UTC+08:00"), or "unknown"."""
    return clock.local_time(ms, zone="offset", unknown="unknown")

