"""Config changes are seen, against real opencode servers: a running patrol daemon and a
running `serve` use a saved config (a raised limit, a folder added to an instance's roots, a
renamed instance) without a restart, keep the config they have through a save that does not
load and say so (their log, the page, `status`), and `status` read from the live board reports
a password its own config lacks as a scan does."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import httpx
import pytest

from tests.e2e.daemon import Lines, _beat, _daemon
from tests.fleet import Hub
from xaf_hub.cli.main import main

pytestmark = pytest.mark.e2e


def _status(hub: Hub, *args: str, drop: str = "") -> tuple[int, dict[str, Any], str]:
    """`status --json` with the hub's environment, less the variable ``drop``."""
    env = {k: v for k, v in hub.env.items() if k != drop}
    out, err = io.StringIO(), io.StringIO()
    code = main(["--config", str(hub.config_path), "status", "--json", *args],
                stdout=out, stderr=err, env=env)
    return code, json.loads(out.getvalue() or "{}"), err.getvalue()


def _said(lines: Lines, words: str) -> bool:
    return any(words in ln for ln in list(lines.lines) + list(lines.err))


@pytest.mark.timeout(900)
def test_a_running_daemon_uses_a_saved_config_and_survives_a_bad_one(hub: Hub) -> None:
    hub.llm.set_mode("slow-model", "slow", delay=120)
    hub.doc["models"]["default_dispatch_model"] = "fake/slow-model"
    for inst in hub.doc["instances"]:
        inst["concurrency_limit"] = 1
    hub.write_config()
    for n in range(4):
        code, _, err = hub.cli("backlog", "add", "--title", f"config work {n}")
        assert code == 0, err
    lines = _daemon(hub)
    try:
        def dispatched() -> int:
            code, doc = hub.cli_json("backlog", "list", "--status", "dispatched")
            return len(doc["tasks"]) if code == 0 else 0

        hub.wait_for(lambda: dispatched() == 3, timeout=90)  # one slot each
        # A save that does not load: the daemon goes on with the config it has, and says so.
        hub.config_path.write_text('{"instances": [', "utf-8")
        hub.wait_for(lambda: _said(lines, "keeps the config it loaded at"), timeout=30)
        assert _said(lines, "invalid JSON at line 1")
        assert lines.proc.poll() is None
        # The heartbeat says it too, once written (just after the log line).
        hub.wait_for(lambda: (_beat(hub).get("config") or {}).get("problem"), timeout=30)
        # A valid save with a higher limit: the fourth task starts, without a round.
        hub.set_instance("lan-b", concurrency_limit=2)
        hub.wait_for(lambda: dispatched() == 4, timeout=60)
        assert _said(lines, "config: read again (3 instance(s))")
        assert _beat(hub)["ticks"] == 1
        assert not _beat(hub)["config"]["problem"]

        # A backend key waits for a restart, and `status` says so while the daemon runs.
        hub.write_config(lock={**hub.doc["lock"], "redis_prefix": "elsewhere"})
        hub.wait_for(lambda: _said(lines, "needs a restart to use the new lock.redis_prefix"),
                     timeout=30)

        def restart_said() -> list[str]:
            return [w for w in _status(hub)[1].get("warnings", [])
                    if "the patrol daemon (pid" in w and "lock.redis_prefix" in w]

        assert hub.wait_for(restart_said, timeout=30)
        assert _status(hub)[0] == 0
    finally:
        assert lines.stop() == 0, lines.err
        for name in ("local-a", "lan-b", "lan-c"):
            for sid in hub.busy_ids(name):
                hub.cli("interrupt", "--session", sid)


@pytest.mark.timeout(600)
def test_a_running_serve_shows_a_folder_added_and_an_instance_renamed(hub: Hub) -> None:
    """...and `status` read from its live board reports a password the reader lacks."""
    elsewhere = hub.root.parent / "elsewhere"
    elsewhere.mkdir()
    sid = hub.session("lan-b", "work in the added folder", directory=elsewhere)
    lines = Lines(hub.popen("serve", "--port", "0", "--cache-seconds", "600"))
    try:
        hub.wait_for(lambda: lines.lines and lines.lines[0].startswith("http://"), timeout=60)
        base = lines.lines[0].rstrip("/")
        client = httpx.Client(trust_env=False, timeout=120)
        # A page open: its change feed follows the fleet (and is moved to the new config).
        threading.Thread(target=lambda: _listen(base), daemon=True).start()

        def snapshot() -> dict[str, Any]:
            return dict(client.get(base + "/api/snapshot").json())

        def ours(doc: dict[str, Any]) -> dict[str, Any] | None:
            return next((s for s in doc["sessions"] if s["id"] == sid), None)

        first = snapshot()
        assert ours(first) is None  # outside the project's folders: not shown
        names = [i["name"] for i in first["instances"]]
        assert names == ["local-a", "lan-b", "lan-c"]

        # `status` from serve's live board, in a shell that lacks lan-b's password: what a
        # scan says (serve's own environment had it), exit code included.
        hub.wait_for(lambda: _status(hub)[1].get("source") == "live", timeout=60)
        code, doc, err = _status(hub, drop="XAF_HUB_PW_LAN_B")
        fresh_code, _, fresh_err = _status(hub, "--fresh", drop="XAF_HUB_PW_LAN_B")
        assert code == fresh_code == 4, (code, fresh_code, err)
        assert "no password configured for lan-b" in err
        assert "no password configured for lan-b" in fresh_err
        assert sorted(doc["live_instances"]) == ["lan-c", "local-a"]
        for inst in hub.doc["instances"]:
            if inst["name"] == "lan-b":
                inst["roots"] = [*inst["roots"], str(elsewhere)]
            if inst["name"] == "lan-c":
                inst.update(name="lan-c-renamed", password_env="XAF_HUB_PW_LAN_C")
        hub.write_config()

        def changed() -> dict[str, Any] | None:
            doc = snapshot()
            seen = ours(doc)
            renamed = [i["name"] for i in doc["instances"]] == ["local-a", "lan-b",
                                                                 "lan-c-renamed"]
            return doc if renamed and seen is not None else None

        doc = hub.wait_for(changed, timeout=60)
        assert all(i["reachable"] for i in doc["instances"]), doc["instances"]
        assert "work in the added folder" in client.get(base + "/").text
        # A save that does not load: the page keeps working on the config it has, and says
        # so, in the reader's language.
        hub.config_path.write_text('{"instances": [', "utf-8")
        hub.wait_for(lambda: "keeps the config it loaded at" in client.get(base + "/").text,
                     timeout=30)
        assert "仍在使用" in client.get(base + "/?lang=zh").text
        assert [i["name"] for i in snapshot()["instances"]][-1] == "lan-c-renamed"
        assert _said(lines, "config: serve keeps the config it loaded at")
        hub.write_config()
        hub.wait_for(lambda: "keeps the config" not in client.get(base + "/").text, timeout=30)
        client.close()
    finally:
        assert lines.stop() == 0, lines.err


def _listen(base: str) -> None:
    """Hold one change-notice stream open, as an open page does."""
    try:
        with httpx.Client(trust_env=False, timeout=httpx.Timeout(None, connect=10)) as c, \
                c.stream("GET", base + "/api/events") as resp:
            for _ in resp.iter_lines():
                pass
    except httpx.HTTPError:
        return
