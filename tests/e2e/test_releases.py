"""opencode releases against real servers: run state as each line reports it, the session's
directory on every call, fail closed, and a mixed fleet (1.14.41 beside 1.18.33).

The ``core`` tests here run on whatever release the session fleet runs (1.18.33 by default;
scripts/release-matrix.sh points it at others). The mixed fleet needs 1.14.41 installed
(scripts/opencode-releases.sh 1.14.41; the whole run of scripts/test.sh does it first).
"""

from __future__ import annotations

import http.server
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import fleet as sandbox
from sandbox.fake_llm import FakeLLM
from sandbox.fleet import SandboxError
from sandbox.releases import release_binary
from tests.e2e.proxy import LoopbackServer, forward, read_body, send_back
from tests.fleet import MODELS, PRICES, Hub
from xaf_hub.fleet.releases import classify
from xaf_hub.fleet.wire import messages_of
from xaf_hub.ops.ceiling import run_cost

pytestmark = pytest.mark.e2e


def server_busy(url: str, password: str, *directories: Path) -> set[str]:
    """What the server itself reports running: each directory's map and the no-directory one."""
    with httpx.Client(
        base_url=url, headers=sandbox.auth_headers(password), timeout=15, trust_env=False
    ) as c:
        busy = set(c.get("/session/status").json())
    for d in directories:
        busy |= set(sandbox.status(url, password, d))
    return busy


def assistants(hub: Hub, name: str, sid: str) -> list[dict[str, Any]]:
    msgs = sandbox.messages(hub.server(name).url, hub.password(name), sid)
    return [m["info"] for m in msgs if m["info"]["role"] == "assistant"]


def prompts_sent(llm: FakeLLM, texts: list[str]) -> set[str]:
    """Which of ``texts`` reached the model (as the start of an agent call's prompt)."""
    calls = [r["last_user_text"] for r in llm.requests() if not r["title_call"]]
    return {t for t in texts for c in calls if c.startswith(t)}


def interrupt_all(hub: Hub, name: str) -> None:
    for sid in hub.busy_ids(name):
        hub.cli("interrupt", "--session", sid, "--allow-prod")


@pytest.mark.core
def test_run_state_and_the_directory_of_a_dispatch(hub: Hub) -> None:
    """A run another client started without a directory and one the hub started both count,
    and the hub's run works in its session's directory (1.2-1.14 used the server's own)."""
    version = sandbox.health(hub.server("local-a").url, hub.password("local-a"))["version"]
    # scripts/release-matrix.sh says which release the fleet must run: make sure it does.
    assert version == os.environ.get("XAF_HUB_OPENCODE_VERSION", version)
    hub.llm.set_mode("slow-model", "slow", delay=30)
    hub.doc["models"]["default_dispatch_model"] = "fake/slow-model"
    hub.write_config()
    other = hub.session("local-a", "started elsewhere", "web")
    mine = hub.session("local-a", "started by the hub", "api")
    try:
        hub.prompt("local-a", other, "other client's work", "fake/slow-model")  # no directory
        code, out, err = hub.cli("dispatch", "--session", mine, "--text", "the hub's work")
        assert code == 0 and f"started idle session {mine}" in out, out + err
        hub.wait_for(lambda: {other, mine} <= hub.busy_ids("local-a"), timeout=60)

        code, data = hub.cli_json("status", "--instance", "local-a")
        row = data["instances"][0]
        assert (row["running_project"], row["dispatchable"]) == (2, False), row
        assert row["reason"].startswith("full (2 running")
        code, data = hub.cli_json("instances", "--instance", "local-a")
        assert data[0]["release"] == classify(version).describe() and version in data[0]["release"]
        assert data[0]["run_state_unknown"] == ""

        # The server agrees, and runs the hub's prompt in the session's own directory.
        api = hub.root / "api"
        url, pw = hub.server("local-a").url, hub.password("local-a")
        assert {other, mine} <= server_busy(url, pw, api, hub.root / "web")
        assert mine in sandbox.status(url, pw, api)
        info = hub.wait_for(lambda: assistants(hub, "local-a", mine), timeout=60)[-1]
        assert info["path"]["cwd"] == str(api)
    finally:
        interrupt_all(hub, "local-a")
    dirs = (hub.root / "api", hub.root / "web")
    hub.wait_for(lambda: not {other, mine} & server_busy(url, pw, *dirs), timeout=30)


@pytest.mark.core
def test_a_steer_queues_behind_a_run_started_without_a_directory(hub: Hub) -> None:
    """Steering must not start a second run beside the first (on 1.2-1.14 a prompt sent with
    the directory to a run living in the server's own directory does exactly that)."""
    hub.llm.set_mode("slow-model", "slow", delay=8)
    sid = hub.session("lan-b", "long run", "svc")
    hub.prompt("lan-b", sid, "first part", "fake/slow-model")
    hub.wait_for(lambda: sid in hub.busy_ids("lan-b"), timeout=60)
    code, out, err = hub.cli(
        "dispatch", "--session", sid, "--text", "second part", "--model", "fake/fake-model"
    )
    assert code == 0 and f"steered running session {sid}" in out, out + err

    def both_done() -> list[dict[str, Any]] | None:
        infos = assistants(hub, "lan-b", sid)
        done = [i for i in infos if i.get("time", {}).get("completed")]
        return infos if len(done) >= 2 and len(done) == len(infos) else None

    infos = hub.wait_for(both_done, timeout=120)
    infos.sort(key=lambda i: i["time"]["created"])
    for first, second in zip(infos, infos[1:], strict=False):
        assert second["time"]["created"] >= first["time"]["completed"], infos  # no overlap
    assert not any(i.get("error") for i in infos), infos


class RunStateProxy(LoopbackServer):
    """Forward to a real server, but refuse ``/session/status`` (404) or report another
    version in ``/global/health``."""

    def __init__(self, target: str, mode: str) -> None:
        self.target = target.rstrip("/")
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = read_body(self)
                path = self.path.split("?", 1)[0]
                if mode == "refused" and path == "/session/status":
                    err = {"name": "NotFoundError", "data": {"message": "no such route"}}
                    send_back(self, httpx.Response(404, json=err), all_headers=False)
                    return
                r = forward(self, proxy.target, body, timeout=30)
                if mode == "old" and path == "/global/health" and r.status_code == 200:
                    r = httpx.Response(200, json={**r.json(), "version": "0.9.0"})
                send_back(self, r, all_headers=mode != "old")

            do_GET = do_POST = do_DELETE = do_PATCH = _forward  # noqa: N815 - stdlib names

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)


@pytest.mark.parametrize(
    ("mode", "why"),
    [("refused", "/session/status HTTP 404"), ("old", "older than 1.2")],
)
def test_an_instance_whose_run_state_cannot_be_read_counts_full(
    hub: Hub, mode: str, why: str
) -> None:
    idle = hub.session("lan-c", "idle project work", "lib")
    with RunStateProxy(hub.server("lan-c").url, mode) as proxy:
        hub.set_instance("lan-c", url=proxy.url)
        code, data = hub.cli_json("status")
        assert code == 0
        row = next(x for x in data["instances"] if x["instance"] == "lan-c")
        assert row["reachable"] and not row["dispatchable"]
        assert row["running_project"] == row["project_sessions"] == 1
        assert row["reason"].startswith("counted full: run state unknown (")
        assert why in row["reason"] and "\n" not in row["reason"]
        code, out, err = hub.cli("status")
        line = next(ln for ln in out.splitlines() if ln.startswith("lan-c"))
        assert "counted full: run state unknown" in line
        assert f"lan-c: run state unknown ({why}" in err

        # The gate refuses it (exit 3, nothing reserved); a fleet-wide dispatch goes elsewhere.
        code, _, err = hub.cli("dispatch", "--new", "--instance", "lan-c", "--text", "x")
        assert code == 3 and "run state unknown" in err and "counted full" in err
        assert not list((Path(hub.env["XAF_HUB_HOME"]) / "slots").glob("*.slot"))
        # Its sessions look running only as a guess: a prompt to one is a start, not a steer.
        code, _, err = hub.cli("dispatch", "--session", idle, "--text", "not a steer")
        assert code == 3 and "run state unknown" in err, err
        assert sandbox.messages(hub.server("lan-c").url, hub.password("lan-c"), idle) == []
        code, plan = hub.cli_json("dispatch", "--new", "--text", "y", "--dry-run")
        assert code == 0 and plan["instance"] != "lan-c"

        code, out, _ = hub.cli("doctor")
        assert "run state unknown" in out and why in out


# ---------------------------------------------------------------------------------------------
# the mixed fleet: 1.14.41 beside 1.18.33

MIXED = {"old-1-14": "1.14.41", "new-1-18": "1.18.33"}


@pytest.fixture(scope="module")
def mixed(
    tmp_path_factory: pytest.TempPathFactory, llm: FakeLLM
) -> Iterator[dict[str, sandbox.Fleet]]:
    binaries = {}
    for name, version in MIXED.items():
        try:
            binaries[name] = release_binary(version)
        except SandboxError as exc:
            pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("mixed")
    fleets = {
        name: sandbox.Fleet(
            root / name,
            n=1,
            binary=binaries[name],
            llm=llm,
            models=MODELS,
            prices=PRICES,
            start_timeout=120,
        )
        for name in MIXED
    }
    try:
        for f in fleets.values():
            f.start()
        yield fleets
    finally:
        for f in fleets.values():
            f.stop()


def mixed_hub(fleets: dict[str, sandbox.Fleet], llm: FakeLLM, tmp: Path, home: Path) -> Hub:
    root = tmp / "proj"
    (root / "app").mkdir(parents=True)
    env = {"XAF_HUB_HOME": str(home)}
    instances = []
    for name, f in fleets.items():
        env[f"XAF_HUB_PW_{name.upper().replace('-', '_')}"] = f.passwords[0] or ""
        instances.append(
            {
                "name": name,
                "url": f.servers[0].url,
                "roots": [str(root)],
                "default_directory": str(root / "app"),
                "concurrency_limit": 2,
            }
        )
    doc = {
        "project": {"name": "mixed"},
        "timeouts": {"connect_seconds": 2, "read_seconds": 15},
        "lock": {"slot_ttl_seconds": 90, "lock_timeout_seconds": 60, "slot_grace_seconds": 5},
        "models": {"default_dispatch_model": "fake/slow-model"},
        "instances": instances,
    }
    h = Hub(root, tmp / "config.json", env, next(iter(fleets.values())), llm, doc)
    h.write_config()
    return h


def test_mixed_fleet_limit_holds_on_each_release(
    mixed: dict[str, sandbox.Fleet], llm: FakeLLM, tmp_path: Path, _isolated_home: Path
) -> None:
    hub = mixed_hub(mixed, llm, tmp_path, _isolated_home)
    llm.reset()
    llm.set_mode("slow-model", "slow", delay=40)
    try:
        code, out, _ = hub.cli("doctor")
        assert "opencode 1.14.41 (server-wide run state)" in out, out
        assert "opencode 1.18.33 (per-directory run state)" in out, out
        code, data = hub.cli_json("instances")
        assert {i["name"]: i["release"] for i in data} == {
            "old-1-14": "1.14.41 (server-wide run state)",
            "new-1-18": "1.18.33 (per-directory run state)",
        }

        for name, f in mixed.items():
            texts = [f"mixed race {name} {i}" for i in range(5)]
            procs = [
                hub.popen("dispatch", "--new", "--instance", name, "--text", t, "--no-record")
                for t in texts
            ]
            results = [(p.communicate(timeout=180), p.returncode) for p in procs]
            codes = sorted(rc for _, rc in results)
            assert codes == [0, 0, 3, 3, 3], [(rc, err) for (_, err), rc in results]
            created = {
                out.split("created session ", 1)[1].split()[0]
                for (out, _), rc in results
                if rc == 0
            }
            # The server runs exactly those two, and the model got exactly two of the prompts.
            url, pw = f.servers[0].url, f.passwords[0] or ""
            hub.wait_for(lambda u=url, p=pw: server_busy(u, p, hub.root / "app"), timeout=60)
            assert server_busy(url, pw, hub.root / "app") == created
            hub.wait_for(lambda ts=texts: len(prompts_sent(llm, ts)) >= 2, timeout=90)
            sent = prompts_sent(llm, texts)
            assert len(sent) == 2, sent
            code, st = hub.cli_json("status", "--instance", name)
            row = st["instances"][0]
            assert (row["running_project"], row["dispatchable"]) == (2, False), row
    finally:
        for name in mixed:
            interrupt_all(hub, name)
        llm.reset()


def test_a_release_without_session_cost_is_counted_unknown_never_zero(
    mixed: dict[str, sandbox.Fleet], llm: FakeLLM, tmp_path: Path, _isolated_home: Path
) -> None:
    """1.14.41 reports cost per assistant message only, 1.18.33 on the session too (measured):
    the old line's sessions are "cost unknown", shown beside the spend, and do not block."""
    hub = mixed_hub(mixed, llm, tmp_path, _isolated_home)
    hub.doc["budget"] = {"daily_usd": 1.0}
    hub.doc["models"]["timezone"] = "UTC"
    hub.write_config()
    llm.reset()
    sids = {}
    for name in mixed:
        code, doc = hub.cli_json("dispatch", "--new", "--instance", name, "--text",
                                 f"priced {name}", "--model", "fake/priced-model", "--no-record")
        assert code == 0, doc
        sids[name] = str(doc["session_id"])

    def replies(name: str, sid: str) -> list[dict[str, Any]]:
        f = mixed[name]
        msgs = sandbox.messages(f.servers[0].url, f.passwords[0], sid)
        return [m["info"] for m in msgs if m["info"]["role"] == "assistant"]

    for name, sid in sids.items():
        hub.wait_for(
            lambda n=name, s=sid: any(
                a.get("time", {}).get("completed") and a.get("cost") for a in replies(n, s)
            ),
            timeout=90,
        )
        # Both servers priced the run the same: $0.02 on the assistant message.
        assert [a["cost"] for a in replies(name, sid)] == [pytest.approx(0.02)]
        # So a run's cost, what the run ceiling is held to, is known on both lines.
        f = mixed[name]
        assert run_cost(messages_of(sandbox.messages(f.servers[0].url, f.passwords[0], sid))) == (
            pytest.approx(0.02)
        )
    code, st = hub.cli_json("status")
    rows = {r["instance"]: r for r in st["instances"]}
    assert (rows["new-1-18"]["spent_today_usd"], rows["new-1-18"]["cost_unknown_sessions"]) == (
        pytest.approx(0.02), 0)
    assert (rows["old-1-14"]["spent_today_usd"], rows["old-1-14"]["cost_unknown_sessions"]) == (
        0.0, 1)
    assert st["spend"] == {"spent_today_usd": pytest.approx(0.02), "budget_daily_usd": 1.0,
                             "cost_unknown_sessions": 1}
    code, out, err = hub.cli("status")
    assert "project spend: $0.02 of $1.00 today (2 %); cost unknown for 1 session" in out, out
    code, shown = hub.cli_json("show", sids["old-1-14"])
    assert code == 0 and shown["cost"] is None
    code, out, err = hub.cli("show", sids["old-1-14"])
    assert "cost:      unknown" in out, out
    # Unknown cost does not block: the old line still takes work under the budget.
    code, out, err = hub.cli("dispatch", "--new", "--instance", "old-1-14", "--text", "more",
                             "--no-record")
    assert code == 0, err
