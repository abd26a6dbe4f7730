"""The hub as an MCP server: a lead agent sees the fleet, sends work and queues it, with every
guarantee of the command line.

Each tool is a command of the CLI, run exactly as a person runs it (``cli.main.invoke``): the
same options, the same gate and limit, the same production guard, the same audit log (the
caller is ``mcp:<client name>``) and the same discipline block in every prompt. Nothing here
decides anything; it turns a tool call into the command's words and the command's JSON into
the tool's result. A refused command is a tool error whose text starts with the refusal's
class (``limit reached: ...``), never a traceback and never a secret (the command's output is
redacted before it leaves, as on a terminal).

A command runs in a worker thread that is never abandoned: a client that disconnects mid-call
leaves the command to finish (a dispatch either completed, and is audited, or never started).
"""

# No `from __future__ import annotations`: the SDK reads each tool's signature at run time.
import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent
from pydantic import Field

from xaf_hub import __version__
from xaf_hub.cli.main import Ran, invoke
from xaf_hub.errors import (
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

if TYPE_CHECKING:
    from xaf_hub.fleet.scan import TransportFactory

# One task text an agent may send: far more than any prompt needs, far less than a memory risk.
MAX_TEXT = 64_000
MAX_SHORT = 512  # a title, a keyword, an instance or session id, a model, a directory
Short = Annotated[str, Field(min_length=1, max_length=MAX_SHORT)]
INSTRUCTIONS = """\
xaf-hub runs a team's fleet of opencode servers as one. Look before you send: `status` says
how full each instance is (running + reserved of its limit); `sessions` lists the project's
sessions. `dispatch` sends a task to a related session or a new one on the least-loaded
instance; every instance keeps at most its limit of runs, for you exactly as for a person.
When the fleet is full, `dispatch` with queue=true puts the task in the pool instead, and the
patrol starts it when a slot frees. A refusal names its class first: limit reached, lock busy,
production needs allow_prod, not a project session, instance unreachable, bad argument."""


def refusal_class(error: HubError | None, code: int) -> str:
    """The class of a refusal, as an agent reads it (the first words of the tool error)."""
    if isinstance(error, LockLostError):
        return "lock lost"
    if isinstance(error, RunStateUnknown):
        return "run state unknown"
    if isinstance(error, BusyError):
        return "lock busy" if "could not obtain" in str(error) else "limit reached"
    if isinstance(error, ProductionRefused):
        return "production needs allow_prod"
    if isinstance(error, NotProjectSession):
        return "not a project session"
    if isinstance(error, MissingPassword):
        return "password missing"
    if isinstance(error, UnreachableError):
        return "instance unreachable"
    if isinstance(error, SessionNotFound | UsageError):
        return "bad argument"
    if isinstance(error, ConfigError):
        return "config error"
    if isinstance(error, StateFileError):
        return "state file damaged"
    return {2: "instance unreachable", 3: "limit reached", 4: "bad argument",
            5: "not a project session"}.get(code, "internal error")


@dataclass(frozen=True)
class Answer:
    """A tool's result: the command's JSON document and one line an agent reads."""

    document: dict[str, Any]
    text: str


class Refused(Exception):
    """A command refused the call; ``str()`` is the tool error an agent reads."""


class Hub:
    """Runs the CLI's commands for the tools: the config, the environment and the caller."""

    def __init__(
        self,
        *,
        config: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        transport_factory: "TransportFactory | None" = None,
    ) -> None:
        self.config = config
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd or Path.cwd()
        self.transport_factory = transport_factory

    def run(self, words: Sequence[str], caller: str) -> Ran:
        """One command as the CLI runs it, with ``--json`` and this caller in the audit log."""
        head = ["--config", self.config] if self.config else []
        env = {**self.env, "XAF_HUB_CALLER": f"mcp:{caller}"}
        extra: dict[str, Any] = {}
        if self.transport_factory is not None:
            extra["transport_factory"] = self.transport_factory
        return invoke([words[0], *head, *words[1:], "--json"], env=env, cwd=self.cwd, **extra)

    def answer(
        self, words: Sequence[str], caller: str, summary: Callable[[Any], str], *,
        reads: bool = False,
    ) -> Answer:
        """Run the command; its JSON as the result, or Refused with the reason's class. A read
        (``reads``) that printed its document despite an unreachable instance (exit 2) is a
        result: the document names the instances it could not reach."""
        ran = self.run(words, caller)
        partial = ran.code == 2 and reads and ran.error is None and bool(ran.out.strip())
        if ran.code != 0 and not partial:
            shown = _last_line(ran.err).removeprefix("xaf-hub: error: ")
            reason = shown or (str(ran.error) if ran.error else f"exit {ran.code}")
            raise Refused(f"{refusal_class(ran.error, ran.code)}: {reason}")
        try:
            doc = json.loads(ran.out) if ran.out.strip() else {}
        except ValueError as exc:  # a command that printed something else: a bug, said plainly
            raise Refused(f"internal error: {words[0]} printed no JSON") from exc
        document = doc if isinstance(doc, dict) else {"items": doc}
        return Answer(document, summary(doc))


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# -- what an agent reads in one line -------------------------------------------------------------


def _count(doc: Any, what: str) -> str:
    if isinstance(doc, dict):
        doc = doc.get(what, [])
    n = len(doc) if isinstance(doc, list) else 0
    return f"{n} {what}"


def _field(doc: Any, key: str) -> str:
    return str(doc.get(key, "")) if isinstance(doc, dict) else ""


def _status_line(doc: Any) -> str:
    parts = []
    for inst in doc.get("instances", []) if isinstance(doc, dict) else []:
        if not isinstance(inst, dict):
            continue
        name = inst.get("instance", "?")
        if not inst.get("reachable"):
            parts.append(f"{name} unreachable")
            continue
        load = (f"{name} {inst.get('running_project')} running + {inst.get('reserved')} "
                f"reserved of {inst.get('limit')}")
        parts.append(load + ("" if inst.get("dispatchable") else " (takes no new work)"))
    queue = doc.get("queue") if isinstance(doc, dict) else None
    tail = f"; {queue.get('pending', 0)} queued in the pool" if isinstance(queue, dict) else ""
    return ("; ".join(parts) or "no instances") + tail


def _dispatch_line(doc: Any) -> str:
    if not isinstance(doc, dict):
        return "done"
    if doc.get("queued"):
        line = f"queued as {doc.get('task')} (position {doc.get('position')} of {doc.get('of')})"
        if not doc.get("daemon_running"):
            line += "; no patrol daemon is running, so nothing starts it until a patrol round"
        return line
    if doc.get("dry_run"):
        return f"plan: {doc.get('action')} on {doc.get('instance')} (nothing sent)"
    return (f"{doc.get('action')} {doc.get('session_id')} on {doc.get('instance')}; "
            f"model {doc.get('model') or 'server default'}")


# -- the server ----------------------------------------------------------------------------------


def build_server(hub: Hub) -> MCPServer:
    """The MCP server with one tool per command an agent needs (names as in the CLI)."""
    server: MCPServer = MCPServer(
        "xafhub", title="xaf-hub", version=__version__, instructions=INSTRUCTIONS,
        log_level="WARNING",
    )

    def caller_of(ctx: Context) -> str:
        try:
            info = ctx.request_context.session.client_params.client_info  # type: ignore[union-attr]
            name = str(info.name or "agent")
        except AttributeError:
            name = "agent"
        return "".join(c for c in name if c.isprintable())[:64] or "agent"

    async def call(
        ctx: Context, words: list[str], summary: Callable[[Any], str], *, reads: bool = False
    ) -> CallToolResult:
        caller = caller_of(ctx)
        try:
            # Never abandoned: a cancelled call waits for its command (done or not started).
            got = await anyio.to_thread.run_sync(
                functools.partial(hub.answer, words, caller, summary, reads=reads)
            )
        except Refused as exc:
            raise ToolError(str(exc)) from None
        return CallToolResult(
            content=[TextContent(type="text", text=got.text)],
            structured_content=got.document,
        )

    def opt(flag: str, value: str | int | None) -> list[str]:
        return [] if value is None or value == "" else [flag, str(value)]

    @server.tool(description="List the fleet's instances: reachable or not (with the reason), "
                 "opencode version, role, limit.")
    async def instances(ctx: Context) -> CallToolResult:
        return await call(ctx, ["instances"], lambda d: _count(d, "instances"), reads=True)

    @server.tool(description="How full each instance is: running + reserved of its limit, and "
                 "whether it can take new work now; the task pool's queue.")
    async def status(ctx: Context) -> CallToolResult:
        return await call(ctx, ["status"], _status_line, reads=True)

    @server.tool(description="The project's sessions on every instance (or one): id, title, "
                 "directory, run state, last result.")
    async def sessions(
        ctx: Context,
        instance: Annotated[str | None, Field(max_length=MAX_SHORT,
                                              description="only this instance")] = None,
        keyword: Annotated[str | None, Field(max_length=MAX_SHORT,
                                             description="only titles containing this")] = None,
        limit: Annotated[int | None, Field(ge=1, le=10_000,
                                           description="at most this many sessions")] = None,
    ) -> CallToolResult:
        words = ["sessions", *opt("--instance", instance), *opt("--keyword", keyword)]
        got = await call(ctx, words, lambda d: _count(d, "sessions"), reads=True)
        if limit is not None and isinstance(got.structured_content, dict):
            rows = got.structured_content.get("sessions")
            if isinstance(rows, list):
                got.structured_content["sessions"] = rows[:limit]
        return got

    @server.tool(description="One session: its state, the last prompt and the last answer.")
    async def show(
        ctx: Context,
        session: Annotated[Short, Field(description="the session id (ses_...)")],
        instance: Annotated[str | None, Field(max_length=MAX_SHORT,
                                              description="where it lives (default: any)")] = None,
    ) -> CallToolResult:
        return await call(ctx, ["show", session, *opt("--instance", instance)],
                          lambda d: f"session {session}")

    @server.tool(description="Send a task to the right session: a related one (smart match), a "
                 "named one, or a new one on the least-loaded instance, never past an instance's "
                 "limit. queue=true puts the task in the pool when no instance can take it now.")
    async def dispatch(
        ctx: Context,
        text: Annotated[str, Field(min_length=1, max_length=MAX_TEXT,
                                   description="what the agent should do")],
        instance: Annotated[str | None, Field(max_length=MAX_SHORT,
                                              description="only this instance")] = None,
        session: Annotated[str | None, Field(max_length=MAX_SHORT,
                                             description="send to this session")] = None,
        directory: Annotated[str | None, Field(max_length=4096,
                                               description="directory for a new session")] = None,
        title: Annotated[str | None, Field(max_length=MAX_SHORT,
                                           description="reuse the session whose title contains "
                                           "this (with new: the new session's title)")] = None,
        new: Annotated[bool, Field(description="always create a new session")] = False,
        dry_run: Annotated[bool, Field(description="plan only; send nothing")] = False,
        model: Annotated[str | None, Field(max_length=MAX_SHORT,
                                           description="provider/model to use")] = None,
        queue: Annotated[bool, Field(description="when the fleet is full, queue the task in "
                                     "the pool instead of refusing")] = False,
        allow_prod: Annotated[bool, Field(description="allow a production instance (a person "
                                          "must have said so)")] = False,
    ) -> CallToolResult:
        if not text.strip():
            raise ToolError("bad argument: text is empty")
        words = ["dispatch", "--text", text, *opt("--instance", instance),
                 *opt("--session", session), *opt("--dir", directory), *opt("--title", title),
                 *opt("--model", model)]
        words += [flag for flag, on in (("--new", new), ("--dry-run", dry_run),
                                        ("--queue", queue), ("--allow-prod", allow_prod)) if on]
        return await call(ctx, words, _dispatch_line)

    @server.tool(description="Stop a session's run (a person's decision: the patrol never "
                 "resumes it).")
    async def interrupt(
        ctx: Context,
        session: Annotated[Short, Field(description="the session to stop")],
        instance: Annotated[str | None, Field(max_length=MAX_SHORT,
                                              description="where it runs (default: any)")] = None,
        allow_prod: Annotated[bool, Field(description="allow a production instance")] = False,
    ) -> CallToolResult:
        words = ["interrupt", "--session", session, *opt("--instance", instance)]
        words += ["--allow-prod"] if allow_prod else []
        return await call(ctx, words, lambda d: f"interrupted {session}")

    @server.tool(description="The task pool: every task with its status (pending, dispatched, "
                 "done), priority and session.")
    async def backlog_list(
        ctx: Context,
        status: Annotated[Literal["pending", "dispatched", "done"] | None,
                          Field(description="only tasks with this status")] = None,
    ) -> CallToolResult:
        return await call(ctx, ["backlog", "list", *opt("--status", status)],
                          lambda d: _count(d, "tasks"))

    @server.tool(description="Add a task to the pool; the patrol dispatches it when a slot is "
                 "free (after the tasks it depends on are done).")
    async def backlog_add(
        ctx: Context,
        title: Annotated[Short, Field(description="short title (also the session title)")],
        prompt: Annotated[str | None, Field(max_length=MAX_TEXT,
                                            description="the work text (default: the title)")]
        = None,
        priority: Annotated[Literal["P0", "P1", "P2", "P3"],
                            Field(description="P0 first")] = "P2",
        instance: Annotated[str | None, Field(max_length=MAX_SHORT,
                                              description="prefer this instance")] = None,
        depends_on: Annotated[list[Short] | None, Field(max_length=100,
                                                        description="task ids to wait for")]
        = None,
    ) -> CallToolResult:
        words = ["backlog", "add", "--title", title, "--priority", priority,
                 *opt("--prompt", prompt), *opt("--instance", instance)]
        if depends_on:
            words += ["--depends-on", *depends_on]
        return await call(ctx, words, lambda d: f"added {_field(d, 'id')}")

    @server.tool(description="One task of the pool, whole.")
    async def backlog_show(
        ctx: Context,
        task_id: Annotated[Short, Field(description="the task id (T-...)")],
    ) -> CallToolResult:
        return await call(ctx, ["backlog", "show", task_id], lambda d: f"task {task_id}")

    _forbid_unknown_arguments(server)
    return server


def _forbid_unknown_arguments(server: MCPServer) -> None:
    """An argument a tool does not know is refused with its name, not silently dropped."""
    for tool in server._tool_manager.list_tools():  # noqa: SLF001 - the SDK has no public hook
        model = tool.fn_metadata.arg_model
        model.model_config["extra"] = "forbid"
        model.model_rebuild(force=True)
        tool.parameters = model.model_json_schema(by_alias=True)
