"""An event in plain words, in English or Chinese: a short headline and one or two lines.

The words are ``core.catalogue``'s: one headline ("chat.<type>") and one body
("chat.<type>.body") per event type. Error texts quoted from servers stay as the server wrote
them. Rendering is pure: the clock's zone for local times and the overview link are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import tzinfo
from typing import Any

from xaf_hub.core.catalogue import TEXT, text
from xaf_hub.core.clock import local_iso
from xaf_hub.notify.events import Event

# A chat line is read on a phone: long titles and error texts are cut.
_TITLE_CHARS = 80
_DETAIL_CHARS = 300


def _cut(words: str, limit: int) -> str:
    words = " ".join(str(words).split())
    return words if len(words) <= limit else words[: limit - 1] + "\u2026"


# Event data said as it is (unknown when missing), quoted from a server (cut), and counted (0).
_NAMED = ("from_model", "model", "family", "from_host", "to_host")
_QUOTED = ("error", "reason", "answer")
_NUMBERS = ("running", "waiting", "asking", "up", "servers")
# The daily summary's counts: its field -> the event type counted.
_COUNTED = {"done": "task_done", "finished": "task_finished", "parked": "task_parked",
            "healed": "healed", "people": "needs_person"}


def _fields(event: Event, lang: str, tz: tzinfo) -> dict[str, Any]:
    data: Mapping[str, Any] = event.data
    unknown = text(lang, "time.unknown")
    detail = _cut(str(data.get("detail") or unknown), _DETAIL_CHARS)
    state = f"chat.state.{data.get('state') or ''}"
    counts = data.get("counts") if isinstance(data.get("counts"), Mapping) else {}
    assert isinstance(counts, Mapping)
    return {
        **{key: data.get(key) or unknown for key in _NAMED},
        **{key: _cut(str(data.get(key) or unknown), _DETAIL_CHARS) for key in _QUOTED},
        **{key: data.get(key, 0) for key in _NUMBERS},
        **{key: counts.get(kind, 0) for key, kind in _COUNTED.items()},
        "title": _cut(event.title or event.task or event.session or unknown, _TITLE_CHARS),
        "task": event.task or "-",
        "instance": event.instance or unknown,
        "attempts": data.get("attempts", "?"),
        "state": text(lang, state if state in TEXT else "chat.state", detail=detail),
        "until": local_iso(str(data.get("until") or ""), tz, seconds=False, unknown="?"),
        # Which rule made it done: "verified: commit ... (new work...; check: passed)".
        "judged": "\n" + _cut(str(data["judged"]), _DETAIL_CHARS) if data.get("judged") else "",
        "day": data.get("day") or "",
        "detail": detail,
        "webhook": data.get("webhook") or "",
        "level": data.get("level", "?"),
        "scope": event.instance
        or text(lang, "chat.every_project" if data.get("every_project") else "chat.project"),
        "spent": _dollars(data.get("spent_usd")),
        "budget": _dollars(data.get("budget_usd")),
        "budget_next": text(lang, f"chat.budget.{100 if data.get('level') == 100 else 80}"),
    }


def _dollars(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"${value:,.2f}"
    return "?"


def render(
    event: Event, *, language: str, project: str, page_url: str, tz: tzinfo
) -> tuple[str, str]:
    """(headline, body) for ``event``; the headline names the hub and project."""
    lang = "zh" if language == "zh" else "en"
    key = f"chat.{event.type}" if f"chat.{event.type}.body" in TEXT else ""
    values = _fields(event, lang, tz)
    head = text(lang, key, **values) if key else values["title"]
    body = text(lang, f"{key}.body", **values) if key else values["state"]
    if page_url:
        body += "\n" + text(lang, "chat.link", url=page_url)
    # No project: an event of the whole fleet, told by a hub serving several projects.
    where = project or text(lang, "chat.every_project")
    return text(lang, "chat.prefix", project=where) + " " + head, body
