"""Small loopback servers that fail the way real instances fail, for the fault matrix.

One ``FaultServer`` (a ThreadingHTTPServer) whose behaviour is chosen by ``mode``:

* ``401``       every request is refused with 401 and an empty body, like opencode with a
                wrong password;
* ``500``       every request answers 500 with a JSON error body;
* ``truncated`` ``/global/health`` is fine; every other answer announces its full length and
                is cut off mid-JSON (the connection closes);
* ``html``      every request answers 200 with an HTML page (opencode's web-UI fallback for a
                wrong URL or path prefix);
* ``shape``     a healthy ``/global/health``, then JSON of the wrong shape everywhere else;
* ``slow``      forwards everything to a real opencode server, but ``/session/status`` is held
                back (far longer than any client timeout) before it is forwarded.

Plus the faults that are not HTTP at all: ``HangServer`` accepts TCP connections and never
answers; ``RefusedPort`` is a port bound but not listening (connections are refused, and no
other process can take the port meanwhile); ``DNS_URL`` names a host that cannot resolve.
``FaultKit`` starts one of each and hands out the URL per fault name.

``StepProxy`` is the crash-test tool: it forwards to a real server, records every request, and
can hold one chosen request back before forwarding it (then drop it) or before answering it,
so a client can be killed at an exact step.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
from collections.abc import Callable, Iterator

import httpx

from sandbox.fake_llm import Running
from tests.e2e.proxy import LoopbackServer, forward, read_body, send_back

FAULTS = ("refused", "dns", "hang", "401", "500", "truncated", "html", "shape", "slow")
DNS_URL = "http://xaf-hub-fault.invalid:4096"
HTML_PAGE = b"<!doctype html><html><head><title>opencode</title></head><body>app</body></html>"


class FaultServer(LoopbackServer):
    """A loopback HTTP server that answers every request with the fault named by ``mode``."""

    def __init__(self, mode: str, target: str = "", hold: float = 60.0) -> None:
        self.mode = mode
        self.target = target.rstrip("/")
        self.hold = hold
        self.hits: list[tuple[str, str]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                body = read_body(self)
                server.hits.append((self.command, self.path))
                getattr(self, "_" + {"401": "unauthorized", "500": "error"}.get(mode, mode))(body)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _answer  # noqa: N815 - stdlib names

            def _send(self, status: int, ctype: str, payload: bytes, length: int = -1) -> None:
                self.send_response(status)
                if ctype:
                    self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(payload) if length < 0 else length))
                self.end_headers()
                self.wfile.write(payload)

            def _unauthorized(self, body: bytes) -> None:
                self.send_response(401)
                self.send_header("www-authenticate", 'Basic realm="Secure Area"')
                self.send_header("content-length", "0")
                self.end_headers()

            def _error(self, body: bytes) -> None:
                doc = {"name": "UnknownError", "data": {"message": "internal failure"}}
                self._send(500, "application/json", json.dumps(doc).encode())

            def _health(self) -> bool:
                if self.path.split("?", 1)[0] != "/global/health":
                    return False
                self._send(200, "application/json", b'{"healthy":true,"version":"0.0.0-fault"}')
                return True

            def _truncated(self, body: bytes) -> None:
                if self._health():
                    return
                full = json.dumps(
                    [{"id": f"ses_cut{i}", "title": "cut", "directory": "/x"} for i in range(20)]
                ).encode()
                self._send(200, "application/json", full[: len(full) // 2], length=len(full))
                self.close_connection = True

            def _html(self, body: bytes) -> None:
                self._send(200, "text/html; charset=utf-8", HTML_PAGE)

            def _shape(self, body: bytes) -> None:
                if self._health():
                    return
                # Valid JSON, wrong shape: an object where a list belongs and vice versa.
                path = self.path.split("?", 1)[0]
                doc: object = {"sessions": "not a list"} if path.endswith("/session") else [1, 2]
                self._send(200, "application/json", json.dumps(doc).encode())

            def _slow(self, body: bytes) -> None:
                if self.path.startswith("/session/status"):
                    server.released.wait(server.hold)
                try:
                    r = forward(self, server.target, body, timeout=30)
                except httpx.HTTPError:
                    self._send(502, "text/plain", b"bad gateway")
                    return
                send_back(self, r, all_headers=False)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)


class HangServer:
    """Accept every TCP connection and never send a byte (nor read one)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.held.append(conn)  # kept open so the client waits for an answer

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self) -> HangServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        for conn in self.held:
            conn.close()
        self.sock.close()


class RefusedPort:
    """A loopback port that refuses connections: bound (so nobody else takes it), not listening."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self) -> RefusedPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


class FaultKit(Running):
    """One server per fault, started together; ``url(fault)`` is where that fault lives."""

    def __init__(self, slow_target: str) -> None:
        self.slow_target = slow_target
        self.stack = contextlib.ExitStack()
        self.urls: dict[str, str] = {}
        self.servers: dict[str, FaultServer] = {}

    def start(self) -> None:
        self.urls["refused"] = self.stack.enter_context(RefusedPort()).url
        self.urls["dns"] = DNS_URL
        self.urls["hang"] = self.stack.enter_context(HangServer()).url
        for mode in ("401", "500", "truncated", "html", "shape", "slow"):
            srv = self.stack.enter_context(FaultServer(mode, target=self.slow_target))
            self.servers[mode] = srv
            self.urls[mode] = srv.url

    def stop(self) -> None:
        self.stack.close()

    def url(self, fault: str) -> str:
        return self.urls[fault]


@contextlib.contextmanager
def fault_kit(slow_target: str) -> Iterator[FaultKit]:
    """Start every fault server for the duration of a ``with`` block."""
    with FaultKit(slow_target) as kit:
        yield kit


Match = Callable[[str, str], bool]


class StepProxy(LoopbackServer):
    """Forward to ``target``, recording (method, path) in ``hits``.

    A request matching ``before`` is held until ``release()`` and then dropped, never
    forwarded (its sender died before sending it); one matching ``after`` is forwarded and its
    answer held until ``release()`` (its sender died waiting for the answer); one matching
    ``refuse`` is answered 400 without being forwarded; one matching ``pause`` is held until
    ``release()`` and then forwarded as usual (a slow link: the sender is still waiting).
    """

    def __init__(
        self,
        target: str,
        *,
        before: Match | None = None,
        after: Match | None = None,
        refuse: Match | None = None,
        pause: Match | None = None,
    ):
        self.target = target.rstrip("/")
        self.held = threading.Event()
        self.hits: list[tuple[str, str]] = []
        proxy = self

        def hold() -> None:
            proxy.held.set()
            proxy.released.wait()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = read_body(self)
                proxy.hits.append((self.command, self.path))
                if before is not None and before(self.command, self.path):
                    hold()
                    self.close_connection = True
                    return  # its sender was killed before the request left the machine
                if pause is not None and pause(self.command, self.path):
                    hold()
                if refuse is not None and refuse(self.command, self.path):
                    doc = {"name": "BadRequest", "data": {"message": "refused by the test"}}
                    payload = json.dumps(doc).encode()
                    self.send_response(400)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                r = forward(self, proxy.target, body, timeout=60)
                if after is not None and after(self.command, self.path):
                    hold()
                send_back(self, r, all_headers=False)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _forward  # noqa: N815 - stdlib

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)

    def writes(self) -> list[tuple[str, str]]:
        """Every request that could change the server (anything but GET/HEAD)."""
        return [(m, p) for m, p in self.hits if m not in ("GET", "HEAD")]
