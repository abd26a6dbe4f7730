"""The live board against real opencode servers: a patrol daemon follows the fleet and publishes
what it sees; `status`, `sessions` and `dispatch`'s plan read that instead of scanning, a run
that started shows within seconds, and `status` scans again once the board is no longer kept
current (a frozen daemon, a stopped one), so it never shows what the servers no longer say.

How fast the board is against a scan is measured in `python -m bench --board`; nothing here
asserts on elapsed time.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest

from tests.e2e.daemon import _daemon, _home
from tests.e2e.dispatch_checks import slow
from tests.fleet import Hub

pytestmark = pytest.mark.e2e

# Above opencode 1.18's heartbeat (every 10 s): an idle stream is confirmed that often.
FRESH_SECONDS = 12


def status(hub: Hub, *flags: str) -> dict[str, Any]:
    code, doc = hub.cli_json("status", *flags)
    assert code == 0, [(i["instance"], i.get("reason")) for i in doc.get("instances", [])] or doc
    return dict(doc)


def lan_c(doc: dict[str, Any]) -> dict[str, Any]:
    return next(i for i in doc["instances"] if i["instance"] == "lan-c")


@pytest.mark.timeout(600)
def test_status_reads_the_daemons_board_and_scans_once_it_is_not_kept(hub: Hub) -> None:
    hub.write_config(patrol={"live_board_seconds": FRESH_SECONDS})
    slow(hub, 40)
    daemon = _daemon(hub)
    try:
        live = hub.wait_for(lambda: (d := status(hub))["source"] == "live" and d, timeout=60)
        assert live["live_age_seconds"] <= FRESH_SECONDS
        assert live["live_instances"] == sorted(i["name"] for i in hub.doc["instances"])
        scanned = status(hub, "--fresh")
        assert scanned["source"] == "scan" and scanned["live_age_seconds"] is None
        counted = ("running_project", "project_sessions", "reserved", "limit", "dispatchable")
        for a, b in zip(live["instances"], scanned["instances"], strict=True):
            assert {k: a[k] for k in counted} == {k: b[k] for k in counted}
        code, out, _err = hub.cli("status")
        assert code == 0 and "source: live, " in out and "s old (--fresh scans)" in out
        # sessions reads the same board, and lists what a scan lists.
        listed = [hub.cli_json("sessions", *flags)[1] for flags in ((), ("--fresh",))]
        assert [d["source"] for d in listed] == ["live", "scan"]
        assert listed[0]["live_age_seconds"] <= FRESH_SECONDS
        assert listed[1]["live_age_seconds"] is None
        assert [(s["id"], s["run_state"]) for s in listed[0]["sessions"]] == [
            (s["id"], s["run_state"]) for s in listed[1]["sessions"]]
        # dispatch plans from the board too, to the same instance a scan would choose. (Under
        # load an instance's entry can pass its age between the calls above: then the plan
        # scans that one, "mixed"; the next publish makes it whole again.)
        def plan(*flags: str) -> Any:
            return hub.cli_json("dispatch", "--dry-run", "--new", "--text", "Add a health check",
                                *flags)[1]

        plans = [hub.wait_for(lambda: (p := plan())["source"] == "live" and p, timeout=60),
                 plan("--fresh")]
        assert [p["source"] for p in plans] == ["live", "scan"]
        assert plans[0]["instance"] == plans[1]["instance"]
        assert plans[0]["load"] == plans[1]["load"]

        # A run starts: the board shows it without a scan.
        sid = hub.session("lan-c", "live board run", "app")
        started = time.monotonic()
        hub.prompt("lan-c", sid, "work slowly", "fake/slow-model")
        hub.wait_for(lambda: (d := status(hub))["source"] == "live"
                     and lan_c(d)["running_project"] == 1, timeout=60)
        print(f"run start on the board after {time.monotonic() - started:.1f} s")

        # The daemon freezes; the run is stopped meanwhile. The board still says "running",
        # so every status from then on either reads a board confirmed within the limit or
        # scans, and once the limit passed it says what the server says.
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        try:
            frozen = time.monotonic()
            assert hub.cli("interrupt", "--session", sid, "--allow-prod")[0] == 0
            hub.wait_for(lambda: sid not in hub.busy_ids("lan-c"), timeout=60)
            while time.monotonic() - frozen < FRESH_SECONDS + 2:
                doc = status(hub)
                if doc["source"] != "scan":
                    assert doc["live_age_seconds"] <= FRESH_SECONDS
                time.sleep(0.5)
            doc = status(hub)
            assert doc["source"] == "scan" and lan_c(doc)["running_project"] == 0
            board = _home(hub) / "live-board-patrol.json"
            assert json.loads(board.read_text("utf-8"))["writer"] == "patrol"
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)

        # Back: the board is kept again, and says what the server says.
        doc = hub.wait_for(lambda: (d := status(hub))["source"] == "live" and d, timeout=60)
        assert lan_c(doc)["running_project"] == 0
    finally:
        assert daemon.stop() == 0
    # A daemon that stopped leaves a board nobody keeps: status scans at once.
    doc = status(hub)
    assert doc["source"] == "scan"
    assert not any(pw in json.dumps(doc) for pw in hub.secrets())
