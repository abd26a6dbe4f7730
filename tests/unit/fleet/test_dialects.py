"""The two dialects' routes: every call the client makes of a session, as each dialect sends it
(method, path, query, body), over httpx.MockTransport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest

from xaf_hub.config.load import InstanceConfig
from xaf_hub.fleet.client import OpencodeClient

INST = InstanceConfig(name="lan-x", url="http://127.0.0.1:1", password="pw")
SESSION = {"id": "ses_a", "title": "T", "directory": "/d", "time": {"created": 1, "updated": 2}}
V2_SESSION = {"id": "ses_a", "title": "T", "location": {"directory": "/d"},
              "time": {"created": 1, "updated": 2}}

# What a server answers on each route (the shapes of fleet/wire.py's readers).
ANSWERS: dict[str, Any] = {
    "/global/health": {"healthy": True, "version": "1.18.33"},
    "/session/ses_a": SESSION,
    "/session": SESSION,
    "/session/ses_a/message": [],
    "/session/ses_a/children": [],
    "/session/status": {},
    "/api/session/ses_a": {"data": V2_SESSION},
    "/api/session": {"data": V2_SESSION},
    "/api/session/ses_a/message": {"data": []},
    "/api/session/active": {"data": {"ses_b": {}}},
}

Call = Callable[[OpencodeClient], Awaitable[Any]]
CALLS: dict[str, Call] = {
    "get_session": lambda c: c.get_session("ses_a", "/d"),
    "messages": lambda c: c.messages("ses_a", 3, "/d"),
    "abort": lambda c: c.abort("ses_a", "/d"),
    "create_session": lambda c: c.create_session("/d", "T"),
    "prompt_async": lambda c: c.prompt_async("ses_a", "hi", "prov/mod", "/d"),
    "children": lambda c: c.children("ses_a", "/d"),
    "running": lambda c: c.running(["/d"]),
}

D = {"directory": "/d"}
SENT: dict[tuple[str, str], list[tuple[str, str, dict[str, str], Any]]] = {
    ("classic", "get_session"): [("GET", "/session/ses_a", D, None)],
    ("classic", "messages"): [("GET", "/session/ses_a/message", {"limit": "3", **D}, None)],
    ("classic", "abort"): [("GET", "/global/health", {}, None),
                           ("POST", "/session/ses_a/abort", D, None)],
    ("classic", "create_session"): [("POST", "/session", D, {"title": "T"})],
    ("classic", "prompt_async"): [
        ("GET", "/global/health", {}, None),
        ("POST", "/session/ses_a/prompt_async", D,
         {"parts": [{"type": "text", "text": "hi"}],
          "model": {"providerID": "prov", "modelID": "mod"}}),
    ],
    ("classic", "children"): [("GET", "/session/ses_a/children", D, None)],
    ("classic", "running"): [("GET", "/global/health", {}, None),
                             ("GET", "/session/status", D, None)],
    ("v2", "get_session"): [("GET", "/api/session/ses_a", {}, None)],
    ("v2", "messages"): [("GET", "/api/session/ses_a/message", {"limit": "3"}, None)],
    ("v2", "abort"): [("POST", "/api/session/ses_a/interrupt", {}, None)],
    ("v2", "create_session"): [("POST", "/api/session", {}, {"location": {"directory": "/d"}})],
    ("v2", "prompt_async"): [
        ("POST", "/api/session/ses_a/model", {}, {"model": {"providerID": "prov", "id": "mod"}}),
        ("POST", "/api/session/ses_a/prompt", {}, {"prompt": {"text": "hi"}}),
    ],
    ("v2", "children"): [],
    ("v2", "running"): [("GET", "/api/session/active", {}, None)],
}


@pytest.mark.parametrize(("dialect", "call"), sorted(SENT))
def test_each_dialect_sends_its_own_routes(dialect: str, call: str) -> None:
    sent: list[tuple[str, str, dict[str, str], Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content) if req.content else None
        sent.append((req.method, req.url.path, dict(req.url.params), body))
        if req.method == "POST" and req.url.path not in ("/session", "/api/session"):
            return httpx.Response(204)
        return httpx.Response(200, json=ANSWERS[req.url.path])

    async def go() -> Any:
        inst = replace(INST, api=dialect)
        async with OpencodeClient(inst, transport=httpx.MockTransport(handler)) as client:
            assert client.dialect == dialect
            return await CALLS[call](client)

    answer = asyncio.run(go())
    assert sent == SENT[dialect, call]
    if call in ("get_session", "create_session"):
        assert (answer.id, answer.directory) == ("ses_a", "/d")
    if call == "running":
        assert answer == ({} if dialect == "classic" else {"ses_b": {"type": "busy"}})
