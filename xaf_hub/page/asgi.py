"""The served page on Starlette and uvicorn, and the deadlines uvicorn has no knob for.

``PageApp`` sends every request to ``Viewer.respond`` in a thread of its own and streams change
notices; ``GuardedH11`` adds the connection cap and the request, answer and write deadlines;
``serve`` runs it on a bound socket. Imported only by ``serve`` (docs/architecture.md §6.2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response as Answer
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from xaf_hub.errors import UsageError
from xaf_hub.page.notices import ChangeFeed
from xaf_hub.page.serve import Limits, RequestLog, Viewer, _text, printable

T = TypeVar("T")


@dataclass
class Counts:
    """What the limits did, for the tests and the log (touched on the event loop only)."""

    refused: int = 0  # connections past the cap, answered 503 and closed at once
    cut: dict[str, int] = field(default_factory=dict)  # connections ended by each deadline
    viewers: int = 0  # change-notice streams open now
    refused_viewers: int = 0
    in_flight: int = 0  # answers being worked out or sent (streams aside)


# The words the request log gives each deadline.
CUT_WORDS = {
    "request": "request not sent in time",
    "answer": "answer not taken in time",
    "write": "client stopped reading",
}


_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 38\r\nretry-after: 5\r\nconnection: close\r\n\r\n"
    b"too many connections; try again soon\r\n"
)


# An answer longer than this goes out in pieces of this size, each once the previous one has
# left: a client that does not read holds one piece in memory, not a copy of the whole page.
_PIECE = 65536


_CONNECTION = "xaf_hub.connection"  # the key of a request's connection in scope["state"]


class GuardedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with the cap at connect time and the three deadlines."""

    page: PageApp  # set on the subclass ``server_for`` makes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Each request's scope["state"] is a copy of this: the app finds its connection there.
        self.app_state = {**self.app_state, _CONNECTION: self}
        self._deadline: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None
        self._timed: object = None  # the request whose answer the deadline times
        self.streaming = False
        self.cut_for = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.page.limits.max_connections:
            self.page.counts.refused += 1
            transport.write(_BUSY)
            transport.close()
            return
        self._arm("request", self.page.limits.request_seconds)

    def data_received(self, data: bytes) -> None:
        try:
            super().data_received(data)
        except UnicodeDecodeError:  # a request target h11 lets through and uvicorn cannot read
            self.transport.close()
            return
        self._time_answer()

    def on_response_complete(self) -> None:
        self.streaming = False
        super().on_response_complete()
        if not self._time_answer():  # else a pipelined request came in with it
            self._arm("request", self.page.limits.request_seconds)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            self._stall = self.loop.call_later(self.page.limits.write_seconds, self._cut, "write")

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._deadline, self._stall):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def to_stream(self) -> None:
        """This connection now carries a change-notice stream: no answer deadline (the write
        deadline stays) and small buffers, so a viewer that stops reading stalls a write
        after a few KB and meets that deadline."""
        self.streaming = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.page.limits.viewer_sndbuf)
        self.transport.set_write_buffer_limits(high=self.page.limits.viewer_sndbuf)

    def _time_answer(self) -> bool:
        """Give a request that has fully arrived its answer deadline; whether one is open."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete or self.conn.their_state is not h11.DONE:
            return False
        if self._timed is not cycle and not self.streaming:
            self._timed = cycle
            self._arm("answer", self.page.limits.answer_seconds)
        return True

    def _arm(self, what: str, seconds: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        closing = self.transport is None or self.transport.is_closing()
        self._deadline = None if closing else self.loop.call_later(seconds, self._cut, what)

    def _cut(self, what: str) -> None:
        if self.transport.is_closing():
            return
        self.cut_for = what
        self.page.counts.cut[what] = self.page.counts.cut.get(what, 0) + 1
        self.transport.abort()  # the app's pending write returns, a stream hears the disconnect


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a daemon thread of its own, awaited.

    Not anyio's worker threads (``run_in_threadpool``): the interpreter waits for those at exit,
    and a scan in flight must not hold up Ctrl+C; the connection cap bounds these threads.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(put: Callable[[Any], None], value: Any) -> None:
        if not done.done():  # else the request was cancelled meanwhile
            put(value)

    def work() -> None:
        try:
            outcome: tuple[Callable[[Any], None], Any] = (done.set_result, fn(*args))
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting request
            outcome = (done.set_exception, exc)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name="xaf-hub-serve-request", daemon=True).start()
    return await done


def _target(scope: Scope) -> str:
    """The request target as the client sent it (path and query), leading slashes as one
    (``//api/snapshot``, what a base URL ending in / plus "/api/snapshot" gives, is that route;
    ``http.server`` did the same)."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    if raw.startswith(b"//"):
        raw = b"/" + raw.lstrip(b"/")
    query: bytes = scope.get("query_string") or b""
    return raw.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")


async def _pieces(body: bytes) -> AsyncIterator[bytes]:
    view = memoryview(body)
    for start in range(0, len(body), _PIECE):
        yield bytes(view[start:start + _PIECE])


@dataclass(eq=False)
class PageApp:
    """The ASGI app: ``Viewer.respond`` for every request, change-notice streams, the log."""

    viewer: Viewer
    log: RequestLog
    limits: Limits = field(default_factory=Limits)
    # Starts the follower on the first /api/events viewer: no listener, no stream traffic.
    feed_factory: Callable[[], ChangeFeed] | None = None
    counts: Counts = field(default_factory=Counts, init=False)
    feed: ChangeFeed | None = field(default=None, init=False)  # notices for /api/events
    asgi: Starlette = field(default_factory=Starlette, init=False)
    _feed_lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        # Every method and target reaches Viewer.respond, which owns the routes and their words.
        self.asgi.router.default = self._answer

    def change_feed(self) -> ChangeFeed | None:
        """The shared follower, started when the first page asks for change notices."""
        with self._feed_lock:
            if self.feed is None and self.feed_factory is not None:
                self.feed = self.feed_factory()
            return self.feed

    def close(self) -> None:
        """Stop following the fleet and end every open stream."""
        with self._feed_lock:
            if self.feed is not None:
                self.feed.close()

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        started = time.monotonic()
        request = Request(scope, receive)
        method, target = request.method, _target(scope)
        conn = scope.get("state", {}).get(_CONNECTION)
        self.counts.in_flight += 1
        streamed = False
        try:
            try:
                response = await off_loop(self.viewer.respond, method, target, request.headers.get)
            except Exception as exc:  # noqa: BLE001 - one bad scan must not stop the viewer
                response = _text(500, "internal error while scanning the fleet",
                                         note=f"error: {type(exc).__name__}")
            feed = await off_loop(self.change_feed) if response.is_stream else None
            if response.is_stream and feed is None:
                response = _text(404, "change notices are off")
            elif feed is not None and self.counts.viewers >= self.limits.max_viewers:
                self.counts.refused_viewers += 1
                feed = None
                response = _text(
                    503, "too many change-notice viewers; the page refreshes on its timer",
                    ("Retry-After", "30"), note="viewers full",
                )
            headers = dict(response.all_headers())
            if feed is not None and method != "HEAD":
                self.counts.in_flight -= 1
                streamed = True
                note = await self._stream(feed, headers, conn, scope, receive, send)
            else:
                body = response.body
                answer = (
                    StreamingResponse(_pieces(body), response.status, headers)
                    if len(body) > _PIECE and method != "HEAD"
                    else Answer(body, response.status, headers)
                )
                await answer(scope, receive, send)
                note = response.note
        finally:
            if not streamed:
                self.counts.in_flight -= 1
        if conn is not None and conn.cut_for:
            note = CUT_WORDS.get(conn.cut_for, conn.cut_for)
        took = (time.monotonic() - started) * 1000
        peer = (scope.get("client") or ("?",))[0]
        said = f" ({note})" if note else ""
        self.log.line(f"{peer} {printable(method, 10)} {printable(target)} {response.status} "
                      f"{len(response.body)}B {took:.0f}ms{said}")

    async def _stream(
        self, feed: ChangeFeed, headers: dict[str, str], conn: GuardedH11 | None,
        scope: Scope, receive: Receive, send: Send,
    ) -> str:
        """One viewer's change notices, until the stream's life ends, the feed closes or the
        viewer goes (or is cut); say why."""
        said: list[str] = []
        self.counts.viewers += 1
        if conn is not None:
            conn.to_stream()
        notices = feed.events(self.limits.stream_seconds, said)
        try:
            await StreamingResponse(notices, 200, headers)(scope, receive, send)
        finally:
            await notices.aclose()
            self.counts.viewers -= 1
        return said[0] if said else "viewer went away"


class _ToLog(logging.Handler):
    """uvicorn's own warnings (a 503 past the cap, a malformed request) as request-log lines:
    one line each, no traceback (the log stays short and holds nothing of a request)."""

    def __init__(self, log: RequestLog) -> None:
        super().__init__(logging.WARNING)
        self._log = log

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().strip()
        if record.exc_info and record.exc_info[1] is not None:
            text += f": {type(record.exc_info[1]).__name__}"
        self._log.line(printable(text))


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, page: PageApp) -> None:
        super().__init__(config)
        self.page = page

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.page.close()  # every stream ends first: the drain below waits for answers only
        await super().shutdown(sockets)


def server_for(page: PageApp) -> uvicorn.Server:
    """uvicorn, configured with the page's limits where it has the knob."""
    limits = page.limits
    config = uvicorn.Config(
        page.asgi,
        http=type("PageProtocol", (GuardedH11,), {"page": page}),  # bound to ``page``
        ws="none",
        lifespan="off",
        loop="asyncio",
        log_config=None,
        log_level="warning",
        access_log=False,  # PageApp writes the one line per request
        proxy_headers=False,  # the log names the real peer, whatever X-Forwarded-For says
        headers=[("Server", "xaf-hub")],  # instead of uvicorn's: nothing that names a version
        limit_concurrency=limits.max_connections,
        timeout_keep_alive=limits.idle_seconds,
        h11_max_incomplete_event_size=limits.max_head_bytes,
        # Answers under way get this long once Ctrl+C comes; a scan in flight is not waited for.
        timeout_graceful_shutdown=limits.drain_seconds,
    )
    return _Server(config, page)


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (port 0: any free one); UsageError when it cannot."""
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off only on sockets that say so, and
    # with it on, an answer written in two pieces (head, then body) waits for the client's
    # delayed ACK (docs/performance.md).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listening before the URL is printed: a client that connects at once waits in the
        # backlog until uvicorn accepts, instead of being refused.
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


def serve(page: PageApp, sock: socket.socket, server: uvicorn.Server | None = None) -> None:
    """Serve ``page`` on ``sock`` until Ctrl+C or SIGTERM (uvicorn's handlers, in the main
    thread; it raises the signal again once it has stopped), or until the uvicorn server it
    runs is told to exit (its ``should_exit``, what the tests set)."""
    server = server or server_for(page)
    handler = _ToLog(page.log)
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        server.run(sockets=[sock])
    finally:
        logger.removeHandler(handler)
