"""The floor issues the requests a hub scan issues: the waiting round too, for the folders whose
run state shows a run, once per folder, and none for idle folders."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import httpx
import pytest

from bench import floor

SESSIONS = [
    {"id": "s1", "directory": "/w/a", "time": {"updated": 3}},
    {"id": "s2", "directory": "/w/a", "time": {"updated": 2}},
    {"id": "s3", "directory": "/w/b", "time": {"updated": 1}},
    {"id": "s4", "directory": "/w/c", "time": {"updated": 0}},
]
# /w/a has two runs (asked once), /w/b an idle entry (not asked), /w/c nothing.
STATUS = {"/w/a": {"s1": {"type": "busy"}, "s2": {"type": "retry"}},
          "/w/b": {"s3": {"type": "idle"}}, "/w/c": {}}


def run_floor(monkeypatch: pytest.MonkeyPatch, waiting: bool) -> tuple[tuple[int, int], list[str]]:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        path, d = request.url.path, request.url.params.get("directory", "")
        seen.append(f"{path} {d}".strip())
        body: Any = {"healthy": True}
        if path == "/experimental/session":
            body = SESSIONS
        elif path == "/session/status":
            body = STATUS[d]
        elif path in ("/permission", "/question"):
            body = []
        return httpx.Response(200, content=json.dumps(body).encode())

    client = functools.partial(httpx.AsyncClient, transport=httpx.MockTransport(answer))
    monkeypatch.setattr(floor.httpx, "AsyncClient", client)
    spec = {"page_size": 100, "fan_out": 2, "roots": ["/w"], "exclude_substrings": []}
    inst = {"url": "http://127.0.0.1:9"}
    return asyncio.run(floor._scan(inst, spec, False, waiting)), seen


def test_the_floor_asks_the_folders_with_a_run_once(monkeypatch: pytest.MonkeyPatch) -> None:
    (requests, sessions), seen = run_floor(monkeypatch, waiting=True)
    assert sessions == 4
    asked = sorted(r for r in seen if r.startswith(("/permission", "/question")))
    assert asked == ["/permission /w/a", "/question /w/a"]
    assert requests == len(seen) == 1 + 1 + 3 + 2


def test_without_the_waiting_round_it_asks_run_state_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (requests, _), seen = run_floor(monkeypatch, waiting=False)
    assert not [r for r in seen if r.startswith(("/permission", "/question"))]
    assert requests == len(seen) == 5
