"""Soak: the patrol daemon and `watch` follow the three real instances while work starts,
hits a rate limit, gets cut off, and a server restarts; afterwards every change was reported
once, nothing was healed or resumed twice, and no instance ran more than its limit.

CI runs a short soak (XAF_HUB_SOAK_SECONDS, default 30); set it to 600 for ten minutes.
All work goes through the hub (`dispatch`, the pool), so the limit applies to all of it.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.e2e.daemon import Lines, _audit, _beat, _home, start_again
from tests.fleet import NAMES, Hub

pytestmark = pytest.mark.e2e

SOAK_SECONDS = float(os.environ.get("XAF_HUB_SOAK_SECONDS", "30"))


def _running(hub: Hub) -> dict[str, int]:
    code, doc = hub.cli_json("status")
    return {i["instance"]: int(i["running_project"] or 0)
            for i in doc["instances"] if i.get("reachable", True) and
            isinstance(i.get("running_project"), int)}


@pytest.mark.timeout(int(SOAK_SECONDS) + 900)
def test_soak_daemon_and_watch_follow_three_instances(hub: Hub) -> None:
    hub.doc["models"] = {"default_dispatch_model": "fake/fake-model",
                         "chain": ["opencode/free-model", "backup/good-model"]}
    hub.doc["concurrency_limit"] = 2
    hub.write_config()
    hub.llm.set_mode("free-model", "429", retry_after=1)
    hub.llm.set_mode("slow-model", "slow", delay=8)
    rnd = random.Random(20)
    daemon = Lines(hub.popen("patrol", "--interval-seconds", "3600", "--no-design"))
    watch = Lines(hub.popen("watch", "--json"))
    peaks: Counter[str] = Counter()
    restarted = False
    try:
        try:
            hub.wait_for(lambda: _beat(hub).get("ticks", 0) >= 1, timeout=300)
            hub.wait_for(lambda: any("watching 3 instance" in e for e in watch.err),
                         timeout=300)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\ndaemon: {daemon.lines} {daemon.err[-20:]}\n"
                                 f"watch: {watch.err[-20:]}") from None
        end = time.monotonic() + SOAK_SECONDS
        n = 0
        while time.monotonic() < end:
            n += 1
            action = rnd.choice(("dispatch", "dispatch", "pool", "ratelimit", "cut"))
            if action == "dispatch":
                hub.cli("dispatch", "--new", "--text", f"soak work {n}", "--model",
                        rnd.choice(("fake/fake-model", "fake/slow-model")))
            elif action == "pool":
                hub.cli("backlog", "add", "--id", f"SOAK-{n}", "--title", f"soak task {n}")
            elif action == "ratelimit":
                hub.cli("dispatch", "--new", "--text", f"soak limited {n}", "--model",
                        "opencode/free-model")
            else:
                name = rnd.choice(NAMES)
                busy = sorted(hub.busy_ids(name))
                if busy:
                    sandbox.abort(hub.server(name).url, hub.password(name), busy[0])
            if not restarted and time.monotonic() > end - SOAK_SECONDS / 2:
                restarted = True
                server = hub.server("lan-c")
                port = server.port
                server.stop(grace=2.0)
                time.sleep(3)
                start_again(server, port)
            for name, count in _running(hub).items():
                peaks[name] = max(peaks[name], count)
            time.sleep(rnd.uniform(1.0, 3.0))
        hub.wait_for(lambda: any("live: lan-c up" in ln for ln in daemon.lines), timeout=180)
        hub.wait_for(lambda: "up" in watch.instance_kinds("lan-c"), timeout=180)
    finally:
        assert daemon.stop() == 0, daemon.err
        watch.stop()
    assert max(peaks.values(), default=0) <= 2, peaks
    assert sum("live: lan-c down" in ln for ln in daemon.lines) == 1, daemon.lines
    assert watch.instance_kinds("lan-c") == ["down", "up"]
    # Nothing healed or resumed twice.
    for command in ("patrol.heal", "patrol.resume"):
        per_session = Counter(r["session"] for r in _audit(hub, command))
        assert all(v == 1 for v in per_session.values()), (command, per_session)
    # Every change reported once: a session never starts twice without stopping in between.
    by_session: dict[str, list[str]] = {}
    for ev in watch.events():
        sess: dict[str, Any] | None = ev.get("session")
        if sess and ev["event"] in ("started", "stopped"):
            by_session.setdefault(sess["id"], []).append(ev["event"])
    for sid, kinds in by_session.items():
        assert all(a != b for a, b in zip(kinds, kinds[1:], strict=False)), (sid, kinds)
    # No pool task went out twice.
    pool = _home(hub) / "tasks_backlog.json"
    if pool.exists():
        tasks = json.loads(pool.read_text("utf-8"))["tasks"]
        sent = Counter(r["task"] for r in _audit(hub, "patrol.backlog")
                       if r.get("result") == "dispatched")
        assert all(v == 1 for v in sent.values()), sent
        assert {t["id"] for t in tasks} >= set(sent)
