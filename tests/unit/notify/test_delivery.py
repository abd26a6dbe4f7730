"""Delivery semantics against a real loopback receiver (``tests.notify_capture``): a slow answer
is not re-sent, a refusal or a redirect is parked, an unreachable receiver is tried again after
a back-off, the claim is durable before the request leaves, a claim left by a dead sender is
settled without a blind re-send, two senders never post one message, and ``patrol --once``
sends with the cycle lock released."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tests.notify_capture import Capture
from tests.unit.notify.delivery_support import NOW, ctx, make_cfg, state
from xaf_hub.config.load import Config
from xaf_hub.notify import outbox
from xaf_hub.notify.check import webhook_checks
from xaf_hub.notify.events import Event
from xaf_hub.notify.patrol import Sender, outgoing, send_outbox
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.context import CYCLE_LOCK, Cycle
from xaf_hub.patrol.runner import STEP_NAMES, run_once
from xaf_hub.store.statefile import file_lock


def events(n: int) -> list[Event]:
    at = NOW.isoformat()
    return [Event(f"task_done:T-{i}:s{i}", "task_done", at, task=f"T-{i}") for i in range(n)]


def queue(cfg: Config, evs: list[Event], now: datetime = NOW) -> None:
    outbox.enqueue(
        cfg.state_dir, lambda state: evs, cfg.notify.webhooks, now=now, queue_limit=100,
        keep_hours=24,
    )


def wait(cond: Any, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


def reported_sent(said: list[str], hook: str = "team") -> int:
    """How many messages the sender's lines say it sent to ``hook``."""
    import re

    return sum(
        int(m.group(1))
        for line in said
        if (m := re.search(rf"sent (\d+) message\(s\) to '{hook}'", line))
    )


def receiver(mode: str = "ok", delay: float = 30.0) -> Capture:
    cap = Capture("json")
    cap.mode, cap.delay = mode, delay
    return cap  # started by ``with``


# ---------------------------------------------------------------------------------------------


def test_a_slow_answer_after_the_timeout_is_not_sent_again(tmp_path: Path) -> None:
    with receiver("slow", delay=3) as cap:
        cfg = make_cfg(tmp_path, cap.url, retries=2)
        queue(cfg, events(1))
        lines = send_outbox(ctx(cfg), seconds=30, due_only=False)
        for _ in range(2):  # later passes find nothing to send
            send_outbox(ctx(cfg), seconds=30, due_only=False)
        assert len(cap.hits) == 1, lines
    st = state(cfg)
    assert st["outbox"] == [] and "team:task_done:T-0:s0" in st["sent"]
    assert "counts as delivered (at most once)" in st["last"]["team"]["error"]
    assert any("no answer within 1s" in line for line, bad in lines if bad), lines


def test_a_refused_or_redirected_message_is_parked_and_never_sent_again(tmp_path: Path) -> None:
    for mode, why in (("refuse", "HTTP 400"), ("redirect", "HTTP 302")):
        home = tmp_path / mode
        home.mkdir()
        with receiver(mode) as cap:
            cfg = make_cfg(home, cap.url, retries=2)
            queue(cfg, events(2))
            lines = send_outbox(ctx(cfg), seconds=30, due_only=False)
            for _ in range(3):  # rounds and reactions go on: nothing is posted again
                queue(cfg, events(2))
                send_outbox(ctx(cfg), seconds=30, due_only=False)
            assert len(cap.hits) == 2, (mode, lines)  # each message once, no retries
        st = state(cfg)
        assert st["outbox"] == []
        assert [(p["event"]["id"], p["reason"].split(":")[0]) for p in st["parked"]] == [
            ("task_done:T-0:s0", why),
            ("task_done:T-1:s1", why),
        ]
        assert sum("parked, not sent again" in line for line, _ in lines) == 2
        said = [c.message for c in webhook_checks(cfg.notify, cfg.state_dir) if c.level == "warn"]
        assert any("2 message(s) refused in the last 24 h and parked" in d for d in said), said
        # Parked messages are kept for a day (doctor, report), then forgotten.
        queue(cfg, [], now=NOW + timedelta(hours=25))
        assert state(cfg)["parked"] == []


def test_an_unreachable_receiver_is_tried_again_after_a_back_off(tmp_path: Path) -> None:
    cap = receiver()
    cap.start()
    cap.stop()  # connection refused: nothing was sent
    cfg = make_cfg(tmp_path, cap.url)
    queue(cfg, events(1))
    clock = [NOW]
    lines = send_outbox(ctx(cfg, clock), seconds=30, due_only=True)
    assert any("connection refused" in line for line, _ in lines), lines
    item = state(cfg)["outbox"][0]
    assert item["attempts"] == 1 and item["next_at"] == (NOW + timedelta(seconds=10)).isoformat()
    assert "sending" not in item
    cap.start()
    try:
        clock[0] = NOW + timedelta(seconds=5)  # still in its back-off: the sender waits
        send_outbox(ctx(cfg, clock), seconds=30, due_only=True)
        assert cap.hits == []
        clock[0] = NOW + timedelta(seconds=11)
        send_outbox(ctx(cfg, clock), seconds=30, due_only=True)
        assert len(cap.hits) == 1 and state(cfg)["outbox"] == []
    finally:
        cap.stop()


def test_the_claim_is_durable_before_the_request_leaves(tmp_path: Path) -> None:
    with receiver("hang", delay=3) as cap:
        cfg = make_cfg(tmp_path, cap.url, timeout_seconds=10)
        queue(cfg, events(1))
        t = threading.Thread(target=send_outbox, args=(ctx(cfg),), kwargs={"seconds": 30,
                             "due_only": False})
        t.start()
        wait(lambda: cap.hits)
        claim = state(cfg)["outbox"][0]["sending"]  # the receiver has it, the hub waits
        assert claim["owner"] == os.getpid() and claim["posted"] is True
        t.join(30)


def test_a_claim_left_by_a_dead_sender_is_never_re_sent_blindly(tmp_path: Path) -> None:
    with receiver() as cap:
        cfg = make_cfg(tmp_path, cap.url)
        queue(cfg, events(2))
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
        pid = int(dead.stdout)  # a process that is gone
        first = outbox.claim(cfg.state_dir, "team", now=NOW, owner=os.getpid()).entry
        second = outbox.claim(cfg.state_dir, "team", now=NOW, owner=os.getpid()).entry
        assert first is not None and second is not None
        outbox.mark_posted(cfg.state_dir, first)  # killed during its POST
        # ... and the second before its request left: the sender that claimed them is gone.
        path = outbox.state_path(cfg.state_dir)
        raw = json.loads(path.read_text("utf-8"))
        for item in raw["outbox"]:
            item["sending"]["owner"] = pid
        path.write_text(json.dumps(raw), "utf-8")
        lines = send_outbox(ctx(cfg), seconds=30, due_only=False)
        assert [h.body["event"]["id"] for h in cap.hits] == [second.event.id]
        assert any("maybe delivered, not sent again" in line for line, _ in lines), lines
    st = state(cfg)
    assert st["outbox"] == [] and f"team:{first.event.id}" in st["sent"]


def test_two_senders_never_post_the_same_message(tmp_path: Path) -> None:
    with receiver("slow", delay=0.3) as cap:
        cfg = make_cfg(tmp_path, cap.url, timeout_seconds=5)
        queue(cfg, events(6))
        threads = [
            threading.Thread(target=send_outbox, args=(ctx(cfg),),
                             kwargs={"seconds": 60, "due_only": False})
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        ids = [h.body["event"]["id"] for h in cap.hits]
        assert sorted(ids) == sorted(e.id for e in events(6)), ids


def test_patrol_once_sends_with_the_cycle_lock_released(tmp_path: Path) -> None:
    """A hanging receiver neither keeps another patrol out nor holds `--once` past its timeout."""
    with receiver("hang", delay=60) as cap:
        cfg = make_cfg(tmp_path, cap.url, timeout_seconds=2)
        queue(cfg, events(3))
        result: list[Any] = []
        steps = tuple((name, _noop) for name in STEP_NAMES)
        t = threading.Thread(target=lambda: result.append(run_once(ctx(cfg), (), steps)))
        t.start()
        wait(lambda: cap.hits)  # `--once` is posting to a receiver that never answers
        with file_lock(cfg.state_dir / "patrol" / CYCLE_LOCK, 0, what="patrol cycle lock"):
            pass  # not held: another patrol (the daemon's reaction) may heal meanwhile
        t.join(30)  # given up on after one try's timeout, long before the receiver answers
        assert not t.is_alive() and result[0].status == "ran"
        assert len(cap.hits) == 1  # one message tried; the rest waits for the next pass
        errors = result[0].cycle.log.errors
        assert any("no answer within 2s" in e for e in errors), errors
    left = [i["event"]["id"] for i in state(cfg)["outbox"]]
    assert left[:2] == ["task_done:T-1:s1", "task_done:T-2:s2"], left  # (+ the daily summary)


async def _noop(pctx: OpsContext, cycle: Cycle) -> None:
    return None


def test_the_daemon_sender_delivers_from_its_own_thread(tmp_path: Path) -> None:
    with receiver() as cap:
        cfg = make_cfg(tmp_path, cap.url)
        said: list[str] = []
        sender = Sender(ctx(cfg), said.append)
        sender.start()  # sends what a previous run left queued
        try:
            queue(cfg, events(1))
            sender.wake()
            wait(lambda: len(cap.hits) == 1)
            queue(cfg, events(2))
            sender.wake()
            wait(lambda: len(cap.hits) == 2)
        finally:
            sender.stop()
        # Each message is reported sent once. Two passes say "sent 1" each; when the second
        # was queued while the first was being posted, one pass sends both and says "sent 2".
        wait(lambda: reported_sent(said) == 2)
        assert not sender._thread.is_alive()
        assert len(cap.hits) == 2


def test_a_notice_names_its_sessions_project(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "http://127.0.0.1:9/hook")
    ev = Event("waiting_person:a:per_1", "waiting_person", "2026-12-01T10:00:00Z", "lan-a",
               "s1", "t", project="shop")
    doc = json.loads(outgoing(cfg, cfg.notify.webhooks[0], ev, NOW).body)
    assert doc["project"] == "shop" and "shop" in doc["headline"], doc
    assert doc["event"]["project"] == "shop"
    plain = json.loads(outgoing(cfg, cfg.notify.webhooks[0], replace(ev, project=""), NOW).body)
    assert plain["project"] == cfg.project_name
