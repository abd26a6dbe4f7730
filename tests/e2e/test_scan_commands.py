"""`instances`, `sessions`, `status` against real opencode servers (issue: foundation)."""

from __future__ import annotations

import csv
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import fleet as sandbox
from tests.fleet import Hub

pytestmark = pytest.mark.e2e


@pytest.fixture
def html_server() -> Iterator[str]:
    """A loopback server that answers every path with a 200 HTML page (a wrong URL)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            body = b"<!doctype html><html><body>web ui</body></html>"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def populate(hub: Hub) -> dict[str, str]:
    """Sessions in directories that hit every rule on local-a, a few elsewhere."""
    ids = {
        "root": hub.session("local-a", "修复登录页样式", directory=hub.root),
        "below": hub.session("local-a", "补充单元测试", "app", "tests"),
        "segment": hub.session(
            "local-a", "segment hit", directory=hub.root.parent / "x" / "e2e-seg"
        ),
        "excluded": hub.session("local-a", "vendor work", "vendor", "lib"),
        "substring": hub.session("local-a", "workbuddy", "tools", "workbuddy-1"),
        "outside": hub.session("local-a", "outside", directory=hub.root.parent / "elsewhere"),
        "b1": hub.session("lan-b", "订单导出 CSV 乱码", "shop"),
    }
    return ids


@pytest.mark.core
def test_sessions_counts_and_exports(hub: Hub, tmp_path: Path) -> None:
    hub.doc["project"]["fallback_segments"] = ["e2e-seg"]
    hub.write_config()
    ids = populate(hub)
    hub.llm.set_mode("slow-model", "slow", delay=20)
    hub.prompt("local-a", ids["below"], "keep busy", "fake/slow-model")
    hub.wait_for(lambda: ids["below"] in hub.busy_ids("local-a"))

    code, doc = hub.cli_json("sessions")
    assert code == 0
    got = {s["id"] for s in doc["sessions"]}
    assert got == {ids["root"], ids["below"], ids["segment"], ids["b1"]}
    assert doc["by_instance"]["local-a"] == {"project_sessions": 3, "running": 1}
    assert doc["by_instance"]["lan-b"] == {"project_sessions": 1, "running": 0}
    assert doc["unreachable"] == []
    rec = next(s for s in doc["sessions"] if s["id"] == ids["below"])
    assert rec["running"] is True and rec["run_state"] == "busy"
    assert rec["instance"] == "local-a" and rec["title"] == "补充单元测试"
    assert [s["updated"] for s in doc["sessions"]] == sorted(
        (s["updated"] for s in doc["sessions"]), reverse=True
    )

    # --keyword narrows by title; --limit only shortens the screen, never exports.
    code, doc = hub.cli_json("sessions", "--keyword", "登录")
    assert [s["id"] for s in doc["sessions"]] == [ids["root"]]
    out_csv, out_json = tmp_path / "s.csv", tmp_path / "s.json"
    code, out, err = hub.cli("sessions", "--limit", "1", "--out", str(out_csv))
    assert code == 0 and len([ln for ln in out.splitlines() if "ses_" in ln]) == 1
    raw = out_csv.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")
    rows = list(csv.reader(raw.decode("utf-8-sig").splitlines()))
    assert rows[0] == [
        "instance",
        "session id",
        "directory",
        "run state",
        "updated",
        "created",
        "outcome",
        "title",
        "cost",
    ]
    assert len(rows) == 5
    code, _, _ = hub.cli("sessions", "--out", str(out_json))
    assert len(json.loads(out_json.read_text("utf-8"))["sessions"]) == 4
    code, _, err = hub.cli("sessions", "--out", str(tmp_path / "s.xlsx"))
    assert code == 4 and "unsupported export format" in err
    for text in (out, err, raw.decode("utf-8-sig"), out_json.read_text("utf-8")):
        assert not any(pw in text for pw in hub.secrets())


def test_chinese_titles_line_up(hub: Hub) -> None:
    hub.session("local-a", "修复登录页样式", "a")
    hub.session("local-a", "short", "b")
    code, out, _ = hub.cli("sessions")
    assert code == 0
    from wcwidth import wcswidth

    lines = [ln for ln in out.splitlines() if "ses_" in ln]
    assert len(lines) == 2 and len({wcswidth(ln.rstrip()) for ln in lines}) <= 2
    # The directory column starts at the same display column on both rows.
    starts = {wcswidth(ln.rstrip().rsplit(" ", 1)[0]) for ln in lines}
    assert len(starts) == 1


def test_instances_and_status_with_failures(hub: Hub, html_server: str) -> None:
    ids = populate(hub)
    hub.doc["instances"].extend(
        [
            {"name": "lan-down", "url": "http://127.0.0.1:9", "roots": [str(hub.root)]},
            {"name": "lan-html", "url": html_server, "roots": [str(hub.root)]},
            {
                "name": "lan-dns",
                "url": "http://no-such-host.invalid:4096",
                "roots": [str(hub.root)],
            },
        ]
    )
    hub.write_config()
    hub.env["XAF_HUB_PW_LAN_C"] = "wrong-password"
    code, data = hub.cli_json("instances")
    assert code == 0
    by = {i["name"]: i for i in data}
    assert by["local-a"]["reachable"] and by["local-a"]["version"] == "1.18.33"
    assert by["local-a"]["project_sessions"] == 2 and by["lan-b"]["project_sessions"] == 1
    assert by["local-a"]["total_sessions"] >= 6
    assert "connection refused" in by["lan-down"]["reason"]
    assert "HTML page instead of JSON" in by["lan-html"]["reason"]
    assert "DNS lookup failed" in by["lan-dns"]["reason"]
    assert "auth rejected (HTTP 401)" in by["lan-c"]["reason"]
    assert ids["root"]

    code, out, err = hub.cli("status")
    assert code == 0
    assert "lan-down unreachable: connection refused" in err
    assert "local-a" in out and "lan-b" in out
    code, data = hub.cli_json("status")
    loads = {x["instance"]: x for x in data["instances"]}
    assert loads["local-a"]["dispatchable"] and loads["local-a"]["limit"] == 2
    assert not loads["lan-down"]["dispatchable"]
    everything = out + err + json.dumps(data)
    assert "wrong-password" not in everything
    assert not any(pw in everything for pw in hub.secrets())

    # A command aimed at one unreachable instance exits 2; so does a fleet where none answers.
    code, _, err = hub.cli("status", "--instance", "lan-down")
    assert code == 2 and "connection refused" in err
    hub.doc["instances"] = [
        i for i in hub.doc["instances"] if i["name"] in ("lan-down", "lan-html")
    ]
    hub.write_config()
    assert hub.cli("instances")[0] == 2
    assert hub.cli("sessions")[0] == 2


def test_status_when_a_real_instance_stops(hub: Hub, tmp_path: Path) -> None:
    extra = sandbox.OpencodeServer(
        sandbox.find_opencode_binary(),
        home=tmp_path / "h4",
        cwd=tmp_path / "c4",
        password="pw-four",
        config=sandbox.fake_provider_config(hub.llm.url),
    )
    extra.start()
    try:
        hub.doc["instances"].append(
            {"name": "lan-four", "url": extra.url, "roots": [str(hub.root)]}
        )
        hub.write_config()
        hub.env["XAF_HUB_PW_LAN_FOUR"] = "pw-four"
        code, data = hub.cli_json("status")
        assert code == 0 and {x["instance"] for x in data["instances"] if x["reachable"]} == {
            "local-a",
            "lan-b",
            "lan-c",
            "lan-four",
        }
    finally:
        extra.stop()
    code, out, err = hub.cli("status")
    assert code == 0
    assert "lan-four unreachable: connection refused" in err
    assert "pw-four" not in out + err


def test_unknown_instance_and_bad_config(hub: Hub) -> None:
    code, _, err = hub.cli("sessions", "--instance", "nope")
    assert code == 4 and "unknown instance 'nope'" in err
    hub.config_path.write_text('{"instances": [', "utf-8")
    code, _, err = hub.cli("status")
    assert code == 4 and "invalid JSON at line 1" in err and str(hub.config_path) in err
    code, _, err = hub.cli("status", "--bogus-flag")
    assert code == 4


# Never needed to print the fleet's state: the matcher's and page's libraries, the scheduler,
# the MCP server, the live followers, the patrol, the chat notices and the served page.
HEAVY = (
    "sklearn", "numpy", "jinja2", "apscheduler", "mcp", "xaf_hub.fleet.follow",
    "xaf_hub.fleet.stream", "xaf_hub.fleet.mailbox", "xaf_hub.fleet.live_view",
    "xaf_hub.fleet.events", "xaf_hub.patrol", "xaf_hub.notify", "xaf_hub.page.serve",
    "xaf_hub.cli.mcp",
)
# `status` only reads: no audit, no model state, no planner; the queue count needs the pool
# alone. (zoneinfo is not listed: it loads when a zone is resolved, which a day's spend does.)
NOT_FOR_STATUS = (
    "tabulate", "wcwidth", "importlib.metadata", "xaf_hub.store.audit",
    "xaf_hub.store.model_state", "xaf_hub.ops.planner", "xaf_hub.store.patrol_state",
    "xaf_hub.page",
)


def test_help_and_status_do_not_import_heavy_modules(hub: Hub) -> None:
    # Counts the modules a run imported (sys.modules after it), not time: honest on a loaded
    # machine. The figures themselves are the benchmark's (`python -m bench`).
    probe = (
        "import sys, io, json\n"
        "from xaf_hub.cli.main import main\n"
        "code = main(sys.argv[2:], stdout=io.StringIO(), stderr=io.StringIO())\n"
        "banned = json.loads(sys.argv[1])\n"
        "heavy = sorted(m for m, mod in sys.modules.items() if mod is not None and (m in "
        "banned or m.startswith(tuple(b + '.' for b in banned))))\n"
        "print(json.dumps([code, heavy]))\n"
    )
    env = {**__import__("os").environ, **hub.env}
    cfg = ["--config", str(hub.config_path)]
    for args, banned in (
        (["--help"], HEAVY + ("httpx",)),
        (["status", "--help"], HEAVY + ("httpx",)),
        ([*cfg, "status"], HEAVY + NOT_FOR_STATUS),
        ([*cfg, "status", "--json"], HEAVY + NOT_FOR_STATUS),
        ([*cfg, "sessions", "--json"],
         HEAVY + ("xaf_hub.store.model_state", "tabulate", "wcwidth")),
        ([*cfg, "instances"], HEAVY),
    ):
        out = subprocess.run(
            [sys.executable, "-c", probe, json.dumps(banned), *args],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
        code, heavy = json.loads(out.strip().splitlines()[-1])
        assert code == 0 and heavy == [], (args, heavy)
