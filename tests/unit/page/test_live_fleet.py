"""What `serve` shows (page/notices.py LiveFleet): each instance from its change feed's
follower while that view is fresh, the rest scanned; last results read once per change of a
session. Judged on labelled views: fresh, stale, not followed, changed."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from xaf_hub.config.load import Config, InstanceConfig, load_config
from xaf_hub.core.records import SessionRecord
from xaf_hub.fleet.events import FleetEvent
from xaf_hub.fleet.follow import FleetFollower, run_in_thread
from xaf_hub.fleet.live_view import LiveInstance
from xaf_hub.fleet.scan import InstanceScan
from xaf_hub.page.notices import ChangeFeed, LiveFleet


def config(tmp_path: Path) -> Config:
    doc = {
        "state_dir": str(tmp_path / "state"),
        "instances": [{"name": n, "url": f"http://{n}.test:4096", "roots": ["/srv/proj"]}
                      for n in ("a", "b")],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    return load_config(path, env={"XAF_HUB_HOME": str(tmp_path / "home")})


def rec(name: str, sid: str, *, running: bool = False, updated: int = 1000) -> SessionRecord:
    return SessionRecord(name, sid, f"title {sid}", "/srv/proj/app", created=1, updated=updated,
                         cost=None, running=running, run_state="busy" if running else "idle",
                         project=True)


def live(cfg: Config, name: str, sessions: list[SessionRecord], ago_ms: int = 1000,
         mode: str = "global") -> LiveInstance:
    scan = InstanceScan(cfg.instance(name), reachable=True, version="1.18.33", api="classic",
                        sessions=sessions)
    return LiveInstance(scan, mode, int(time.time() * 1000) - ago_ms)


class Fleet:
    """A LiveFleet over a feed whose follower's view is ``views``; counts what it asks."""

    def __init__(self, tmp_path: Path) -> None:
        self.cfg = config(tmp_path)
        self.views: list[LiveInstance] = []
        self.scanned: list[list[str]] = []
        self.asked: list[str] = []  # session ids whose last result was read
        self.feed = ChangeFeed(self.cfg)
        self.feed.live_view = lambda: self.views  # type: ignore[method-assign]
        self.fleet = LiveFleet(self.cfg, scan=self.scan, outcomes=self.outcomes)

    def scan(self, rest: list[InstanceConfig]) -> list[InstanceScan]:
        self.scanned.append([i.name for i in rest])
        return [InstanceScan(i, reachable=True, sessions=[rec(i.name, f"scanned_{i.name}")])
                for i in rest]

    def outcomes(self, scans: list[InstanceScan]) -> None:
        for sc in scans:
            for j, s in enumerate(sc.sessions):
                if not s.running and not s.outcome:
                    self.asked.append(s.id)
                    sc.sessions[j] = SessionRecord(**{**s.__dict__, "outcome": "succeeded"})


def test_before_the_feed_starts_every_instance_is_scanned(tmp_path: Path) -> None:
    f = Fleet(tmp_path)
    snap = f.fleet()
    assert f.scanned == [["a", "b"]] and snap.source == "scan"
    assert {s.id for s in snap.sessions} == {"scanned_a", "scanned_b"}


def test_fresh_views_are_taken_from_memory_and_the_rest_scanned(tmp_path: Path) -> None:
    f = Fleet(tmp_path)
    f.fleet.follow(f.feed)
    f.views = [live(f.cfg, "a", [rec("a", "s1", running=True), rec("a", "s2")]),
               live(f.cfg, "b", [rec("b", "s3")], ago_ms=60_000)]  # b: confirmed too long ago
    snap = f.fleet()
    assert f.scanned == [["b"]]
    assert snap.source == "mixed" and list(snap.live) == ["a"] and snap.live["a"] < 5
    assert {s.id: s.outcome for s in snap.sessions} == {
        "s1": "", "s2": "succeeded", "scanned_b": "succeeded"}
    f.views[1] = live(f.cfg, "b", [rec("b", "s3")])
    snap = f.fleet()
    assert f.scanned == [["b"]] and snap.source == "live"  # nothing scanned this time
    assert [i.name for i in snap.instances] == ["a", "b"]  # in the config's order


def test_a_view_not_kept_current_is_scanned(tmp_path: Path) -> None:
    f = Fleet(tmp_path)
    f.fleet.follow(f.feed)
    down = live(f.cfg, "a", [rec("a", "s1")])
    f.views = [LiveInstance(down.scan, "global", 0),  # its stream is down or reconnecting
               live(f.cfg, "b", [rec("b", "s3")], ago_ms=-60_000)]  # a time ahead of ours
    f.fleet()
    assert f.scanned == [["a", "b"]]


def test_a_last_result_is_read_once_until_the_session_changes(tmp_path: Path) -> None:
    f = Fleet(tmp_path)
    f.fleet.follow(f.feed)
    f.views = [live(f.cfg, "a", [rec("a", "s1"), rec("a", "s2")]), live(f.cfg, "b", [])]
    f.fleet()
    f.fleet()
    assert sorted(f.asked) == ["s1", "s2"]  # the second build asked nothing
    # s1 changed (a newer `updated`); s2 was named by a notice: both are read again.
    f.views[0] = live(f.cfg, "a", [rec("a", "s1", updated=2000), rec("a", "s2")])
    f.feed.publish(FleetEvent("stopped", "a", rec("a", "s2")))
    snap = f.fleet()
    assert sorted(f.asked) == ["s1", "s1", "s2", "s2"]
    assert {s.id: s.outcome for s in snap.sessions} == {"s1": "succeeded", "s2": "succeeded"}
    # A running session's result is never remembered: once it stops it is read.
    f.views[0] = live(f.cfg, "a", [rec("a", "s1", running=True, updated=3000)])
    f.fleet()
    f.views[0] = live(f.cfg, "a", [rec("a", "s1", updated=3000)])
    f.fleet()
    assert f.asked.count("s1") == 3


def test_the_followers_view_is_handed_to_another_thread(tmp_path: Path) -> None:
    from tests.unit.fleet.event_support import FakeServer, _cfg

    server = FakeServer()
    transport = httpx.MockTransport(server.handler)
    follower = FleetFollower(_cfg(tmp_path), emit=lambda ev: None,
                             transport_factory=lambda inst: transport, probe_seconds=1.0)
    assert follower.view_now() == []  # not running
    run_in_thread(follower)
    try:
        deadline = time.monotonic() + 20
        got: list[Any] = []
        while not got and time.monotonic() < deadline:
            got = [v for v in follower.view_now() if v.confirmed_at_ms]
            time.sleep(0.05)
        assert [s.id for s in got[0].scan.sessions] == ["ses_a"]
        assert threading.current_thread() is threading.main_thread()
    finally:
        follower.close()
    assert follower.view_now() == []  # stopped


def test_fill_outcomes_asks_only_the_sessions_without_one(tmp_path: Path) -> None:
    from xaf_hub.core import aio
    from xaf_hub.fleet.scan import fill_outcomes

    cfg = config(tmp_path)
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        msg = {"info": {"role": "assistant", "id": "msg_1", "time": {"completed": 3},
                        "finish": "stop"}, "parts": []}
        return httpx.Response(200, json=[msg])

    known = SessionRecord(**{**rec("a", "s1").__dict__, "outcome": "failed"})
    sc = InstanceScan(cfg.instance("a"), reachable=True, sessions=[known, rec("a", "s2")])
    snap = aio.run(fill_outcomes(cfg, [sc], lambda inst: httpx.MockTransport(handler)))
    assert [p for p in asked if p.endswith("/message")] == ["/session/s2/message"]
    assert {s.id: s.outcome for s in snap.sessions} == {"s1": "failed", "s2": "succeeded"}
