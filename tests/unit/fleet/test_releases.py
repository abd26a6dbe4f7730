"""Release detection and run-state reading per release line, over httpx.MockTransport.

The servers here answer the way docs/opencode-releases.md says each line answers (measured on
real servers; tests/e2e/test_releases.py runs the real thing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.rules import ProjectRules
from xaf_hub.errors import ExitCode, RunStateUnknown
from xaf_hub.fleet.client import OpencodeClient
from xaf_hub.fleet.releases import classify, parse_version
from xaf_hub.fleet.scan import scan_instance

G = "/srv/demo/app"


@pytest.mark.parametrize(
    ("version", "behaviour", "server_wide"),
    [
        ("1.2.27", "server-wide", True),
        ("1.3.2", "server-wide", True),
        ("1.14.41", "server-wide", True),
        ("1.14.99-beta.1", "server-wide", True),
        ("1.15.0", "per-directory", False),
        ("1.15.13", "per-directory", False),
        ("1.17.19", "per-directory", False),
        ("1.18.33", "per-directory", False),
        ("v1.18.40", "per-directory", False),
        ("1.19.0", "per-directory", True),  # newer than measured: read both ways
        ("2.0.1", "per-directory", True),
        ("1.1.9", "unknown", True),
        ("0.15.3", "unknown", True),
        ("local", "unknown", True),
        ("", "unknown", True),
    ],
)
def test_classify(version: str, behaviour: str, server_wide: bool) -> None:
    rel = classify(version)
    assert rel.behaviour == behaviour
    assert rel.reads_server_wide is server_wide
    assert rel.known is (behaviour != "unknown")
    line = rel.describe()
    assert "\n" not in line and behaviour in line and (version or "unknown version") in line


def test_parse_version_and_v2() -> None:
    assert parse_version("1.14.41") == (1, 14, 41)
    assert parse_version(" 1.2.27 ") == (1, 2, 27)
    assert parse_version("1.14") is None
    assert classify("9.9.9", "v2").behaviour == "v2"


def test_run_state_unknown_is_a_busy_exit() -> None:
    err = RunStateUnknown("lan-x", "version 'local' is not a release number")
    assert err.exit_code == ExitCode.BUSY
    assert str(err).startswith("lan-x: run state unknown (") and "counted full" in str(err)


class Server:
    """A fake classic server of one release: sessions in G, run state where that line puts it.

    ``runs`` maps a session id to where its run lives: "G" (started with ?directory=G) or
    "server" (started without a directory; on 1.2-1.14 that is the server's own directory).
    """

    def __init__(self, version: str, runs: dict[str, str], status_code: int = 200) -> None:
        self.version = version
        self.runs = runs
        self.status_code = status_code
        self.seen: list[tuple[str, str, str | None]] = []

    def per_directory(self) -> bool:
        return classify(self.version).behaviour == "per-directory"

    def handler(self, req: httpx.Request) -> httpx.Response:
        path, d = req.url.path, req.url.params.get("directory")
        self.seen.append((req.method, path, d))
        if path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": self.version})
        if path == "/experimental/session":
            sessions = [
                {"id": sid, "directory": G, "time": {"created": 1, "updated": 2}}
                for sid in ("ses_a", "ses_b", "ses_c")
            ]
            return httpx.Response(200, json=sessions)
        if path == "/session/status":
            if self.status_code != 200:
                return httpx.Response(self.status_code, json={"name": "NotFoundError"})
            if self.per_directory():
                # 1.15+: every run shows under its session's own directory.
                shown = self.runs if d == G else {}
            else:
                want = "G" if d == G else "server" if d is None else "?"
                shown = {k: v for k, v in self.runs.items() if v == want}
            return httpx.Response(200, json={k: {"type": "busy"} for k in shown})
        if path.startswith("/session/ses_"):
            if req.method == "GET" and path.count("/") == 2:
                sid = path.rsplit("/", 1)[1]
                body = {"id": sid, "directory": G, "time": {"created": 1, "updated": 2}}
                return httpx.Response(200, json=body)
            if path.endswith("/abort"):
                return httpx.Response(200, json=True)
            if path.endswith("/message"):
                return httpx.Response(200, json=[])
            return httpx.Response(204)
        return httpx.Response(404, json={"name": "NotFoundError"})


INST = InstanceConfig(
    name="lan-x",
    url="http://127.0.0.1:1",
    roots=("/srv/demo",),
    rules=ProjectRules.build(roots=("/srv/demo",)),
)


def run(server: Server, coro: Callable[[OpencodeClient], Any]) -> Any:
    async def go() -> Any:
        async with OpencodeClient(INST, transport=httpx.MockTransport(server.handler)) as c:
            return await coro(c)

    return asyncio.run(go())


@pytest.mark.parametrize("version", ["1.2.27", "1.14.41", "1.15.13", "1.18.33"])
def test_scan_counts_runs_started_with_and_without_a_directory(version: str) -> None:
    server = Server(version, {"ses_a": "G", "ses_b": "server"})
    sc = run(server, lambda c: scan_instance(c, INST))
    assert sc.reachable and not sc.run_state_unknown
    assert {s.id for s in sc.sessions if s.running} == {"ses_a", "ses_b"}
    assert sc.summary().running_project == 2
    wide = ("GET", "/session/status", None) in server.seen
    assert wide is (not server.per_directory())  # read the way that release answers
    assert version in sc.release and ("server-wide" in sc.release) is wide


@pytest.mark.parametrize(
    ("server", "why"),
    [
        (Server("local", {}), "not a release number"),
        (Server("1.1.0", {}), "older than 1.2"),
        (Server("1.18.33", {}, status_code=404), "/session/status HTTP 404"),
    ],
    ids=["unparsable", "too-old", "status-refused"],
)
def test_unreadable_run_state_counts_project_sessions_running(server: Server, why: str) -> None:
    sc = run(server, lambda c: scan_instance(c, INST))
    assert sc.reachable
    assert why in sc.run_state_unknown and "\n" not in sc.run_state_unknown
    assert all(s.running and s.run_state == "busy" for s in sc.sessions if s.project)
    assert len(sc.sessions) == 3
    assert any("run state unknown" in w and "count as running" in w for w in sc.warnings)
    assert sc.summary().run_state_unknown == sc.run_state_unknown


def test_an_unknown_status_kind_is_never_idle() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/session/status":
            return httpx.Response(200, json={"ses_a": {"type": "compacting"}})
        return Server("1.18.33", {}).handler(req)

    async def go() -> Any:
        async with OpencodeClient(INST, transport=httpx.MockTransport(handler)) as c:
            return await scan_instance(c, INST)

    sc = asyncio.run(go())
    assert [s.id for s in sc.sessions if s.running] == ["ses_a"]


def _calls(server: Server, method: str, suffix: str) -> list[str | None]:
    return [d for m, p, d in server.seen if m == method and p.endswith(suffix)]


@pytest.mark.parametrize("version", ["1.2.27", "1.14.41", "1.18.33"])
def test_per_session_calls_carry_the_session_directory(version: str) -> None:
    server = Server(version, {})

    async def go(c: OpencodeClient) -> None:
        await c.prompt_async("ses_a", "hi", None)  # not seen before: looked up first
        await c.abort("ses_a")
        await c.messages("ses_a", limit=2)
        await c.delete("ses_a")
        await c.get_session("ses_b")

    run(server, go)
    assert _calls(server, "POST", "/prompt_async") == [G]
    assert _calls(server, "POST", "/abort") == [G]
    assert _calls(server, "GET", "/message") == [G]
    assert _calls(server, "DELETE", "/ses_a") == [G]
    # the very first GET of ses_a had no directory to send; once known, it is sent
    assert [d for m, p, d in server.seen if (m, p) == ("GET", "/session/ses_a")] == [None]


def test_directories_come_from_the_listing_without_a_lookup() -> None:
    server = Server("1.18.33", {})

    async def go(c: OpencodeClient) -> None:
        await c.list_sessions()
        await c.prompt_async("ses_c", "hi", "fake/fake-model")

    run(server, go)
    assert _calls(server, "POST", "/prompt_async") == [G]
    assert not [p for m, p, d in server.seen if p == "/session/ses_c" and m == "GET"]


@pytest.mark.parametrize("version", ["1.2.27", "1.14.41"])
def test_writes_to_a_run_in_the_server_directory_go_there(version: str) -> None:
    # Started by another client without a directory: the run lives in the server's own
    # directory, so a steer or an abort sent with ?directory=G would miss it.
    server = Server(version, {"ses_b": "server"})

    async def go(c: OpencodeClient) -> None:
        await c.prompt_async("ses_b", "steer", None, G)
        await c.abort("ses_b", G)
        await c.prompt_async("ses_a", "start", None, G)  # idle: runs in its own directory

    run(server, go)
    assert _calls(server, "POST", "/prompt_async") == [None, G]
    assert _calls(server, "POST", "/abort") == [None]


def test_per_directory_releases_need_no_server_wide_read_for_writes() -> None:
    server = Server("1.18.33", {"ses_b": "server"})
    run(server, lambda c: c.prompt_async("ses_b", "steer", None, G))
    assert _calls(server, "POST", "/prompt_async") == [G]
    assert ("GET", "/session/status", None) not in server.seen


def test_a_directory_given_once_is_sent_on_later_calls() -> None:
    server = Server("1.18.33", {})

    async def go(c: OpencodeClient) -> None:
        await c.abort("ses_a", "/srv/demo/other")  # the caller knew it
        await c.prompt_async("ses_a", "hi", None)  # the caller did not (ops.send's delivery)

    run(server, go)
    assert _calls(server, "POST", "/prompt_async") == ["/srv/demo/other"]
    assert not [p for m, p, d in server.seen if (m, p) == ("GET", "/session/ses_a")]


def test_a_refused_directory_leaves_no_status_request_running() -> None:
    # One directory's /session/status is refused while 39 others are still answering: the
    # scan fails closed, and none of the others is still in flight (with its connection
    # open) once it has: the CI run found 12-18 such sockets left for the GC to warn about.
    dirs = [f"/srv/demo/d{i:02d}" for i in range(40)]
    state = {"started": 0, "finished": 0, "cancelled": 0}

    async def handler(req: httpx.Request) -> httpx.Response:
        path, d = req.url.path, req.url.params.get("directory")
        if path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        if path == "/experimental/session":
            body = [{"id": f"ses_{i:02d}", "directory": d, "time": {"created": 1, "updated": 2}}
                    for i, d in enumerate(dirs)]
            return httpx.Response(200, json=body)
        if d == dirs[0]:
            return httpx.Response(404, json={"name": "NotFoundError"})
        state["started"] += 1
        try:
            await asyncio.sleep(0.3)
        except asyncio.CancelledError:
            state["cancelled"] += 1
            raise
        state["finished"] += 1
        return httpx.Response(200, json={})

    async def go() -> tuple[Any, set[asyncio.Task[Any]]]:
        async with OpencodeClient(INST, transport=httpx.MockTransport(handler)) as c:
            sc = await scan_instance(c, INST)
            others = asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]
            return sc, others

    sc, others = asyncio.run(go())
    assert "/session/status HTTP 404" in sc.run_state_unknown
    assert others == set()
    assert state["started"] > 0 and state["cancelled"] == state["started"] - state["finished"]
    assert state["finished"] < state["started"]  # they were stopped, not waited out
