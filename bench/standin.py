"""A light stand-in for opencode 1.18 on 127.0.0.1: many instances in one process, for
benchmarks of fleets no machine here can run as real servers (50 instances).

It answers what a hub scan and a follower ask, in the shapes opencode 1.18.33 answers them
(as tests/unit/fleet/event_support.FakeServer does, over real sockets): ``GET /global/health``,
``/experimental/session`` (every session in one page), ``/session/status?directory=D``,
``/session/<id>``, ``/session/<id>/message`` (one finished assistant message), ``/permission``
and ``/question`` (none), ``/`` (not the web UI) and ``/global/event`` (a server-sent stream:
``server.connected``, a ``server.heartbeat`` every 10 s, and the frames ``touch`` sends).
Every request is counted per instance (``requests``). No authentication: loopback only.

    with StandIn(instances=50, sessions=200) as fleet:
        fleet.urls                  # one http://127.0.0.1:PORT per instance
        fleet.touch(3, "ses_...")   # a session.updated frame on instance 3's stream
        fleet.run(3, "ses_...", True)  # the session runs: busy, and a session.status frame
        fleet.total()               # requests answered so far (event streams included)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

ROOT = "/srv/proj"
VERSION = "1.18.33"
HEARTBEAT_SECONDS = 10.0


class StandIn:
    """``instances`` stand-in servers of ``sessions`` project sessions each (``running`` of
    them busy), served from one thread's event loop."""

    def __init__(self, instances: int, sessions: int, running: int = 2,
                 directories: int = 40) -> None:
        now = int(time.time() * 1000)
        self.sessions: list[dict[str, dict[str, Any]]] = []
        for i in range(instances):
            rows = {}
            for j in range(sessions):
                sid = f"ses_{i:02d}_{j:06d}"
                rows[sid] = {"id": sid, "title": f"task {j}", "version": VERSION,
                             "directory": f"{ROOT}/w{j % directories}",
                             "time": {"created": now - j * 1000, "updated": now - j * 1000}}
            self.sessions.append(rows)
        self.busy = [set(list(rows)[:running]) for rows in self.sessions]
        self.requests = [0] * instances
        self.urls: list[str] = []
        self._streams: list[set[asyncio.Queue[bytes | None]]] = [set() for _ in range(instances)]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.Server] = []
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    # ------------------------------------------------------------------ control

    def __enter__(self) -> StandIn:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True,
                                        name="standin")
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the stand-in servers did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        loop = self._loop
        if loop is not None and self._stop is not None:
            loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def total(self) -> int:
        """Requests answered so far, over every instance."""
        return sum(self.requests)

    def touch(self, instance: int, sid: str) -> None:
        """The session changes (a newer ``updated``): one ``session.updated`` frame."""
        info = self.sessions[instance][sid]
        info["time"] = {**info["time"], "updated": int(time.time() * 1000)}
        frame = {"directory": info["directory"],
                 "payload": {"type": "session.updated", "properties": {"info": info}}}
        self._push(instance, frame)

    def run(self, instance: int, sid: str, running: bool) -> None:
        """A run starts or stops: the session is busy (or idle) on ``/session/status``, its
        ``updated`` moves, and one ``session.status`` frame goes out."""
        info = self.sessions[instance][sid]
        info["time"] = {**info["time"], "updated": int(time.time() * 1000)}
        (self.busy[instance].add if running else self.busy[instance].discard)(sid)
        status = {"type": "busy" if running else "idle"}
        frame = {"directory": info["directory"], "payload": {
            "type": "session.status", "properties": {"sessionID": sid, "status": status}}}
        self._push(instance, frame)

    def _push(self, instance: int, frame: dict[str, Any]) -> None:
        data = f"data: {json.dumps(frame)}\n\n".encode()
        assert self._loop is not None
        for q in list(self._streams[instance]):
            self._loop.call_soon_threadsafe(q.put_nowait, data)

    # ------------------------------------------------------------------ serving

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        for i in range(len(self.sessions)):
            server = await asyncio.start_server(
                lambda r, w, i=i: self._connection(i, r, w), "127.0.0.1", 0)
            self._servers.append(server)
            self.urls.append(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        beat = asyncio.ensure_future(self._heartbeats())
        self._ready.set()
        await self._stop.wait()
        beat.cancel()
        for server in self._servers:
            server.close()
        for streams in self._streams:
            for q in streams:
                q.put_nowait(None)

    async def _heartbeats(self) -> None:
        frame = {"payload": {"type": "server.heartbeat", "properties": {}}}
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            for i in range(len(self.sessions)):
                self._push(i, frame)

    async def _connection(self, i: int, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, OSError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                method, target = line.split(" ")[:2]
                length = 0
                for h in head.split(b"\r\n")[1:]:
                    if h.lower().startswith(b"content-length:"):
                        length = int(h.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                self.requests[i] += 1
                url = urlsplit(target)
                if method == "GET" and url.path == "/global/event":
                    await self._stream(i, writer)
                    return
                status, body = self._answer(i, url.path, parse_qs(url.query))
                data = json.dumps(body).encode()
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
        writer.close()

    async def _stream(self, i: int, writer: asyncio.StreamWriter) -> None:
        q: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._streams[i].add(q)
        try:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"connection: close\r\n\r\n")
            writer.write(b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n')
            await writer.drain()
            while (data := await q.get()) is not None:
                writer.write(data)
                await writer.drain()
        finally:
            self._streams[i].discard(q)
            writer.close()

    def _answer(self, i: int, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        rows = self.sessions[i]
        if path == "/global/health":
            return 200, {"healthy": True, "version": VERSION}
        if path == "/experimental/session":
            return 200, sorted(rows.values(), key=lambda s: -s["time"]["updated"])
        if path == "/session/status":
            directory = query.get("directory", [""])[0]
            return 200, {sid: {"type": "busy"} for sid in self.busy[i]
                         if rows[sid]["directory"] == directory}
        if path in ("/permission", "/question"):
            return 200, []
        parts = path.strip("/").split("/")
        if len(parts) >= 2 and parts[0] == "session" and parts[1] in rows:
            if len(parts) == 2:
                return 200, rows[parts[1]]
            if parts[2:] == ["message"]:
                msg = {"info": {"role": "assistant", "id": "msg_1", "time": {"completed": 3},
                                "finish": "stop"}, "parts": []}
                return 200, [msg]
        return 404, {"name": "NotFoundError", "data": {"message": f"no route {path}"}}
