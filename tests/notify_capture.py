"""A chat service stand-in on 127.0.0.1 for the notification tests.

``Capture(fmt, secret)`` answers like that service's incoming webhook: Slack ``ok``, Feishu
``{"code": 0, "msg": "success"}``, DingTalk / WeCom ``{"errcode": 0, "errmsg": "ok"}``. With a
secret it checks the signature the way the service documents it (Feishu: body ``timestamp`` +
``sign``; DingTalk: query ``timestamp`` + ``sign``) and refuses a wrong one with that
service's error code. It records every request. ``mode`` switches to ``"500"``, ``"refuse"``,
``"hang"`` (no answer for ``delay`` seconds, then the connection closes), ``"slow"`` (the
right answer after ``delay`` seconds), ``"redirect"`` (302 elsewhere) or ``"cut"`` (the
connection closed without an answer, as a receiver killed mid-POST); ``stop()`` closes the port
(connection refused) and ``start()`` reopens the same port.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

TOKEN = "tok3nSecretPath0123456789abcdef"


@dataclass
class Hit:
    """One request the capture server received."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> Any:
        return json.loads(self.raw)


def feishu_expected(timestamp: str, secret: str) -> str:
    """The documented Feishu recipe: HMAC-SHA256 keyed with "timestamp\\nsecret", empty msg."""
    string_to_sign = f"{timestamp}\n{secret}"
    digest = hmac.new(string_to_sign.encode("utf-8"), digestmod=hashlib.sha256).digest()
    return base64.b64encode(digest).decode("utf-8")


def dingtalk_expected(timestamp: str, secret: str) -> str:
    """The documented DingTalk recipe (before URL-encoding)."""
    string_to_sign = f"{timestamp}\n{secret}"
    digest = hmac.new(secret.encode("utf-8"), string_to_sign.encode("utf-8"), hashlib.sha256)
    return base64.b64encode(digest.digest()).decode("utf-8")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    capture: Capture

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        cap = self.server.capture
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        with cap.lock:
            cap.hits.append(Hit(parts.path, query, dict(self.headers.items()), raw))
            cap.inflight += 1
        try:
            self._reply(cap, parts.path, raw)
        finally:
            with cap.lock:
                cap.inflight -= 1

    def _reply(self, cap: Capture, path: str, raw: bytes) -> None:
        if cap.mode == "cut":
            self.close_connection = True
            return
        status, answer = cap.answer(path, self.path, raw)
        if cap.mode == "hang":
            self.close_connection = True
            return
        body = answer.encode()
        self.send_response(status)
        if status == 302:
            self.send_header("Location", f"http://127.0.0.1:{cap.port}/moved")
        self.send_header("Content-Type", "text/plain" if cap.fmt == "slack" else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Capture:
    """The stand-in server (use as ``with``)."""

    def __init__(self, fmt: str, secret: str = "", port: int = 0) -> None:
        self.fmt, self.secret = fmt, secret
        self.port = port
        self.mode = "ok"
        self.delay = 30.0  # seconds, for "hang" and "slow"
        self.hits: list[Hit] = []
        self.inflight = 0  # requests being answered (a hanging one stays here)
        self.lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The webhook URL, token included, shaped like the service's."""
        base = f"http://127.0.0.1:{self.port}"
        if self.fmt in ("dingtalk",):
            return f"{base}/robot/send?access_token={TOKEN}"
        if self.fmt == "wecom":
            return f"{base}/cgi-bin/webhook/send?key={TOKEN}"
        if self.fmt == "feishu":
            return f"{base}/open-apis/bot/v2/hook/{TOKEN}"
        return f"{base}/hooks/{TOKEN}"

    def start(self) -> None:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.capture = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join()
            self._server = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def texts(self) -> list[str]:
        """The message text of every request, whatever the format."""
        with self.lock:
            hits = list(self.hits)
        out = []
        for h in hits:
            body = h.body
            if self.fmt == "slack":
                out.append(body["text"])
            elif self.fmt == "feishu":
                out.append(body["content"]["text"])
            elif self.fmt in ("dingtalk", "wecom"):
                out.append(body["text"]["content"])
            else:
                out.append(body["headline"] + "\n" + body["text"])
        return out

    def events(self) -> list[dict[str, Any]]:
        """The event records (json format only)."""
        with self.lock:
            return [h.body["event"] for h in self.hits]

    def answer(self, path: str, full: str, raw: bytes) -> tuple[int, str]:
        if self.mode == "500":
            return 500, "server error"
        if self.mode in ("hang", "slow"):
            time.sleep(self.delay)
        if self.mode == "redirect":
            return 302, ""
        ok = {
            "slack": (200, "ok"),
            "feishu": (200, json.dumps({"code": 0, "msg": "success", "data": {}})),
            "dingtalk": (200, json.dumps({"errcode": 0, "errmsg": "ok"})),
            "wecom": (200, json.dumps({"errcode": 0, "errmsg": "ok"})),
            "json": (200, json.dumps({"received": True})),
        }[self.fmt]
        refused = {
            "slack": (400, "invalid_payload"),
            "feishu": (200, json.dumps({"code": 19021, "msg": "sign match fail", "data": {}})),
            "dingtalk": (200, json.dumps({"errcode": 310000, "errmsg": "sign not match"})),
            "wecom": (200, json.dumps({"errcode": 93000, "errmsg": "invalid webhook url"})),
            "json": (400, json.dumps({"error": "refused"})),
        }[self.fmt]
        if self.mode == "refuse":
            return refused
        if TOKEN not in full:
            return refused
        if self.secret and self.fmt == "feishu":
            body = json.loads(raw)
            if body.get("sign") != feishu_expected(str(body.get("timestamp")), self.secret):
                return refused
        if self.secret and self.fmt == "dingtalk":
            query = {k: v[0] for k, v in parse_qs(urlsplit(full).query).items()}
            ts = query.get("timestamp", "")
            # The service URL-decodes the query once, as parse_qs does.
            if query.get("sign") != dingtalk_expected(ts, self.secret):
                return refused
        return ok
