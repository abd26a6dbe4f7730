"""Secrets never leak, private files are private, production is never written by accident.

* Every command and every export runs with known passwords (from the environment, from
  config.local.json, a wrong one that the server rejects, one a server echoes back inside
  its 400 answer with the Authorization header); stdout, stderr, the audit log,
  the patrol report, the JSON / CSV / HTML exports, the served page, every file in the state
  dir and the text of errors (``--debug`` tracebacks included) are searched for each password
  and its encodings (plain, URL-quoted, base64, the Basic credential ``base64(user:password)``
  with and without padding, ``user:password``): zero hits.
* Every file the hub keeps in its state dir is mode 0600 (lock files hold nothing).
* A production (``danger``) instance sits behind a recording proxy: dispatch, cleanup,
  interrupt and a full patrol cycle, each with work waiting on that instance, send it no
  request but reads unless ``--allow-prod`` is given (the positive control proves the proxy
  sees writes).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import fleet as sandbox
from tests.e2e.faulty import StepProxy
from tests.e2e.hostile import HostileServer
from tests.e2e.leaks import ECHO_USER, leaks
from tests.fleet import Hub

pytestmark = pytest.mark.e2e



def home(hub: Hub) -> Path:
    return Path(hub.env["XAF_HUB_HOME"])


def test_no_password_in_any_output_file_or_error(
    hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "wrong-pw-Zq81x"
    secrets = [*hub.secrets(), wrong]
    # lan-c's password comes from config.local.json, a fourth instance has a rejected one.
    hub.env.pop("XAF_HUB_PW_LAN_C")
    (hub.config_path.parent / "config.local.json").write_text(
        json.dumps({"instances": {"lan-c": {"password": hub.password("lan-c")}}}), "utf-8"
    )
    hub.doc["instances"].append(
        {"name": "lan-wrong", "url": hub.server("lan-b").url, "roots": [str(hub.root)]}
    )
    hub.write_config()
    hub.env["XAF_HUB_PW_LAN_WRONG"] = wrong
    idle = hub.session("lan-b", "secret test idle")
    hub.session("local-a", "secret test other")
    code, out, err = hub.cli("backlog", "add", "--title", "pending secret task", "--id", "SEC-1")
    assert code == 0, err

    exports = tmp_path / "exports dir"
    exports.mkdir()
    runs: list[tuple[str, ...]] = [
        ("instances",),
        ("instances", "--json"),
        ("sessions",),
        ("sessions", "--json"),
        ("sessions", "--out", str(exports / "s.json")),
        ("sessions", "--out", str(exports / "s.csv")),
        ("sessions", "--html", str(exports / "s.html")),
        ("status",),
        ("status", "--json"),
        ("watch", "--once"),
        ("watch", "--once", "--json"),
        ("dispatch", "--text", "secret test steer", "--dry-run"),
        ("dispatch", "--new", "--instance", "lan-b", "--text", "secret test create", "--json"),
        ("dispatch", "--new", "--instance", "lan-wrong", "--text", "x", "--debug"),
        ("interrupt", "--session", idle, "--json"),
        ("interrupt", "--session", idle, "--instance", "lan-wrong", "--debug"),
        ("cleanup", "--ttl-days", "0"),
        ("cleanup", "--ttl-days", "0", "--execute", "--instance", "local-a", "--json"),
        ("patrol", "--once", "--no-fill"),
        ("patrol", "status"),
        ("backlog", "list"),
        ("backlog", "show", "SEC-1", "--json"),
        ("backlog", "set", "SEC-1", "--status", "done"),
        ("doctor",),
        ("doctor", "--json"),
    ]
    # Errors whose text carries a password (an id typed by mistake), shown with --debug.
    for pw in secrets:
        runs.append(("interrupt", "--session", pw, "--debug"))
        runs.append(("dispatch", "--text", "x", "--session", pw, "--debug"))
        runs.append(("backlog", "show", pw, "--debug"))
    seen = []
    for args in runs:
        code, out, err = hub.cli(*args)
        assert not leaks(out + err, secrets), (args, leaks(out + err, secrets))
        seen.append((args, code, err))
    codes = {args: code for args, code, _ in seen}
    assert codes[("instances",)] == 0
    assert codes[("dispatch", "--new", "--instance", "lan-wrong", "--text", "x", "--debug")] == 2
    debug_errs = [err for args, _, err in seen if "--debug" in args]
    assert all("Traceback" in e for e in debug_errs)  # the tracebacks were printed, redacted
    assert any("auth rejected" in err for _, _, err in seen)

    # An internal error whose message holds a password, with and without --debug.
    import xaf_hub.cli.commands.status as status_cmd

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"boom {hub.password('local-a')} {wrong}")

    monkeypatch.setattr(status_cmd, "instance_load", boom)
    for debug in ((), ("--debug",)):
        code, out, err = hub.cli(*debug, "status")
        assert code == 1 and "boom" in err and not leaks(out + err, secrets), err

    # The served overview page and its JSON.
    proc = hub.popen("serve", "--port", "0", "--cache-seconds", "0")
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        with httpx.Client(timeout=30, trust_env=False) as c:
            page = c.get(url + "/").text
            api = c.get(url + "/api/snapshot").text
        assert "secret test idle" in page + api
        assert not leaks(page + api, secrets)
    finally:
        proc.terminate()
        _, serve_err = proc.communicate(timeout=30)
    assert not leaks(serve_err, secrets)

    # Every file the hub wrote: exports, audit log, patrol report, state files.
    written = [p for p in [*home(hub).rglob("*"), *exports.rglob("*")] if p.is_file()]
    names = {p.name for p in written}
    assert {"audit.log", "report-latest.json", "report-latest.md", "tasks_backlog.json"} <= names
    assert {"s.json", "s.csv", "s.html"} <= names
    for p in written:
        text = p.read_bytes().decode("utf-8", "replace")
        assert not leaks(text, secrets), (p, leaks(text, secrets))

    # Private: every state file 0600; lock files are empty.
    if os.name == "posix":
        for p in home(hub).rglob("*"):
            if not p.is_file():
                continue
            if p.name.endswith(".lock"):
                assert p.stat().st_size == 0, p
                continue
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, (p, oct(p.stat().st_mode))


def test_echoed_authorization_never_leaks(hub: Hub, tmp_path: Path) -> None:
    """A server (or proxy) that answers 400 quoting our Authorization header, decoded too.

    Its echo holds the Basic credential (base64 of user:password) and the password itself;
    no output, error (``--debug`` included), audit line, report or export may carry either.
    """
    pw = "echo-pw-Vb71q/x+y="
    secrets = [*hub.secrets(), pw]
    exports = tmp_path / "exports"
    exports.mkdir()
    with HostileServer(str(hub.root / "app"), mode="echo-writes") as server:
        hub.doc["instances"].append(
            {
                "name": "lan-echo",
                "url": server.url,
                "username": ECHO_USER,
                "roots": [str(hub.root)],
                "default_directory": str(hub.root / "app"),
            }
        )
        hub.write_config()
        hub.env["XAF_HUB_PW_LAN_ECHO"] = pw
        hub.session("local-a", "echo test healthy")
        runs: list[tuple[str, ...]] = [
            ("instances",),
            ("sessions", "--json"),
            ("sessions", "--out", str(exports / "e.json")),
            ("sessions", "--out", str(exports / "e.csv"), "--html", str(exports / "e.html")),
            ("status",),
            ("dispatch", "--new", "--instance", "lan-echo", "--text", "echo work"),
            ("dispatch", "--new", "--instance", "lan-echo", "--text", "echo work", "--debug"),
            ("interrupt", "--session", "ses_echo1", "--instance", "lan-echo", "--debug"),
            ("cleanup", "--ttl-days", "0", "--execute", "--instance", "lan-echo"),
            ("patrol", "--once", "--no-fill", "--no-design"),
        ]
        # First a proxy that refuses writes only, then one that refuses everything.
        for mode in ("echo-writes", "echo-auth"):
            server.mode = mode
            seen = []
            for args in runs:
                code, out, err = hub.cli(*args)
                assert not leaks(out + err, secrets), (mode, args, leaks(out + err, secrets))
                seen.append((args, code, out + err))
            # The server did echo (shown masked), and the other instances were still scanned.
            texts = "".join(text for _, _, text in seen)
            assert "Authorization: Basic *** (***)" in texts, mode  # user:password too
            assert seen[0][1] == 0 and "echo test healthy" in seen[1][2], mode
        assert any(m == "POST" for m, _ in server.hits), server.hits
    audit_log = home(hub) / "audit.log"
    assert audit_log.exists() and "lan-echo" in audit_log.read_text("utf-8")
    for p in [*home(hub).rglob("*"), *exports.rglob("*")]:
        if p.is_file():
            text = p.read_bytes().decode("utf-8", "replace")
            assert not leaks(text, secrets), (p, leaks(text, secrets))


# ---------------------------------------------------------------------------------------------
# Production


def _prod_hub(hub: Hub, proxy: StepProxy) -> None:
    """local-a and lan-b as usual; lan-c's server becomes `prod-x`, reached through ``proxy``."""
    hub.doc["instances"] = [i for i in hub.doc["instances"] if i["name"] != "lan-c"]
    hub.doc["instances"].append(
        {
            "name": "prod-x",
            "url": proxy.url,
            "roots": [str(hub.root)],
            "default_directory": str(hub.root / "app"),
            "danger": True,
            "concurrency_limit": 4,  # room left: only the production rule may refuse
        }
    )
    hub.doc["models"] = {
        "default_dispatch_model": "fake/fake-model",
        "chain": ["opencode/free-model", "backup/good-model"],
    }
    hub.write_config()
    hub.env["XAF_HUB_PW_PROD_X"] = hub.password("lan-c")


def test_production_is_never_written_without_allow_prod(hub: Hub) -> None:
    url, pw = hub.server("lan-c").url, hub.password("lan-c")
    d = hub.root / "app"
    hub.llm.set_mode("slow-model", "slow", delay=90)
    hub.llm.set_mode("free-model", "429", retry_after=3600)
    # Work waiting on production for every writer: a busy run (interrupt / steer), an
    # interrupted one (check_agents would resume it), one stuck in a rate-limit retry
    # (fix_free_limit would heal it), an idle one (cleanup, reuse), a task pinned there.
    busy = hub.session("lan-c", "prod busy job")
    hub.prompt("lan-c", busy, "prod long work", "fake/slow-model")
    broken = hub.session("lan-c", "prod interrupted job")
    hub.prompt("lan-c", broken, "prod other work", "fake/slow-model")
    stuck = hub.session("lan-c", "prod retry job")
    hub.prompt("lan-c", stuck, "prod limited work", "opencode/free-model")
    idle = hub.session("lan-c", "prod idle login page")
    hub.wait_for(lambda: {busy, broken} <= set(hub.status("lan-c", d)), timeout=60)
    sandbox.abort(url, pw, broken)
    hub.wait_for(lambda: hub.status("lan-c", d).get(stuck, {}).get("type") == "retry", timeout=60)
    try:
        with StepProxy(url) as proxy:
            _prod_hub(hub, proxy)
            code, _, err = hub.cli(
                "backlog",
                "add",
                "--title",
                "prod task",
                "--id",
                "PX-1",
                "--instance",
                "prod-x",
                "--prompt",
                "prod pinned work",
            )
            assert code == 0, err

            def refused(*args: str) -> None:
                code, _, err = hub.cli(*args)
                assert code == 4 and "--allow-prod" in err, (args, code, err)

            refused("dispatch", "--new", "--instance", "prod-x", "--text", "x")
            refused("dispatch", "--session", idle, "--text", "x")
            refused("dispatch", "--session", busy, "--text", "steer it")
            refused("dispatch", "--title", "prod idle", "--instance", "prod-x", "--text", "x")
            refused("interrupt", "--session", busy)
            refused("interrupt", "--session", busy, "--instance", "prod-x")
            # Smart matching never lands on production, even for a near-identical title.
            code, out, err = hub.cli("dispatch", "--text", "prod idle login page", "--json")
            assert code == 0 and json.loads(out)["instance"] != "prod-x", err
            for args in (
                ("cleanup", "--ttl-days", "0", "--execute"),
                ("cleanup", "--ttl-days", "0", "--execute", "--instance", "prod-x"),
                (
                    "dispatch",
                    "--new",
                    "--instance",
                    "prod-x",
                    "--text",
                    "x",
                    "--dry-run",
                    "--allow-prod",
                ),
            ):
                code, _, err = hub.cli(*args)
                assert code == 0, (args, err)
            code, _, err = hub.cli("patrol", "--once")
            assert code == 0, err
            doc = json.loads((home(hub) / "patrol" / "report-latest.json").read_text("utf-8"))
            prod = next(i for i in doc["instances"] if i["name"] == "prod-x")
            assert prod["production"] and prod["reachable"]

            assert proxy.writes() == []
            assert any(p.startswith("/session/status") for _, p in proxy.hits)  # it was read
            assert hub.status("lan-c", d).get(stuck, {}).get("type") == "retry"  # not healed
            assert set(hub.status("lan-c", d)) == {busy, stuck}  # nothing resumed or started
            pool = json.loads((home(hub) / "tasks_backlog.json").read_text("utf-8"))
            task = next(t for t in pool["tasks"] if t["id"] == "PX-1")
            assert task["dispatched_to"] != "prod-x"

            # Positive control: with --allow-prod the write goes through the proxy.
            code, _, err = hub.cli("interrupt", "--session", busy, "--allow-prod")
            assert code == 0, err
            # (The client names the session's folder too: ?directory=, since issue 14.)
            writes = [(m, p.partition("?")[0]) for m, p in proxy.writes()]
            assert writes == [("POST", f"/session/{busy}/abort")]
    finally:
        for sid in (busy, stuck):
            sandbox.abort(url, pw, sid)
        for name in ("local-a", "lan-b"):
            for sid in hub.busy_ids(name):
                sandbox.abort(hub.server(name).url, hub.password(name), sid)


def test_new_state_files_are_private_under_a_permissive_umask(hub: Hub) -> None:
    """Even with umask 000 the hub's own files come out 0600."""
    if os.name != "posix":
        pytest.skip("POSIX modes")
    script = (
        "import os, sys; os.umask(0); from xaf_hub.cli.main import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    env = {**os.environ, **hub.env}
    for args in (
        ["backlog", "add", "--title", "umask task"],
        ["dispatch", "--new", "--instance", "lan-b", "--text", "umask dispatch"],
    ):
        subprocess.run(
            [sys.executable, "-c", script, "--config", str(hub.config_path), *args],
            env=env,
            check=True,
            capture_output=True,
        )
    files = [p for p in home(hub).rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert {"audit.log", "tasks_backlog.json"} <= {p.name for p in files}
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, (p, oct(p.stat().st_mode))
