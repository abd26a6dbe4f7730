"""`serve`'s limits against the real server (Starlette on uvicorn, in this process, on
127.0.0.1): the connection cap, the request, answer and write deadlines, the viewers' cap and a
stream's longest life, the request head's size, and what every answer carries."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.core.records import InstanceSummary, SessionRecord, Snapshot
from xaf_hub.errors import UsageError
from xaf_hub.page.asgi import PageApp, listen, serve, server_for
from xaf_hub.page.notices import ChangeFeed
from xaf_hub.page.serve import Limits, RequestLog, SnapshotCache, Viewer


def _snap(sessions: int = 1, title: str = "title") -> Snapshot:
    return Snapshot(
        generated_at=1_717_000_000_000,
        instances=(InstanceSummary("a", "http://127.0.0.1:1", True),),
        sessions=tuple(SessionRecord("a", f"ses_{i}", title, "/p/app", project=True)
                       for i in range(sessions)),
    )


@contextlib.contextmanager
def running(limits: Limits, snap: Snapshot | None = None,
            password: str | None = None) -> Iterator[tuple[PageApp, int, Any]]:
    """The page served on 127.0.0.1 in a thread: the app, its port and the uvicorn server."""
    shown = snap or _snap()
    cache = SnapshotCache(lambda: shown, 60.0)
    page = PageApp(Viewer(cache, title="T", password=password), RequestLog(io.StringIO()),
                   limits)
    sock = listen("127.0.0.1", 0)
    server = server_for(page)
    thread = threading.Thread(target=serve, args=(page, sock, server))
    thread.start()
    try:
        _wait(lambda: server.started)
        yield page, sock.getsockname()[1], server
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


def _feed(tmp_path: Path, **kwargs: Any) -> ChangeFeed:
    """A change feed whose follower never starts: the test publishes its notices."""
    from xaf_hub.config.load import load_config

    path = tmp_path / "config.json"
    doc = {"project": {"name": "t"}, "instances": [{"name": "a", "url": "http://127.0.0.1:9"}]}
    path.write_text(json.dumps(doc), "utf-8")
    cfg = load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    return ChangeFeed(cfg, **kwargs)


def _wait(cond: Any, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


def _get(port: int, target: str = "/health", extra: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(f"GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n".encode() + extra + b"\r\n")
        chunks = []
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


def _closed(sock: socket.socket) -> bool:
    """Whether the server ended this connection (end of stream or reset) within 20 s."""
    sock.settimeout(20)
    try:
        while sock.recv(1024):
            pass  # an error answer may come first
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def _loris(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(b"GET / HTT")  # and never the rest
    return s


def test_slow_loris_clients_are_cut_at_the_deadline_and_the_cap_holds() -> None:
    with running(Limits(max_connections=5, request_seconds=1.5)) as (page, port, server):
        loris = [_loris(port) for _ in range(4)]
        try:
            _wait(lambda: len(server.server_state.connections) == 4)
            # A request made at the cap (its own connection the fifth) is told so at once
            # (uvicorn's limit_concurrency) rather than queued behind the slow ones...
            assert _get(port).startswith(b"HTTP/1.1 503")
            loris.append(_loris(port))
            _wait(lambda: len(server.server_state.connections) == 5)
            # ...and a connection past it is answered and closed before it sends anything.
            busy = _get(port)
            assert busy.startswith(b"HTTP/1.1 503") and b"retry-after: 5" in busy
            assert page.counts.refused == 1
            # Past their deadline the slow clients are cut: their sockets see the end.
            for s in loris:
                assert _closed(s)
            _wait(lambda: not server.server_state.connections)
            assert page.counts.cut.get("request", 0) >= 5
            assert _get(port).startswith(b"HTTP/1.1 200")
        finally:
            for s in loris:
                s.close()


def test_a_client_dribbling_one_byte_at_a_time_is_cut() -> None:
    with running(Limits(request_seconds=0.8)) as (page, port, _):
        sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        try:
            cut = False
            # One byte every 0.1 s: each read gets data, so only a whole-request deadline helps.
            for byte in b"GET / HTTP/1.0\r\nX-Long: " + b"a" * 200:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    cut = True
                    break
                time.sleep(0.1)
            assert cut or _closed(sock)
            assert page.counts.cut.get("request", 0) == 1
        finally:
            sock.close()


def test_a_connection_that_sends_nothing_is_cut_too() -> None:
    # uvicorn alone would hold it until the client goes: its keep-alive timer starts only
    # after a first answer. (The old server cut it at the same deadline.)
    with running(Limits(request_seconds=0.5)) as (page, port, _):
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            assert _closed(sock)
        assert page.counts.cut == {"request": 1}


def test_a_request_head_past_its_size_is_refused() -> None:
    # h11 holds at most max_head_bytes of a head still incomplete (the bound on what a client
    # that sends its head in pieces makes the server keep); past it, a 400.
    def head_in_two_pieces(port: int, pad: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            s.sendall(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * pad)
            time.sleep(0.3)
            with contextlib.suppress(OSError):
                s.sendall(b"\r\n\r\n")
            chunks = []
            with contextlib.suppress(ConnectionResetError):
                while chunk := s.recv(65536):
                    chunks.append(chunk)
            return b"".join(chunks)

    with running(Limits(max_head_bytes=4096)) as (_, port, _):
        assert head_in_two_pieces(port, 3000).startswith(b"HTTP/1.1 200")
        assert head_in_two_pieces(port, 6000).startswith(b"HTTP/1.1 400")


@pytest.mark.parametrize("deadline", ["answer", "write"])
def test_an_answer_the_client_never_reads_is_cut(deadline: str) -> None:
    # 4 MB of JSON to a client with a tiny window that reads nothing: the answer's deadline
    # (from the request's arrival) or the write's (no byte taken for that long) ends it.
    snap = _snap(1000, "x" * 4000)
    short, long = 1.0, 120.0
    limits = (Limits(answer_seconds=short, write_seconds=long) if deadline == "answer"
              else Limits(answer_seconds=long, write_seconds=short))
    with running(limits, snap) as (page, port, _):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"GET /api/snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            _wait(lambda: page.counts.cut)
            assert page.counts.cut == {deadline: 1}
            _wait(lambda: page.counts.in_flight == 0)
            assert _get(port).startswith(b"HTTP/1.1 200")
        finally:
            sock.close()


def test_every_answer_carries_the_security_headers_and_one_log_line() -> None:
    with running(Limits()) as (page, port, _):
        log = io.StringIO()
        page.log = RequestLog(log)
        answers = {
            "GET /health": _get(port),
            "HEAD /": _send(port, b"HEAD / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"),
            "POST /": _send(port, b"POST / HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                                  b"Content-Length: 2\r\n\r\nhi"),
            "GET /nope": _get(port, "/nope"),
            "GET /health (foreign Host)": _send(
                port, b"GET /health HTTP/1.0\r\nHost: evil.example\r\n\r\n"),
        }
        for name, raw in answers.items():
            head, _, body = raw.partition(b"\r\n\r\n")
            lines = head.decode().lower().split("\r\n")
            assert "x-content-type-options: nosniff" in lines, name
            assert "x-frame-options: deny" in lines, name
            assert "cache-control: no-store" in lines, name
            assert any(x.startswith("content-security-policy: ") for x in lines), name
            assert "server: xaf-hub" in lines, name  # and nothing that names a version
        assert answers["GET /health"].startswith(b"HTTP/1.1 200")
        head, _, body = answers["HEAD /"].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and body == b""
        assert int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]) > 1000
        assert answers["POST /"].startswith(b"HTTP/1.1 405")
        assert b"allow: GET, HEAD" in answers["POST /"]
        assert answers["GET /nope"].startswith(b"HTTP/1.1 404")
        assert answers["GET /health (foreign Host)"].startswith(b"HTTP/1.1 403")
        # A base URL ending in / plus "/api/snapshot": the route all the same.
        assert _get(port, "//api/snapshot").startswith(b"HTTP/1.1 200")
        _wait(lambda: len(log.getvalue().splitlines()) == 6)
        text = log.getvalue()
        for line in ("GET /health 200", "HEAD / 200", "POST / 405", "GET /nope 404",
                     "GET /health 403", "GET /api/snapshot 200"):
            assert f"127.0.0.1 {line} " in text, text


def _send(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(raw)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_a_change_notice_stream_outlives_the_answer_deadline(tmp_path: Path) -> None:
    with running(Limits(max_connections=4, request_seconds=0.5, answer_seconds=0.5)) as (
        page, port, server,
    ):
        feed = page.feed = _feed(tmp_path, keepalive_seconds=0.1)
        sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        try:
            sock.sendall(b"GET /api/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            got = b""
            # Several answer deadlines long: the stream keeps its keep-alives coming.
            until = time.monotonic() + 3.0
            while time.monotonic() < until:
                chunk = sock.recv(65536)
                assert chunk, "the stream was cut"
                got += chunk
            assert got.startswith(b"HTTP/1.1 200") and got.count(b": keep-alive") >= 3
            assert b"content-type: text/event-stream" in got
            assert page.counts.cut == {} and page.counts.viewers == 1
            feed.close()
            assert _closed(sock)  # and the feed's close ends it
            _wait(lambda: page.counts.viewers == 0 and feed.viewers == 0)
        finally:
            feed.close()
            sock.close()


def test_a_crowd_of_viewers_that_never_read_never_locks_out_the_page_or_health(
    tmp_path: Path,
) -> None:
    """70 change-notice streams that never read: /health and the page still answer 200."""
    with running(Limits()) as (page, port, _):  # the defaults: 96 connections, 32 viewers
        feed = page.feed = _feed(tmp_path)
        crowd: list[socket.socket] = []
        try:
            for _ in range(70):
                s = socket.create_connection(("127.0.0.1", port), timeout=20)
                s.sendall(b"GET /api/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                crowd.append(s)  # and never read
            _wait(lambda: feed.viewers >= 32)
            # The viewers past the cap are told so (the page keeps its timer), not queued.
            late = crowd[-1]
            late.settimeout(20)
            assert late.recv(65536).startswith(b"HTTP/1.1 503")
            for _ in range(5):
                assert _get(port, "/health").startswith(b"HTTP/1.1 200")
                got = _get(port, "/")
                assert got.startswith(b"HTTP/1.1 200") and b"<html" in got
            _wait(lambda: page.counts.refused_viewers == 38 and page.counts.in_flight == 0)
            assert page.counts.viewers == feed.viewers == 32
        finally:
            feed.close()
            for s in crowd:
                s.close()


def test_a_viewer_that_stops_reading_is_cut_by_the_write_deadline(tmp_path: Path) -> None:
    from xaf_hub.fleet.events import FleetEvent

    with running(Limits(max_connections=4, write_seconds=0.5)) as (page, port, _):
        feed = page.feed = _feed(tmp_path)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, never read
        sock.settimeout(20)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"GET /api/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            _wait(lambda: page.counts.viewers == 1)
            # Notices pile up in the buffers until a write stalls; the deadline then cuts it.
            sent = 0
            while page.counts.viewers and sent < 200_000:
                feed.publish(FleetEvent("stopped", "a", at_ms=sent))
                sent += 1
                if sent % 500 == 0:
                    time.sleep(0.05)
            _wait(lambda: page.counts.viewers == 0 and feed.viewers == 0)
            assert page.counts.cut == {"write": 1}
            assert _get(port, "/health").startswith(b"HTTP/1.1 200")
        finally:
            feed.close()
            sock.close()


def test_a_stream_ends_after_its_longest_life_and_the_page_reconnects(tmp_path: Path) -> None:
    with running(Limits(max_connections=4, stream_seconds=1.0)) as (page, port, _):
        feed = page.feed = _feed(tmp_path, keepalive_seconds=0.2)
        sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        try:
            sock.sendall(b"GET /api/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            got = b""
            while chunk := sock.recv(65536):  # ends by itself, even for a viewer that never reads
                got += chunk
            assert got.startswith(b"HTTP/1.1 200") and b"retry: 3000" in got
            _wait(lambda: page.counts.viewers == 0 and feed.viewers == 0)
        finally:
            feed.close()
            sock.close()


def test_a_stream_in_progress_does_not_hold_up_the_stop(tmp_path: Path) -> None:
    # Ctrl+C ends every stream first (the feed closes), so the drain waits for none of them.
    with running(Limits()) as (page, port, server):
        feed = page.feed = _feed(tmp_path)
        sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        sock.sendall(b"GET /api/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        _wait(lambda: page.counts.viewers == 1)
        began = time.monotonic()
        server.should_exit = True
        assert _closed(sock)
        sock.close()
    assert time.monotonic() - began < 1.5  # Limits.drain_seconds is 2
    assert feed.closed


def test_answers_leave_at_once_without_waiting_for_the_client_s_ack() -> None:
    # Nagle's algorithm off on every connection (asyncio does it only for a socket made with
    # IPPROTO_TCP): otherwise a small answer's body waits behind its head for the client's
    # delayed ACK, 40 ms on Linux (/health took 44 ms instead of 1 ms in bench/serve.py).
    with running(Limits()) as (_, port, server), \
            socket.create_connection(("127.0.0.1", port), timeout=20):
        _wait(lambda: server.server_state.connections)
        conn = next(iter(server.server_state.connections))
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_port_in_use_is_one_line_naming_it() -> None:
    """serve and mcp --http both listen through listen(): a port taken is a UsageError (exit
    4) that names the address and why, and no socket is left open."""
    with contextlib.closing(listen("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=rf"^cannot listen on 127\.0\.0\.1:{port}: "):
            listen("127.0.0.1", port)
