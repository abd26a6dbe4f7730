"""Following the fleet live against real opencode servers: `watch` and the patrol daemon read
the servers' event streams; an instance killed and restarted under them is reported down and
up, and nothing is lost or sent twice.

Latency targets are measured in `python -m bench`; here the waits are generous (a loaded CI
box) and nothing asserts on elapsed time.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import fleet as sandbox
from tests.e2e import daemon
from tests.e2e.daemon import Lines, _audit, _beat, _daemon, _home, start_again
from tests.e2e.patrol_checks import RESUME_HEAD, agent_requests, children, delegating
from tests.fleet import Hub
from tests.notify_capture import Capture

pytestmark = pytest.mark.e2e

# The fixture lives in tests/e2e/daemon.py (tests/e2e/conftest.py offers it to every module);
# this name keeps the old import path working.
own_server = daemon.own_server


@pytest.fixture
def watching(hub: Hub) -> Iterator[Lines]:
    proc = hub.popen("watch", "--json", "--instance", "lan-c", "--verbose")
    lines = Lines(proc)
    try:
        hub.wait_for(lambda: any("watching 1 instance" in e for e in lines.err), timeout=120)
        yield lines
    finally:
        lines.stop()


def delete_session(hub: Hub, name: str, sid: str) -> None:
    with httpx.Client(base_url=hub.server(name).url, trust_env=False, timeout=30,
                      headers=sandbox.auth_headers(hub.password(name))) as c:
        assert c.delete(f"/session/{sid}").status_code < 300


def test_watch_reports_new_start_stop_and_gone_from_events(hub: Hub, watching: Lines) -> None:
    assert any("following its global event stream" in e for e in watching.err), watching.err
    sid = hub.session("lan-c", "live task", "live")
    hub.wait_for(lambda: "new" in watching.about(sid), timeout=60)
    hub.prompt("lan-c", sid, "say hello", "fake/fake-model")
    hub.wait_for(lambda: "stopped" in watching.about(sid), timeout=120)
    stopped = [e for e in watching.events()
               if e["event"] == "stopped" and e["session"]["id"] == sid]
    assert stopped[0]["outcome"] == "succeeded" and stopped[0]["source"] == "stream"
    # Each line names its project, as every --json record does.
    assert stopped[0]["project"] == hub.doc["project"]["name"], stopped[0]
    delete_session(hub, "lan-c", sid)
    hub.wait_for(lambda: "gone" in watching.about(sid), timeout=60)
    assert watching.about(sid) == ["new", "started", "stopped", "gone"]
    # Sessions outside the project never show.
    outside = hub.session("lan-c", "not ours", directory=hub.root.parent / "elsewhere")
    hub.prompt("lan-c", outside, "hello", "fake/fake-model")
    marker = hub.session("lan-c", "marker", "live")
    hub.wait_for(lambda: "new" in watching.about(marker), timeout=60)
    assert watching.about(outside) == []
    assert watching.stop() == 0
    assert not any(pw in "\n".join(watching.lines + watching.err) for pw in hub.secrets())


# ---------------------------------------------------------------------------------------------
# An instance of our own, killed and restarted under the followers


@pytest.mark.timeout(900)
@pytest.mark.parametrize("command", ["watch", "serve"])
def test_ctrl_c_at_any_moment_stops_the_follower(hub: Hub, command: str) -> None:
    # SIGINT while connecting, probing the streams, rescanning or listening: the process
    # ends promptly and cleanly every time (a cancel swallowed during a reader's clean-up
    # once kept it following until it was killed).
    args = ["watch", "--json"] if command == "watch" else ["serve", "--port", "0"]
    rng = random.Random(20261201)
    delays = [0.0, 0.3, 0.8, 1.5, 2.5, *(rng.uniform(0, 4) for _ in range(3))]
    for delay in delays:
        lines = Lines(hub.popen(*args))
        if command == "serve":  # the follower starts on the first page that listens
            hub.wait_for(lambda lines=lines: lines.lines, timeout=60)
            threading.Thread(target=_listen_once, args=(lines.lines[0],), daemon=True).start()
        time.sleep(delay)
        began = time.monotonic()
        code = lines.stop()
        took = time.monotonic() - began
        assert took < 30, (delay, took)
        if code == 1 and any("init_import_site" in e for e in lines.err):
            continue  # Python itself was still starting (its site imports): not ours yet
        # Following: exit 0. Before that, the CLI says "interrupted" (130), or, still
        # importing, Python ends as the signal does.
        assert code in (0, 130, -signal.SIGINT), (delay, code, lines.err[-5:])
        assert not any("Traceback" in e for e in lines.err), lines.err


def _listen_once(url: str) -> None:
    with contextlib.suppress(httpx.HTTPError), httpx.Client(trust_env=False, timeout=30) as c, \
            c.stream("GET", url.rstrip("/") + "/api/events") as resp:
        for _ in resp.iter_lines():
            pass


def test_watch_reports_a_restarted_instance_down_and_up_and_loses_nothing(
    hub: Hub, own_server: sandbox.OpencodeServer
) -> None:
    url, pw = own_server.url, own_server.password
    proc = hub.popen("watch", "--json")
    lines = Lines(proc)
    try:
        hub.wait_for(lambda: any("watching 1 instance" in e for e in lines.err), timeout=120)
        before = sandbox.create_session(url, pw, str(hub.project_dir("app")), "before")["id"]
        hub.wait_for(lambda: "new" in lines.about(before), timeout=60)
        port = own_server.port
        own_server.stop(grace=2.0)
        hub.wait_for(lambda: "down" in lines.instance_kinds("own"), timeout=90)
        start_again(own_server, port)
        # While the watcher reconnects, a session is made and run: the rescan finds it.
        during = sandbox.create_session(url, pw, str(hub.project_dir("app")), "during")["id"]
        hub.wait_for(lambda: "up" in lines.instance_kinds("own"), timeout=120)
        hub.wait_for(lambda: "new" in lines.about(during), timeout=60)
        sandbox.prompt_async(url, pw, during, "hello", "fake/fake-model")
        hub.wait_for(lambda: "stopped" in lines.about(during), timeout=120)
    finally:
        code = lines.stop()
    assert code == 0, lines.err
    assert lines.instance_kinds("own") == ["down", "up"]
    assert lines.about(before) == ["new"]
    assert lines.about(during) == ["new", "started", "stopped"]


# ---------------------------------------------------------------------------------------------
# The patrol daemon reacting between its rounds


def _last_assistant(hub: Hub, url: str, pw: str | None, sid: str) -> dict[str, Any]:
    msgs = [m for m in sandbox.messages(url, pw, sid) if m["info"]["role"] == "assistant"]
    return msgs[-1] if msgs else {}


@pytest.mark.timeout(900)
def test_daemon_heals_a_rate_limited_session_without_waiting_for_its_round(hub: Hub) -> None:
    hub.doc["models"] = {"default_dispatch_model": "fake/fake-model",
                         "chain": ["opencode/free-model", "backup/good-model"]}
    chat = Capture("json")
    chat.start()
    hub.env["HOOK_TEAM"] = chat.url
    hub.doc["notify"] = {"webhooks": [{"name": "team", "url_env": "HOOK_TEAM", "format": "json",
                                       "events": ["healed", "blackout"]}]}
    hub.write_config()
    hub.llm.set_mode("free-model", "429", retry_after=1)
    lines = _daemon(hub, "--no-fill")
    try:
        sid = hub.session("lan-b", "rate limited live", "rl")
        hub.prompt("lan-b", sid, "do the work", "opencode/free-model")
        url, pw = hub.server("lan-b").url, hub.password("lan-b")

        def healed() -> bool:
            info = _last_assistant(hub, url, pw, sid).get("info", {})
            done = bool(info.get("time", {}).get("completed"))
            return info.get("modelID") == "good-model" and done

        hub.wait_for(healed, timeout=240)
        assert _beat(hub)["ticks"] == 1  # healed by the live reaction, not by a round
        heals = [r for r in _audit(hub, "patrol.heal") if r["session"] == sid]
        assert len(heals) == 1, heals
        hub.wait_for(lambda: any(f"heal lan-b/{sid}" in ln for ln in lines.lines), timeout=30)
        # The team hears of it now, not at the round an hour later: once, with the blackout.
        hub.wait_for(lambda: [e for e in chat.events() if e["type"] == "healed"], timeout=60)
        time.sleep(3)  # a second copy would come with the next batch
        kinds = [e["type"] for e in chat.events()]
        assert kinds.count("healed") == 1 and kinds.count("blackout") == 1, kinds
        assert _beat(hub)["ticks"] == 1
    finally:
        chat.stop()
        assert lines.stop() == 0, lines.err
    out = "\n".join(lines.lines + lines.err)
    assert not any(pw in out for pw in hub.secrets())


@pytest.mark.timeout(900)
def test_daemon_follows_a_restart_and_resumes_the_cut_run_once(
    hub: Hub, own_server: sandbox.OpencodeServer
) -> None:
    hub.llm.set_mode("fake-model", "slow", delay=40)
    # The grace before a cut run is resumed (60 s by default) short: the test waits it out.
    hub.write_config(patrol={"run_start_grace_seconds": 5})
    code, _, err = hub.cli("backlog", "add", "--id", "LIVE-1", "--title", "live task")
    assert code == 0, err
    lines = _daemon(hub)
    try:
        pool = _home(hub) / "tasks_backlog.json"

        def task() -> dict[str, Any]:
            return next(t for t in json.loads(pool.read_text("utf-8"))["tasks"]
                        if t["id"] == "LIVE-1")

        hub.wait_for(lambda: task()["status"] == "dispatched", timeout=60)
        sid = task()["session_id"]
        hub.wait_for(lambda: any("live task" in r["last_user_text"] or "LIVE-1" in
                                 r["last_user_text"] for r in hub.llm.requests()), timeout=120)
        port = own_server.port
        own_server.stop(grace=2.0)
        hub.wait_for(lambda: any("live: own down" in ln for ln in lines.lines), timeout=90)
        hub.llm.set_mode("fake-model", "ok")
        start_again(own_server, port)
        hub.wait_for(lambda: any("live: own up" in ln for ln in lines.lines), timeout=120)
        # The cut run is resumed once (after the grace for runs that may still be starting),
        # then finishes, and the pool settles the task: all before the next round.
        hub.wait_for(lambda: task()["status"] == "done", timeout=300)
        assert _beat(hub)["ticks"] == 1
    finally:
        assert lines.stop() == 0, lines.err
    assert [r["session"] for r in _audit(hub, "patrol.fill_slots")] == [sid]
    assert [r["session"] for r in _audit(hub, "patrol.resume")] == [sid]


# ---------------------------------------------------------------------------------------------
# serve: change notices to open pages


def test_serve_pushes_change_notices_to_every_open_page(hub: Hub) -> None:
    proc = hub.popen("serve", "--port", "0", "--cache-seconds", "600")
    lines = Lines(proc)
    try:
        hub.wait_for(lambda: lines.lines and lines.lines[0].startswith("http://127.0.0.1:"),
                     timeout=60)
        base = lines.lines[0].rstrip("/")
        got: list[list[str]] = [[], []]

        def listen(into: list[str]) -> None:
            with httpx.Client(trust_env=False, timeout=httpx.Timeout(None, connect=10)) as c, \
                    c.stream("GET", base + "/api/events") as resp:
                assert resp.headers["content-type"].startswith("text/event-stream")
                for line in resp.iter_lines():
                    into.append(line)

        for into in got:
            threading.Thread(target=listen, args=(into,), daemon=True).start()
        hub.wait_for(lambda: all(any(ln.startswith("event: hello") for ln in g) for g in got),
                     timeout=60)
        with httpx.Client(trust_env=False, timeout=120) as c:
            first = c.get(base + "/api/snapshot").json()
        sid = hub.session("lan-b", "served live", "srv")
        assert sid not in json.dumps(first)
        hub.wait_for(lambda: all(any(sid in ln for ln in g) for g in got), timeout=60)
        # The cached scan is stale after the notice although --cache-seconds is long.
        with httpx.Client(trust_env=False, timeout=120) as c:
            after = c.get(base + "/api/snapshot").json()
        assert sid in [s["id"] for s in after["sessions"]]
        # ... built from the follower's memory of lan-b, not from a scan of it.
        assert "lan-b" in after["live_instances"] and after["source"] in ("live", "mixed")
        notes = [json.loads(ln[5:]) for g in got for ln in g if ln.startswith("data:")]
        assert any(n.get("event") == "new" and n.get("session") == sid for n in notes)
        assert "served live" not in "\n".join(got[0] + got[1])  # notices carry no titles
    finally:
        assert lines.stop() == 0, lines.err


@pytest.mark.timeout(900)
def test_queued_work_starts_when_a_slot_frees(hub: Hub) -> None:
    # dispatch --queue on a full fleet: the task waits in the pool and the daemon's live
    # reaction starts it on the instance it would have gone to, once that one has a free slot.
    hub.llm.set_mode("slow-model", "slow", delay=120)
    hub.doc["models"]["default_dispatch_model"] = "fake/slow-model"
    # The slot frees while the run sent into it is still in its reservation's grace (a run
    # sent seconds ago may not show yet): the first fill finds it reserved and must try again.
    hub.doc["lock"] = {**hub.doc["lock"], "slot_grace_seconds": 15}
    for inst in hub.doc["instances"]:
        inst["concurrency_limit"] = 1
    hub.write_config()
    for name in ("local-a", "lan-b", "lan-c"):
        code, _, err = hub.cli("dispatch", "--new", "--instance", name, "--text",
                               f"fill {name}", "--no-record")
        assert code == 0, err
    lines = _daemon(hub)
    try:
        code, out, err = hub.cli("dispatch", "--text", "Queued: write the release notes",
                                 "--instance", "local-a", "--new", "--queue", "--json")
        assert code == 0, err
        queued = json.loads(out)
        assert queued["queued"] is True and queued["daemon_running"] is True, queued
        assert queued["instance"] == "local-a" and queued["position"] == 1
        assert _audit(hub, "patrol.fill_slots") == []
        (busy,) = hub.busy_ids("local-a")
        hub.cli("interrupt", "--session", busy)

        def started() -> dict[str, Any] | None:
            code, doc = hub.cli_json("backlog", "show", queued["task"])
            return doc if code == 0 and doc.get("status") == "dispatched" else None

        task = hub.wait_for(started, timeout=90)
        assert task["dispatched_to"] == "local-a", task
        assert _beat(hub)["ticks"] == 1  # started by the live reaction, not a round

        def sent() -> str:
            msgs = sandbox.messages(hub.server("local-a").url, hub.password("local-a"),
                                    task["session_id"])
            return "".join(p.get("text", "") for m in msgs if m["info"]["role"] == "user"
                           for p in m.get("parts", []))

        # The row names its session once the session exists; the prompt follows it.
        hub.wait_for(lambda: "Queued: write the release notes" in sent(), timeout=30)
        assert len(hub.busy_ids("local-a")) <= 1
    finally:
        assert lines.stop() == 0, lines.err
        for name in ("local-a", "lan-b", "lan-c"):
            for sid in hub.busy_ids(name):
                hub.cli("interrupt", "--session", sid)


@pytest.mark.timeout(600)
def test_daemon_stops_a_run_past_its_ceiling_while_it_waits_in_a_tool(hub: Hub) -> None:
    """The run's first step costs $0.02 against a $0.01 ceiling, then the run waits in a
    90-second tool call: the daemon aborts it within seconds, parks its task, audits it,
    tells the team once and leaves it stopped (no resume)."""
    hub.doc["budget"] = {"run_usd": 0.01}
    chat = Capture("json")
    chat.start()
    hub.env["HOOK_TEAM"] = chat.url
    hub.doc["notify"] = {"webhooks": [{"name": "team", "url_env": "HOOK_TEAM", "format": "json",
                                       "events": ["run_ceiling"]}]}
    hub.write_config()
    calls = [["bash", {"command": "true", "description": "look"}],
             ["bash", {"command": "sleep 90", "description": "wait"}]]
    hub.llm.set_mode("priced-model", "tools", calls=calls, text="done")
    lines = _daemon(hub, "--no-fill")
    try:
        code, doc = hub.cli_json("dispatch", "--new", "--instance", "lan-b", "--text",
                                 "costly work", "--model", "fake/priced-model")
        assert code == 0, doc
        sid = doc["session_id"]
        url, pw = hub.server("lan-b").url, hub.password("lan-b")

        def cost_seen() -> float:
            msgs = [m for m in sandbox.messages(url, pw, sid) if m["info"]["role"] == "assistant"]
            return sum(float(m["info"].get("cost") or 0) for m in msgs)

        hub.wait_for(lambda: cost_seen() > 0.01, timeout=120)
        over_at = time.monotonic()

        def aborted() -> bool:
            info = _last_assistant(hub, url, pw, sid).get("info", {})
            return (info.get("error") or {}).get("name") == "MessageAbortedError"

        hub.wait_for(aborted, timeout=60)  # the tool would sleep 90 s
        took = time.monotonic() - over_at
        assert took < 30, took  # within seconds (3 s polls, 1 s settle), not at the round
        # The server writes the aborted message before it marks the session idle (the tool's
        # process is still being stopped): idle follows within moments, not at the tool's end.
        hub.wait_for(lambda: sid not in hub.busy_ids("lan-b"), timeout=15, step=0.5)
        rows = [r for r in _audit(hub, "patrol.live.run_ceiling") if r["session"] == sid]
        assert [r["result"] for r in rows] == ["stopping", "aborted"], rows
        assert rows[1]["cost_usd"] == pytest.approx(0.02) and rows[1]["ceiling_usd"] == 0.01
        code, pool = hub.cli_json("backlog", "list")
        task = next(t for t in pool["tasks"] if t.get("session_id") == sid)
        assert task["status"] == "pending" and "over the run ceiling" in task["parked"]
        hub.wait_for(lambda: [e for e in chat.events() if e["type"] == "run_ceiling"],
                     timeout=60)
        time.sleep(4)  # a second notice would come with the next watch of the session
        assert [e["type"] for e in chat.events()].count("run_ceiling") == 1
        # ... and a resume with the reaction to its stop (settled 1 s): the stop is a decision.
        assert not agent_requests(hub, "priced-model", RESUME_HEAD)
        assert sid not in hub.busy_ids("lan-b")
        assert _beat(hub)["ticks"] == 1  # stopped by the live watch, not by a round
    finally:
        lines.stop()
        chat.stop()


@pytest.mark.timeout(600)
def test_daemon_stops_a_run_whose_sub_agent_spends_in_the_background_within_a_step(
    hub: Hub,
) -> None:
    """The parent, on a free model, starts a priced sub-agent in the background and goes idle;
    the child spends $0.02 a step. The daemon judges the run on each step the stream reports
    (not on its 3-second timer), so the child is stopped at the step that passed the $0.05
    ceiling, before the next one is reported, with the parent."""
    hub.doc["budget"] = {"run_usd": 0.05}
    hub.write_config()
    delegating(hub, background=True, step_seconds=2.0)
    lines = _daemon(hub, "--no-fill")
    url, pw = hub.server("lan-b").url, hub.password("lan-b")
    try:
        code, doc = hub.cli_json("dispatch", "--new", "--instance", "lan-b", "--text",
                                 "delegate it", "--model", "fake/fake-model", "--no-record")
        assert code == 0, doc
        sid = doc["session_id"]
        kid = hub.wait_for(lambda: children(hub, "lan-b", sid), timeout=120)[0]["id"]

        def aborted() -> bool:
            info = _last_assistant(hub, url, pw, kid).get("info", {})
            return (info.get("error") or {}).get("name") == "MessageAbortedError"

        hub.wait_for(aborted, timeout=120)
        steps = [m["info"] for m in sandbox.messages(url, pw, kid)
                 if m["info"]["role"] == "assistant" and m["info"].get("cost")]
        spent = sum(float(s["cost"]) for s in steps)
        print(f"sub-agent stopped after {len(steps)} priced steps: ${spent:.2f} of $0.05")
        assert spent == pytest.approx(0.06)  # the step that passed the ceiling, no more
        hub.wait_for(lambda: not {sid, kid} & set(hub.status("lan-b", hub.root / "app")),
                     timeout=30)
        rows = [r for r in _audit(hub, "patrol.live.run_ceiling") if r["session"] == sid]
        assert [r["result"] for r in rows] == ["stopping", "aborted"], rows
        assert rows[1]["sub_agents"] == 1
        assert _beat(hub)["ticks"] == 1  # stopped by the live watch, not by a round
    finally:
        lines.stop()
        for s in hub.busy_ids("lan-b"):
            hub.cli("interrupt", "--session", s)


def test_a_starting_daemon_fills_free_slots_before_its_first_round(
    hub: Hub, tmp_path: Path
) -> None:
    # Pending work and idle instances when the daemon starts; its first timed round is half an
    # hour away: the work starts now, from the live reaction, not at that round.
    hub.llm.set_mode("slow-model", "slow", delay=120)
    hub.doc["models"]["default_dispatch_model"] = "fake/slow-model"
    minute = time.gmtime().tm_min
    hub.doc.setdefault("patrol", {}).update(interval_minutes=60, minute_offset=(minute + 30) % 60)
    hub.write_config()
    seed = {"tasks": [{"id": f"S-{n}", "title": f"start fill {n}"} for n in range(2)]}
    (tmp_path / "seed.json").write_text(json.dumps(seed), "utf-8")
    code, _, err = hub.cli("backlog", "import", str(tmp_path / "seed.json"))
    assert code == 0, err
    t0 = time.monotonic()
    lines = Lines(hub.popen("patrol", "--no-design"))
    try:
        def started() -> list[dict[str, Any]] | None:
            code, doc = hub.cli_json("backlog", "list", "--status", "dispatched")
            got = [t for t in doc.get("tasks", []) if t["id"].startswith("S-")] if code == 0 else []
            return got if len(got) == 2 else None

        tasks = hub.wait_for(started, timeout=90)
        assert _beat(hub)["ticks"] == 0  # no round has run: the start's fill sent them

        def audited() -> list[str] | None:  # the row is claimed before the prompt goes out
            rows = _audit(hub, "patrol.backlog")
            sent = sorted(r["task"] for r in rows if r["result"] == "dispatched")
            return sent if len(sent) >= 2 else None

        assert hub.wait_for(audited, timeout=60) == ["S-0", "S-1"]  # each once
        assert _beat(hub)["ticks"] == 0
        assert all(t["session_id"] for t in tasks), tasks
        print(f"started {len(tasks)} task(s) {time.monotonic() - t0:.1f} s after the daemon")
    finally:
        assert lines.stop() == 0, lines.err
        for name in ("local-a", "lan-b", "lan-c"):
            for sid in hub.busy_ids(name):
                hub.cli("interrupt", "--session", sid)
