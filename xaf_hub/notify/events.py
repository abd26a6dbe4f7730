"""The event record: one thing the team hears about, with a stable id for "send once"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Event:
    """One notification-worthy fact.

    ``id`` is stable for the fact (the same task finishing, the same outage), so deriving it
    twice never sends it twice. ``data`` holds the type's own fields (models, reasons, counts),
    as JSON values.
    """

    id: str
    type: str
    at: str  # ISO 8601, UTC
    instance: str = ""
    session: str = ""
    title: str = ""
    task: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    project: str = ""  # the configured project its session belongs to ("" none or unknown)

    def to_json(self) -> dict[str, Any]:
        """The hub's own event record (the ``json`` format's body carries it)."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        return {"schema_version": SCHEMA_VERSION, **doc, "data": dict(self.data)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Event:
        """Read a record back from the outbox (ValueError when it is not one)."""
        if not isinstance(raw.get("id"), str) or not isinstance(raw.get("type"), str):
            raise ValueError("an event needs a string id and type")
        data = raw.get("data")
        words = {name: str(raw.get(name) or "") for name in _WORDS}
        return cls(raw["id"], raw["type"], data=dict(data) if isinstance(data, Mapping) else {},
                   **words)


_WORDS = ("at", "instance", "session", "title", "task", "project")  # the fields held as text
