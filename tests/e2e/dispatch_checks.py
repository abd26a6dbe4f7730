"""A slow dispatch model, stopping every run on an instance and reading the audit log: shared by
the dispatch and MCP end-to-end tests."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fleet import Hub


def slow(hub: Hub, seconds: float = 25) -> None:
    """Make the dispatch model answer slowly so sessions stay busy."""
    hub.llm.set_mode("slow-model", "slow", delay=seconds)
    hub.doc["models"]["default_dispatch_model"] = "fake/slow-model"
    hub.write_config()


def abort_all(hub: Hub, name: str) -> None:
    # The hub's interrupt aborts where the run lives on every release (a bare abort does not).
    for sid in hub.busy_ids(name):
        hub.cli("interrupt", "--session", sid, "--allow-prod")


def audit_lines(hub: Hub) -> list[dict[str, object]]:
    path = Path(hub.env["XAF_HUB_HOME"]) / "audit.log"
    return [json.loads(ln) for ln in path.read_text("utf-8").splitlines()] if path.exists() else []
