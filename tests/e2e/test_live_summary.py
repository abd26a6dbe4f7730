"""`status` from the live board's summary against real opencode: with priced runs done,
one running, one waiting for a person, sessions outside the project and in an excluded
folder, and budgets set, every figure `status --json` takes from the summary is the one
`status --json --fresh` scans."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.e2e.daemon import _daemon
from tests.fleet import Hub

pytestmark = pytest.mark.e2e

PRICED = "fake/priced-model"
ASK_BASH = [{"permission": "bash", "pattern": "*", "action": "ask"}]
SOURCE = ("generated_at", "generated_at_ms", "source", "live_age_seconds", "live_instances")


def status(hub: Hub, *flags: str) -> dict[str, Any]:
    code, doc = hub.cli_json("status", *flags)
    assert code == 0, doc
    return dict(doc)


def figures(doc: dict[str, Any]) -> dict[str, Any]:
    """What `status --json` says of the fleet, but where it came from and the running total
    (other tests' runs on the shared servers may end between two reads: `running_total` is
    compared on its own, below)."""
    out = {k: v for k, v in doc.items() if k not in SOURCE}
    out["instances"] = [{k: v for k, v in i.items() if k != "running_total"}
                        for i in doc["instances"]]
    return out


def running_total(doc: dict[str, Any], name: str) -> int:
    return int(next(i for i in doc["instances"] if i["instance"] == name)["running_total"])


def run(hub: Hub, name: str, directory: Any, model: str, permission: Any = None) -> str:
    s = sandbox.create_session(hub.server(name).url, hub.password(name), str(directory),
                               "summary", permission)
    sid = str(s["id"])
    sandbox.prompt_async(hub.server(name).url, hub.password(name), sid, "go", model, directory)
    return sid


@pytest.mark.timeout(300)
def test_status_from_the_summary_says_what_a_scan_says(hub: Hub) -> None:
    hub.doc["models"]["timezone"] = "Asia/Kathmandu"
    hub.doc["budget"] = {"daily_usd": 5.0}
    hub.set_instance("lan-b", budget_daily_usd=0.02)
    hub.write_config(patrol={"live_board_seconds": 12})
    hub.set_instance("local-a", concurrency_limit=3)
    hub.llm.set_mode("slow-model", "slow", delay=60)
    hub.llm.set_mode("fake-model", "tools", calls=[["bash", {"command": "echo hi",
                                                             "description": "say"}]],
                     text="Done:")
    elsewhere = hub.root.parent / "elsewhere"
    elsewhere.mkdir()
    started: list[tuple[str, str]] = []
    daemon = _daemon(hub)
    try:
        started.append(("lan-b", run(hub, "lan-b", hub.project_dir("app"), PRICED)))
        started.append(("lan-b", run(hub, "lan-b", hub.project_dir("vendor"), PRICED)))
        started.append(("lan-c", run(hub, "lan-c", elsewhere, PRICED)))
        started.append(("lan-c", run(hub, "lan-c", hub.project_dir("app"), "fake/slow-model")))
        # A run outside the project, started once the daemon follows: its frames count too
        # (on 1.18.33 the board said running 0 for it where a scan said 1).
        started.append(("lan-c", run(hub, "lan-c", elsewhere, "fake/slow-model")))
        started.append(("local-a", run(hub, "local-a", hub.project_dir("app"),
                                       "fake/fake-model", ASK_BASH)))

        def settled() -> dict[str, Any] | None:
            d = status(hub, "--fresh")
            by = {i["instance"]: i for i in d["instances"]}
            done = (by["lan-b"]["spent_today_usd"] or 0) >= 0.02 - 1e-9 and \
                by["local-a"]["waiting"] == 1 and by["lan-c"]["running_project"] == 1
            return d if done else None

        hub.wait_for(settled, timeout=90, step=1)
        time.sleep(2)  # the board's next publish
        for _ in range(3):
            live = status(hub)
            fresh = status(hub, "--fresh")
            again = status(hub)
            if live["source"] == "live" and figures(live) == figures(again):
                break
        assert live["source"] == "live" and fresh["source"] == "scan"
        assert figures(live) == figures(fresh)
        # lan-c runs two slow runs, one of them outside the project: the board counts both.
        for _ in range(5):
            live, fresh = status(hub), status(hub, "--fresh")
            if running_total(live, "lan-c") == running_total(fresh, "lan-c"):
                break
            time.sleep(1)  # another test's run ended between the two reads
        assert live["source"] == "live"
        assert running_total(live, "lan-c") == running_total(fresh, "lan-c") >= 2
        b = next(i for i in live["instances"] if i["instance"] == "lan-b")
        assert (b["dispatchable"], b["spent_today_usd"]) == (False, pytest.approx(0.02))
    finally:
        for _name, sid in started:
            hub.cli("interrupt", "--session", sid, "--allow-prod")
        assert daemon.stop() == 0

