"""Loopback HTTP servers for the tests: a threaded server base, request forwarding, and a
forwarding proxy that can hold chosen requests back (to freeze a client mid-step)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable
from typing import Literal, Self

import httpx

# Hop-by-hop and length headers are the forwarding server's own business.
_NOT_FORWARDED = ("host", "content-length", "connection")
_NOT_RETURNED = ("content-length", "transfer-encoding", "connection", "content-encoding")


class QuietServer(http.server.ThreadingHTTPServer):
    """A threaded server that keeps a deep accept queue and stays quiet about dropped clients."""

    # The hub fans out up to 16 requests per instance: a 5-deep backlog drops SYNs.
    request_queue_size = 128
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients that are killed or time out mid-request are the point of these servers


class LoopbackServer:
    """Serve ``handler`` on 127.0.0.1 in a thread while inside ``with``.

    ``released`` is set by ``release()`` and on the way out, so handlers that wait on it end.
    """

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.released = threading.Event()
        self.server = QuietServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def release(self) -> None:
        self.released.set()

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def read_body(handler: http.server.BaseHTTPRequestHandler) -> bytes:
    """The request body (by content-length)."""
    length = int(handler.headers.get("content-length") or 0)
    return handler.rfile.read(length) if length else b""


def forward(
    handler: http.server.BaseHTTPRequestHandler, target: str, body: bytes, timeout: float
) -> httpx.Response:
    """Send the handler's request, with ``body``, to ``target`` and return the answer."""
    headers = {k: v for k, v in handler.headers.items() if k.lower() not in _NOT_FORWARDED}
    with httpx.Client(timeout=timeout) as c:
        return c.request(handler.command, target + handler.path, content=body, headers=headers)


def send_back(
    handler: http.server.BaseHTTPRequestHandler, r: httpx.Response, *, all_headers: bool = True
) -> None:
    """Answer the handler's client with ``r`` (its headers, or only its content type)."""
    handler.send_response(r.status_code)
    if all_headers:
        for k, v in r.headers.items():
            if k.lower() not in _NOT_RETURNED:
                handler.send_header(k, v)
    elif r.headers.get("content-type"):
        handler.send_header("content-type", r.headers["content-type"])
    handler.send_header("content-length", str(len(r.content)))
    handler.end_headers()
    handler.wfile.write(r.content)


# What a StallProxy does with a request it holds (see StallProxy).
StallMode = Literal["forward", "drop", "hold-answer"]


class StallProxy(LoopbackServer):
    """Forward everything to ``target``, but hold the requests for which ``stall(method, path)``
    is true until ``release()`` (or the end of ``with``). What a held request becomes:

    * ``"forward"``: forwarded on release (its sender was only slow);
    * ``"drop"``: never forwarded; on release its connection is closed unanswered (its sender
      died before the request left: the server never hears of it);
    * ``"hold-answer"``: forwarded at once, its answer held until release (the server acted on
      it; its sender hears of it late, or never).
    """

    def __init__(
        self, target: str, stall: Callable[[str, str], bool], mode: StallMode = "forward"
    ) -> None:
        self.target = target.rstrip("/")
        self.stall = stall
        self.mode = mode
        self.stalled = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = read_body(self)
                if not proxy.stall(self.command, self.path):
                    send_back(self, forward(self, proxy.target, body, timeout=30))
                    return
                answer = None
                if proxy.mode == "hold-answer":
                    answer = forward(self, proxy.target, body, timeout=30)
                proxy.stalled.set()
                proxy.released.wait()
                if proxy.mode == "drop":
                    self.close_connection = True
                    return
                send_back(self, answer or forward(self, proxy.target, body, timeout=30))

            do_GET = do_POST = do_DELETE = do_PATCH = _forward  # noqa: N815 - stdlib names

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)


class DelayProxy(LoopbackServer):
    """Forward everything to ``target``; a request for which ``delay(method, path)`` is above 0
    waits that many seconds first (a slow link), and is forwarded even if its sender gave up
    meanwhile (the late packet still lands). ``delayed`` is set when one starts waiting."""

    def __init__(self, target: str, delay: Callable[[str, str], float]) -> None:
        self.target = target.rstrip("/")
        self.delayed = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = read_body(self)
                seconds = proxy.delay_for(self.command, self.path)
                if seconds > 0:
                    proxy.delayed.set()
                    proxy.released.wait(seconds)
                send_back(self, forward(self, proxy.target, body, timeout=60))

            do_GET = do_POST = do_DELETE = do_PATCH = _forward  # noqa: N815 - stdlib names

            def log_message(self, *args: object) -> None:
                pass

        self.delay_for = delay
        super().__init__(Handler)
