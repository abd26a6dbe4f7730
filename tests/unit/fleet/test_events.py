"""The fleet follower's edge cases over a loopback mock transport (real servers: e2e).

Frames of both streams, the bookkeeping that reports each change once, the choice of stream
by version, the heartbeat deadline, and down/up with the rescan that finds what the stream
missed while it was away.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.config.projects_support import load, projects
from tests.unit.fleet.event_support import (
    ROOT,
    FakeServer,
    _cfg,
    _follower,
    _g,
    _info,
    _until,
)
from xaf_hub.config.load import Config, load_config
from xaf_hub.core.records import SessionRecord
from xaf_hub.fleet.events import Board, FleetEvent, Frame, parse_frame
from xaf_hub.fleet.follow import FleetFollower
from xaf_hub.fleet.scan import build_record
from xaf_hub.fleet.wire import ServerSession


def test_parse_frame_reads_both_streams_and_skips_the_rest() -> None:
    wrapped = parse_frame(_g("session.idle", {"sessionID": "ses_a"}))
    assert wrapped is not None and wrapped.type == "session.idle"
    assert wrapped.directory == f"{ROOT}/app"
    bare = parse_frame('data: {"type":"session.idle","properties":{"sessionID":"ses_a"}}', "/d")
    assert bare is not None and bare.directory == "/d" and bare.properties["sessionID"] == "ses_a"
    assert parse_frame(_g("message.part.delta", {"sessionID": "ses_a"})) is None
    assert parse_frame('data: {"payload":{"type":"sync","syncEvent":{}}}') is None
    assert parse_frame("data: {not json session.") is None
    assert parse_frame(": comment") is None


def _step(sid: str, cost: Any, *, role: str = "assistant", completed: int = 5) -> str:
    when = {"created": 1, "completed": completed} if completed else {"created": 1}
    info = {"id": "msg_1", "sessionID": sid, "role": role, "cost": cost, "time": when}
    return _g("message.updated", {"sessionID": sid, "info": info})


def test_a_board_with_steps_reports_each_priced_step_of_a_project_session(tmp_path: Path) -> None:
    """The patrol daemon's board says when a project session (a sub-agent's too) finished a
    step that cost money (``message.updated`` of an assistant message, completed, with its
    cost); the other boards (watch, serve) report nothing for those frames."""
    inst = _cfg(tmp_path).instances[0]
    kid = SessionRecord("a", "ses_kid", "k", f"{ROOT}/app", project=True, parent_id="ses_root")
    plain, steps = Board(inst), Board(inst, steps=True)
    for board in (plain, steps):
        board.reconcile([kid], "rescan")

    def kinds(board: Board, line: str) -> list[str]:
        frame = parse_frame(line)
        assert frame is not None
        return [e.kind for e in board.apply(frame)]

    assert kinds(steps, _step("ses_kid", 0.02)) == ["spent"]
    assert kinds(plain, _step("ses_kid", 0.02)) == []
    for quiet in (
        _step("ses_kid", 0),  # a free step
        _step("ses_kid", 0.02, completed=0),  # a step under way
        _step("ses_kid", "0.02"),  # a cost no release sends: unknown
        _step("ses_kid", None, role="user"),
    ):
        assert kinds(steps, quiet) == []
    assert kinds(steps, _step("ses_unknown", 0.02)) == []  # looked up first, as any new session
    assert steps.missing == [("ses_unknown", f"{ROOT}/app")]


def test_a_session_error_is_said_as_every_view_says_an_error(tmp_path: Path) -> None:
    board = Board(_cfg(tmp_path).instances[0])
    board.reconcile([SessionRecord("a", "ses_1", "t", f"{ROOT}/app", project=True)], "rescan")
    error = {"name": "APIError",
             "data": {"statusCode": 429, "message": "Rate limit exceeded\nretry later"}}
    frame = parse_frame(_g("session.error", {"sessionID": "ses_1", "error": error}))
    assert frame is not None
    (event,) = board.apply(frame)
    # One line, with the HTTP status, as runstate.error_text says it for show and the patrol.
    assert (event.kind, event.detail) == ("error", "APIError: HTTP 429: Rate limit exceeded")


def test_board_reports_each_change_once(tmp_path: Path) -> None:
    inst = _cfg(tmp_path).instances[0]
    board = Board(inst)
    old = SessionRecord("a", "ses_old", "old", f"{ROOT}/app", project=True)
    assert board.reconcile([old], "rescan")[0].kind == "new"

    def kinds(line: str) -> list[str]:
        frame = parse_frame(line)
        assert frame is not None
        return [e.kind for e in board.apply(frame)]

    # A new session said to be in the project: the server is asked (the caller), then learnt.
    assert kinds(_g("session.created", {"info": _info("ses_new")})) == []
    assert board.missing == [("ses_new", f"{ROOT}/app")]
    new = SessionRecord("a", "ses_new", "t", f"{ROOT}/app", project=True)
    assert [e.kind for e in board.learn(new)] == ["new"]
    assert kinds(_g("session.updated", {"info": _info("ses_new", title="renamed")})) == []
    assert board.sessions["ses_new"].title == "renamed"
    assert kinds(_g("session.created", {"info": _info("ses_out", "/elsewhere")})) == []
    busy = {"sessionID": "ses_new", "status": {"type": "busy"}}
    assert kinds(_g("session.status", busy)) == ["started"]
    assert kinds(_g("session.status", busy)) == []
    retry = {"sessionID": "ses_new",
             "status": {"type": "retry", "message": "Rate limit", "next": 5}}
    assert kinds(_g("session.status", retry)) == ["retry"]
    assert kinds(_g("session.error", {"sessionID": "ses_new", "error": {"name": "X"}})) == ["error"]
    assert kinds(_g("session.status", {"sessionID": "ses_new", "status": {"type": "idle"}})) == [
        "stopped"
    ]
    assert kinds(_g("session.idle", {"sessionID": "ses_new"})) == []
    assert kinds(_g("session.status", {"sessionID": "ses_out", "status": {"type": "busy"}})) == []
    # A session the board never saw, in a project directory: looked up by the caller.
    assert kinds(_g("session.status", {"sessionID": "ses_late", "status": {"type": "busy"}})) == []
    assert board.missing == [("ses_late", f"{ROOT}/app")]
    assert kinds(_g("session.deleted", {"sessionID": "ses_new", "info": _info("ses_new")})) == [
        "gone"
    ]
    # A rescan reports what changed while nobody listened.
    busy_old = SessionRecord("a", "ses_old", "old", f"{ROOT}/app", running=True,
                             run_state="busy", project=True)
    later = SessionRecord("a", "ses_later", "x", f"{ROOT}/app", project=True)
    assert [(e.kind, e.session.id if e.session else "") for e in
            board.reconcile([busy_old, later], "rescan")] == [
        ("started", "ses_old"), ("new", "ses_later")
    ]


# ---------------------------------------------------------------------------------------------
# The follower over a mock server


def test_global_stream_changes_down_up_and_rescan(tmp_path: Path) -> None:
    server = FakeServer()

    async def scenario() -> None:
        follower, events = _follower(tmp_path, server)
        task = asyncio.create_task(follower.run())
        await _until(events, "ready")
        assert follower.state["a"].mode == "global"
        assert not [p for p in server.paths if p.startswith("/event")]
        server.push(_g("session.status", {"sessionID": "ses_a", "status": {"type": "busy"}}))
        await _until(events, "started")
        server.push(_g("session.idle", {"sessionID": "ses_a"}))
        await _until(events, "stopped")
        assert [e.outcome for e in events if e.kind == "stopped"] == ["succeeded"]
        # The server dies; while it is away a session starts; it comes back.
        server.up = False
        server.push(None)
        await _until(events, "down")
        server.sessions.append(_info("ses_b"))
        server.busy = {"ses_b": {"type": "busy"}}
        server.up = True
        await _until(events, "up")
        await _until(events, "started", 2)
        follower.stop()
        await asyncio.wait_for(task, 5)
        kinds = [(e.kind, e.session.id if e.session else "") for e in events]
        assert kinds == [
            ("ready", ""), ("started", "ses_a"), ("stopped", "ses_a"), ("down", ""),
            ("up", ""), ("new", "ses_b"), ("started", "ses_b"),
        ]
        assert [e.source for e in events if e.session and e.session.id == "ses_b"] == [
            "rescan", "rescan"
        ]

    asyncio.run(scenario())


def test_old_release_uses_per_directory_streams(tmp_path: Path) -> None:
    server = FakeServer(version="1.14.41")

    async def scenario() -> None:
        follower, events = _follower(tmp_path, server)
        task = asyncio.create_task(follower.run())
        await _until(events, "ready")
        assert follower.state["a"].mode == "directory"
        assert "/global/event" not in server.paths
        assert "/event?directory=%2Fsrv%2Fproj%2Fapp" in server.paths
        bare = {"type": "session.status",
                "properties": {"sessionID": "ses_a", "status": {"type": "busy"}}}
        server.push("data: " + json.dumps(bare))
        await _until(events, "started")
        follower.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_silent_stream_past_its_heartbeat_deadline_is_reconnected(tmp_path: Path) -> None:
    server = FakeServer()

    async def scenario() -> None:
        follower, events = _follower(tmp_path, server, heartbeat_deadline=0.4)
        task = asyncio.create_task(follower.run())
        await _until(events, "ready")
        server.push('data: {"payload":{"type":"server.heartbeat","properties":{}}}')
        for _ in range(300):
            if follower.state["a"].connects >= 2:
                break
            await asyncio.sleep(0.02)
        assert follower.state["a"].connects >= 2
        # It answered again at once: never reported down, nothing reported twice.
        assert [e.kind for e in events] == ["ready"]
        follower.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


@pytest.mark.parametrize("version", ["1.18.33", "1.14.41"])
def test_no_stream_at_all_falls_back_to_polling(tmp_path: Path, version: str) -> None:
    server = FakeServer(version)
    original = server.handler

    def no_streams(request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/event", "/global/event"):
            return httpx.Response(404, json={"message": "no"})
        return original(request)

    async def scenario() -> None:
        events: list[FleetEvent] = []
        transport = httpx.MockTransport(no_streams)
        follower = FleetFollower(_cfg(tmp_path), emit=events.append,
                                 transport_factory=lambda inst: transport, backoff=(0.05,),
                                 probe_seconds=0.5, poll_seconds=0.1)
        task = asyncio.create_task(follower.run())
        await _until(events, "polling")
        server.busy = {"ses_a": {"type": "busy"}}
        await _until(events, "started")
        assert [e.source for e in events if e.kind == "started"] == ["poll"]
        follower.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_doctor_says_which_stream_or_that_it_polls(tmp_path: Path) -> None:
    from xaf_hub.ops.health import stream_findings

    cfg = _cfg(tmp_path)
    for version, handler_paths, level, words in (
        ("1.18.33", (), "ok", "/global/event"),
        ("1.14.41", (), "info", "/event?directory="),
        ("1.18.33", ("/event", "/global/event"), "warn", "poll it every"),
    ):
        server = FakeServer(version)
        original = server.handler

        def handler(request: httpx.Request, blocked: tuple[str, ...] = handler_paths,
                    fallback: Any = original) -> httpx.Response:
            if request.url.path in blocked:
                return httpx.Response(404)
            return fallback(request)

        transport = httpx.MockTransport(handler)
        found = asyncio.run(
            stream_findings(cfg, cfg.instances, lambda inst, t=transport: t)  # type: ignore[misc]
        )
        assert [(f.level, words in f.message) for f in found] == [(level, True)], found


# ---------------------------------------------------------------------------------------------
# serve's change notices


def test_change_feed_wakes_every_viewer_and_says_nothing_secret(tmp_path: Path) -> None:
    import threading
    import time

    from xaf_hub.page.notices import ChangeFeed

    # No heartbeat within the test: only the follower's wake-up brings the notices.
    feed = ChangeFeed(_cfg(tmp_path), keepalive_seconds=60)
    stale: list[str] = []
    feed.on_change.append(lambda ev: stale.append(ev.kind))
    rec = SessionRecord("a", "ses_x", "secret title", "/srv/proj/secret-dir", project=True)

    def follower() -> None:  # the follower's own thread publishes, as in serve
        feed.publish(FleetEvent("ready", "a", detail="global"))
        feed.publish(FleetEvent("stopped", "a", rec, outcome="succeeded", at_ms=5))

    async def viewer(into: list[bytes], said: list[str]) -> None:
        async for chunk in feed.events(said=said):
            into.append(chunk)

    async def two_viewers() -> tuple[list[str], float]:
        said: list[str] = []
        got: list[list[bytes]] = [[], []]
        views = [asyncio.ensure_future(viewer(into, said)) for into in got]
        while feed.viewers < 2:
            await asyncio.sleep(0.01)
        began = time.monotonic()
        threading.Thread(target=follower).start()
        while not all(b'"version": 2' in b"".join(g) for g in got):
            assert time.monotonic() - began < 5, got
            await asyncio.sleep(0.01)
        took = time.monotonic() - began
        feed.close()
        await asyncio.wait_for(asyncio.gather(*views), 5)
        assert said == ["server stopping"] * 2
        return [b"".join(g).decode() for g in got], took

    texts, took = asyncio.run(two_viewers())
    assert took < 2  # woken, not found by a heartbeat a minute later
    # The follower's first view of an instance is a notice too: a change between the page's
    # scan and the follower's start would otherwise never reach the page.
    assert stale == ["ready", "stopped"] and feed.version == 2 and feed.viewers == 0
    for text in texts:
        assert text.startswith("retry: ") and 'event: hello\ndata: {"version": 0}' in text
        assert 'event: change\ndata: {"version": 1, "event": "ready", "instance": "a", ' in text
        assert '"event": "stopped", "instance": "a", "session": "ses_x", ' \
               '"outcome": "succeeded", "at_ms": 5}' in text
        assert "secret" not in text


def test_a_stream_that_is_closed_early_says_the_viewer_went_away(tmp_path: Path) -> None:
    from xaf_hub.page.notices import ChangeFeed

    feed = ChangeFeed(_cfg(tmp_path), keepalive_seconds=0.05)

    async def first_then_gone() -> list[str]:
        said: list[str] = []
        stream = feed.events(said=said)
        assert (await stream.__anext__()).startswith(b"retry: ")
        assert feed.viewers == 1
        await stream.aclose()  # what the server does when the connection ends
        return said

    assert asyncio.run(first_then_gone()) == ["viewer went away"] and feed.viewers == 0


def test_a_stream_ends_by_itself_after_its_life(tmp_path: Path) -> None:
    import time

    from xaf_hub.page.notices import ChangeFeed

    feed = ChangeFeed(_cfg(tmp_path), keepalive_seconds=0.1)

    async def whole(said: list[str]) -> bytes:
        return b"".join([chunk async for chunk in feed.events(0.5, said)])

    said: list[str] = []
    began = time.monotonic()
    text = asyncio.run(whole(said))
    assert 0.5 <= time.monotonic() - began < 3
    assert said == ["stream ended after 0.5s (the page reconnects)"]
    assert text.count(b": keep-alive") >= 3 and feed.viewers == 0


def test_snapshot_cache_scans_again_once_after_a_change() -> None:
    from xaf_hub.core.records import Snapshot
    from xaf_hub.page.serve import SnapshotCache

    calls: list[int] = []

    def scan() -> Snapshot:
        calls.append(1)
        return Snapshot(generated_at=len(calls), instances=())

    now = [100.0]
    cache = SnapshotCache(scan, max_age=60.0, clock=lambda: now[0])
    assert cache.get(now[0])[1] is True
    assert cache.get(now[0])[1] is False  # within max_age: shared
    cache.invalidate()
    now[0] += 1
    assert cache.get(now[0])[1] is True  # stale after a change: scanned again
    assert cache.get(now[0])[1] is False  # and shared again by the next viewers
    assert len(calls) == 2


def test_a_cancelled_follower_ends_even_while_events_pour_in(tmp_path: Path) -> None:
    # Ctrl+C is a cancel of the follower's task. Cancelled at random moments while the
    # stream delivers a frame every millisecond (a cancel arriving with an item is the case
    # 3.11's wait_for could swallow), it must end every time.
    rng = random.Random(7)

    async def once(delay: float) -> bool:
        server = FakeServer()
        follower, events = _follower(tmp_path, server)
        task = asyncio.create_task(follower.run())
        await _until(events, "ready")
        frame = _g("session.updated", {"info": _info("ses_a")})

        async def pour() -> None:
            while True:
                server.push(frame)
                await asyncio.sleep(0.001)

        pouring = asyncio.create_task(pour())
        await asyncio.sleep(delay)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        pouring.cancel()
        server.push(None)
        if not done:
            follower.stop()
            await asyncio.wait({task}, timeout=5)
        return task in done

    async def scenario() -> list[float]:
        delays = [rng.uniform(0, 0.05) for _ in range(30)]
        return [d for d in delays if not await once(d)]

    assert asyncio.run(scenario()) == []


def test_a_follower_of_no_instance_ends_at_once(tmp_path: Path) -> None:
    follower = FleetFollower(_cfg(tmp_path), [], emit=lambda ev: None)
    asyncio.run(asyncio.wait_for(follower.run(), 5))


def test_how_an_instance_is_followed_is_said_in_one_line() -> None:
    from xaf_hub.fleet.events import following_words

    assert following_words(FleetEvent("ready", "a", detail="global")) == \
        "a: following its global event stream"
    assert following_words(FleetEvent("up", "a", detail="directory")) == \
        "a: back, following its directory event stream"
    assert following_words(FleetEvent("down", "a", detail="connection refused")) == \
        "a: lost (connection refused)"
    assert following_words(FleetEvent("polling", "a", detail="no event stream answers")) == \
        "a: no event stream answers; polling it"
    assert following_words(FleetEvent("started", "a")) is None


# ---------------------------------------------------------------------------------------------
# One bad frame, or a follower's own failure on one instance, never stops the others


def _two(tmp_path: Path) -> Config:
    doc = {
        "project": {"name": "t"},
        "instances": [
            {"name": name, "url": f"http://127.0.0.{i + 1}:9", "roots": [ROOT],
             "default_directory": f"{ROOT}/app"} for i, name in enumerate(("a", "b"))
        ],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    return load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)


@pytest.mark.parametrize(("bad", "dropped"), [
    # a frame the board cannot read (an error in ``Board.apply``): dropped, counted
    (_g("session.status", {"sessionID": "ses_boom", "status": {"type": "busy"}}), 1),
    # a retry whose next try is not a time: read as the scan reads it (0), not dropped
    (_g("session.status", {"sessionID": "ses_a", "status": {
        "type": "retry", "attempt": 1, "message": "x", "next": "soon"}}), 0),
    # a session id with a control character (an invalid URL when its session is read): never
    # one of ours, so its frames are left alone without counting as bad
    (_g("session.status", {"sessionID": "ses_\x07bad", "status": {"type": "busy"}}), 0),
])
def test_a_bad_frame_is_dropped_and_every_instance_keeps_following(
    tmp_path: Path, bad: str, dropped: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    apply = Board.apply

    def boom(board: Board, frame: Frame) -> list[FleetEvent]:
        if frame.properties.get("sessionID") == "ses_boom":
            raise ValueError("unreadable")
        return apply(board, frame)

    monkeypatch.setattr(Board, "apply", boom)
    servers = {"a": FakeServer(), "b": FakeServer()}
    transports = {n: httpx.MockTransport(s.handler) for n, s in servers.items()}

    async def scenario() -> None:
        events: list[FleetEvent] = []
        follower = FleetFollower(
            _two(tmp_path), emit=events.append, transport_factory=lambda i: transports[i.name],
            backoff=(0.05,), probe_seconds=1.0,
        )
        task = asyncio.create_task(follower.run())
        await _until(events, "ready", 2)
        servers["a"].push(bad)
        await asyncio.sleep(0.2)
        assert not task.done(), "a bad frame ended the follower"
        for name in ("a", "b"):  # both still follow: a change on each arrives
            servers[name].busy = {}
            servers[name].push(_g("session.status", {"sessionID": "ses_a",
                                                     "status": {"type": "busy"}}))
        await _until(events, "started", 2)
        assert {e.instance for e in events if e.kind == "started"} == {"a", "b"}
        assert follower.state["a"].bad_frames == dropped
        assert follower.state["b"].bad_frames == 0
        follower.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_a_follower_failing_on_one_instance_is_restarted_and_the_other_goes_on(
    tmp_path: Path,
) -> None:
    servers = {"a": FakeServer(), "b": FakeServer()}
    broken = {"on": True}

    def a_handler(request: httpx.Request) -> httpx.Response:
        if broken["on"] and request.url.path == "/global/health":
            raise RuntimeError("a bug while reading the health answer")  # not an httpx error
        return servers["a"].handler(request)

    transports = {"a": httpx.MockTransport(a_handler),
                  "b": httpx.MockTransport(servers["b"].handler)}

    async def scenario() -> None:
        events: list[FleetEvent] = []
        follower = FleetFollower(
            _two(tmp_path), emit=events.append, transport_factory=lambda i: transports[i.name],
            backoff=(0.05,), probe_seconds=1.0,
        )
        task = asyncio.create_task(follower.run())
        await _until(events, "down")
        assert [e.instance for e in events if e.kind == "down"] == ["a"]
        assert "RuntimeError" in follower.state["a"].reason
        await _until(events, "ready")  # b follows meanwhile
        broken["on"] = False
        await _until(events, "up")
        assert not task.done()
        follower.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def _asking_board(tmp_path: Path) -> Board:
    board = Board(_cfg(tmp_path).instances[0])
    rec = SessionRecord("a", "ses_w", "t", f"{ROOT}/app", 1, 2, project=True, running=True,
                        run_state="busy")
    board.reconcile([rec], "rescan")
    return board


def _frame(kind: str, props: dict[str, Any]) -> Any:
    frame = parse_frame(_g(kind, props))
    assert frame is not None, kind
    return frame


ASKED = {"id": "per_1", "sessionID": "ses_w", "permission": "bash", "patterns": ["rm -rf x"],
         "metadata": {"command": "rm -rf x"}, "always": ["rm *"]}


def test_a_request_and_its_answer_are_one_line_each(tmp_path: Path) -> None:
    board = _asking_board(tmp_path)
    [asked] = board.apply(_frame("permission.asked", ASKED))
    assert (asked.kind, asked.detail) == ("asked", "permission bash: rm -rf x")
    assert asked.session is not None and asked.session.waiting is not None
    assert board.apply(_frame("permission.asked", {**ASKED, "id": "per_2"})) == []  # still per_1
    # A reply to some other request says nothing; the one it waits on ends the wait.
    assert board.apply(_frame("permission.replied", {"sessionID": "ses_w", "requestID": "per_9",
                                                     "reply": "once"})) == []
    [answered] = board.apply(_frame("permission.replied", {"sessionID": "ses_w",
                                                           "requestID": "per_1",
                                                           "reply": "reject"}))
    assert (answered.kind, answered.detail, answered.answer) == (
        "answered", "permission bash: rm -rf x -> replied reject", "replied reject"
    )
    assert board.sessions["ses_w"].waiting is None
    q = {"id": "que_1", "sessionID": "ses_w", "questions": [{"question": "Which?",
                                                             "options": [{"label": "a"}]}]}
    assert board.apply(_frame("question.asked", q))[0].detail == "question: Which?"
    assert [e.kind for e in board.apply(_frame("question.rejected", {
        "sessionID": "ses_w", "requestID": "que_1"}))] == ["answered"]


def test_a_rescan_finds_requests_the_stream_missed(tmp_path: Path) -> None:
    from dataclasses import replace

    from xaf_hub.core.records import Waiting

    board = _asking_board(tmp_path)
    rec = board.sessions["ses_w"]
    waiting = replace(rec, waiting=Waiting("permission", "per_1", "ls", permission="bash"))
    assert [(e.kind, e.detail) for e in board.reconcile([waiting], "rescan")] == [
        ("asked", "permission bash: ls")
    ]
    assert board.reconcile([waiting], "rescan") == []  # the same request: nothing new
    ended = replace(rec, running=False, run_state="idle")
    assert [e.kind for e in board.reconcile([ended], "rescan")] == ["stopped", "answered"]


@pytest.mark.parametrize(
    ("status", "running"),
    [
        ({"type": "compacting"}, True),  # a state this hub does not know: busy, never idle
        ({"type": "busy"}, True),
        ({"type": "idle"}, False),
        ({"type": ""}, False),  # no state at all: the frame tells nothing
        ({"type": 7}, False),
        ({}, False),
    ],
)
def test_a_run_state_the_hub_does_not_know_is_busy_on_the_board_as_in_a_scan(
    tmp_path: Path, status: dict[str, object], running: bool
) -> None:
    """The scan reads a status kind it does not know as busy (fleet.scan.read_status); the
    board ignored such a frame, so a session the scan called running stayed idle on it."""
    from xaf_hub.fleet.scan import read_status

    board = Board(_cfg(tmp_path).instances[0])
    board.reconcile([SessionRecord("a", "ses_a", "t", f"{ROOT}/app", project=True)], "rescan")
    frame = parse_frame(_g("session.status", {"sessionID": "ses_a", "status": status}))
    assert frame is not None
    board.apply(frame)
    assert board.sessions["ses_a"].running is running
    if status.get("type") == "compacting":
        assert read_status(status)[0] == "busy"  # what a scan says of it


def test_a_worktree_of_a_project_checkout_is_the_projects(tmp_path: Path) -> None:
    """Sessions in a worktree of the project's checkout (opencode's sandboxes, outside the
    roots) are the project's once a project.updated frame or a rescan names the worktree;
    a worktree of a checkout outside the project is not."""
    board = Board(_cfg(tmp_path).instances[0])
    room, stray = "/data/opencode/worktree/p1/t-1-fix", "/data/opencode/worktree/p2/x"
    assert not board.is_project(room)
    frame = parse_frame(
        _g("project.updated", {"id": "p1", "worktree": f"{ROOT}/app", "sandboxes": [room]},
           directory="global")
    )
    assert frame is not None and board.apply(frame) == []
    assert board.is_project(room)
    other = parse_frame(
        _g("project.updated", {"id": "p2", "worktree": "/elsewhere", "sandboxes": [stray]})
    )
    assert other is not None and board.apply(other) == [] and not board.is_project(stray)
    # A session created in the worktree is looked up, as any new project session is.
    created = parse_frame(_g("session.created", {"info": _info("ses_w", room)}, room))
    assert created is not None and board.apply(created) == []
    assert board.missing == [("ses_w", room)]
    # A rescan teaches the same from the listing's checkouts.
    fresh = Board(_cfg(tmp_path).instances[0])
    rec = SessionRecord("a", "ses_w", "t", room, project=True)
    fresh.reconcile([rec], "rescan", {room: f"{ROOT}/app"})
    assert fresh.is_project(room)


def test_a_board_over_several_projects_learns_each_projects_worktrees(tmp_path: Path) -> None:
    """A daemon follows every project at once (no project chosen): a worktree of any configured
    project's checkout is learnt from the project.updated frame, so the run in it is followed
    (its priced steps reported) from its first frame, not from the next rescan; a worktree of
    a checkout no project holds is not."""
    board = Board(load(tmp_path, projects()).instances[0], steps=True)
    room, stray = "/data/opencode/worktree/p2/t-1-post", "/data/opencode/worktree/p3/x"
    for ident, checkout, folder in (("p2", "/src/blog", room), ("p3", "/elsewhere", stray)):
        frame = parse_frame(
            _g("project.updated", {"id": ident, "worktree": checkout, "sandboxes": [folder]},
               directory="global")
        )
        assert frame is not None and board.apply(frame) == []
    assert board.is_project(room) and not board.is_project(stray)
    assert board.inst.owner(room, board.sandboxes[room]) == "blog"


def test_a_session_read_by_id_in_a_learnt_worktree_is_placed_in_its_projects_checkout(
    tmp_path: Path,
) -> None:
    """A session the follower reads by id does not name its checkout: the board places it in
    the checkout its worktree was made from, so its record names the project that owns it."""
    inst = load(tmp_path, projects()).instances[0]
    board = Board(inst)
    room = "/data/opencode/worktree/p2/t-1-post"
    frame = parse_frame(_g("project.updated", {"id": "p2", "worktree": "/src/blog",
                                               "sandboxes": [room]}, directory="global"))
    assert frame is not None and board.apply(frame) == []
    read = ServerSession("ses_r", "t", room, 1, 1, None, "", "")
    assert build_record(inst, read, None, True).owner == ""  # as the server told it
    assert build_record(inst, board.placed(read), None, True).owner == "blog"
    elsewhere = ServerSession("ses_e", "t", "/data/other", 1, 1, None, "", "")
    assert board.placed(elsewhere) == elsewhere
