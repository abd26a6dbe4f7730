"""A loopback forwarding proxy that can hold chosen requests back (to freeze a client mid-step)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable

import httpx


class StallProxy:
    """Forward everything to ``target``; requests for which ``stall(method, path)`` is true wait
    until ``release()`` (or forever) before being forwarded."""

    def __init__(self, target: str, stall: Callable[[str, str], bool]) -> None:
        self.target = target.rstrip("/")
        self.stall = stall
        self.released = threading.Event()
        self.stalled = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                if proxy.stall(self.command, self.path):
                    proxy.stalled.set()
                    proxy.released.wait()
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "content-length", "connection")
                }
                with httpx.Client(timeout=30) as c:
                    r = c.request(
                        self.command, proxy.target + self.path, content=body, headers=headers
                    )
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in (
                        "content-length",
                        "transfer-encoding",
                        "connection",
                        "content-encoding",
                    ):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = do_DELETE = do_PATCH = _forward  # noqa: N815 - stdlib names

            def log_message(self, *args: object) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            # The hub fans out up to 16 requests per instance: a 5-deep backlog drops SYNs.
            request_queue_size = 128

            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client killed mid-request is the point of some tests

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> StallProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
