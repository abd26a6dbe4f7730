"""What the MCP face's unit tests share: one tool call through an in-memory MCP client, and
the text of its answer."""

from __future__ import annotations

from typing import Any

import anyio


def _call(hub: Any, name: str, arguments: dict[str, Any]) -> Any:
    from mcp import Client

    from xaf_hub.cli.mcp import build_server

    async def go() -> Any:
        async with Client(build_server(hub)) as c:
            return await c.call_tool(name, arguments)

    return anyio.run(go)


def _text(result: Any) -> str:
    return "".join(getattr(part, "text", "") for part in result.content)
