"""The served overview page: routes, the scan cache, change notices and the guards around them.

`xaf-hub serve` (``cli/commands/serve.py``) parses its options and starts a ``PageServer``;
what it serves and to whom is decided here:

* routes: ``/`` (the page), ``/api/snapshot`` (the ``sessions --json`` document),
  ``/api/events`` (change notices, server-sent events), ``/health``;
* ``SnapshotCache``: one scan per cache window, however many viewers;
* who may see it: loopback only, unless ``--public`` with a viewer password of
  ``MIN_PASSWORD_LENGTH`` or more (basic auth), and Host header checks (pure checks: no I/O);
* what a request may cost: a client that opens many connections, sends its request one byte at
  a time (slow loris) or never reads the answer must not pin the viewer's threads.
  ``ConnectionGuard`` counts open connections (past ``max_connections`` a new one gets a short
  503 and is closed) and gives each one a deadline; one watchdog thread shuts down the socket
  of any connection past it, which ends whatever read or write its handler thread is blocked in.
  A change-notice stream (``/api/events``) leaves that count once its request is read: viewers
  have their own cap (``max_viewers``; past it a 503 and the page keeps its timer), each write
  to them a deadline (``write_seconds``), and a stream ends after ``STREAM_SECONDS`` (the
  browser reconnects): a crowd of viewers, reading or not, never keeps the page or ``/health``
  from answering.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.server
import ipaddress
import json
import math
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TextIO, cast
from urllib.parse import parse_qs, urlsplit

from xaf_hub.core.records import Snapshot
from xaf_hub.core.text import dumps
from xaf_hub.errors import UsageError
from xaf_hub.page.words import LANGS, Lang, pick_language

if TYPE_CHECKING:  # the follower pulls in httpx; --help must stay light
    from xaf_hub.config.load import Config
    from xaf_hub.fleet.scan import TransportFactory
    from xaf_hub.page.notices import ChangeFeed


# -- who may see the page (pure checks) and what a request may cost ---------------------

VIEWER_PASSWORD_ENV = "XAF_HUB_VIEWER_PASSWORD"


MIN_PASSWORD_LENGTH = 12


def is_loopback(host: str) -> bool:
    """Return whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # any other host name could resolve anywhere


def host_header_name(header: str) -> str:
    """Return the host part of an HTTP Host header ("[::1]:80" -> "::1", "a:80" -> "a")."""
    value = header.strip()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def check_exposure(host: str, public: bool, password: str | None) -> None:
    """Refuse a listening address the options do not allow (UsageError)."""
    if public:
        if not password:
            raise UsageError(
                f"--public needs a viewer password: set {VIEWER_PASSWORD_ENV} (colleagues "
                "log in with any user name and that password)"
            )
        if len(password) < MIN_PASSWORD_LENGTH:
            raise UsageError(
                f"{VIEWER_PASSWORD_ENV} is too short: use at least {MIN_PASSWORD_LENGTH} characters"
            )
    elif not is_loopback(host):
        raise UsageError(
            f"refusing to listen on {host}: without --public only a loopback address "
            f"(127.0.0.1, ::1, localhost) is allowed; to let colleagues in, set "
            f"{VIEWER_PASSWORD_ENV} and add --public"
        )


def basic_auth_ok(header: str | None, password: str) -> bool:
    """Return whether an Authorization header carries ``password`` (any user name)."""
    if not header:
        return False
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        return False
    _, sep, given = decoded.partition(":")
    if not sep:
        return False
    # Digests first so the comparison takes the same time whatever the lengths.
    return hmac.compare_digest(
        hashlib.sha256(given.encode("utf-8")).digest(),
        hashlib.sha256(password.encode("utf-8")).digest(),
    )


def printable(text: str, limit: int = 200) -> str:
    """Return ``text`` safe for one log line: control characters as "?", at most ``limit``."""
    clean = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return clean + ("..." if len(text) > limit else "")


# Enough for a team refreshing a page; a flood beyond it is answered 503 at once.
MAX_CONNECTIONS = 64


# Open change-notice streams, counted apart from page and API requests.
MAX_VIEWERS = 32


# A notice or a heartbeat must reach a viewer's socket within this, or the viewer is cut.
WRITE_SECONDS = 10.0


# A stream's longest life: then it ends and the browser reconnects (EventSource, 3 s later),
# so a viewer that never reads holds its place at most this long, however little is sent.
STREAM_SECONDS = 300.0


# A viewer's send buffer: small, so a viewer that stops reading blocks a write (and meets the
# write deadline) after a few KB rather than megabytes.
VIEWER_SNDBUF = 16384


# Time a client has to send its request line and headers (a browser needs milliseconds).
REQUEST_SECONDS = 10.0


# Time to send the answer once it is ready (a page of thousands of rows is a few MB).
ANSWER_SECONDS = 20.0


_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 38\r\nRetry-After: 5\r\nConnection: close\r\n\r\n"
    b"too many connections; try again soon\r\n"
)


class ConnectionGuard:
    """Open connections, each with a deadline; a watchdog closes the ones past theirs."""

    def __init__(
        self,
        max_connections: int = MAX_CONNECTIONS,
        *,
        max_viewers: int = MAX_VIEWERS,
        request_seconds: float = REQUEST_SECONDS,
        write_seconds: float = WRITE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        tick: float = 0.25,
    ) -> None:
        self.max_connections = max_connections
        self.max_viewers = max_viewers
        self.request_seconds = request_seconds
        self.write_seconds = write_seconds
        self._clock = clock
        self._tick = tick
        self._lock = threading.Lock()
        self._deadlines: dict[socket.socket, float] = {}
        self._viewers: dict[socket.socket, float] = {}  # deadline of the write in progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="serve-watchdog", daemon=True)
        self.refused = 0
        self.cut = 0
        self.refused_viewers = 0
        self.cut_viewers = 0

    def start(self) -> None:
        """Start the watchdog thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the watchdog thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    @property
    def open(self) -> int:
        """How many connections are being handled now."""
        with self._lock:
            return len(self._deadlines)

    def admit(self, sock: socket.socket) -> bool:
        """Take a new connection (deadline: its request); False, after a 503, when full."""
        with self._lock:
            if len(self._deadlines) < self.max_connections:
                self._deadlines[sock] = self._clock() + self.request_seconds
                return True
            self.refused += 1
        with contextlib.suppress(OSError):
            sock.setblocking(False)  # a client that reads nothing must not block the loop
            sock.send(_BUSY)
        return False

    @property
    def viewers(self) -> int:
        """How many change-notice streams are open now."""
        with self._lock:
            return len(self._viewers)

    def to_viewer(self, sock: socket.socket) -> bool:
        """Move a connection to the viewers (its page slot frees); False when they are full."""
        with self._lock:
            if len(self._viewers) >= self.max_viewers:
                self.refused_viewers += 1
                return False
            self._deadlines.pop(sock, None)
            self._viewers[sock] = math.inf
        return True

    @contextlib.contextmanager
    def writing(self, sock: socket.socket) -> Iterator[None]:
        """One write to a viewer: cut when it has not reached the socket in ``write_seconds``."""
        with self._lock:
            if sock in self._viewers:
                self._viewers[sock] = self._clock() + self.write_seconds
        try:
            yield
        finally:
            with self._lock:
                if sock in self._viewers:
                    self._viewers[sock] = math.inf

    def extend(self, sock: socket.socket, seconds: float) -> None:
        """Give a connection whose request has arrived ``seconds`` more to be answered."""
        with self._lock:
            if sock in self._deadlines:
                self._deadlines[sock] = self._clock() + seconds

    def release(self, sock: socket.socket) -> None:
        """Forget a connection that is finished."""
        with self._lock:
            self._deadlines.pop(sock, None)
            self._viewers.pop(sock, None)

    def _watch(self) -> None:
        while not self._stop.wait(self._tick):
            now = self._clock()
            with self._lock:
                late = [s for s, deadline in self._deadlines.items() if deadline <= now]
                stuck = [s for s, deadline in self._viewers.items() if deadline <= now]
            self.cut_viewers += len(stuck)
            for sock in late + stuck:
                self.cut += sock in late
                # Wakes the handler thread from its blocked read or write; the server closes
                # the socket when the handler returns.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                self.release(sock)


# -- the server --------------------------------------------------------------------------

REALM = "xaf-hub overview"


_HTML = "text/html; charset=utf-8"


_JSON = "application/json; charset=utf-8"


_TEXT = "text/plain; charset=utf-8"


_PAGE_ROUTES = ("/", "/index.html")


_EVENTS = "text/event-stream; charset=utf-8"


_EVENTS_ROUTE = "/api/events"


_ROUTES = (*_PAGE_ROUTES, "/api/snapshot", _EVENTS_ROUTE, "/health")


# Sent with every response. The page carries its own no-network CSP in a <meta>; the header
# adds what a <meta> cannot say (no framing) and locks down every non-HTML answer entirely.
_COMMON_HEADERS: tuple[tuple[str, str], ...] = (
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-store"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
)


DRAIN_SECONDS = 2.0


# How often the served page fetches itself again when it hears no change notice (the scan
# cache decides what is new); a page that follows /api/events refreshes on each change.
REFRESH_SECONDS = 10


_PAGE_CSP = "frame-ancestors 'none'"


_OTHER_CSP = "default-src 'none'; frame-ancestors 'none'"


@dataclass
class Scanned:
    """One scan and the response bodies rendered from it (each rendered once)."""

    snapshot: Snapshot
    started: float
    finished: float
    _bodies: dict[str, bytes] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def body(self, kind: str, render: Callable[[Snapshot], bytes]) -> bytes:
        """Return the ``kind`` body, rendering it on first use."""
        with self._lock:
            if kind not in self._bodies:
                self._bodies[kind] = render(self.snapshot)
            return self._bodies[kind]


class ScanPending(Exception):
    """The first scan is still running after the wait; there is nothing to show yet."""


class SnapshotCache:
    """The latest scan, shared by every request; at most one scan runs at a time.

    A request waits at most ``wait`` seconds for a running scan; then it takes the previous
    scan (or ScanPending before the first), so a slow fleet never stalls the page or /health.
    """

    def __init__(
        self,
        scan_fleet: Callable[[], Snapshot],
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
        wait: float | None = None,
    ) -> None:
        self._scan = scan_fleet
        self._max_age = max_age
        self._clock = clock
        self._wait = wait
        self._lock = threading.Lock()
        self._latest: Scanned | None = None
        self._stale = False
        self.scans = 0

    def invalidate(self, *_: object) -> None:
        """The fleet changed: the next request scans again (once, for everyone waiting)."""
        self._stale = True

    def get(self, arrived: float) -> tuple[Scanned, bool]:
        """Return a usable scan for a request that arrived at ``arrived``; True if it scanned.

        A scan is usable while younger than ``max_age``, and also when it began after the
        request arrived: everyone queued behind a running scan takes its result.
        """
        if not self._lock.acquire(timeout=-1 if self._wait is None else self._wait):
            if self._latest is None:
                raise ScanPending
            return self._latest, False
        try:
            latest = self._latest
            if latest is not None and (
                latest.started >= arrived
                or (not self._stale and self._clock() - latest.finished < self._max_age)
            ):
                return latest, False
            self._stale = False
            started = self._clock()
            snap = self._scan()
            self._latest = Scanned(snap, started, self._clock())
            self.scans += 1
            return self._latest, True
        finally:
            self._lock.release()


@dataclass(frozen=True)
class Response:
    """What to send back; ``note`` only goes to the request log."""

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    note: str = ""

    def all_headers(self) -> list[tuple[str, str]]:
        """Every header line to send, in order."""
        csp = _PAGE_CSP if self.content_type == _HTML else _OTHER_CSP
        length = [] if self.content_type == _EVENTS else [("Content-Length", str(len(self.body)))]
        return [
            ("Content-Type", self.content_type),
            *length,
            *_COMMON_HEADERS,
            ("Content-Security-Policy", csp),
            *self.headers,
        ]


def _text(status: int, message: str, *headers: tuple[str, str], note: str = "") -> Response:
    return Response(status, _TEXT, (message + "\n").encode("utf-8"), tuple(headers), note)


def health_document(snap: Snapshot) -> dict[str, Any]:
    """The /health body: ok when some instance answered (or none is configured)."""
    reachable = sum(1 for i in snap.instances if i.reachable)
    return {
        "ok": reachable > 0 or not snap.instances,
        "instances": len(snap.instances),
        "reachable": reachable,
    }


class Viewer:
    """Turns one request into one response; all policy lives here, no sockets."""

    def __init__(
        self,
        cache: SnapshotCache,
        *,
        title: str,
        password: str | None,
        clock: Callable[[], float] = time.monotonic,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        autopilot: Callable[[int, Lang, Snapshot], Any] | None = None,
        language: str = "auto",
        links: Callable[[list[str]], Any] | None = None,
        tasks: Callable[[], dict[str, str]] | None = None,
        refresh_seconds: int = REFRESH_SECONDS,
        redact: Callable[[str], str] = str,
    ) -> None:
        self._cache = cache
        self._redact = redact
        self._autopilot = autopilot
        self._language = language
        self._links = links
        self._tasks = tasks
        self._refresh = refresh_seconds
        self._title = title
        self._password = password
        self._clock = clock
        self._now_ms = now_ms

    def respond(self, method: str, target: str, header: Callable[[str], str | None]) -> Response:
        """Answer ``method target``; ``header(name)`` reads a request header."""
        arrived = self._clock()
        if self._password is None:
            # Loopback without a password: a page on another site that re-points its own
            # name at 127.0.0.1 (DNS rebinding) would send that name in Host; refuse it.
            host = header("Host")
            if host and not is_loopback(host_header_name(host)):
                return _text(403, "this viewer only answers to a loopback host name",
                             note="wrong Host")
        elif not basic_auth_ok(header("Authorization"), self._password):
            return _text(401, "log in with the viewer password (any user name)",
                         ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"'),
                         note="no or wrong credentials")
        if method not in ("GET", "HEAD"):
            return _text(405, "read-only: only GET and HEAD", ("Allow", "GET, HEAD"))
        parts = urlsplit(target)
        path = parts.path
        if path not in _ROUTES:
            return _text(404, "not found; try / or /api/snapshot or /health")
        if path == _EVENTS_ROUTE:
            return Response(200, _EVENTS, b"", note="change notices")
        try:
            scanned, fresh = self._cache.get(arrived)
        except ScanPending:
            if path == "/health":
                body = b'{"ok": false, "scanning": true}\n'
                return Response(503, _JSON, body, (("Retry-After", "5"),), "first scan running")
            return _text(503, "the first scan of the fleet is still running; try again soon",
                         ("Retry-After", "5"), note="first scan running")
        reachable = sum(1 for i in scanned.snapshot.instances if i.reachable)
        note = (
            f"scanned, {reachable} of {len(scanned.snapshot.instances)} answering"
            if fresh
            else f"cached {self._clock() - scanned.finished:.1f}s"
        )
        if path in _PAGE_ROUTES:
            asked = parse_qs(parts.query).get("lang", [""])[0]
            lang = pick_language(
                asked if asked in LANGS else self._language, header("Accept-Language")
            )
            # Links to a loopback instance only work for a reader on this very machine.
            host = header("Host") or ""
            local = self._password is None or is_loopback(host_header_name(host))
            body = scanned.body(
                f"page:{lang}:{int(local)}", lambda snap: self._page(snap, lang, local)
            )
            return Response(
                200,
                _HTML,
                body,
                (("Content-Language", "zh-CN" if lang == "zh" else "en"),
                 ("Vary", "Accept-Language")),
                note=note,
            )
        if path == "/api/snapshot":
            return Response(200, _JSON, scanned.body("json", self._json), note=note)
        doc = health_document(scanned.snapshot)
        body = (json.dumps(doc) + "\n").encode("utf-8")
        return Response(200 if doc["ok"] else 503, _JSON, body, note=note)

    def _page(self, snap: Snapshot, lang: Lang = "en", local: bool = True) -> bytes:
        from xaf_hub.page import export as report

        # Ages are relative to the scan: the page says what the scan saw, when it saw it
        # (the page's script then keeps them current).
        now = snap.generated_at or self._now_ms()
        panel = self._autopilot(now, lang, snap) if self._autopilot is not None else None
        links: dict[str, Any] = {}
        if self._links is not None:
            found = self._links([i.name for i in snap.instances if i.reachable])
            links = {n: ui for n, ui in found.items() if local or not ui.loopback}
        html = report.render_html(
            snap,
            now_ms=now,
            title=self._title,
            autopilot=panel,
            lang=lang,
            live_seconds=self._refresh,
            links=links,
            tasks=self._tasks() if self._tasks is not None else None,
        )
        return self._redact(html).encode("utf-8")

    def _json(self, snap: Snapshot) -> bytes:
        from xaf_hub.page import export as report

        # Byte for byte what `sessions --json` prints for the same snapshot.
        return (self._redact(dumps(report.snapshot_document(snap))) + "\n").encode("utf-8")


class RequestLog:
    """One line per request to a stream shared by every request thread."""

    def __init__(self, stream: TextIO, redact: Callable[[str], str] = str) -> None:
        self._stream = stream
        self._redact = redact
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._lock:
            print(f"{stamp} {self._redact(text)}", file=self._stream, flush=True)


class _Deadlined:
    """A viewer's socket file whose every write has the guard's write deadline."""

    def __init__(self, out: Any, guard: ConnectionGuard, sock: socket.socket) -> None:
        self._out, self._guard, self._sock = out, guard, sock

    def write(self, data: bytes, /) -> Any:
        with self._guard.writing(self._sock):
            return self._out.write(data)

    def flush(self) -> Any:
        with self._guard.writing(self._sock):
            return self._out.flush()


class PageServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a scan in flight must not hold up Ctrl+C
    request_queue_size = 64
    feed: ChangeFeed | None = None  # change notices for /api/events (page.notices)
    # Starts the follower on the first /api/events viewer: no listener, no stream traffic.
    feed_factory: Callable[[], ChangeFeed] | None = None
    _feed_lock = threading.Lock()

    def change_feed(self) -> ChangeFeed | None:
        """The shared follower, started when the first page asks for change notices."""
        with self._feed_lock:
            if self.feed is None and self.feed_factory is not None:
                self.feed = self.feed_factory()
            return self.feed

    def __init__(
        self,
        address: tuple[str, int],
        viewer: Viewer,
        log: RequestLog,
        guard: ConnectionGuard | None = None,
    ) -> None:
        self.viewer = viewer
        self.log = log
        self.guard = guard or ConnectionGuard()
        self.answer_seconds = ANSWER_SECONDS
        self.stream_seconds = STREAM_SECONDS
        self._active = 0
        self._idle = threading.Condition()
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, PageHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would reverse-resolve the host (slow, and useless here).
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.guard.admit(request):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.guard.release(request)

    def begin(self) -> None:
        with self._idle:
            self._active += 1

    def end(self) -> None:
        with self._idle:
            self._active -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for requests in flight; return whether none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def handle_error(self, request: Any, client_address: Any) -> None:
        peer = client_address[0] if isinstance(client_address, tuple) else "?"
        self.log.line(f"{peer} connection error (ignored)")


class PageHandler(http.server.BaseHTTPRequestHandler):
    # Per read; the guard's deadline bounds the whole request (a slow-loris client).
    timeout = REQUEST_SECONDS

    def version_string(self) -> str:
        return "xaf-hub"  # no Python version on the wire

    def _handle(self) -> None:
        server = cast(PageServer, self.server)
        # The request has arrived: time now for the scan wait and for sending the answer.
        server.guard.extend(self.connection, server.answer_seconds)
        server.begin()
        try:
            self._answer(server)
        finally:
            server.end()

    def _answer(self, server: PageServer) -> None:
        started = time.monotonic()
        try:
            response = server.viewer.respond(self.command, self.path, self.headers.get)
        except Exception as exc:  # noqa: BLE001 - one bad scan must not stop the viewer
            response = _text(500, "internal error while scanning the fleet",
                              note=f"error: {type(exc).__name__}")
        feed = server.change_feed() if response.content_type == _EVENTS else None
        if response.content_type == _EVENTS and feed is None:
            response = _text(404, "change notices are off")
        elif feed is not None and not server.guard.to_viewer(self.connection):
            feed = None
            response = _text(
                503, "too many change-notice viewers; the page refreshes on its timer",
                ("Retry-After", "30"), note="viewers full",
            )
        try:
            self.send_response(response.status)
            for name, value in response.all_headers():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD" and response.content_type == _EVENTS and feed is not None:
                self.close_connection = True
                # A change-notice stream: no answer deadline, but one per write, a small
                # send buffer (a viewer that stops reading blocks a write after a few KB)
                # and a longest life, after which the browser reconnects.
                with contextlib.suppress(OSError):
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, VIEWER_SNDBUF)
                out = _Deadlined(self.wfile, server.guard, self.connection)
                why = feed.stream(out, seconds=server.stream_seconds)
                response = replace(response, note=why)
            elif self.command != "HEAD":
                self.wfile.write(response.body)
        except (BrokenPipeError, ConnectionResetError):
            response = replace(response, note="client went away")
        took = (time.monotonic() - started) * 1000
        note = f" ({response.note})" if response.note else ""
        server.log.line(
            f"{self.client_address[0]} {printable(self.command, 10)} {printable(self.path)} "
            f"{response.status} {len(response.body)}B {took:.0f}ms{note}"
        )

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = _handle  # noqa: N815

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # _handle writes the one line per request itself

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        # Only malformed requests get here (send_error); log them, escaped.
        cast(PageServer, self.server).log.line(
            f"{self.client_address[0]} {printable(format % args)}"
        )


def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def start_feed(
    cfg: Config, transport_factory: TransportFactory | None, cache: SnapshotCache, log: RequestLog
) -> ChangeFeed:
    """The change notices of every open page: one follower of the fleet, started on the first
    viewer; each change marks the cached scan stale and is logged in the words `watch` uses."""
    from xaf_hub.fleet.events import FleetEvent, following_words
    from xaf_hub.page.notices import ChangeFeed

    def note(ev: FleetEvent) -> None:
        line = following_words(ev)
        if line is not None:
            log.line(line)

    feed = ChangeFeed(cfg, transport_factory=transport_factory)
    feed.on_change.append(cache.invalidate)
    feed.on_change.append(note)
    feed.start()
    return feed
