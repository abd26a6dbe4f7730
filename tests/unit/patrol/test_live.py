"""The patrol daemon's live reactions, without servers: which events become work, and that a
reaction never runs while paused, beside another cycle, or twice for one burst.

Healing, resuming and filling themselves are the round's job functions (tests/unit/
test_patrol_jobs.py) and run against real servers in tests/e2e/test_live.py.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path

from xaf_hub.config.load import load_config
from xaf_hub.core.records import SessionRecord
from xaf_hub.fleet.events import FleetEvent
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.context import Cycle
from xaf_hub.patrol.live import LOCKED_RETRY_SECONDS, LiveReactor, _Work
from xaf_hub.store.patrol_state import set_paused
from xaf_hub.store.statefile import file_lock


class Recording(LiveReactor):
    """Records the batches it would react to instead of talking to servers."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.batches: list[_Work] = []

    async def _react(self, work: _Work) -> tuple[Cycle, _Work, _Work]:
        self.batches.append(work)
        return Cycle(started=datetime.now(UTC)), _Work(), _Work()


def _reactor(tmp_path: Path, out: list[str], skip: tuple[str, ...] = ()) -> Recording:
    doc = {"instances": [{"name": "a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}]}
    (tmp_path / "config.json").write_text(json.dumps(doc), "utf-8")
    cfg = load_config(str(tmp_path / "config.json"),
                      env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    return Recording(OpsContext(cfg), skip, threading.Lock(), out.append, settle_seconds=0)


def _ev(kind: str, sid: str = "ses_1") -> FleetEvent:
    rec = SessionRecord("a", sid, "t", "/srv/p/app", project=True)
    return FleetEvent(kind, "a", rec)  # type: ignore[arg-type]


def test_events_become_work_once_per_session(tmp_path: Path) -> None:
    out: list[str] = []
    r = _reactor(tmp_path, out)
    for kind in ("new", "started", "retry", "error", "stopped", "stopped"):
        r.on_event(_ev(kind))
    r.on_event(_ev("gone", "ses_2"))
    r.on_event(FleetEvent("down", "a", detail="connection refused"))
    work = r._take()
    assert work is not None
    assert list(work.sessions) == [("a", "ses_1")] and work.fill
    assert r._work.empty()
    assert [ln.split(" ", 2)[2] for ln in out] == ["live: a down: connection refused"]


def test_no_fill_when_the_patrol_skips_it(tmp_path: Path) -> None:
    r = _reactor(tmp_path, [], skip=("fill_slots",))
    r.on_event(_ev("gone"))
    assert r._work.empty()


def test_a_paused_patrol_reacts_to_nothing(tmp_path: Path) -> None:
    r = _reactor(tmp_path, [])
    set_paused(r.pctx.patrol_dir, "tester", datetime.now(UTC))
    assert r._run(_Work({("a", "ses_1"): 0.0}, True)) is None
    assert r.batches == []


def test_a_held_cycle_lock_makes_the_batch_wait(tmp_path: Path) -> None:
    r = _reactor(tmp_path, [])
    work = _Work({("a", "ses_1"): 0.0}, False)
    r.pctx.patrol_dir.mkdir(parents=True)
    with file_lock(r.pctx.patrol_dir / "cycle.lock", 1):
        assert r._run(work) == (work, LOCKED_RETRY_SECONDS)
    assert r.batches == []
    assert r._run(work) is None and r.batches == [work]
    # Held by the daemon's own round (same process): the reaction waits for it.
    r.busy.acquire()
    done = threading.Event()
    t = threading.Thread(target=lambda: (r._run(work), done.set()))
    t.start()
    assert not done.wait(0.3)
    r.busy.release()
    assert done.wait(10)
    t.join()
    assert len(r.batches) == 2


def test_a_request_becomes_work_only_with_a_policy_and_a_rule_answers_it(tmp_path: Path) -> None:
    import asyncio
    from dataclasses import replace

    import httpx

    from tests.unit.ops.test_waiting import fleet_with_both
    from xaf_hub.config.load import PermissionRule, PermissionsConfig

    r = _reactor(tmp_path, [])
    r.on_event(_ev("asked", "ses_perm"))
    assert r._work.empty()  # no rule, no timeout: a person answers
    server = fleet_with_both()
    server.permissions[0]["patterns"] = ["git status"]
    policy = PermissionsConfig((PermissionRule("bash", "git status*", "allow"),))
    pctx = OpsContext(replace(r.pctx.cfg, permissions=policy), env={},
                      transport_factory=lambda _: httpx.MockTransport(server.route))
    live = LiveReactor(pctx, (), threading.Lock(), [].append, settle_seconds=0)
    live.on_event(_ev("asked", "ses_perm"))
    work = live._take()
    assert work is not None and list(work.sessions) == [("a", "asked:ses_perm")]
    cycle, again = asyncio.run(live._react(work))
    assert server.replies == [("/permission/per_aaa1/reply", {"reply": "once"})]
    assert [(a.kind, a.result, a.session) for a in cycle.actions] == [("answer", "ok", "ses_perm")]
    assert again.empty()
