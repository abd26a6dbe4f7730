"""A fake opencode event server and the follower's helpers, shared by the event tests
(test_events.py) and the stream-bound tests (test_stream_bounds.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from xaf_hub.config.load import Config, load_config
from xaf_hub.fleet.events import FleetEvent
from xaf_hub.fleet.follow import FleetFollower

ROOT = "/srv/proj"


def _info(sid: str, directory: str = f"{ROOT}/app", title: str = "t") -> dict[str, Any]:
    return {"id": sid, "title": title, "directory": directory, "time": {"created": 1, "updated": 2}}


def _g(kind: str, props: dict[str, Any], directory: str = f"{ROOT}/app") -> str:
    frame = {"directory": directory, "payload": {"id": "evt_1", "type": kind, "properties": props}}
    return "data: " + json.dumps(frame)


def _cfg(tmp_path: Path) -> Config:
    doc = {
        "project": {"name": "t"},
        "instances": [
            {"name": "a", "url": "http://127.0.0.1:9", "roots": [ROOT],
             "default_directory": f"{ROOT}/app"}
        ],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    return load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)


class _Stream(httpx.AsyncByteStream):
    def __init__(self, queue: asyncio.Queue[str | None]) -> None:
        self.queue = queue

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n'
        while True:
            line = await self.queue.get()
            if line is None:
                return
            yield (line + "\n\n").encode()


class FakeServer:
    """Enough of opencode for the follower: health, listing, status, messages, streams."""

    def __init__(self, version: str = "1.18.33") -> None:
        self.version = version
        self.sessions: list[dict[str, Any]] = [_info("ses_a")]
        self.busy: dict[str, Any] = {}
        self.up = True
        self.paths: list[str] = []
        self.streams: list[asyncio.Queue[str | None]] = []

    def push(self, line: str | None) -> None:
        for q in self.streams:
            q.put_nowait(line)

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.paths.append(path + ("?" + request.url.query.decode() if request.url.query else ""))
        if not self.up:
            raise httpx.ConnectError("connection refused", request=request)
        if path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": self.version})
        if path == "/experimental/session":
            return httpx.Response(200, json=self.sessions)
        if path == "/session/status":
            return httpx.Response(200, json=self.busy)
        if path.endswith("/message"):
            msg = {"info": {"role": "assistant", "id": "msg_1", "time": {"completed": 3},
                            "finish": "stop"}, "parts": []}
            return httpx.Response(200, json=[msg])
        if path == "/event" or (path == "/global/event" and self.version >= "1.15"):
            q: asyncio.Queue[str | None] = asyncio.Queue()
            self.streams.append(q)
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  stream=_Stream(q))
        if path == "/global/event":
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  stream=_Stream(asyncio.Queue()))  # never a frame beyond hello
        return httpx.Response(404, json={"message": "nope"})


async def _until(events: list[FleetEvent], kind: str, count: int = 1, timeout: float = 10) -> None:
    for _ in range(int(timeout / 0.02)):
        if sum(1 for e in events if e.kind == kind) >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {kind!r} x{count} in {[e.kind for e in events]}")


def _follower(
    tmp_path: Path, server: FakeServer, **kw: Any
) -> tuple[FleetFollower, list[FleetEvent]]:
    events: list[FleetEvent] = []
    transport = httpx.MockTransport(server.handler)
    follower = FleetFollower(
        _cfg(tmp_path), emit=events.append, transport_factory=lambda inst: transport,
        backoff=(0.05,), probe_seconds=1.0, **kw,
    )
    return follower, events
