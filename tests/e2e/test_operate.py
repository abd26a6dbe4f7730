"""`cleanup`, `interrupt`, `watch` and the v2 dialect against real opencode servers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sandbox import fleet as sandbox
from tests.e2e.daemon import Lines
from tests.fleet import Hub

pytestmark = pytest.mark.e2e


def server_ids(hub: Hub, name: str) -> set[str]:
    import httpx

    with httpx.Client(
        base_url=hub.server(name).url,
        auth=("opencode", hub.password(name)),
        timeout=15,
        trust_env=False,
    ) as c:
        return {s["id"] for s in c.get("/experimental/session", params={"limit": 100000}).json()}


def test_cleanup_previews_then_deletes_only_stale_idle_project_sessions(hub: Hub) -> None:
    hub.llm.set_mode("slow-model", "slow", delay=30)
    old_idle = hub.session("lan-b", "old idle", "a")
    old_busy = hub.session("lan-b", "old busy", "b")
    old_outside = hub.session("lan-b", "old outside", directory=hub.root.parent / "not-ours")
    hub.prompt("lan-b", old_busy, "keep busy", "fake/slow-model")
    hub.wait_for(lambda: old_busy in hub.busy_ids("lan-b"))
    time.sleep(6)
    fresh = hub.session("lan-b", "fresh", "c")
    ttl = str(5.0 / 86400)  # five seconds, in days

    def touch(sid: str) -> None:  # a rename moves its `updated`: fresh however slow the box
        import httpx

        with httpx.Client(base_url=hub.server("lan-b").url, timeout=15, trust_env=False,
                          auth=("opencode", hub.password("lan-b"))) as c:
            assert c.patch(f"/session/{sid}", json={"title": "fresh"}).status_code == 200

    try:
        code, report = hub.cli_json("cleanup", "--instance", "lan-b", "--ttl-days", ttl)
        assert code == 0 and not report["execute"]
        stale = {s["id"] for s in report["instances"][0]["stale"]}
        assert stale == {old_idle}
        assert old_idle in server_ids(hub, "lan-b")  # preview deleted nothing
        touch(fresh)
        code, out, err = hub.cli("cleanup", "--instance", "lan-b", "--ttl-days", ttl, "--execute")
        assert code == 0 and "deleted 1 of 1" in out, err
        left = server_ids(hub, "lan-b")
        assert old_idle not in left
        assert {old_busy, old_outside, fresh} <= left
        entry = [
            json.loads(ln)
            for ln in (Path(hub.env["XAF_HUB_HOME"]) / "audit.log").read_text().splitlines()
        ][-1]
        assert (entry["command"], entry["session"], entry["result"]) == (
            "cleanup",
            old_idle,
            "deleted",
        )
    finally:
        sandbox.abort(hub.server("lan-b").url, hub.password("lan-b"), old_busy)


def test_cleanup_skips_production_without_allow_prod(hub: Hub) -> None:
    hub.set_instance("lan-c", danger=True)
    hub.session("lan-c", "stale on prod", "p")
    time.sleep(1.5)
    code, report = hub.cli_json(
        "cleanup", "--instance", "lan-c", "--ttl-days", str(1 / 86400), "--execute"
    )
    entry = report["instances"][0]
    assert code == 0 and entry["skipped"].startswith("production") and entry["deleted"] == []
    code, report = hub.cli_json(
        "cleanup", "--instance", "lan-c", "--ttl-days", str(1 / 86400), "--allow-prod"
    )
    assert len(report["instances"][0]["stale"]) == 1


@pytest.mark.core
def test_interrupt_stops_a_busy_session(hub: Hub) -> None:
    hub.llm.set_mode("slow-model", "slow", delay=60)
    sid = hub.session("local-a", "long task", "x")
    hub.prompt("local-a", sid, "long", "fake/slow-model")
    hub.wait_for(lambda: sid in hub.busy_ids("local-a"))
    code, out, err = hub.cli("interrupt", "--session", sid)  # searched on every instance
    assert code == 0 and f"interrupted {sid} on local-a" in out, err
    hub.wait_for(lambda: sid not in hub.busy_ids("local-a"), timeout=15)
    assert hub.cli("interrupt", "--session", "ses_doesnotexist")[0] == 4
    outside = hub.session("local-a", "not ours", directory=hub.root.parent / "other2")
    assert hub.cli("interrupt", "--session", outside)[0] == 5
    hub.set_instance("local-a", danger=True)
    assert hub.cli("interrupt", "--session", sid)[0] == 4
    assert hub.cli("interrupt", "--session", sid, "--allow-prod")[0] == 0


def test_interrupt_waits_for_the_dispatch_lock_and_goes_ahead_without_it(hub: Hub) -> None:
    """A heal or resume holds the instance's dispatch lock from its last look at people's
    decisions to its prompt; a person's stop waits for that lock, so the two never interleave.
    A lock that stays held does not stop the person: after the lock timeout the stop goes
    ahead and says what it could not promise."""
    from xaf_hub.config.load import load_config
    from xaf_hub.ops.context import OpsContext

    hub.llm.set_mode("slow-model", "slow", delay=60)
    sids = [hub.session("lan-c", f"stopped while locked {n}") for n in range(2)]
    for sid in sids:
        hub.prompt("lan-c", sid, "long", "fake/slow-model")
    hub.wait_for(lambda: set(sids) <= hub.busy_ids("lan-c"))
    gate = OpsContext(load_config(str(hub.config_path), env=hub.env), env=hub.env).gate()
    with gate.lock("lan-c"):  # a heal between its last look and its prompt
        proc = hub.popen("interrupt", "--session", sids[0])
        time.sleep(2)
        assert proc.poll() is None and sids[0] in hub.busy_ids("lan-c")  # it waits
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and f"interrupted {sids[0]}" in out, err
    assert err == ""
    hub.wait_for(lambda: sids[0] not in hub.busy_ids("lan-c"), timeout=15)

    hub.doc["lock"] = {**hub.doc.get("lock", {}), "lock_timeout_seconds": 1}
    hub.write_config()
    with gate.lock("lan-c"):  # held for good
        code, out, err = hub.cli("interrupt", "--session", sids[1])
    assert code == 0 and f"interrupted {sids[1]}" in out, err
    assert "stopped without lan-c's dispatch lock" in err
    hub.wait_for(lambda: sids[1] not in hub.busy_ids("lan-c"), timeout=15)


def test_watch_prints_only_changes(hub: Hub) -> None:
    hub.llm.set_mode("slow-model", "slow", delay=4)
    sid = hub.session("lan-c", "watched task", "w")
    code, out, _ = hub.cli("watch", "--once")
    assert code == 0 and "0 project session(s) running" in out
    # --poll is the follower's polling: the same events, in the same JSON form, as following.
    watching = Lines(hub.popen("watch", "--poll", "--json", "--interval", "1", "--instance",
                               "lan-c"))
    try:
        hub.wait_for(lambda: any("watching" in e for e in watching.err), timeout=120)
        hub.prompt("lan-c", sid, "go", "fake/slow-model")
        hub.wait_for(lambda: "stopped" in watching.about(sid), timeout=120)
    finally:
        assert watching.stop() == 0, watching.err
    assert watching.about(sid) == ["started", "stopped"], watching.lines
    stopped = [e for e in watching.events() if e["event"] == "stopped"]
    assert stopped[0]["outcome"] == "succeeded" and stopped[0]["source"] == "poll"
    assert not any("warning" in e for e in watching.err), watching.err  # polling was asked for


def test_v2_dialect_lists_real_sessions(hub: Hub) -> None:
    a = hub.session("local-a", "v2 listing", "v2")
    hub.set_instance("local-a", api="v2")
    code, doc = hub.cli_json("sessions", "--instance", "local-a")
    assert code == 0
    assert doc["instances"][0]["api"] == "v2"
    rec = next(s for s in doc["sessions"] if s["id"] == a)
    assert rec["directory"] == str(hub.root / "v2") and rec["title"] == "v2 listing"
    code, doc = hub.cli_json("instances", "--instance", "local-a")
    assert code == 0 and doc[0]["reachable"]


def test_sessions_outcomes_from_real_runs(hub: Hub) -> None:
    hub.llm.set_mode("slow-model", "slow", delay=30)
    done = hub.session("lan-c", "finished", "o1")
    busy = hub.session("lan-c", "still going", "o2")
    cut = hub.session("lan-c", "cut short", "o3")
    never = hub.session("lan-c", "never prompted", "o4")
    hub.prompt("lan-c", done, "quick", "fake/fake-model")
    hub.prompt("lan-c", busy, "slow busy", "fake/slow-model")
    hub.prompt("lan-c", cut, "slow cut", "fake/slow-model")
    hub.wait_for(lambda: {busy, cut} <= hub.busy_ids("lan-c"))
    # Abort once the model is answering: a session is busy a moment before its answer exists,
    # and an abort in that moment leaves no answer to call "aborted".
    hub.wait_for(
        lambda: any(
            "slow cut" in r["last_user_text"] and not r["title_call"] for r in hub.llm.requests()
        )
    )
    sandbox.abort(hub.server("lan-c").url, hub.password("lan-c"), cut)
    last: dict[str, str] = {}
    try:

        def outcomes() -> dict[str, str] | None:
            code, doc = hub.cli_json("sessions", "--instance", "lan-c", "--outcomes")
            got = {s["id"]: s["outcome"] for s in doc["sessions"]}
            last.update(got)
            return got if got.get(done) == "succeeded" and got.get(cut) == "interrupted" else None

        try:
            got = hub.wait_for(outcomes, timeout=60, step=1)
        except AssertionError:
            raise AssertionError(f"outcomes seen last: {last}") from None
        assert got[busy] == "running" and got[never] == "not_started"
        code, out, _ = hub.cli("sessions", "--instance", "lan-c", "--outcomes")
        assert "last result" in out and "succeeded" in out
        code, doc = hub.cli_json("sessions", "--instance", "lan-c")
        assert {s["outcome"] for s in doc["sessions"]} == {""}  # only where fetched
    finally:
        sandbox.abort(hub.server("lan-c").url, hub.password("lan-c"), busy)
