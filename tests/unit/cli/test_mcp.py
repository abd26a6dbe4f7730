"""The MCP face's own decisions: a refusal's class, and the bearer token on Streamable HTTP."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp.server.mcpserver")

from tests.unit.cli.mcp_support import _call, _text
from tests.unit.config.projects_support import projects  # noqa: E402
from xaf_hub.cli.mcp import MAX_TEXT, refusal_class  # noqa: E402
from xaf_hub.cli.mcp_command import bearer_guard  # noqa: E402
from xaf_hub.errors import (  # noqa: E402
    BudgetReached,
    BusyError,
    ConfigError,
    HubError,
    LockBusy,
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


@pytest.mark.parametrize(("error", "word"), [
    (BusyError("lan-b is at its limit: 2 running + 0 reserved of 2"), "limit reached"),
    (LockBusy("could not obtain the dispatch lock (x.lock) within 20s"), "lock busy"),
    # The class comes from the exception's type, never from its words.
    (BusyError("could not obtain a free slot"), "limit reached"),
    (LockBusy("lan-b is at its limit"), "lock busy"),
    (LockLostError("the dispatch lock was lost"), "lock lost"),
    (RunStateUnknown("lan-b", "no status"), "run state unknown"),
    (BudgetReached("daily budget $3.00 reached"), "limit reached"),
    (ProductionRefused("prod-x is production: pass --allow-prod"),
     "production needs allow_prod"),
    (NotProjectSession("ses_x is not a project session"), "not a project session"),
    (UnreachableError("lan-b", "connection refused"), "instance unreachable"),
    (MissingPassword("lan-b", "XAF_HUB_PW_LAN_B"), "password missing"),
    (SessionNotFound("no session ses_x"), "bad argument"),
    (UsageError("unknown instance 'nope'"), "bad argument"),
    (ConfigError("config.json: bad key"), "config error"),
    (StateFileError("tasks_backlog.json: invalid JSON"), "state file damaged"),
    (HubError("something"), "internal error"),
    (RuntimeError("a bug"), "internal error"),
])
def test_each_refusal_has_its_class(error: BaseException, word: str) -> None:
    assert refusal_class(error) == word


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


# -- the tools: generated from the commands' option declarations -------------------------------


def _tools(hub: Any) -> dict[str, Any]:
    from mcp import Client

    from xaf_hub.cli.mcp import build_server

    async def go() -> Any:
        async with Client(build_server(hub)) as c:
            return (await c.list_tools()).tools

    return {t.name: t for t in anyio.run(go)}


def test_each_tool_parameter_is_the_commands_declared_option(tmp_path: Path) -> None:
    # One declaration, two faces: a tool parameter has the name, help, default and limits of
    # the option its command's parser has (same dest, same help, same default).
    from xaf_hub.cli.main import build_parser
    from xaf_hub.cli.mcp import TOOLS, Hub

    tools = _tools(Hub(config=str(tmp_path / "none.json"), env={}, cwd=tmp_path))
    assert set(tools) == {t.name for t in TOOLS}
    command_of = {"backlog_list": ("backlog", "list"), "backlog_add": ("backlog", "add"),
                  "backlog_show": ("backlog", "show")}
    checked = 0
    for tool in TOOLS:
        words = command_of.get(tool.name, (tool.name,))
        parser = build_parser([words[0]])
        sub = parser._subparsers._group_actions[0].choices[words[0]]  # type: ignore[union-attr]
        if len(words) > 1:
            sub = sub._subparsers._group_actions[0].choices[words[1]]  # type: ignore[union-attr]
        actions = {a.dest: a for a in sub._actions}
        schema = tools[tool.name].input_schema["properties"]
        for opt in tool.options:
            assert opt.dest in actions, (tool.name, opt.dest)
            action = actions[opt.dest]
            assert schema[opt.dest]["description"] == (opt.tool_help or action.help)
            if opt.kind is not bool and not opt.required:
                # a common option (--project) is the root parser's on a command: its default
                default = None if action.default == argparse.SUPPRESS else action.default
                assert schema[opt.dest].get("default") == (
                    list(default) if isinstance(default, list) else default)
            checked += 1
    assert checked >= 20
    dispatch = tools["dispatch"].input_schema
    assert dispatch["required"] == ["text"] and dispatch["additionalProperties"] is False
    assert dispatch["properties"]["text"]["maxLength"] == MAX_TEXT


@pytest.mark.parametrize(("arguments", "line"), [
    ({"text": 5}, "bad argument: text: Input should be a valid string"),
    ({}, "bad argument: text: Field required"),
    ({"text": "x", "surprise": 1}, "bad argument: surprise: Extra inputs are not permitted"),
    ({"text": "x" * (MAX_TEXT + 1)}, f"bad argument: text: String should have at most "
                                     f"{MAX_TEXT} characters"),
])
def test_a_bad_argument_is_one_line_naming_it(
    tmp_path: Path, arguments: dict[str, Any], line: str
) -> None:
    from xaf_hub.cli.mcp import Hub

    got = _call(Hub(config=str(tmp_path / "none.json"), env={}, cwd=tmp_path), "dispatch",
                arguments)
    assert got.is_error and _text(got) == f"Error executing tool dispatch: {line}"


def test_a_config_that_cannot_load_is_a_config_error_in_every_answer(tmp_path: Path) -> None:
    from xaf_hub.cli.mcp import TOOLS, Hub

    broken = tmp_path / "config.json"
    broken.write_text('{"instances": [', "utf-8")
    hub = Hub(config=str(broken), env={}, cwd=tmp_path)
    needs = {"show": {"session": "ses_x"}, "dispatch": {"text": "x"},
             "interrupt": {"session": "ses_x"}, "backlog_add": {"title": "x"},
             "backlog_show": {"task_id": "T-x"}, "approve": {"request": "per_x"},
             "deny": {"request": "per_x"}, "answer": {"request": "que_x"},
             "land": {"task_id": "T-x"}}
    for tool in TOOLS:
        got = _call(hub, tool.name, needs.get(tool.name, {}))
        assert got.is_error and f": config error: {broken}" in _text(got), _text(got)


def test_the_server_starts_without_a_config_and_says_why_to_the_agent(tmp_path: Path) -> None:
    # As opencode starts it: in a session's folder, where no config is found. The handshake
    # completes, the tools are listed, and a call answers with the reason (exit 0 at the end).
    import os
    import sys

    from mcp import Client, StdioServerParameters

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("XAF_HUB_")}
    env.update(XAF_HUB_HOME=str(home), HOME=str(home),
               PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    params = StdioServerParameters(command=sys.executable, args=["-m", "xaf_hub", "mcp"],
                                   env=env, cwd=tmp_path)

    async def go() -> tuple[list[str], Any]:
        with anyio.fail_after(60):
            async with Client(params) as c:
                names = [t.name for t in (await c.list_tools()).tools]
                return names, await c.call_tool("status", {})

    names, got = anyio.run(go)
    assert "status" in names and "dispatch" in names
    assert got.is_error and "config error: no config found" in _text(got), _text(got)


# -- 40.4: a text is text, a list is data (what reaches the typed record) ------------------------


def test_arguments_reach_the_record_as_data() -> None:
    from xaf_hub.cli.commands import backlog, dispatch
    from xaf_hub.cli.options import record

    opts = record(dispatch.Options, {"text": "--fix-it", "new": True})
    assert opts.text == "--fix-it" and opts.new and not opts.queue and opts.instance is None
    add = record(backlog.AddOptions, {"title": "B", "depends_on": ["A", "--instance", "lan-z"]})
    assert add.depends_on == ("A", "--instance", "lan-z") and add.instance == ""
    assert add.priority == "P2" and add.prompt == ""


def test_a_read_names_a_missing_password_and_still_answers_past_a_down_instance(
    tmp_path: Path,
) -> None:
    import json

    import httpx

    from xaf_hub.cli.mcp import Hub

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"instances": [
        {"name": "locked", "url": "http://127.0.0.1:1", "roots": [str(tmp_path)]},
        {"name": "down", "url": "http://127.0.0.1:2", "roots": [str(tmp_path)]},
    ]}), "utf-8")

    def transport(inst: Any) -> httpx.MockTransport:
        if inst.name == "locked":
            return httpx.MockTransport(lambda r: httpx.Response(401))
        return httpx.MockTransport(lambda r: httpx.Response(503, text="down"))

    env = {"XAF_HUB_HOME": str(tmp_path / "home")}
    hub = Hub(config=str(config), env=env, cwd=tmp_path, transport_factory=transport)
    for tool in ("instances", "status", "sessions"):
        got = _call(hub, tool, {})
        assert got.is_error, (tool, _text(got))
        assert _text(got).endswith(
            "password missing: no password configured for locked: set XAF_HUB_PW_LOCKED")
    got = _call(hub, "sessions", {"instance": "down"})
    assert not got.is_error, _text(got)
    assert got.structured_content["unreachable"][0]["instance"] == "down"


def test_every_answer_names_the_project_it_was_read_as(tmp_path: Path) -> None:
    import json

    from xaf_hub.cli.mcp import Hub

    one = tmp_path / "one.json"
    one.write_text(json.dumps({"project": {"name": "demo"}, "instances": [
        {"name": "down", "url": "http://127.0.0.1:9", "roots": [str(tmp_path)]}]}), "utf-8")
    several = tmp_path / "several.json"
    doc = projects()
    for inst in doc["instances"]:
        inst["url"] = "http://127.0.0.1:9"
    several.write_text(json.dumps(doc), "utf-8")
    env = {"XAF_HUB_HOME": str(tmp_path / "home")}
    for config, tool, args, name in (
        (one, "backlog_list", {}, "demo"), (one, "instances", {}, "demo"),
        (several, "sessions", {"project": "blog"}, "blog"), (several, "waiting", {}, None),
        (one, "status", {}, "demo"),
    ):
        got = _call(Hub(config=str(config), env=env, cwd=tmp_path), tool, args)
        answer = got.structured_content
        for record in answer.get("items", [answer]):
            assert record.get("project", "missing") == name, (tool, answer)


def test_only_a_missing_sdk_reads_as_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The MCP face is imported when the command runs: a missing SDK is the user's to install
    # (exit 4 with the command that adds it); a module of ours that fails to import is a fault.
    import io
    import sys

    from xaf_hub.cli.main import main

    def run() -> tuple[int, str]:
        err = io.StringIO()
        return main(["mcp"], stdout=io.StringIO(), stderr=err, env={}, cwd=tmp_path), err.getvalue()

    monkeypatch.delitem(sys.modules, "xaf_hub.cli.mcp", raising=False)
    monkeypatch.setitem(sys.modules, "mcp_types", None)  # the SDK's, not installed
    code, err = run()
    assert code == 4 and "needs the MCP SDK: pipx inject xaf-hub" in err, err
    monkeypatch.setitem(sys.modules, "xaf_hub.cli.mcp", None)  # ours, broken
    code, err = run()
    assert code == 1 and "MCP SDK" not in err, err
