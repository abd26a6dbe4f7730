"""What the verified-commit tests share: a patrol round and its report, the first round that
judges a task, the task pool as stored, the page (tests/e2e/test_verified_commits.py and
test_done_work.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fleet import Hub


def home(hub: Hub) -> Path:
    return Path(hub.env["XAF_HUB_HOME"])


def patrol(hub: Hub) -> dict[str, Any]:
    code, out, err = hub.cli("patrol", "--once", "--no-design")
    assert code == 0, err
    return json.loads((home(hub) / "patrol" / "report-latest.json").read_text("utf-8"))


def settling_round(hub: Hub, task_id: str, *, kept: bool = False) -> dict[str, Any]:
    """The first patrol round that judges the task (a row younger than 10 s is left alone);
    ``kept``: one that keeps it waiting for verification."""
    rounds: list[dict[str, Any]] = []

    def judged() -> bool:
        doc = patrol(hub)
        rounds.append(doc)
        rows = doc["tasks_done"] + doc["needs_person"] + doc["tasks_requeued"]
        if kept:
            rows = [r for r in doc["tasks_kept"] if "verification" in r.get("detail", "")]
        return any(r.get("task") == task_id for r in rows)

    hub.wait_for(judged, timeout=90, step=1.0)
    return rounds[-1]


def pool(hub: Hub) -> dict[str, dict[str, Any]]:
    doc = json.loads((home(hub) / "tasks_backlog.json").read_text("utf-8"))
    return {t["id"]: t for t in doc["tasks"]}


def page(hub: Hub) -> str:
    path = home(hub) / "page.html"
    code, _, err = hub.cli("sessions", "--html", str(path))
    assert code == 0, err
    return path.read_text("utf-8")
