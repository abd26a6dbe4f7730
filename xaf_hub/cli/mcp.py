"""The hub as an MCP server: a lead agent sees the fleet, sends work and queues it, with every
guarantee of the command line (docs/mcp.md, docs/architecture.md §6.1).

Each ``Tool`` is one declaration built on its command's ``Opt`` declarations and runs the
operation the command runs, answering its ``--json`` document. A refusal is a tool error that
starts with its class, never a traceback or a secret; a call is never abandoned mid-way; a config
that cannot load makes every call a ``config error``.
"""

# No `from __future__ import annotations`: the SDK reads each tool's signature at run time.
import contextlib
import functools
import inspect
import io
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context as McpContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp_types import CallToolResult, TextContent
from pydantic import ValidationError

from xaf_hub import __version__
from xaf_hub.cli.commands import (
    answer,
    approve,
    backlog,
    deny,
    dispatch,
    instances,
    interrupt,
    land,
    sessions,
    show,
    status,
    waiting,
)
from xaf_hub.cli.commands._common import answer_waiting, missing_passwords
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import MAX_SHORT, MAX_TEXT, Common, Opt, declared, pick, record
from xaf_hub.core.records import Snapshot
from xaf_hub.core.text import dumps, redact
from xaf_hub.errors import HubError
from xaf_hub.fleet.scan import TransportFactory
from xaf_hub.page.export import snapshot_document

__all__ = ["MAX_SHORT", "MAX_TEXT", "TOOLS", "Hub", "Tool", "build_server", "refusal_class"]

INSTRUCTIONS = """\
xaf-hub runs a team's fleet of opencode servers as one. Look before you send: `status` says
how full each instance is (running + reserved of its limit); `sessions` lists the project's
sessions. `dispatch` sends a task to a related session or a new one on the least-loaded
instance; every instance keeps at most its limit of runs, for you exactly as for a person.
When the fleet is full, `dispatch` with queue=true puts the task in the pool instead, and the
patrol starts it when a slot frees. A run that stops to ask a person (a permission or a
question) holds its slot: `waiting` lists them, `approve`, `deny` and `answer` reply. A refusal
names its class first: limit reached, lock busy, production needs allow_prod, not a project
session, instance unreachable, no longer waiting, bad argument, config error."""

def refusal_class(error: BaseException) -> str:
    """The class of a refusal, as an agent reads it (the first words of the tool error): the
    error's own ``HubError.refusal``."""
    return error.refusal if isinstance(error, HubError) else HubError.refusal


@dataclass(frozen=True)
class Tool:
    """One MCP tool, declared: its name (as the command's), what it does, the command's options
    record and the options of it the tool takes (``required`` there, though optional on the
    command line), and the one call that answers it. ``answer`` gets a context for this call
    and the record built from the arguments given, and returns the document the command prints
    with --json; ``summary`` is the line an agent reads first. A ``view`` also takes the common
    project, and without it sees every project."""

    name: str
    description: str
    record: type[Any]
    takes: tuple[str, ...]
    answer: Callable[[Context, Any], Any]
    summary: Callable[[Any], str]
    required: tuple[str, ...] = ()
    view: bool = False

    @property
    def options(self) -> tuple[Opt, ...]:
        """The options the tool takes, as the command declares them."""
        names = [n for n in self.takes if n != "project"]  # the common one, not the record's
        own = tuple(o.but(required=True) if o.dest in self.required else o
                    for o in pick(declared(self.record), *names))
        return (*own, PROJECT) if self.view or "project" in self.takes else own


@dataclass(frozen=True, kw_only=True)
class Hub:
    """What every tool call shares: the config, the environment, the folder and the transport
    seam; each call gets its own context with the caller in the audit log."""

    config: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    cwd: Path = field(default_factory=Path.cwd)
    transport_factory: TransportFactory | None = None

    def context(self, caller: str) -> Context:
        """A context for one call: JSON, its own streams, ``mcp:<caller>`` in the audit log."""
        return Context.of(
            Common(config=self.config, json=True),
            stdout=io.StringIO(), stderr=io.StringIO(),
            env={**self.env, "XAF_HUB_CALLER": f"mcp:{caller}"}, cwd=self.cwd,
            transport_factory=self.transport_factory,
        )

    def answer(self, tool: Tool, values: dict[str, Any], caller: str) -> CallToolResult:
        """Run the tool's call: its document and its line as the result, or a ToolError that
        starts with the reason's class. Everything that leaves is redacted of every secret the
        run knows."""
        ctx = self.context(caller)
        try:
            if tool.view:  # as the project given, else as every project
                values = dict(values)
                ctx.see_every_project()
                ctx.choose(values.pop("project", None))
            doc = ctx.named(tool.answer(ctx, record(tool.record, values)))
        except Exception as exc:  # noqa: BLE001 - the last line of defence answers one line
            said = str(exc) if isinstance(exc, HubError) else f"{type(exc).__name__}: {exc}"
            raise ToolError(f"{refusal_class(exc)}: {_redacted(ctx, said)}") from None
        finally:
            with contextlib.suppress(Exception):  # closing never hides the call's answer
                ctx.close()
        safe = json.loads(_redacted(ctx, dumps(doc)))
        return CallToolResult(
            content=[TextContent(type="text", text=_redacted(ctx, tool.summary(safe)))],
            structured_content=safe if isinstance(safe, dict) else {"items": safe},
        )


def _redacted(ctx: Context, text: str) -> str:
    return redact(text, ctx.every_secret())


# -- what an agent reads in one line -------------------------------------------------------------


def _count(doc: Any, what: str) -> str:
    return f"{len(doc.get(what, []) if isinstance(doc, dict) else doc)} {what}"


def _status_line(doc: dict[str, Any]) -> str:
    parts = []
    for inst in doc["instances"]:
        name = inst["instance"]
        if not inst.get("reachable"):
            parts.append(f"{name} unreachable")
            continue
        load = (f"{name} {inst.get('running_project')} running + {inst.get('reserved')} "
                f"reserved of {inst.get('limit')}")
        parts.append(load + ("" if inst.get("dispatchable") else " (takes no new work)"))
    tail = f"; {doc['queue']['pending']} queued in the pool"
    return ("; ".join(parts) or "no instances") + tail


def _dispatch_line(doc: dict[str, Any]) -> str:
    if doc.get("queued"):
        line = f"queued as {doc.get('task')} (position {doc.get('position')} of {doc.get('of')})"
        if not doc.get("daemon_running"):
            line += "; no patrol daemon is running, so nothing starts it until a patrol round"
        return line
    if doc.get("dry_run"):
        return f"plan: {doc.get('action')} on {doc.get('instance')} (nothing sent)"
    return (f"{doc.get('action')} {doc.get('session_id')} on {doc.get('instance')}; "
            f"model {doc.get('model') or 'server default'}")


# -- the tools: one declaration each, one call into what the command runs ----------------------


def _status(ctx: Context, opts: status.Options) -> Any:
    m = status.measure(ctx, opts)
    return _unless_password_missing(ctx, status.document(m), m.snap)


def _sessions(ctx: Context, opts: sessions.Options) -> Any:
    snap = sessions.read(ctx, opts)
    doc = _unless_password_missing(ctx, snapshot_document(snap), snap)
    if opts.limit is not None and isinstance(doc.get("sessions"), list):
        doc["sessions"] = doc["sessions"][: opts.limit]
    return doc


def _unless_password_missing(ctx: Context, doc: Any, snap: Snapshot) -> Any:
    """A read's document, even when an instance did not answer (it names those), unless one
    asks for a password the config lacks: a fix for the person, said as a refusal (the
    command's exit 4)."""
    missing = missing_passwords(ctx, snap)
    if missing:
        raise missing[0]
    return doc


def _dispatch(ctx: Context, opts: dispatch.Options) -> Any:
    done = dispatch.carry_out(ctx, opts)
    if isinstance(done, dispatch.Planned):
        done.refuse()
    return dispatch.document(done, ctx.config.project_name)


def _waiting_line(doc: dict[str, Any]) -> str:
    line = f"{len(doc['waiting'])} request(s) waiting for a person"
    if doc["unknown"]:
        line += "; not known for " + ", ".join(str(u.get("instance")) for u in doc["unknown"])
    return line


def _reply_line(doc: dict[str, Any]) -> str:
    return (f"{_field(doc, 'reply')}: {_field(doc, 'id')} of {_field(doc, 'session_id')} on "
            f"{_field(doc, 'instance')}")


def _field(doc: dict[str, Any], key: str) -> str:
    return str(doc.get(key, ""))


PROJECT = pick(declared(Common), "project")[0]  # the common --project, as a tool's parameter

TOOLS: tuple[Tool, ...] = (
    Tool("instances", "List the fleet's instances: reachable or not (with the reason), "
         "opencode version, role, limit.", instances.Options, (),
         lambda ctx, o: _unless_password_missing(ctx, *instances.read(ctx, o)),
         lambda d: _count(d, "instances")),
    Tool("status", "How full each instance is: running + reserved of its limit, and whether it "
         "can take new work now, per project with several; the task pool's queue.",
         status.Options, (), _status, _status_line, view=True),
    Tool("sessions", "The project's sessions (every project's without project) on every "
         "instance (or one): id, project, title, directory, run state, last result.",
         sessions.Options, ("instance", "keyword", "limit"), _sessions,
         lambda d: _count(d, "sessions"), view=True),
    Tool("show", "One session: its state, the last prompt and the last answer.",
         show.Options, ("session", "instance"), lambda ctx, o: show.document(show.look(ctx, o)),
         lambda d: f"session {_field(d, 'session_id')}", required=("session",)),
    Tool("dispatch", "Send a task to the right session: a related one (smart match), a named "
         "one, or a new one on the least-loaded instance, never past an instance's limit. "
         "queue=true puts the task in the pool when no instance can take it now.",
         dispatch.Options, ("text", "instance", "session", "directory", "title", "new",
                            "dry_run", "model", "queue", "allow_prod", "project"),
         _dispatch, _dispatch_line),
    Tool("interrupt", "Stop a session's run (a person's decision: the patrol never resumes it).",
         interrupt.Options, ("session", "instance", "allow_prod"),
         lambda ctx, o: interrupt.document(interrupt.carry_out(ctx, o)),
         lambda d: f"interrupted {_field(d, 'session_id')}", required=("session",)),
    Tool("backlog_list", "The task pool: every task with its status (pending, dispatched, "
         "done), priority and session.", backlog.ListOptions, ("status",), backlog.listing,
         lambda d: _count(d, "tasks")),
    Tool("land", "Land a task's verified branch on the base branch now (or send_back a text "
         "to its session, or drop its work): for tasks in worktrees of their own.",
         land.Options, ("task_id", "send_back", "drop"),
         lambda ctx, o: land.document(land.carry_out(ctx, o)),
         lambda d: f"{_field(d, 'task')}: {_field(d, 'detail')}"),
    Tool("backlog_add", "Add a task to the pool; the patrol dispatches it when a slot is free "
         "(after the tasks it depends on are done).", backlog.AddOptions,
         ("title", "prompt", "priority", "instance", "depends_on"),
         lambda ctx, o: backlog.add_task(ctx, o).to_json(),
         lambda d: f"added {_field(d, 'id')}"),
    Tool("backlog_show", "One task of the pool, whole.", backlog.ShowOptions, ("task_id",),
         lambda ctx, o: backlog.show_document(*backlog.shown(ctx, o)),
         lambda d: f"task {_field(d, 'id')}"),
    Tool("waiting", "Every request a run waits on across the fleet (permission requests and "
         "questions for a person): id, instance, session, what is asked, options, since when. "
         "Such a run holds a slot until it is answered.", waiting.Options, ("instance",),
         lambda ctx, o: waiting.document(waiting.look(ctx, o), int(time.time() * 1000)),
         _waiting_line, view=True),
    Tool("approve", "Approve a permission request a run waits on (always=true: the patterns it "
         "offers too, for that session). Checked first: a request no longer waiting is "
         "refused and nothing is sent.", approve.Options,
         ("request", "instance", "allow_prod", "always"), answer_waiting, _reply_line),
    Tool("deny", "Deny a permission request (or reject a question) a run waits on; the run goes "
         "on without it, with your message if you give one.", deny.Options,
         ("request", "instance", "allow_prod", "message"), answer_waiting, _reply_line),
    Tool("answer", "Answer a question a run waits on: one option label per question (choices), "
         "or your own text.", answer.Options,
         ("request", "instance", "allow_prod", "choices", "text"), answer_waiting, _reply_line),
)


# -- the server ----------------------------------------------------------------------------------


def build_server(hub: Hub, tools: tuple[Tool, ...] = TOOLS) -> MCPServer:
    """The MCP server with one tool per declaration (names as in the CLI)."""
    server: MCPServer = MCPServer(
        "xafhub", title="xaf-hub", version=__version__, instructions=INSTRUCTIONS,
        log_level="WARNING",
    )
    for tool in tools:
        server.add_tool(_tool_function(hub, tool), name=tool.name, description=tool.description)
    _check_arguments(server)
    return server


def _caller_of(ctx: McpContext) -> str:
    try:
        info = ctx.request_context.session.client_params.client_info  # type: ignore[union-attr]
        name = str(info.name or "agent")
    except AttributeError:
        name = "agent"
    return "".join(c for c in name if c.isprintable())[:64] or "agent"


def _tool_function(hub: Hub, tool: Tool) -> Callable[..., Any]:
    """The function the SDK registers for ``tool``: its signature (hence the tool's JSON schema)
    is generated from the tool's option declarations."""

    async def call(ctx: McpContext, **arguments: Any) -> CallToolResult:
        if _BAD in arguments:
            raise ToolError(arguments[_BAD])
        given = {k: v for k, v in arguments.items() if v is not None}
        # Never abandoned: a cancelled call waits for its operation (done or not started).
        return await anyio.to_thread.run_sync(
            functools.partial(hub.answer, tool, given, _caller_of(ctx))
        )

    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("ctx", keyword, annotation=McpContext)]
    for opt in sorted(tool.options, key=lambda o: not o.required):
        annotation, default = opt.tool_parameter()
        params.append(inspect.Parameter(opt.dest, keyword, annotation=annotation, default=default))
    signature = inspect.Signature(params, return_annotation=CallToolResult)
    call.__signature__ = signature  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in params} | {"return": CallToolResult}
    call.__name__ = tool.name
    return call


_BAD = "bad_argument_"  # where a refused argument's reason reaches the tool function


class _Checked(FuncMetadata):
    """The SDK's argument check, with a refusal an agent reads: ``bad argument: text: String
    should have at most 64000 characters``, not pydantic's dump with its links."""

    def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
        try:
            return super().validate_arguments(arguments_to_validate)
        except ValidationError as exc:
            return {_BAD: bad_argument(exc)}


def bad_argument(exc: ValidationError) -> str:
    """One line naming each argument that is wrong and why (never its value)."""
    reasons = []
    for err in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in err.get("loc", ())) or "arguments"
        reasons.append(f"{where}: {err.get('msg', 'invalid')}")
    return "bad argument: " + "; ".join(reasons)


def _check_arguments(server: MCPServer) -> None:
    """An argument a tool does not know is refused with its name, not silently dropped; every
    refused argument answers ``bad argument: ...``."""
    for tool in server._tool_manager.list_tools():  # noqa: SLF001 - the SDK has no public hook
        meta = tool.fn_metadata
        model = meta.arg_model
        model.model_config["extra"] = "forbid"
        model.model_rebuild(force=True)
        tool.fn_metadata = _Checked(arg_model=model, output_schema=meta.output_schema,
                                    output_model=meta.output_model, wrap_output=meta.wrap_output)
        tool.parameters = model.model_json_schema(by_alias=True)
