"""A loopback server that answers like a hostile or broken opencode, one attack per mode.

It speaks the classic dialect (a healthy ``/global/health``) and attacks in the answers that
follow; ``mode`` can be changed between commands. Sessions it lists live in ``directory`` (a
project folder of the test) so they reach every table, export and page.

* ``endless``    every page of ``/experimental/session`` is full of ids never seen before;
* ``slow-body``  the listing announces a megabyte and sends one byte every 0.5 s (each read
                 gets a byte in time: only a deadline for the whole scan ends it);
* ``huge-body``  the listing is 100 MB, sent as fast as the client reads;
* ``bad-next``   a retrying session whose ``next`` is ``"soon"``;
* ``time-inf``   a session with ``time.updated`` = 1e400 (Infinity once parsed);
* ``time-huge``  a session with ``time.updated`` = 10**22;
* ``nan-cost``   a session whose ``cost`` is ``NaN``;
* ``types``      fields of every wrong type, an entry without id, one that is not an object;
* ``echo-auth``  every request but health is refused with 400, echoing the Authorization
                 header and the credential it decodes to;
* ``formula``    titles a spreadsheet would run (``=HYPERLINK(...)``, ``@SUM``, ``+1+1``...).

Outside the case table: ``echo-writes`` answers reads as an empty, healthy instance and
refuses every write with the same 400 echo (a proxy in front of a real server does that).
"""

from __future__ import annotations

import base64
import http.server
import json
import time

from tests.e2e.proxy import LoopbackServer, read_body

MODES = (
    "endless",
    "slow-body",
    "huge-body",
    "bad-next",
    "time-inf",
    "time-huge",
    "nan-cost",
    "types",
    "echo-auth",
    "formula",
)
FORMULAS = ('=HYPERLINK("http://127.0.0.1:9/x","click")', "@SUM(1+1)", "+1+1", "-2+3")
HUGE = 100 * 1024 * 1024


class HostileServer(LoopbackServer):
    """One loopback server; ``mode`` picks the attack (see the module docstring)."""

    def __init__(self, directory: str, mode: str = "endless") -> None:
        self.directory = directory
        self.mode = mode
        self.issued = 0
        self.hits: list[tuple[str, str]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                read_body(self)
                server.hits.append((self.command, self.path))
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/global/health":
                        self._json(200, b'{"healthy":true,"version":"1.18.33"}')
                    elif server.mode == "echo-auth" or (
                        server.mode == "echo-writes" and self.command not in ("GET", "HEAD")
                    ):
                        self._echo()
                    elif path == "/experimental/session":
                        self._listing()
                    elif path == "/session/status":
                        self._json(200, json.dumps(server.status()).encode())
                    elif path.endswith("/message"):
                        self._json(200, b"[]")
                    else:
                        self._json(404, b'{"name":"NotFound","data":{"message":"no"}}')
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up on us: as it should

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _answer  # noqa: N815 - stdlib

            def _json(self, status: int, payload: bytes, length: int = -1) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload) if length < 0 else length))
                self.end_headers()
                self.wfile.write(payload)

            def _echo(self) -> None:
                header = self.headers.get("authorization", "")
                decoded = base64.b64decode(header.partition(" ")[2] or b"").decode(
                    "utf-8", "replace"
                )
                message = f"bad request; you sent Authorization: {header} ({decoded})"
                doc = {"name": "BadRequest", "data": {"message": message}}
                self._json(400, json.dumps(doc).encode())

            def _listing(self) -> None:
                mode = server.mode
                if mode == "slow-body":
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(10**6))  # under the body cap
                    self.end_headers()
                    self.wfile.write(b"[")
                    while not server.released.is_set():
                        time.sleep(0.5)
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    return
                if mode == "huge-body":
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(HUGE))
                    self.end_headers()
                    chunk = b" " * (1024 * 1024)
                    for _ in range(HUGE // len(chunk)):
                        self.wfile.write(chunk)
                    return
                limit = int(_query(self.path).get("limit", "100"))
                self._json(200, server.listing(limit).encode())

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)

    def session(self, ident: str, **fields: object) -> dict[str, object]:
        now = int(time.time() * 1000)
        doc: dict[str, object] = {
            "id": ident,
            "title": f"hostile {self.mode}",
            "directory": self.directory,
            "time": {"created": now - 60_000, "updated": now},
            "cost": 0.5,
        }
        doc.update(fields)
        return doc

    def listing(self, limit: int) -> str:
        """The listing's JSON text (written by hand where JSON has no word for the value)."""
        mode = self.mode
        if mode == "endless":
            start, self.issued = self.issued, self.issued + limit
            return json.dumps([self.session(f"ses_hostile{start + i:09d}") for i in range(limit)])
        if mode == "bad-next":
            return json.dumps([self.session("ses_hostileretry")])
        if mode in ("time-inf", "time-huge", "nan-cost"):
            text = json.dumps([self.session("ses_hostileodd", title=f"hostile {mode}")])
            value = {"time-inf": "1e400", "time-huge": "10000000000000000000000"}.get(mode)
            if value is not None:
                doc = json.loads(text)
                stamp = doc[0]["time"]["updated"]
                return text.replace(f'"updated": {stamp}', f'"updated": {value}')
            return text.replace('"cost": 0.5', '"cost": NaN')
        if mode == "types":
            return json.dumps(
                [
                    self.session("ses_hostiletypes", title={"x": 1}, time="yesterday", cost="$"),
                    self.session(12345),
                    {"title": "no id"},
                    "not an object",
                    self.session("ses_hostilemodel", model=[1], parentID={"x": 1}),
                ]
            )
        if mode == "formula":
            return json.dumps(
                [self.session(f"ses_hostileformula{i}", title=t) for i, t in enumerate(FORMULAS)]
            )
        return "[]"

    def status(self) -> dict[str, object]:
        if self.mode == "bad-next":
            retry = {"type": "retry", "attempt": 1, "message": "slow down", "next": "soon"}
            return {"ses_hostileretry": retry}
        return {}


def _query(path: str) -> dict[str, str]:
    from urllib.parse import parse_qsl, urlsplit

    return dict(parse_qsl(urlsplit(path).query))
