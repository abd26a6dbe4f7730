"""The patrol's state files that others read: pause flag, daemon heartbeat, latest report.

Both live in ``<state_dir>/patrol/``. The pause flag is written by ``patrol pause`` and
removed by ``patrol resume``; the heartbeat is written by the running daemon
(``patrol.runner``). ``doctor``, ``patrol status`` and the overview page read them here.
"""

from __future__ import annotations

import socket
from datetime import datetime
from pathlib import Path
from typing import Any

from xaf_hub.config.load import Config
from xaf_hub.errors import StateFileError
from xaf_hub.store.statefile import read_json, write_json_atomic

PAUSE_FILE = "paused.json"
HEARTBEAT_FILE = "daemon.json"
LATEST = "report-latest"  # <LATEST>.json / .md: the newest round's report


def patrol_dir(cfg: Config) -> Path:
    """Where the patrol keeps its reports, pause flag, heartbeat and locks."""
    return cfg.state_dir / "patrol"


def pause_info(folder: Path) -> dict[str, Any] | None:
    """The pause flag's content when paused, else None (a damaged flag still means paused)."""
    try:
        data = read_json(folder / PAUSE_FILE, what="patrol pause flag")
    except FileNotFoundError:
        return None
    except StateFileError as exc:
        return {"paused_at": "", "by": "", "note": str(exc)}
    return data if isinstance(data, dict) else {"paused_at": "", "by": ""}


def paused_message(info: dict[str, Any]) -> str:
    """The line a paused patrol prints instead of running."""
    since = f" since {info['paused_at']}" if info.get("paused_at") else ""
    by = f" by {info['by']}" if info.get("by") else ""
    return f"patrol is paused{since}{by}; no cycle run (xaf-hub patrol resume)"


def set_paused(folder: Path, who: str, now: datetime) -> bool:
    """Write the pause flag; False when it was already paused."""
    if pause_info(folder) is not None:
        return False
    write_json_atomic(
        folder / PAUSE_FILE,
        {"schema_version": 1, "paused_at": now.isoformat(timespec="seconds"), "by": who},
    )
    return True


def clear_paused(folder: Path) -> bool:
    """Remove the pause flag; False when it was not paused."""
    try:
        (folder / PAUSE_FILE).unlink()
    except FileNotFoundError:
        return False
    return True


def heartbeat(folder: Path) -> dict[str, Any] | None:
    """The daemon heartbeat, or None when no daemon ever ran."""
    try:
        data = read_json(folder / HEARTBEAT_FILE, what="patrol heartbeat")
    except (FileNotFoundError, StateFileError):
        return None
    return data if isinstance(data, dict) else None


def daemon_alive(beat: dict[str, Any] | None) -> bool:
    """True when the heartbeat's daemon is a live process on this host that has not stopped."""
    from xaf_hub.store.gate import pid_alive

    return bool(
        beat
        and not beat.get("stopped_at")
        and beat.get("host") == socket.gethostname()
        and isinstance(beat.get("pid"), int)
        and pid_alive(beat["pid"])
    )


def latest_report(folder: Path) -> dict[str, Any] | None:
    """The newest report document, or None when no cycle has run yet."""
    try:
        doc = read_json(folder / f"{LATEST}.json", what="patrol report")
    except FileNotFoundError:
        return None
    return doc if isinstance(doc, dict) else None
