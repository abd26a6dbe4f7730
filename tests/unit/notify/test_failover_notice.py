"""The ``failover`` notice: on by default, one per take (its id is the new lease token), in
plain words in both languages, queued for the sender and never raising out of the keeper."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

from tests.unit.notify.delivery_support import NOW, ctx, make_cfg, state
from xaf_hub.config.notify import DEFAULT_EVENTS
from xaf_hub.notify.derive import failover_event
from xaf_hub.notify.messages import render
from xaf_hub.notify.patrol import queue_failover


def test_failover_notices_are_on_by_default_and_read_well() -> None:
    assert "failover" in DEFAULT_EVENTS
    ev = failover_event("host-a", "host-b", "host-b|42|beef", NOW)
    assert ev.id == "failover:host-b|42|beef" and ev.type == "failover"
    head, text = render(ev, language="en", project="shop", page_url="", tz=UTC)
    assert head == "[xaf-hub · shop] Patrol moved: host-a → host-b"
    assert text == (
        "The patrol moved from host host-a to host host-b: host-a stopped renewing its lease, "
        "and host-b now heals and fills the fleet."
    )
    head, text = render(ev, language="zh", project="shop", page_url="", tz=UTC)
    assert head.endswith("巡检已转移:host-a → host-b")
    assert text.startswith("巡检从主机 host-a 转移到了主机 host-b")


def test_one_notice_per_take_however_often_it_is_queued(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "http://127.0.0.1:9/hook")
    pctx = ctx(cfg)
    assert queue_failover(pctx, "host-a", "host-b", "host-b|42|beef") == (
        "notify: queued the failover notice"
    )
    assert queue_failover(pctx, "host-a", "host-b", "host-b|42|beef") == ""  # same take
    assert queue_failover(pctx, "host-b", "host-a", "host-a|7|cafe") != ""  # moved back: news
    queued = [(i["event"]["type"], i["event"]["id"]) for i in state(cfg)["outbox"]]
    assert queued == [
        ("failover", "failover:host-b|42|beef"),
        ("failover", "failover:host-a|7|cafe"),
    ]


def test_a_broken_outbox_is_a_line_not_an_exception(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "http://127.0.0.1:9/hook")
    pctx = ctx(cfg)
    queue_failover(pctx, "host-a", "host-b", "host-b|1|aa")
    path = next(cfg.state_dir.rglob("state.json"))
    path.write_text("{not json", "utf-8")
    line = queue_failover(pctx, "host-a", "host-b", "host-b|2|bb")
    assert line.startswith("notify: failover notice not queued: ")
