"""Load: 20 dispatch processes at once against 3 real instances while a patrol cycle runs.

Each instance allows 2 running project sessions and the model answers slowly, so 6 runs fit
and everything else must be refused (exit 3) by the gate. A sampler asks every server for
its running sessions every 100 ms during the whole run: no sample may ever show more than 2
on one instance. Meanwhile the patrol fills slots from the task pool and `backlog add`
processes write the same pool: no update may be lost.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.fleet import NAMES, Hub
from xaf_hub.sandbox import fleet as sandbox

pytestmark = pytest.mark.e2e

LIMIT = 2
DISPATCHES = 20


class Sampler(threading.Thread):
    """Count each server's running sessions in one directory every 100 ms."""

    def __init__(self, hub: Hub, directory: Path) -> None:
        super().__init__(daemon=True)
        self.hub = hub
        self.directory = str(directory)
        self.stop = threading.Event()
        self.peak = dict.fromkeys(NAMES, 0)
        self.samples = 0
        self.errors = 0

    def run(self) -> None:
        clients = {
            name: httpx.Client(
                base_url=self.hub.server(name).url,
                headers=sandbox.auth_headers(self.hub.password(name)),
                timeout=10,
                trust_env=False,
            )
            for name in NAMES
        }
        try:
            while not self.stop.is_set():
                for name, c in clients.items():
                    try:
                        r = c.get("/session/status", params={"directory": self.directory})
                        running = len(r.json())
                    except (httpx.HTTPError, ValueError):
                        self.errors += 1
                        continue
                    self.peak[name] = max(self.peak[name], running)
                    self.samples += 1
                self.stop.wait(0.1)
        finally:
            for c in clients.values():
                c.close()


def test_twenty_dispatches_and_a_patrol_hold_the_limit_and_lose_no_update(hub: Hub) -> None:
    hub.llm.set_mode("slow-model", "slow", delay=120)
    hub.doc["models"]["default_dispatch_model"] = "fake/slow-model"
    hub.doc["concurrency_limit"] = LIMIT
    hub.write_config()
    for i in range(3):
        code, _, err = hub.cli("backlog", "add", "--id", f"LD-{i}", "--title", f"pool task {i}")
        assert code == 0, err
    sampler = Sampler(hub, hub.root / "app")
    sampler.start()
    try:
        patrol = hub.popen("patrol", "--once", "--no-freelimit", "--no-check", "--no-design")
        procs = [
            hub.popen("dispatch", "--new", "--text", f"load task {i}", "--json")
            for i in range(DISPATCHES)
        ]
        adds = [
            hub.popen("backlog", "add", "--id", f"ADD-{i}", "--title", f"added {i}")
            for i in range(3)
        ]
        results = [(p, *p.communicate(timeout=240)) for p in procs]
        for p in adds:
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, err
        _, patrol_err = patrol.communicate(timeout=240)
        # Keep sampling a little after the last process: a late start would show now.
        time.sleep(1.0)
    finally:
        sampler.stop.set()
        sampler.join(timeout=30)

    try:
        assert patrol.returncode == 0, patrol_err
        created = {}
        for p, out, err in results:
            assert p.returncode in (0, 3), err
            if p.returncode == 0:
                doc = json.loads(out)
                created[doc["session_id"]] = doc
            else:
                assert "at its limit" in err or "dispatch lock" in err, err

        # The limit held at every sampled moment, and the run did press against it.
        assert sampler.samples >= 30 and sampler.errors <= sampler.samples // 10
        assert all(peak <= LIMIT for peak in sampler.peak.values()), sampler.peak
        assert max(sampler.peak.values()) == LIMIT, sampler.peak
        assert len(created) < DISPATCHES

        # Nothing lost in the pool: every manual dispatch recorded once, every add present,
        # the patrol's dispatches marked with their sessions, every running session accounted.
        pool = json.loads((Path(hub.env["XAF_HUB_HOME"]) / "tasks_backlog.json").read_text())
        tasks = {t["id"]: t for t in pool["tasks"]}
        assert len(tasks) == len(pool["tasks"])
        for sid, doc in created.items():
            task = tasks[doc["task_id"]]
            assert (task["session_id"], task["dispatched_to"]) == (sid, doc["instance"])
        assert {f"ADD-{i}" for i in range(3)} <= set(tasks)
        sessions = [t["session_id"] for t in tasks.values() if t["session_id"]]
        assert len(sessions) == len(set(sessions))
        patrol_sent = [t for t in tasks.values() if t["id"].startswith("LD-")]
        assert all(
            t["status"] == "pending" or (t["status"] == "dispatched" and t["session_id"])
            for t in patrol_sent
        )
        running = set()
        for name in NAMES:
            running |= set(hub.status(name, hub.root / "app"))
        assert running <= set(sessions)
        assert len(running) <= LIMIT * len(NAMES)
        print(
            f"load: {len(created)} of {DISPATCHES} dispatches ran, "
            f"{sum(t['status'] == 'dispatched' for t in patrol_sent)} pool tasks by the patrol; "
            f"{sampler.samples} samples, peak per instance {sampler.peak}"
        )
    finally:
        for name in NAMES:
            for sid in hub.status(name, hub.root / "app"):
                sandbox.abort(hub.server(name).url, hub.password(name), sid)
