"""Serve the overview page over HTTP, rescanning the fleet at most every few seconds.

Read-only: the server lists sessions and nothing else; it never dispatches, deletes or
interrupts. Routes: `/` (the same page as `sessions --html`, in the browser's language, and
fetching itself again every few seconds), `/api/snapshot` (the same JSON as
`sessions --json`), `/api/events` (server-sent change notices) and `/health`. However many
people refresh, the fleet is scanned at most once per --cache-seconds, and requests that
arrive during a scan share it. One follower of the servers' event streams serves every open
page: a change marks the cached scan stale and notifies the pages, which can fetch
`/api/snapshot` again at once.

It listens on loopback only, unless --public is given AND a viewer password is set in the
environment variable XAF_HUB_VIEWER_PASSWORD; then every request must log in (any user name,
that password). The password crosses the network as plain HTTP: use --public on a trusted
network, or put a TLS reverse proxy in front.
"""

from __future__ import annotations

import argparse
import http.server
import json
import math
import signal
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO, cast
from urllib.parse import parse_qs, urlsplit

from xaf_hub.cli.commands._common import scan
from xaf_hub.cli.context import Context
from xaf_hub.core.records import Snapshot
from xaf_hub.core.text import dumps
from xaf_hub.errors import UsageError
from xaf_hub.page.serve_checks import MIN_PASSWORD_LENGTH as MIN_PASSWORD_LENGTH
from xaf_hub.page.serve_checks import VIEWER_PASSWORD_ENV as VIEWER_PASSWORD_ENV
from xaf_hub.page.serve_checks import basic_auth_ok as basic_auth_ok
from xaf_hub.page.serve_checks import check_exposure as check_exposure
from xaf_hub.page.serve_checks import host_header_name as host_header_name
from xaf_hub.page.serve_checks import is_loopback as is_loopback
from xaf_hub.page.serve_checks import printable as printable
from xaf_hub.page.serve_limits import ANSWER_SECONDS, REQUEST_SECONDS, ConnectionGuard
from xaf_hub.page.view import QUIET_REFRESH_FACTOR
from xaf_hub.page.words import LANGS, Lang, pick_language

if TYPE_CHECKING:  # the follower pulls in httpx; --help must stay light
    from xaf_hub.page.notices import ChangeFeed

EXAMPLES = """\
examples:
  xaf-hub serve                                  # http://127.0.0.1:7317/ on this machine only
  xaf-hub serve --port 0                         # any free port; the URL is printed
  XAF_HUB_VIEWER_PASSWORD='long shared secret' xaf-hub serve --public --host 0.0.0.0
routes: /  (the page)   /api/snapshot  (same JSON as `sessions --json`)   /api/events  (change
notices, server-sent events)   /health
Ctrl+C stops it.
"""

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
_DRAIN_SECONDS = 2.0
# How often the served page fetches itself again when it hears no change notice (the scan
# cache decides what is new); a page that follows /api/events refreshes on each change.
REFRESH_SECONDS = 10
_PAGE_CSP = "frame-ancestors 'none'"
_OTHER_CSP = "default-src 'none'; frame-ancestors 'none'"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `serve`."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7317, help="port (default 7317; 0 picks a free one)")
    p.add_argument("--cache-seconds", type=float, default=5.0, metavar="S",
                   help="reuse a scan for S seconds before scanning again (default 5)")
    p.add_argument("--refresh-seconds", type=int, default=REFRESH_SECONDS, metavar="S",
                   help="an open page fetches itself every S seconds when its change notices "
                        f"are cut off, every {QUIET_REFRESH_FACTOR}xS while they flow (it also "
                        f"refreshes at once on each change; default {REFRESH_SECONDS})")
    p.add_argument("--public", action="store_true",
                   help=f"allow a non-loopback --host; requires ${VIEWER_PASSWORD_ENV}")


# --------------------------------------------------------------------------- the cache


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


# --------------------------------------------------------------------------- routing


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


# --------------------------------------------------------------------------- HTTP server


class _RequestLog:
    """One line per request to a stream shared by every request thread."""

    def __init__(self, stream: TextIO, redact: Callable[[str], str] = str) -> None:
        self._stream = stream
        self._redact = redact
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._lock:
            print(f"{stamp} {self._redact(text)}", file=self._stream, flush=True)


class _Server(http.server.ThreadingHTTPServer):
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
        log: _RequestLog,
        guard: ConnectionGuard | None = None,
    ) -> None:
        self.viewer = viewer
        self.log = log
        self.guard = guard or ConnectionGuard()
        self.answer_seconds = ANSWER_SECONDS
        self._active = 0
        self._idle = threading.Condition()
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)

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


class _Handler(http.server.BaseHTTPRequestHandler):
    # Per read; the guard's deadline bounds the whole request (a slow-loris client).
    timeout = REQUEST_SECONDS

    def version_string(self) -> str:
        return "xaf-hub"  # no Python version on the wire

    def _handle(self) -> None:
        server = cast(_Server, self.server)
        # The request has arrived: time now for the scan wait and for sending the answer.
        server.guard.extend(self.connection, server.answer_seconds)
        server.begin()
        try:
            self._answer(server)
        finally:
            server.end()

    def _answer(self, server: _Server) -> None:
        started = time.monotonic()
        try:
            response = server.viewer.respond(self.command, self.path, self.headers.get)
        except Exception as exc:  # noqa: BLE001 - one bad scan must not stop the viewer
            response = _text(500, "internal error while scanning the fleet",
                              note=f"error: {type(exc).__name__}")
        feed = server.change_feed() if response.content_type == _EVENTS else None
        if response.content_type == _EVENTS and feed is None:
            response = _text(404, "change notices are off")
        try:
            self.send_response(response.status)
            for name, value in response.all_headers():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD" and response.content_type == _EVENTS and feed is not None:
                self.close_connection = True
                # A change-notice stream lives as long as its page: no answer deadline. It
                # still counts against the connection cap, and a viewer that stops reading
                # is dropped by the socket's write timeout within a keep-alive or two.
                server.guard.extend(self.connection, math.inf)
                response = replace(response, note=feed.stream(self.wfile))
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
        cast(_Server, self.server).log.line(
            f"{self.client_address[0]} {printable(format % args)}"
        )


class _Stop(Exception):
    """Raised from the SIGTERM handler to leave serve_forever."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def _start_feed(ctx: Context, cache: SnapshotCache, log: _RequestLog) -> ChangeFeed:
    from xaf_hub.fleet.events import FleetEvent, following_words
    from xaf_hub.page.notices import ChangeFeed

    def note(ev: FleetEvent) -> None:
        line = following_words(ev)
        if line is not None:
            log.line(line)

    feed = ChangeFeed(ctx.config, transport_factory=ctx.transport_factory)
    feed.on_change.append(cache.invalidate)
    feed.on_change.append(note)
    feed.start()
    return feed


def run(ctx: Context) -> int:
    """Serve until Ctrl+C or SIGTERM."""
    args = ctx.args
    if not 0 <= args.port <= 65535:
        raise UsageError("--port must be between 0 and 65535")
    if not args.cache_seconds >= 0:
        raise UsageError("--cache-seconds must be 0 or more")
    if not 1 <= args.refresh_seconds <= 86400:
        raise UsageError("--refresh-seconds must be between 1 and 86400")
    password = ctx.env.get(VIEWER_PASSWORD_ENV) or None
    check_exposure(args.host, args.public, password)
    cfg = ctx.config
    instances = list(cfg.instances)
    # No request waits for a scan longer than one instance's scan deadline.
    cache = SnapshotCache(
        lambda: scan(ctx, instances, outcomes=True)[0], args.cache_seconds, wait=cfg.scan_timeout
    )
    from xaf_hub.fleet.web_ui import Finder
    from xaf_hub.page import autopilot as overview

    viewer = Viewer(
        cache,
        title=cfg.project_name,
        password=password if args.public else None,
        autopilot=lambda now, lang, snap: overview.build(
            cfg, now, lang, {(s.instance, s.id): s for s in snap.sessions}
        ),
        language=cfg.page_language,
        links=Finder(cfg, ctx.transport_factory),
        tasks=lambda: overview.task_ids_by_session(cfg),
        refresh_seconds=args.refresh_seconds,
        redact=ctx.redact,
    )
    log = _RequestLog(ctx.stderr, ctx.redact)
    try:
        server = _Server((args.host, args.port), viewer, log)
        server.answer_seconds = cfg.scan_timeout + ANSWER_SECONDS
        server.feed_factory = lambda: _start_feed(ctx, cache, log)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {reason}") from exc
    restore: Any = None
    if threading.current_thread() is threading.main_thread():
        restore = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        url = _url(server.server_name, server.server_port)
        ctx.out(url)  # stdout holds only the URL, for scripts
        ctx.stdout.flush()
        login = " (log in with any user name and the viewer password)" if args.public else ""
        ctx.info(f"serving the overview of {len(instances)} instance(s) at {url}{login}; "
                 f"read-only, rescans at most every {args.cache_seconds:g}s; Ctrl+C stops")
        if args.host in ("0.0.0.0", "::"):
            ctx.info(f"colleagues open {_url(socket.gethostname(), server.server_port)}")
        server.guard.start()
        server.serve_forever(poll_interval=0.5)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        server.guard.stop()
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)
        server.server_close()
        if server.feed is not None:
            server.feed.close()  # ends every open /api/events stream
    # Let answers already on their way finish (and log); a scan in flight is not waited for.
    if not server.wait_idle(_DRAIN_SECONDS):
        ctx.info("stopped with requests still in flight")
        return 0
    ctx.info("stopped")
    return 0
