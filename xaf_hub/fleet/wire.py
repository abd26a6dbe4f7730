"""Reading what a server sent, defensively: field readers, session records, error text.

A hostile or broken server may send any JSON: every reader here returns a usable value
("" or 0 for unknown) instead of raising, except that a session without a usable id is a
KeyError (the caller skips that entry and says so).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from xaf_hub.core.records import sane_ms

# What a hostile or broken server may cost us, at most: one answer's size (decompressed), the
# pages and the sessions of one listing. Real instances stay far below (8000 sessions ~ 4 MB).
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_PAGES = 1000
MAX_SESSIONS = 100_000
# One session costing more than this is a broken or hostile report, not spend: unknown.
MAX_SESSION_COST_USD = 100_000.0


@dataclass(frozen=True)
class ServerSession:
    """A session as the server described it, before project rules and run state."""

    id: str
    title: str
    directory: str
    created: int
    updated: int
    cost: float | None  # None: the server reported no usable cost (unknown, never 0)
    parent_id: str
    model: str


# A tuple, not ``int | float``: that expression builds a new union object on every call, and
# these readers run a few times per session of every listing.
_NUMBER = (int, float)


def _is_mapping(value: Any) -> bool:
    # JSON objects are dicts: the exact-type test spares the ABC's slower isinstance check.
    return type(value) is dict or isinstance(value, Mapping)


def text_field(value: Any) -> str:
    """A string field; numbers as text, anything else (object, list, null) as ''."""
    if isinstance(value, str):
        return value
    if isinstance(value, _NUMBER) and not isinstance(value, bool):
        return str(value)
    return ""


def as_mapping(value: Any) -> Mapping[str, Any]:
    """An object field, or an empty one when the server sent anything else."""
    return value if _is_mapping(value) else {}


def cost_value(value: Any) -> float | None:
    """A session's cost in USD, or None (unknown) when it is missing or absurd.

    Absurd: not a number (text, a boolean), NaN, infinite, negative, or above
    ``MAX_SESSION_COST_USD``. Releases before 1.18 put cost on messages only, so their sessions
    have none (docs/architecture.md, "Daily budgets").
    """
    if isinstance(value, _NUMBER) and not isinstance(value, bool):
        number = float(value)
        if math.isfinite(number) and 0 <= number <= MAX_SESSION_COST_USD:
            return number
    return None


def usable_id(obj: Any) -> str:
    """A session's id, or '' when the entry is not an object with a usable id."""
    ident = obj.get("id") if _is_mapping(obj) else None
    return ident if isinstance(ident, str) and 0 < len(ident) <= 200 else ""


def _model_name(model: Any) -> str:
    if _is_mapping(model):
        provider = text_field(model.get("providerID"))
        ident = text_field(model.get("id")) or text_field(model.get("modelID"))
        if provider and ident:
            return f"{provider}/{ident}"
    return ""


def session_from_classic(obj: Mapping[str, Any]) -> ServerSession:
    """Normalise a classic Session / GlobalSession object (KeyError without a usable id).

    Every other field of the wrong type or range reads as unknown: '' or 0.
    """
    ident = usable_id(obj)
    if not ident:
        raise KeyError("id")
    t = as_mapping(obj.get("time"))
    return ServerSession(
        id=ident,
        title=text_field(obj.get("title")),
        directory=text_field(obj.get("directory")),
        created=sane_ms(t.get("created")),
        updated=sane_ms(t.get("updated")),
        cost=cost_value(obj.get("cost")),
        parent_id=text_field(obj.get("parentID")),
        model=_model_name(obj.get("model")),
    )


def session_from_v2(obj: Mapping[str, Any]) -> ServerSession:
    """Normalise a v2 SessionV2Info object (directory lives in ``location``)."""
    loc = as_mapping(obj.get("location")) if _is_mapping(obj) else {}
    plain = session_from_classic(obj)
    directory = text_field(loc.get("directory")) or plain.directory
    return dataclasses.replace(plain, directory=directory)



def error_message(content: bytes) -> str:
    """The message of a server's error answer, on one line (not yet redacted nor cut)."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return one_line(content.decode("utf-8", "replace")) or "no message"
    if isinstance(data, dict):
        inner = data.get("data")
        if isinstance(inner, dict) and inner.get("message"):
            return one_line(str(inner["message"]))
        for key in ("message", "name", "_tag"):
            if data.get(key):
                return one_line(str(data[key]))
    return "no message"


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) as one space."""
    return " ".join(text.split())


def read_page(
    items: list[Any], parse: Callable[[Any], ServerSession], seen: dict[str, ServerSession]
) -> tuple[list[ServerSession], int, int]:
    """Parse one listing page into ``seen`` (by id): (the page, how many were new, how many
    entries were skipped for want of a usable id)."""
    page: list[ServerSession] = []
    new = skipped = 0
    for obj in items:
        try:
            s = parse(obj)
        except KeyError:
            skipped += 1
            continue
        page.append(s)
        if s.id not in seen:
            seen[s.id] = s
            new += 1
    return page, new, skipped


def skip_note(skipped: int, what: str) -> str:
    """The note for entries of ``what`` skipped by read_page."""
    entries = "entry" if skipped == 1 else "entries"
    return f"skipped {skipped} {entries} of {what} without a usable session id"


def over_cap(cap: int, what: str) -> str:
    """The reason given when a listing goes beyond one of the caps above."""
    return f"more than {cap} {what} (stopped reading; endless pagination?)"
