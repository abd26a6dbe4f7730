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

from sandbox import fleet as sandbox
from tests.fleet import NAMES, Hub

pytestmark = pytest.mark.e2e

LIMIT = 2
DISPATCHES = 20


class Sampler(threading.Thread):
    """Count one server's running sessions in one directory every 100 ms."""

    def __init__(self, hub: Hub, name: str, directory: Path, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.hub = hub
        self.name = name
        self.directory = str(directory)
        self.stop = stop
        self.peak = 0
        self.samples = 0
        self.errors = 0

    def run(self) -> None:
        with httpx.Client(
            base_url=self.hub.server(self.name).url,
            headers=sandbox.auth_headers(self.hub.password(self.name)),
            timeout=10,
            trust_env=False,
        ) as c:
            while not self.stop.is_set():
                try:
                    r = c.get("/session/status", params={"directory": self.directory})
                    running = len(r.json())
                except (httpx.HTTPError, ValueError):
                    self.errors += 1
                else:
                    self.peak = max(self.peak, running)
                    self.samples += 1
                self.stop.wait(0.1)


def test_twenty_dispatches_and_a_patrol_hold_the_limit_and_lose_no_update(hub: Hub) -> None:
    hub.llm.set_mode("slow-model", "slow", delay=120)
    hub.doc["models"]["default_dispatch_model"] = "fake/slow-model"
    hub.doc["concurrency_limit"] = LIMIT
    # A busy 2-core box must not turn this into a timeout test: reads may take their time.
    hub.doc["timeouts"]["read_seconds"] = 30
    hub.write_config()
    for i in range(3):
        code, _, err = hub.cli("backlog", "add", "--id", f"LD-{i}", "--title", f"pool task {i}")
        assert code == 0, err
    stop = threading.Event()
    samplers = [Sampler(hub, name, hub.root / "app", stop) for name in NAMES]
    for sampler in samplers:
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
        stop.set()
        for sampler in samplers:
            sampler.join(timeout=30)
    peak = {sm.name: sm.peak for sm in samplers}

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
        for sm in samplers:
            assert sm.samples >= 30 and sm.errors <= sm.samples // 10, (sm.name, sm.errors)
        assert all(n <= LIMIT for n in peak.values()), peak
        assert max(peak.values()) == LIMIT, peak
        assert len(created) < DISPATCHES
        print(
            f"load: {len(created)} of {DISPATCHES} dispatches ran; "
            f"{[sm.samples for sm in samplers]} samples, peak per instance {peak}"
        )

        # Nothing lost in the pool: every manual dispatch recorded once, every add present,
        # the patrol's dispatches marked with their sessions, every running session accounted.
        pool = json.loads((Path(hub.env["XAF_HUB_HOME"]) / "tasks_backlog.json").read_text())
        tasks = {t["id"]: t for t in pool["tasks"]}
        assert len(tasks) == len(pool["tasks"])
        assert {f"ADD-{i}" for i in range(3)} <= set(tasks)
        lost = [
            tasks[doc["task_id"]]
            for sid, doc in created.items()
            if (tasks[doc["task_id"]]["session_id"], tasks[doc["task_id"]]["dispatched_to"])
            != (sid, doc["instance"])
        ]
        assert not lost, json.dumps(lost)
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
    finally:
        for name in NAMES:
            for sid in hub.status(name, hub.root / "app"):
                sandbox.abort(hub.server(name).url, hub.password(name), sid)
