"""Work is started when it arrives: a running patrol daemon starts a task added to the pool by
any path (the command line, the MCP tool, `dispatch --queue`, a design sync run by another
patrol process) while a slot is free, without waiting for its next round. Against real
opencode servers; the seconds each path took are printed (docs/live.md has the figures). With
the pool in Redis, a task added on another host starts too."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from tests.e2e.daemon import _beat, _daemon
from tests.e2e.two_hosts import Host, abort_all
from tests.fleet import Hub

pytestmark = pytest.mark.e2e


def _mcp_add(hub: Hub, title: str) -> str:
    """Add a task through the MCP tool `backlog_add` (the SDK's in-memory client)."""
    pytest.importorskip("mcp.server.mcpserver")
    from mcp import Client

    from xaf_hub.cli.mcp import Hub as McpHub
    from xaf_hub.cli.mcp import build_server

    async def go() -> Any:
        tools = McpHub(config=str(hub.config_path), env=hub.env, cwd=hub.root)
        async with Client(build_server(tools)) as c:
            return await c.call_tool("backlog_add", {"title": title, "priority": "P0"})

    got = anyio.run(go)
    assert not got.is_error, got
    return str(got.structured_content["id"])


@pytest.mark.timeout(900)
def test_a_running_daemon_starts_work_added_by_each_path_at_once(hub: Hub) -> None:
    hub.llm.set_mode("slow-model", "slow", delay=120)
    hub.doc["models"]["default_dispatch_model"] = "fake/slow-model"
    # local-a is full (one run of its limit 1); lan-b and lan-c have two free slots each.
    limits = {"local-a": 1, "lan-b": 2, "lan-c": 2}
    for inst in hub.doc["instances"]:
        inst["concurrency_limit"] = limits[inst["name"]]
    plans = hub.project_dir("plans")
    hub.doc["patrol"] = {"repo_root": str(hub.root), "design_dirs": ["plans"]}
    hub.write_config()
    code, _, err = hub.cli("dispatch", "--new", "--instance", "local-a", "--text", "fill a",
                           "--no-record")
    assert code == 0, err
    lines = _daemon(hub)  # its round ran at its start; the next is an hour away

    def by_cli() -> str:
        code, doc = hub.cli_json("backlog", "add", "--title", "Arrived by the command line",
                                 "--priority", "P0")
        assert code == 0, doc
        return str(doc["id"])

    def by_mcp() -> str:
        return _mcp_add(hub, "Arrived by MCP")

    def by_queue() -> str:
        # local-a is full: queued for it, and borrowed by a free instance.
        code, doc = hub.cli_json("dispatch", "--new", "--instance", "local-a", "--queue",
                                 "--text", "Arrived by dispatch --queue")
        assert code == 0 and doc["queued"] is True, doc
        return str(doc["task"])

    def by_design() -> str:
        (plans / "plan.md").write_text(
            "| step | owner | state |\n|---|---|---|\n| F-8 Arrived by design | me | ⏳ 待派发 |\n",
            "utf-8")
        # The daemon's live fill of the previous arrival may still hold the cycle lock: a
        # `patrol --once` then skips its round (exit 3), as cron's next one would not.
        def synced() -> bool:
            code, _, err = hub.cli("patrol", "--once", "--no-fill", "--no-check",
                                   "--no-freelimit")
            assert code in (0, 3), err
            return code == 0

        hub.wait_for(synced, timeout=60, step=1.0)
        return "F-8"

    paths: dict[str, Callable[[], str]] = {
        "backlog add": by_cli, "MCP backlog_add": by_mcp, "dispatch --queue": by_queue,
        "sync_design": by_design,
    }
    took: dict[str, float] = {}
    try:
        for path, add in paths.items():
            task = add()
            added = time.monotonic()

            def started(task: str = task) -> dict[str, Any] | None:
                code, doc = hub.cli_json("backlog", "show", task)
                return doc if code == 0 and doc.get("session_id") else None

            # An hour before the daemon's next round: only the arrival can start it.
            row = hub.wait_for(started, timeout=60, step=0.1)
            took[path] = time.monotonic() - added
            assert row["status"] == "dispatched", row
            assert row["dispatched_to"] in ("lan-b", "lan-c"), row
        assert _beat(hub)["ticks"] == 1  # no round ran since the daemon's first
        print("started after being added: "
              + ", ".join(f"{p} {s:.1f} s" for p, s in took.items()))
    finally:
        assert lines.stop() == 0, lines.err
        for name in ("local-a", "lan-b", "lan-c"):
            for sid in hub.busy_ids(name):
                hub.cli("interrupt", "--session", sid)


@pytest.mark.timeout(600)
def test_work_added_on_another_host_starts_at_once_with_the_pool_in_redis(
    hosts: tuple[Host, Host],
) -> None:
    """The daemon runs on host A; host B, with no daemon, adds a task to the shared pool: A
    hears it through the pool's write counter and starts it, without a round."""
    a, b = hosts
    a.hub.llm.set_mode("slow-model", "slow", delay=120)
    for h in hosts:
        h.write(lambda doc: (doc["models"].update(default_dispatch_model="fake/slow-model"),
                             doc.update(pool={"backend": "redis"})))
    lines = _daemon(a.hub)
    try:
        code, doc = b.hub.cli_json("backlog", "add", "--title", "Arrived from host B")
        assert code == 0, doc
        added = time.monotonic()

        def started() -> dict[str, Any] | None:
            code, row = b.hub.cli_json("backlog", "show", doc["id"])
            return row if code == 0 and row.get("session_id") else None

        row = b.hub.wait_for(started, timeout=60, step=0.1)
        print(f"started {time.monotonic() - added:.1f} s after host B added it")
        assert row["status"] == "dispatched"
        assert _beat(a.hub)["ticks"] == 1
    finally:
        assert lines.stop() == 0, lines.err
        for name in ("local-a", "lan-b", "lan-c"):
            abort_all(a.hub, name)
