"""The served overview page: routes, the scan cache, who may see it and what a request may cost.

The figures of every limit are declared here and kept by ``page.asgi``; the page is loopback-only
unless ``--public`` with a viewer password (docs/overview-page.md, docs/architecture.md §6.2).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO
from urllib.parse import parse_qs, urlsplit

from xaf_hub.config.load import Config
from xaf_hub.config.watch import ConfigState
from xaf_hub.core.catalogue import LANGS, Lang, text
from xaf_hub.core.records import Snapshot
from xaf_hub.core.text import dumps
from xaf_hub.errors import UsageError
from xaf_hub.fleet.events import FleetEvent, following_words
from xaf_hub.fleet.scan import TransportFactory
from xaf_hub.page import export as report
from xaf_hub.page.notices import ChangeFeed
from xaf_hub.page.words import pick_language

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
        check_secret(VIEWER_PASSWORD_ENV, password, MIN_PASSWORD_LENGTH,
                     f"--public needs a viewer password: set {VIEWER_PASSWORD_ENV} (colleagues "
                     "log in with any user name and that password)")
    elif not is_loopback(host):
        raise UsageError(
            f"refusing to listen on {host}: without --public only a loopback address "
            f"(127.0.0.1, ::1, localhost) is allowed; to let colleagues in, set "
            f"{VIEWER_PASSWORD_ENV} and add --public"
        )


def check_secret(variable: str, value: str | None, least: int, missing: str) -> None:
    """Refuse a secret from the environment variable ``variable`` that is unset (UsageError
    ``missing``) or shorter than ``least`` characters."""
    if not value:
        raise UsageError(missing)
    if len(value) < least:
        raise UsageError(f"{variable} is too short: use at least {least} characters")


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


@dataclass(frozen=True)
class Limits:
    """What one connection may cost: the page's figures, kept by ``page.asgi``."""

    # Change-notice streams open at once; past it a 503 and the page keeps its timer.
    max_viewers: int = 32
    # Open connections, the change-notice streams included: uvicorn's ``limit_concurrency``. A
    # request made while this many are open (its own counted) is answered 503 at once, and a
    # connection past it gets the same 503 and is closed, so a crowd holds no more sockets than
    # this. Enough for a team refreshing a page (64), beside every viewer's stream.
    max_connections: int = 64 + 32
    # A request line and its headers still incomplete, at most (h11's maximum incomplete
    # event): what a client sending its head in pieces can make the server hold; past it a 400.
    max_head_bytes: int = 16384
    # Time a client has to send its whole request (a browser needs milliseconds): a slow-loris
    # client dribbling its headers is cut then.
    request_seconds: float = 10.0
    # Time to send the answer once the request is in (a page of thousands of rows is a few MB);
    # serve adds the scan deadline, which a request may spend waiting for a scan.
    answer_seconds: float = 20.0
    # A write that has not reached the client's socket after this (a client that stopped
    # reading, a change-notice viewer included) ends its connection.
    write_seconds: float = 10.0
    # A stream's longest life: then it ends and the browser reconnects (EventSource, 3 s later),
    # so a viewer that never reads holds its place at most this long, however little is sent.
    stream_seconds: float = 300.0
    # A kept-alive connection with no next request is closed after this (uvicorn's
    # ``timeout_keep_alive``).
    idle_seconds: int = 5
    # A viewer's send buffers: small, so a viewer that stops reading stalls a write (and meets
    # the write deadline) after a few KB rather than megabytes.
    viewer_sndbuf: int = 16384
    # On Ctrl+C, answers under way get this long to finish (a scan in flight is not waited for).
    drain_seconds: int = 2


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


@dataclass(eq=False)
class SnapshotCache:
    """The latest scan, shared by every request; at most one scan runs at a time.

    A request waits at most ``wait`` seconds for a running scan; then it takes the previous
    scan (or ScanPending before the first), so a slow fleet never stalls the page or /health.
    """

    scan_fleet: Callable[[], Snapshot]
    max_age: float
    clock: Callable[[], float] = time.monotonic
    wait: float | None = None
    scans: int = field(default=0, init=False)
    _latest: Scanned | None = field(default=None, init=False)
    _stale: bool = field(default=False, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def invalidate(self, *_: object) -> None:
        """The fleet changed: the next request scans again (once, for everyone waiting)."""
        self._stale = True

    def get(self, arrived: float) -> tuple[Scanned, bool]:
        """Return a usable scan for a request that arrived at ``arrived``; True if it scanned.

        A scan is usable while younger than ``max_age``, and also when it began after the
        request arrived: everyone queued behind a running scan takes its result.
        """
        if not self._lock.acquire(timeout=-1 if self.wait is None else self.wait):
            if self._latest is None:
                raise ScanPending
            return self._latest, False
        try:
            latest = self._latest
            if latest is not None and (
                latest.started >= arrived
                or (not self._stale and self.clock() - latest.finished < self.max_age)
            ):
                return latest, False
            self._stale = False
            started = self.clock()
            snap = self.scan_fleet()
            self._latest = Scanned(snap, started, self.clock())
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

    @property
    def is_stream(self) -> bool:
        """Whether this answer opens a change-notice stream (its body comes later)."""
        return self.content_type == _EVENTS

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


@dataclass(kw_only=True, eq=False)
class Viewer:
    """Turns one request into one response; all policy lives here, no sockets."""

    cache: SnapshotCache = field(kw_only=False)
    title: str
    password: str | None
    clock: Callable[[], float] = time.monotonic
    now_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    autopilot: Callable[[int, Lang, Snapshot], Any] = lambda now, lang, snap: None  # no panel
    language: str = "auto"
    links: Callable[[list[str]], Any] = lambda names: {}  # each instance's web UI, by name
    tasks: Callable[[], dict[str, str]] = dict  # {session id: task id}
    refresh_seconds: int = REFRESH_SECONDS
    redact: Callable[[str], str] = str
    notes: Callable[[Lang], list[str]] = lambda lang: []  # what the page adds to the scan's notes
    projects: Sequence[str] = ()  # the projects the page shows apart (``Config.shown_projects``)
    named: Callable[[Any], Any] = lambda doc: doc  # the record as `sessions --json` names it

    def configure(
        self, title: str, language: str, links: Callable[[list[str]], Any],
        projects: Sequence[str] = (),
    ) -> None:
        """What a config read again changes: the page's title, its language, the links, the
        projects shown apart."""
        self.title, self.language, self.links, self.projects = title, language, links, projects

    def respond(self, method: str, target: str, header: Callable[[str], str | None]) -> Response:
        """Answer ``method target``; ``header(name)`` reads a request header."""
        arrived = self.clock()
        host = header("Host") or ""
        if self.password is None:
            # Loopback without a password: a page on another site that re-points its own
            # name at 127.0.0.1 (DNS rebinding) would send that name in Host; refuse it.
            if host and not is_loopback(host_header_name(host)):
                return _text(403, "this viewer only answers to a loopback host name",
                             note="wrong Host")
        elif not basic_auth_ok(header("Authorization"), self.password):
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
            scanned, fresh = self.cache.get(arrived)
        except ScanPending:
            if path == "/health":
                body = b'{"ok": false, "scanning": true}\n'
                return Response(503, _JSON, body, (("Retry-After", "5"),), "first scan running")
            return _text(503, "the first scan of the fleet is still running; try again soon",
                         ("Retry-After", "5"), note="first scan running")
        health = health_document(scanned.snapshot)
        note = (
            f"scanned, {health['reachable']} of {health['instances']} answering"
            if fresh
            else f"cached {self.clock() - scanned.finished:.1f}s"
        )
        if path in _PAGE_ROUTES:
            asked = parse_qs(parts.query).get("lang", [""])[0]
            lang = pick_language(
                asked if asked in LANGS else self.language, header("Accept-Language")
            )
            # Links to a loopback instance only work for a reader on this very machine.
            local = self.password is None or is_loopback(host_header_name(host))
            body = scanned.body(
                f"page:{lang}:{int(local)}", lambda snap: self._page(snap, lang, local)
            )
            language = ("Content-Language", "zh-CN" if lang == "zh" else "en")
            return Response(200, _HTML, body, (language, ("Vary", "Accept-Language")), note)
        if path == "/api/snapshot":
            return Response(200, _JSON, scanned.body("json", self._json), note=note)
        body = (json.dumps(health) + "\n").encode("utf-8")
        return Response(200 if health["ok"] else 503, _JSON, body, note=note)

    def _page(self, snap: Snapshot, lang: Lang = "en", local: bool = True) -> bytes:

        # Ages are relative to the scan: the page says what the scan saw, when it saw it
        # (the page's script then keeps them current).
        now = snap.generated_at or self.now_ms()
        snap = replace(snap, warnings=(*snap.warnings, *self.notes(lang)))
        found = self.links([i.name for i in snap.instances if i.reachable])
        links = {n: ui for n, ui in found.items() if local or not ui.loopback}
        html = report.render_html(
            snap,
            now_ms=now,
            title=self.title,
            autopilot=self.autopilot(now, lang, snap),
            lang=lang,
            live_seconds=self.refresh_seconds,
            links=links,
            tasks=self.tasks(),
            projects=self.projects,
        )
        return self.redact(html).encode("utf-8")

    def _json(self, snap: Snapshot) -> bytes:

        # Byte for byte what `sessions --json` prints for the same snapshot.
        snap = replace(snap, warnings=(*snap.warnings, *self.notes("en")))
        doc = self.named(report.snapshot_document(snap))
        return (self.redact(dumps(doc)) + "\n").encode("utf-8")


@dataclass(eq=False)
class RequestLog:
    """One line per request to a stream shared by every request thread."""

    stream: TextIO
    redact: Callable[[str], str] = str
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def line(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._lock:
            print(f"{stamp} {self.redact(text)}", file=self.stream, flush=True)


def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def config_notes(states: Sequence[tuple[str, ConfigState]], lang: Lang) -> list[str]:
    """What the page says of the config of each process that runs on: (who, as a key of
    ``page.words``; its state), in the reader's language."""
    return [line for who, state in states for line in state.words(text(lang, who), lang)]


def start_feed(
    cfg: Config, transport_factory: TransportFactory | None, cache: SnapshotCache, log: RequestLog,
    state: Callable[[], ConfigState | None] = lambda: None,
) -> ChangeFeed:
    """The change notices of every open page: one follower of the fleet, started on the first
    viewer; each change marks the cached scan stale and is logged in the words `watch` uses."""

    def note(ev: FleetEvent) -> None:
        if (line := following_words(ev)) is not None:
            log.line(line)

    feed = ChangeFeed(cfg, transport_factory=transport_factory, state=state)
    feed.on_change += [cache.invalidate, note]
    feed.start()
    return feed
