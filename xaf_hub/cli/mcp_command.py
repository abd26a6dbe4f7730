"""Serve the hub to a lead agent over MCP (the Model Context Protocol).

The tools are the CLI's commands, named like them: instances, status, sessions, show,
dispatch (queue=true queues the task when the fleet is full), interrupt, backlog_list,
backlog_add, backlog_show. Each runs exactly as the command does: the same limit and gate,
the same production guard, the same audit log (caller `mcp:<client name>`) and the same
discipline block in every prompt, however many agents call at once. A config that cannot be
found or loaded does not stop the server: every tool call answers `config error: <why>`.

By default the server speaks MCP on stdin/stdout, as an agent's MCP client starts it; the
client starts it in a folder of its own, so give the config's absolute path (`xaf-hub init`
prints the exact lines for opencode and Claude Code). With --http it serves
Streamable HTTP at http://HOST:PORT/mcp; every request must carry `Authorization: Bearer
<token>` with the token from XAF_HUB_MCP_TOKEN, and a non-loopback --host is refused without
one. Needs the MCP SDK, the optional extra [mcp]; over an install without it:
pipx inject xaf-hub 'mcp>=2.3,<3'.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from xaf_hub.cli.commands._common import ADD_MCP, MCP_REQUIREMENT
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import flag, opt
from xaf_hub.errors import UsageError
from xaf_hub.page.asgi import listen
from xaf_hub.page.serve import check_secret, is_loopback, url_of

EXAMPLES = """\
examples:
  xaf-hub mcp                                   # MCP on stdio, for an agent's MCP client
  XAF_HUB_MCP_TOKEN=$(openssl rand -hex 24) xaf-hub mcp --http --port 7318
opencode (opencode.json), with the config's absolute path (`xaf-hub init` prints these):
  "mcp": {"xafhub": {"type": "local",
                     "command": ["xaf-hub", "--config", "/abs/config.json", "mcp"]}}
Claude Code:  claude mcp add xafhub -- xaf-hub --config /abs/config.json mcp
"""

TOKEN_ENV = "XAF_HUB_MCP_TOKEN"
MIN_TOKEN_LENGTH = 16
INSTALL_HINT = (
    f"{ADD_MCP} (without pipx: pip install '{MCP_REQUIREMENT}' with the python xaf-hub runs on)"
)


@dataclass(frozen=True, kw_only=True)
class Options:
    """The options of `mcp`."""

    http: bool = flag("--http", help="serve Streamable HTTP at http://HOST:PORT/mcp instead of "
                      f"stdio (needs a bearer token in {TOKEN_ENV})")
    host: str = opt("--host", default="127.0.0.1", help="address for --http (default 127.0.0.1)")
    port: int = opt("--port", default=7318, help="port for --http (default 7318; 0: any)")


def run(ctx: Context) -> int:
    """Serve until the client closes stdin (stdio) or Ctrl+C (--http)."""
    opts = ctx.options(Options)
    token = ctx.env.get(TOKEN_ENV) or ""
    if opts.http:
        if not 0 <= opts.port <= 65535:
            raise UsageError("--port must be between 0 and 65535")
        where = "" if is_loopback(opts.host) else f" on {opts.host}, a non-loopback address"
        check_secret(TOKEN_ENV, token, MIN_TOKEN_LENGTH,
                     f"mcp --http{where} needs a bearer token: set {TOKEN_ENV} "
                     f"(at least {MIN_TOKEN_LENGTH} characters)")
    try:  # deferred: the MCP SDK is an optional extra, see docs/performance.md
        from xaf_hub.cli.mcp import Hub, build_server
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "mcp":  # not the SDK: a fault of ours
            raise
        raise UsageError(f"xaf-hub mcp needs the MCP SDK: {INSTALL_HINT}") from None
    # The config is not loaded here: an agent's MCP client starts this server where it likes (a
    # session's folder) and shows nothing of its stderr, so a missing or broken config is said
    # to the agent instead, as a `config error` answering every tool call.
    server = build_server(Hub(config=ctx.common.config, env=ctx.env, cwd=ctx.cwd,
                              transport_factory=ctx.transport_factory))
    if not opts.http:
        import anyio  # deferred: start-up of `mcp --help`, see docs/performance.md

        anyio.run(server.run_stdio_async)
        return 0
    return _serve_http(ctx, server, opts, token)


def bearer_guard(app: Any, token: str) -> Callable[..., Awaitable[None]]:
    """An ASGI wrapper that answers 401 to any HTTP request without the bearer token."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"www-authenticate", b'Bearer realm="xaf-hub"')]})
                await send({"type": "http.response.body",
                            "body": b"a bearer token is required (XAF_HUB_MCP_TOKEN)\n"})
                return
        await app(scope, receive, send)

    return guarded


def _serve_http(ctx: Context, server: Any, opts: Options, token: str) -> int:
    # deferred: the web stack loads for --http only, see docs/performance.md
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    # On loopback the SDK checks Host and Origin against DNS rebinding (its default for a
    # loopback host); on another address the bearer token is what admits a client.
    security = None if is_loopback(opts.host) else TransportSecuritySettings(
        enable_dns_rebinding_protection=False)
    app = bearer_guard(server.streamable_http_app(host=opts.host, transport_security=security),
                       token)
    sock = listen(opts.host, opts.port)  # serve's: listening before the URL is printed
    url = url_of(opts.host, sock.getsockname()[1]) + "mcp"
    ctx.out(url, flush=True)  # stdout holds only the URL, for scripts
    ctx.info(f"serving MCP at {url} (bearer token from {TOKEN_ENV}); Ctrl+C stops")
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    with sock, contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run(sockets=[sock])
    ctx.info("stopped")
    return 0
