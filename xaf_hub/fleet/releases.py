"""What the hub knows about opencode release lines, and how it reads run state on each
(``OpencodeClient.running`` follows these rules; docs/opencode-releases.md).

A version newer than the newest known line is read both ways; one the hub cannot place leaves the
run state unknown, and the instance counts as full (reason from :func:`classify`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Behaviour = Literal["per-directory", "server-wide", "unknown", "v2"]

OLDEST = (1, 2, 0)
FIRST_PER_DIRECTORY = (1, 15, 0)
NEWEST_MEASURED = (1, 18, 33)

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[-+.].*)?$")




@dataclass(frozen=True)
class Release:
    """One instance's release as the hub understood it."""

    version: str
    behaviour: Behaviour
    note: str = ""

    @property
    def known(self) -> bool:
        """True when the hub knows how this release reports run state."""
        return self.behaviour != "unknown"

    @property
    def reads_server_wide(self) -> bool:
        """Whether the server-wide ``/session/status`` (no directory) must be read too."""
        return self.behaviour == "server-wide" or bool(self.note)

    def describe(self) -> str:
        """One line for doctor and tables, e.g. ``1.14.41 (server-wide run state)``."""
        shown = self.version or "unknown version"
        if self.behaviour == "unknown":
            return f"{shown} (run state unknown: {self.note})"
        extra = f"; {self.note}" if self.note else ""
        return f"{shown} ({self.behaviour} run state{extra})"


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``"1.14.41"`` -> ``(1, 14, 41)``; None when it is not a release number."""
    m = _VERSION_RE.match(text.strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def classify(version: str, dialect: str = "classic") -> Release:
    """The run-state behaviour of a server that reported ``version`` in ``/global/health``."""
    if dialect == "v2":
        return Release(version, "v2")
    parsed = parse_version(version)
    if parsed is None:
        what = f"version {version[:40]!r}" if version else "no version in /global/health"
        return Release(version, "unknown", f"{what} is not a release number")
    if parsed < OLDEST:
        return Release(version, "unknown", "older than 1.2, never measured")
    if parsed < FIRST_PER_DIRECTORY:
        return Release(version, "server-wide")
    if parsed[:2] > NEWEST_MEASURED[:2]:
        newest = ".".join(map(str, NEWEST_MEASURED))
        return Release(version, "per-directory", f"newer than {newest}: also read server-wide")
    return Release(version, "per-directory")


OPENCODE_VERSION = "1.18.33"
