"""Bounded cost per event stream (issue 29, item 2) and frames that lie (item 6).

Each test fails on the follower before these bounds: a long line held whole, keep-alive
comments counted as life, no budget, an unbounded queue, a frame's word taken for a
session's project.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from tests.unit.fleet.event_support import (
    FakeServer,
    _follower,
    _g,
    _info,
    _until,
)
from xaf_hub.fleet.events import Frame, parse_frame
from xaf_hub.fleet.follow import (
    MAX_FRAME_BYTES,
    Budget,
    OverBudget,
    _Behind,
    _Mailbox,
    read_lines,
)

BUSY = _g("session.status", {"sessionID": "ses_a", "status": {"type": "busy"}})


async def _chunks(*parts: bytes, size: int = 65536) -> AsyncIterator[bytes]:
    for part in parts:
        for i in range(0, len(part), size):
            yield part[i:i + size]


def test_a_line_past_the_cap_is_skipped_without_being_held() -> None:
    long = b"data: " + b"x" * (20 * 1024 * 1024) + b"\n"

    async def lines() -> list[tuple[bytes, bool]]:
        seen = []
        async for line, whole in read_lines(_chunks(long, b": c\r\n", BUSY.encode() + b"\n"),
                                            lambda n: None):
            seen.append((line[:20], whole))
        return seen

    tracemalloc.start()
    try:
        seen = asyncio.run(lines())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == [(b"data: " + b"x" * 14, False), (b": c", True), (BUSY.encode()[:20], True)]
    # The 20 MB line (made before the count began) is never held: the reader's peak is its
    # cap and a few chunks, not the line.
    assert peak < MAX_FRAME_BYTES + 4 * 65536 + 512 * 1024, peak


def test_the_mailbox_keeps_the_newest_state_per_session_and_says_when_it_fell_behind() -> None:
    def frame(word: str, sid: str = "ses_a") -> Frame:
        got = parse_frame(_g("session.status", {"sessionID": sid, "status": {"type": word}}))
        assert got is not None
        return got

    async def scenario() -> None:
        box = _Mailbox(max_frames=100, max_bytes=10_000)
        for _ in range(10_000):  # a flood for one session: a start and a stop kept, in order
            box.put(frame("busy"), 50)
            box.put(frame("idle"), 50)
        box.put(frame("busy"), 50)
        assert len(box) == 2
        got = [await box.get(), await box.get()]
        assert [f.properties["status"]["type"] for f in got if isinstance(f, Frame)] == [
            "idle", "busy"]  # the newest state last
        for i in range(150):  # more sessions than it holds: dropped for one rescan
            box.put(frame("busy", f"ses_{i}"), 50)
        assert len(box) < 100
        assert isinstance(await box.get(), _Behind)

    asyncio.run(scenario())


def test_the_mailbox_keeps_each_steps_last_update_when_the_next_step_follows_at_once() -> None:
    """A stream chunk often carries a step's final message.updated (completed, its cost) and
    the next step's first (no cost yet) of the same session: both are kept, each message's
    newest update once, so the step's cost still reaches the ceiling."""

    def update(mid: str, cost: float, completed: int = 0) -> Frame:
        when = {"created": 1, "completed": completed} if completed else {"created": 1}
        info = {"id": mid, "sessionID": "ses_a", "role": "assistant", "cost": cost, "time": when}
        got = parse_frame(_g("message.updated", {"sessionID": "ses_a", "info": info}))
        assert got is not None
        return got

    async def scenario() -> list[tuple[str, float]]:
        box = _Mailbox()
        for frame in (update("msg_1", 0.0), update("msg_1", 0.02, 5), update("msg_1", 0.02, 5),
                      update("msg_2", 0.0)):
            box.put(frame, 100)
        got = [await box.get() for _ in range(len(box))]
        return [(f.properties["info"]["id"], f.properties["info"]["cost"]) for f in got
                if isinstance(f, Frame)]

    assert asyncio.run(scenario()) == [("msg_1", 0.02), ("msg_2", 0.0)]


def test_the_budget_trips_on_frames_or_bytes_within_a_window() -> None:
    now = [0.0]
    budget = Budget(frames_per_s=10, bytes_per_s=1000, window=1.0, clock=lambda: now[0])
    for _ in range(10):
        budget.add(1, 50)
    now[0] = 1.0  # a new window
    for _ in range(10):
        budget.add(1, 0)
    try:
        budget.add(1, 0)
    except OverBudget as exc:
        assert "11 frames" in str(exc)
    else:
        raise AssertionError("11 frames in a window of 10 passed")
    now[0] = 2.0
    try:
        budget.add(0, 1001)
    except OverBudget as exc:
        assert "MB" in str(exc)
    else:
        raise AssertionError("1001 bytes in a window of 1000 passed")


class _Comments(httpx.AsyncByteStream):
    """A stream that sends one heartbeat, then only keep-alive comments."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n'
        yield b'data: {"payload":{"type":"server.heartbeat","properties":{}}}\n\n'
        while True:
            await asyncio.sleep(0.05)
            yield b": keep-alive\n\n"


def test_keep_alive_comments_alone_are_not_life(tmp_path: Path) -> None:
    server = FakeServer()
    original = server.handler

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/global/event":
            server.paths.append("/global/event")
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  stream=_Comments())
        return original(request)

    server.handler = handler  # type: ignore[method-assign]

    async def scenario() -> None:
        follower, events = _follower(tmp_path, server, heartbeat_deadline=0.5)
        task = asyncio.create_task(follower.run())
        await _until(events, "ready")
        for _ in range(300):
            if follower.state["a"].connects >= 2:
                break
            await asyncio.sleep(0.02)
        assert follower.state["a"].connects >= 2, "a stream of comments counted as alive"
        follower.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_a_flood_past_the_budget_is_polled_with_the_reason_then_streamed_again(
    tmp_path: Path,
) -> None:
    server = FakeServer()

    async def scenario() -> None:
        follower, events = _follower(
            tmp_path, server, poll_seconds=0.1, budget_cooldown=1.0,
            budget=lambda: Budget(frames_per_s=100, window=1.0),
        )
        task = asyncio.create_task(follower.run())
        await _until(events, "ready")
        for _ in range(150):
            server.push(BUSY)
        await _until(events, "polling")
        polling = next(e for e in events if e.kind == "polling")
        assert "over its budget" in polling.detail
        assert follower.state["a"].mode == "polling"
        assert "over its budget" in follower.state["a"].reason
        # While polled, a change still arrives (by the poll).
        server.sessions.append(_info("ses_b"))
        await _until(events, "new")
        assert [e.source for e in events if e.kind == "new"][0] in ("poll", "rescan")
        assert "ready" not in [e.kind for e in events[events.index(polling):]]
        await _until(events, "ready", 2)  # the cooldown over: streamed again
        assert follower.state["a"].mode == "global"
        assert follower.state["a"].over_budget == 1
        follower.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_a_frame_that_claims_a_foreign_session_for_the_project_reports_nothing(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    original = server.handler

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.startswith("/session/ses_") and "/" not in path[len("/session/"):]:
            sid = path.rsplit("/", 1)[1]
            info = next((s for s in server.sessions if s["id"] == sid), None)
            if info is None:
                return httpx.Response(404, json={"name": "NotFoundError"})
            return httpx.Response(200, json=info)
        return original(request)

    server.handler = handler  # type: ignore[method-assign]

    async def scenario() -> None:
        follower, events = _follower(tmp_path, server)
        task = asyncio.create_task(follower.run())
        await _until(events, "ready")
        # A session the server does not have, and one it has in a foreign directory, both
        # said by the frame to live in the project.
        server.sessions.append(_info("ses_foreign", "/elsewhere/x"))
        server.push(_g("session.created", {"info": _info("ses_ghost")}))
        server.push(_g("session.updated", {"info": _info("ses_foreign")}))
        server.sessions.append(_info("ses_real"))
        server.push(_g("session.created", {"info": _info("ses_real")}))
        await _until(events, "new")
        await asyncio.sleep(0.2)
        assert [e.session.id for e in events if e.kind == "new" and e.session] == ["ses_real"]
        follower.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


class _Flood(httpx.AsyncByteStream):
    """A stream that pours status frames as fast as it can."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n'
        line = (BUSY + "\n\n").encode()
        while True:
            yield line * 100
            await asyncio.sleep(0)


def test_doctor_says_when_a_stream_floods_past_its_budget(tmp_path: Path) -> None:
    from tests.unit.fleet.event_support import _cfg
    from xaf_hub.ops.health import stream_findings

    cfg = _cfg(tmp_path)
    server = FakeServer()
    original = server.handler

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/global/event":
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  stream=_Flood())
        return original(request)

    transport = httpx.MockTransport(handler)
    found = asyncio.run(stream_findings(cfg, cfg.instances, lambda inst: transport))
    assert [f.level for f in found] == ["warn"], found
    assert "over its budget" in found[0].message and "poll it every" in found[0].message


def test_the_page_server_line_says_an_instance_is_polled_and_why(tmp_path: Path) -> None:
    from tests.unit.fleet.event_support import _cfg
    from xaf_hub.core.records import InstanceSummary, Snapshot
    from xaf_hub.fleet.events import FleetEvent
    from xaf_hub.page.export import render_html
    from xaf_hub.page.notices import ChangeFeed

    feed = ChangeFeed(_cfg(tmp_path))
    seen: list[Snapshot] = []
    snap = Snapshot(1, (InstanceSummary("a", "", True, note="lab"),
                        InstanceSummary("b", "", True)))
    # The hook (serve's cache invalidation) already sees the reason when it runs.
    feed.on_change.append(lambda ev: seen.append(feed.annotate(snap)))
    why = "event stream over its budget (2001 frames in under 1 s; at most 2000/s)"
    feed.publish(FleetEvent("polling", "a", detail=why))
    assert [i.note for i in seen[0].instances] == [f"lab · a: {why}; polling it", ""]
    assert f"a: {why}; polling it" in render_html(seen[0], now_ms=1)
    feed.publish(FleetEvent("ready", "a", detail="global"))  # streamed again
    assert feed.annotate(snap) == snap


def test_the_mailbox_hands_over_what_a_stream_sent_before_its_end_but_a_stop_at_once() -> None:
    from xaf_hub.fleet.follow import _Closed

    frame = parse_frame(BUSY)
    assert frame is not None

    async def scenario() -> None:
        box = _Mailbox()
        box.put(frame, 10)
        box.close("the event stream ended")
        assert await box.get() == frame
        assert await box.get() == _Closed("the event stream ended")
        box = _Mailbox()
        box.put(frame, 10)
        box.put_nowait(_Closed("stop"))
        assert await box.get() == _Closed("stop")

    asyncio.run(scenario())
