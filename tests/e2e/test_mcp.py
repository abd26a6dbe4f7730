"""`xaf-hub mcp` against real opencode servers: every tool through the SDK's in-memory client,
each refusal with its class, the limit under agents calling at once, `dispatch --queue`, and
Streamable HTTP with and without the bearer token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("mcp.server.mcpserver")

from mcp import Client  # noqa: E402

from tests.e2e.dispatch_checks import abort_all, slow  # noqa: E402
from tests.e2e.dispatch_checks import audit_lines as audit  # noqa: E402
from tests.fleet import Hub  # noqa: E402
from xaf_hub.cli.mcp import MAX_TEXT, build_server  # noqa: E402
from xaf_hub.cli.mcp import Hub as McpHub
from xaf_hub.sandbox import fleet as sandbox  # noqa: E402

pytestmark = pytest.mark.e2e


def tools_of(hub: Hub) -> McpHub:
    return McpHub(config=str(hub.config_path), env=hub.env, cwd=hub.root)


def call(hub: Hub, name: str, arguments: dict[str, Any], *, client: str = "lead") -> Any:
    """One tool call through the SDK's in-memory client; returns the CallToolResult."""

    async def go() -> Any:
        async with Client(build_server(tools_of(hub)), client_info=_info(client)) as c:
            return await c.call_tool(name, arguments)

    return anyio.run(go)


def _info(name: str) -> Any:
    from mcp_types import Implementation

    return Implementation(name=name, version="1")


def text(result: Any) -> str:
    return "".join(getattr(part, "text", "") for part in result.content)


def fill(hub: Hub, name: str, n: int) -> None:
    """``n`` slow runs on ``name``, sent by hand (no pool rows), seen running."""
    slow(hub, 40)
    for i in range(n):
        code, _, err = hub.cli("dispatch", "--new", "--instance", name, "--text", f"fill {i}",
                               "--no-record")
        assert code == 0, err
    hub.wait_for(lambda: len(hub.busy_ids(name)) == n)


def prompt_of(hub: Hub, name: str, sid: str) -> str:
    """Everything the session's user messages said, as the server keeps it. A prompt sent with
    prompt_async is stored after its 204, so this waits until the user's message shows."""

    def said() -> str:
        messages = sandbox.messages(hub.server(name).url, hub.password(name), sid)
        return "".join(p.get("text", "") for m in messages if m["info"]["role"] == "user"
                       for p in m.get("parts", []))

    return str(hub.wait_for(said, timeout=30))


def test_the_tools_an_agent_sees_have_schemas_and_descriptions(hub: Hub) -> None:
    async def go() -> Any:
        async with Client(build_server(tools_of(hub))) as c:
            return (await c.list_tools()).tools

    tools = {t.name: t for t in anyio.run(go)}
    assert set(tools) == {"instances", "status", "sessions", "show", "dispatch", "interrupt",
                          "backlog_list", "backlog_add", "backlog_show",
                          "waiting", "approve", "deny", "answer", "land"}
    assert tools["answer"].input_schema["properties"]["choices"]["type"] == "array"
    dispatch = tools["dispatch"].input_schema
    assert dispatch["required"] == ["text"] and dispatch["additionalProperties"] is False
    assert dispatch["properties"]["text"]["maxLength"] == MAX_TEXT
    for name in ("queue", "dry_run", "allow_prod", "instance", "session", "model"):
        assert dispatch["properties"][name]["description"]
    assert all(t.description for t in tools.values())


def test_reads_give_the_same_documents_as_the_cli(hub: Hub) -> None:
    sid = hub.session("lan-b", "MCP readable session", "app")
    got = call(hub, "status", {})
    assert not got.is_error, text(got)
    names = [i["instance"] for i in got.structured_content["instances"]]
    assert names == ["local-a", "lan-b", "lan-c"]
    assert "local-a 0 running + 0 reserved of 2" in text(got)
    assert got.structured_content["queue"] == {"pending": 0}

    got = call(hub, "sessions", {"instance": "lan-b", "keyword": "readable"})
    assert [s["id"] for s in got.structured_content["sessions"]] == [sid]
    code, cli_doc = hub.cli_json("sessions", "--instance", "lan-b", "--keyword", "readable")
    assert code == 0 and [s["id"] for s in cli_doc["sessions"]] == [sid]

    got = call(hub, "show", {"session": sid})
    assert not got.is_error and got.structured_content["session_id"] == sid

    got = call(hub, "instances", {})
    assert not got.is_error and text(got) == "3 instances"
    for secret in hub.secrets():
        assert secret not in json.dumps(got.structured_content) + text(got)


def test_dispatch_lands_with_the_discipline_and_is_audited_as_the_agent(hub: Hub) -> None:
    got = call(hub, "dispatch", {"text": "Add a health check endpoint", "instance": "lan-b",
                                 "new": True}, client="opencode")
    assert not got.is_error, text(got)
    doc = got.structured_content
    assert doc["action"] == "create" and doc["instance"] == "lan-b"
    prompt = prompt_of(hub, "lan-b", doc["session_id"])
    assert "Add a health check endpoint" in prompt and "commit" in prompt.lower()
    entry = [e for e in audit(hub) if e.get("session") == doc["session_id"]][-1]
    assert entry["who"]["caller"] == "mcp:opencode"


def test_pool_tools_and_interrupt(hub: Hub) -> None:
    got = call(hub, "backlog_add", {"title": "Document the API", "priority": "P1",
                                    "prompt": "Write docs/api.md", "instance": "lan-b"})
    assert not got.is_error, text(got)
    task = got.structured_content["id"]
    assert text(got) == f"added {task}"
    got = call(hub, "backlog_show", {"task_id": task})
    assert got.structured_content["prompt"] == "Write docs/api.md"
    assert got.structured_content["priority"] == "P1"
    got = call(hub, "backlog_list", {"status": "pending"})
    assert task in json.dumps(got.structured_content) and text(got).endswith("tasks")
    got = call(hub, "backlog_show", {"task_id": "T-nope"})
    assert got.is_error and "bad argument: " in text(got)
    got = call(hub, "backlog_add", {"title": "x", "priority": "P9"})
    assert got.is_error and "priority" in text(got)

    slow(hub, 40)
    sid = hub.session("lan-b", "to be stopped", "app")
    hub.prompt("lan-b", sid, "long work", "fake/slow-model")
    hub.wait_for(lambda: sid in hub.busy_ids("lan-b"))
    got = call(hub, "interrupt", {"session": sid}, client="lead")
    assert not got.is_error, text(got)
    hub.wait_for(lambda: sid not in hub.busy_ids("lan-b"))
    stopped = [e for e in audit(hub) if e.get("session") == sid and e["command"] == "interrupt"]
    assert stopped and stopped[-1]["who"]["caller"] == "mcp:lead"


def test_a_client_that_goes_away_mid_call_leaves_a_dispatch_done_or_not_started(
    hub: Hub,
) -> None:
    # The call is cancelled while its command runs; the command is never abandoned half-way:
    # whatever the audit log says was created exists on the server, and nothing else does.
    texts = [f"cancelled call {i}" for i in range(4)]

    async def go(i: int) -> None:
        async with Client(build_server(tools_of(hub))) as c:
            with anyio.move_on_after(0.05 * (i + 1)):
                await c.call_tool("dispatch", {"text": texts[i], "instance": "lan-c",
                                               "new": True})

    for i in range(len(texts)):
        anyio.run(go, i)
    time.sleep(1.0)
    created = {e["session"] for e in audit(hub) if e.get("result") == "create"}
    code, doc = hub.cli_json("sessions", "--instance", "lan-c")
    on_server = {s["id"] for s in doc["sessions"] if s["title"].startswith("cancelled call")}
    assert created == on_server


def test_dispatch_into_a_full_instance_is_refused_with_the_reason_and_sends_nothing(
    hub: Hub,
) -> None:
    try:
        fill(hub, "local-a", 2)
        before = len(audit(hub))
        got = call(hub, "dispatch", {"text": "one too many", "instance": "local-a", "new": True})
        assert got.is_error and "limit reached: " in text(got) and "at its limit" in text(got)
        assert "Traceback" not in text(got)
        assert [e for e in audit(hub)[before:] if e.get("result") == "create"] == []
        assert len(hub.busy_ids("local-a")) == 2
    finally:
        abort_all(hub, "local-a")


def test_refusals_name_their_class(hub: Hub) -> None:
    hub.write_config(instances=[*hub.doc["instances"], {
        "name": "prod-x", "url": hub.server("lan-c").url, "roots": [str(hub.root)],
        "danger": True}, {"name": "gone", "url": "http://127.0.0.1:9", "roots": [str(hub.root)]}])
    hub.env["XAF_HUB_PW_PROD_X"] = hub.password("lan-c")
    outside = hub.session("lan-b", "someone else's", directory=hub.root.parent / "elsewhere")
    cases = [
        ({"text": "x", "instance": "prod-x", "new": True}, "production needs allow_prod: "),
        ({"text": "x", "session": outside, "instance": "lan-b"}, "not a project session: "),
        ({"text": "x", "instance": "lan-b", "new": True, "directory": f"{hub.root}/../elsewhere"},
         "not a project session: "),
        ({"text": "x", "instance": "gone", "new": True}, "instance unreachable: "),
        ({"text": "x", "instance": "nope"}, "bad argument: "),
        ({"text": "x", "session": "ses_nope", "instance": "lan-b"}, "bad argument: "),
        ({"text": "   "}, "bad argument: --text is empty"),
    ]
    for args, expected in cases:
        got = call(hub, "dispatch", args)
        assert got.is_error and expected in text(got), (args, text(got))
        for secret in hub.secrets():
            assert secret not in text(got)
    for args, word in [({"text": "x", "surprise": 1}, "surprise"), ({"text": 5}, "text"),
                       ({}, "text"), ({"text": "x" * (MAX_TEXT + 1)}, "text"),
                       ({"text": "x", "new": "maybe"}, "new")]:
        got = call(hub, "dispatch", args)
        # One line an agent reads, naming the argument: no pydantic dump, no echoed value.
        assert got.is_error and f"bad argument: {word}" in text(got), (args, text(got))
        assert "pydantic" not in text(got) and "validation error" not in text(got)
        assert "\n" not in text(got) and "xxxxxxxx" not in text(got)
    assert [e for e in audit(hub) if e.get("result") == "create"] == []


def test_a_text_is_text_whatever_its_first_character_and_a_list_is_data(hub: Hub) -> None:
    got = call(hub, "dispatch", {"text": "--fix-it", "instance": "lan-b", "new": True,
                                 "dry_run": True})
    assert not got.is_error, text(got)
    assert got.structured_content["dry_run"] is True and "--fix-it" in got.structured_content[
        "prompt"]
    got = call(hub, "backlog_add", {"title": "-t", "depends_on": ["A", "--instance", "lan-z"]})
    assert not got.is_error, text(got)
    code, task = hub.cli_json("backlog", "show", got.structured_content["id"])
    assert code == 0 and task["title"] == "-t"
    assert task["depends_on"] == ["A", "--instance", "lan-z"] and task["instance"] == ""


def test_lock_busy_is_its_own_class(hub: Hub) -> None:
    import portalocker

    hub.write_config(lock={**hub.doc["lock"], "lock_timeout_seconds": 1})
    lock_file = Path(hub.env["XAF_HUB_HOME"]) / "locks" / "local-a.lock"
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+b") as held:
        portalocker.lock(held, portalocker.LOCK_EX)
        got = call(hub, "dispatch", {"text": "x", "instance": "local-a", "new": True})
    assert got.is_error and text(got).startswith("Error executing tool dispatch: lock busy: ")


def test_agents_calling_at_once_never_exceed_the_limit(hub: Hub) -> None:
    slow(hub, 40)
    server = build_server(tools_of(hub))

    async def one(i: int, results: list[Any]) -> None:
        async with Client(server, client_info=_info(f"agent-{i}")) as c:
            results.append(await c.call_tool("dispatch", {
                "text": f"parallel task {i}", "instance": "local-a", "new": True}))

    async def go() -> list[Any]:
        results: list[Any] = []
        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(one, i, results)
        return results

    try:
        results = anyio.run(go)
        ok = [r for r in results if not r.is_error]
        refused = [text(r) for r in results if r.is_error]
        assert len(ok) == 2, refused
        assert all("limit reached" in t or "lock busy" in t for t in refused), refused
        assert len(hub.busy_ids("local-a")) == 2
        callers = {e["who"]["caller"] for e in audit(hub) if e.get("result") == "create"}
        assert len(callers) == 2 and all(c.startswith("mcp:agent-") for c in callers)
    finally:
        abort_all(hub, "local-a")


def test_queue_puts_the_work_in_the_pool_when_the_fleet_is_full(hub: Hub) -> None:
    for name in ("local-a", "lan-b", "lan-c"):
        hub.set_instance(name, concurrency_limit=1)
    try:
        for name in ("local-a", "lan-b", "lan-c"):
            fill(hub, name, 1)
        code, out, err = hub.cli("dispatch", "--text", "Write the release notes", "--queue")
        assert code == 0, err
        assert out.startswith("queued as T-") and "(position 1 of 1)" in out
        assert "no patrol daemon is running" in out
        got = call(hub, "dispatch", {"text": "Translate the README", "queue": True})
        assert not got.is_error, text(got)
        doc = got.structured_content
        assert doc["queued"] is True and doc["task"].startswith("T-") and doc["position"] == 2
        code, pool = hub.cli_json("backlog", "list", "--status", "pending")
        assert code == 0
        queued = {t["id"]: t for t in pool["tasks"]} if isinstance(pool, dict) else {
            t["id"]: t for t in pool}
        assert queued[doc["task"]]["prompt"] == "Translate the README"
        code, status = hub.cli_json("status")
        assert status["queue"] == {"pending": 2}
        # Without --queue the same dispatch still refuses (exit 3) and queues nothing.
        code, _, err = hub.cli("dispatch", "--text", "not queued", "--new")
        assert code == 3 and "at its limit" in err
    finally:
        for name in ("local-a", "lan-b", "lan-c"):
            abort_all(hub, name)


# -- Streamable HTTP -------------------------------------------------------------------------


@pytest.fixture
def http_server(hub: Hub, tmp_path: Path) -> Iterator[tuple[str, str]]:
    token = "t0ken-" + os.urandom(12).hex()
    env = {**os.environ, **hub.env, "XAF_HUB_MCP_TOKEN": token}
    log = tmp_path / "mcp-http.log"
    with open(log, "w", encoding="utf-8") as err, subprocess.Popen(
        [sys.executable, "-m", "xaf_hub", "--config", str(hub.config_path), "mcp", "--http",
         "--port", "0"], stdout=subprocess.PIPE, stderr=err, text=True, env=env,
    ) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp"), log.read_text()
            yield url, token
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        assert token not in log.read_text("utf-8")


def test_streamable_http_needs_the_token(hub: Hub, http_server: tuple[str, str]) -> None:
    url, token = http_server
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "curl", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream"}
    for auth in (None, "Bearer wrong-token-value", f"Basic {token}"):
        extra = {"Authorization": auth} if auth else {}
        r = httpx.post(url, json=hello, headers={**headers, **extra}, timeout=10)
        assert r.status_code == 401 and token not in r.text

    async def go() -> Any:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
        async with client, Client(streamable_http_client(url, http_client=client)) as c:
            return await c.call_tool("status", {})

    got = anyio.run(go)
    assert not got.is_error and len(got.structured_content["instances"]) == 3


def test_http_without_a_token_or_on_a_public_address_is_refused(hub: Hub) -> None:
    assert "XAF_HUB_MCP_TOKEN" not in hub.env
    code, _, err = hub.cli("mcp", "--http", "--port", "0")
    assert code == 4 and "XAF_HUB_MCP_TOKEN" in err
    code, _, err = hub.cli("mcp", "--http", "--host", "0.0.0.0", "--port", "0")
    assert code == 4 and "non-loopback" in err
    hub.env["XAF_HUB_MCP_TOKEN"] = "short"
    code, _, err = hub.cli("mcp", "--http", "--port", "0")
    assert code == 4 and "too short" in err


# -- a real opencode server as the MCP client: a lead agent drives the fleet -------------------


@pytest.fixture
def lead(hub: Hub, tmp_path: Path) -> Iterator[sandbox.OpencodeServer]:
    """A separate opencode server whose config names `xaf-hub mcp` as its MCP server `xafhub`;
    its model is the tests' fake, scripted per test to call the hub's tools."""
    config = sandbox.fake_provider_config(hub.llm.url, ("fake/lead-model", "fake/fake-model"))
    config["mcp"] = {"xafhub": {
        "type": "local",
        "command": [sys.executable, "-m", "xaf_hub", "--config", str(hub.config_path), "mcp"],
        "environment": {**hub.env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        "timeout": 60_000,
    }}
    server = sandbox.OpencodeServer(
        sandbox.find_opencode_binary(), home=tmp_path / "lead" / "home",
        cwd=tmp_path / "lead" / "cwd", password="lead-" + os.urandom(8).hex(), config=config,
        start_timeout=120.0,
    )
    with server:
        yield server


def lead_run(hub: Hub, lead: sandbox.OpencodeServer, calls: list[Any]) -> list[str]:
    """Prompt a lead session whose model makes ``calls``; return the tool results it saw."""
    hub.llm.set_mode("lead-model", "tools", calls=calls, text="lead done")
    workdir = lead.cwd / "plan"
    workdir.mkdir(parents=True, exist_ok=True)
    sid = str(sandbox.create_session(lead.url, lead.password, str(workdir), "lead")["id"])
    sandbox.prompt_async(lead.url, lead.password, sid, "split the goal and send the pieces",
                         "fake/lead-model")

    def finished() -> list[str] | None:
        for entry in reversed(hub.llm.requests()):
            if entry["model"] == "lead-model" and len(entry["tool_results"]) >= len(calls):
                return list(entry["tool_results"])
        return None

    return hub.wait_for(finished, timeout=120, step=0.5)


def test_a_lead_agent_in_opencode_sees_the_fleet_and_sends_work(
    hub: Hub, lead: sandbox.OpencodeServer
) -> None:
    results = lead_run(hub, lead, [
        ["status", {}],
        ["dispatch", {"text": "Write the changelog entry", "instance": "lan-b", "new": True}],
    ])
    assert "local-a" in results[0] and "running" in results[0], results
    assert results[1].startswith("create ses_") and " on lan-b; model " in results[1], results
    created = [e for e in audit(hub)
               if e.get("result") == "create" and e.get("instance") == "lan-b"]
    assert len(created) == 1 and created[0]["who"]["caller"].startswith("mcp:")
    sid = created[0]["session"]
    prompt = prompt_of(hub, "lan-b", sid)
    assert "Write the changelog entry" in prompt and "commit" in prompt.lower()


def test_a_lead_agent_dispatching_into_a_full_instance_is_refused_and_nothing_is_sent(
    hub: Hub, lead: sandbox.OpencodeServer
) -> None:
    try:
        fill(hub, "local-a", 2)
        before = len(audit(hub))
        results = lead_run(hub, lead, [
            ["dispatch", {"text": "one too many", "instance": "local-a", "new": True}],
        ])
        assert "limit reached" in results[0] and "at its limit" in results[0], results
        assert [e for e in audit(hub)[before:] if e.get("result") == "create"] == []
        assert len(hub.busy_ids("local-a")) == 2
    finally:
        abort_all(hub, "local-a")


def test_opencode_configured_with_the_lines_init_prints_drives_the_hub(
    hub: Hub, tmp_path: Path
) -> None:
    # As a person does it: `init` for the fleet, then opencode's `mcp` key pasted exactly as
    # printed (no environment, no timeout); opencode starts the server in a session's folder.
    import io

    from xaf_hub.cli.main import main

    config = tmp_path / "mine" / "config.json"
    config.parent.mkdir()
    args = ["--config", str(config), "init", "--root", str(hub.root)]
    for name in ("local-a", "lan-b", "lan-c"):
        args += ["-i", f"{name}={hub.server(name).url}"]
    out, err = io.StringIO(), io.StringIO()
    assert main(args, stdout=out, stderr=err, env=hub.env, cwd=tmp_path) == 0, err.getvalue()
    pasted = json.loads(next(line for line in out.getvalue().splitlines()
                             if line.strip().startswith('{"mcp"')))
    lead_config = sandbox.fake_provider_config(hub.llm.url, ("fake/lead-model",
                                                             "fake/fake-model"))
    lead_config.update(pasted)
    # The person's shell: the passwords the next-step line asks for, and this checkout.
    shell = {**hub.env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    server = sandbox.OpencodeServer(
        sandbox.find_opencode_binary(), home=tmp_path / "lead" / "home",
        cwd=tmp_path / "lead" / "cwd", password="lead-" + os.urandom(8).hex(),
        config=lead_config, extra_env=shell, start_timeout=120.0,
    )
    with server:
        results = lead_run(hub, server, [["status", {}]])
    assert "local-a 0 running + 0 reserved of 2" in results[0], results
    assert "lan-c" in results[0] and "config error" not in results[0]
