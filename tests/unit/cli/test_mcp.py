"""The MCP face's own decisions: a refusal's class, and the bearer token on Streamable HTTP."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

pytest.importorskip("mcp.server.mcpserver")

from xaf_hub.cli.commands.mcp import bearer_guard  # noqa: E402
from xaf_hub.cli.mcp import refusal_class  # noqa: E402
from xaf_hub.errors import (  # noqa: E402
    BusyError,
    ConfigError,
    HubError,
    LockLostError,
    MissingPassword,
    NotProjectSession,
    ProductionRefused,
    RunStateUnknown,
    SessionNotFound,
    StateFileError,
    UnreachableError,
    UsageError,
)


@pytest.mark.parametrize(("error", "code", "word"), [
    (BusyError("lan-b is at its limit: 2 running + 0 reserved of 2"), 3, "limit reached"),
    (BusyError("could not obtain the dispatch lock (x.lock) within 20s"), 3, "lock busy"),
    (LockLostError("the dispatch lock was lost"), 3, "lock lost"),
    (RunStateUnknown("lan-b", "no status"), 3, "run state unknown"),
    (ProductionRefused("prod-x is production: pass --allow-prod"), 4,
     "production needs allow_prod"),
    (NotProjectSession("ses_x is not a project session"), 5, "not a project session"),
    (UnreachableError("lan-b", "connection refused"), 2, "instance unreachable"),
    (MissingPassword("lan-b", "XAF_HUB_PW_LAN_B"), 4, "password missing"),
    (SessionNotFound("no session ses_x"), 4, "bad argument"),
    (UsageError("unknown instance 'nope'"), 4, "bad argument"),
    (ConfigError("config.json: bad key"), 4, "config error"),
    (StateFileError("tasks_backlog.json: invalid JSON"), 1, "state file damaged"),
    (HubError("something"), 1, "internal error"),
    (None, 3, "limit reached"),
    (None, 2, "instance unreachable"),
])
def test_each_refusal_has_its_class(error: HubError | None, code: int, word: str) -> None:
    assert refusal_class(error, code) == word


def _asgi(headers: list[tuple[bytes, bytes]]) -> tuple[int, bool]:
    reached: list[bool] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    guarded = bearer_guard(app, "s3cret-token-value")
    anyio.run(guarded, {"type": "http", "headers": headers}, receive, send)
    return sent[0]["status"], bool(reached)


def test_the_bearer_token_admits_and_nothing_else_does() -> None:
    assert _asgi([(b"authorization", b"Bearer s3cret-token-value")]) == (200, True)
    for wrong in ([], [(b"authorization", b"Bearer s3cret-token-valuX")],
                  [(b"authorization", b"s3cret-token-value")],
                  [(b"authorization", b"Basic s3cret-token-value")]):
        assert _asgi(wrong) == (401, False)
