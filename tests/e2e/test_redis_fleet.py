"""Several hubs on "different hosts" sharing one gate and one model state through Redis.

Each simulated host has its own XAF_HUB_HOME (so its own state folder) and its own
XAF_HUB_HOSTNAME; the two share nothing but a real redis-server (tests/redis_fixture.py) and
the real opencode fleet. Host-specific commands run as separate processes.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import UTC, datetime
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.e2e import two_hosts
from tests.e2e.proxy import StallProxy
from tests.e2e.two_hosts import Host, abort_all, on_both
from tests.fleet import Hub
from tests.redis_fixture import RedisServer, write_redis_config

pytestmark = pytest.mark.e2e

# The fixtures live in tests/e2e/two_hosts.py (tests/e2e/conftest.py offers them to every
# module); these names keep the old import path working.
hosts = two_hosts.hosts
rds = two_hosts.rds


def slow(hosts: tuple[Host, Host], seconds: float = 25) -> None:
    hosts[0].hub.llm.set_mode("slow-model", "slow", delay=seconds)

    def change(doc: dict[str, Any]) -> None:
        doc["models"]["default_dispatch_model"] = "fake/slow-model"

    on_both(hosts, change)


def set_instance(hosts: tuple[Host, Host], name: str, **fields: Any) -> None:
    def change(doc: dict[str, Any]) -> None:
        for inst in doc["instances"]:
            if inst["name"] == name:
                inst.update(fields)

    on_both(hosts, change)


def slot_entries(rds: Any, hub: Hub, instance: str) -> dict[str, dict[str, Any]]:
    prefix = hub.doc["lock"]["redis_prefix"]
    keys = [f"{prefix}:slot:{instance}:{t}" for t in rds.smembers(f"{prefix}:slots:{instance}")]
    values = rds.mget(keys) if keys else []
    return {k: json.loads(v) for k, v in zip(keys, values, strict=True) if v}


@pytest.mark.parametrize("attempt", range(10))
def test_race_across_two_hosts(hosts: tuple[Host, Host], rds: Any, attempt: int) -> None:
    a, b = hosts
    slow(hosts)
    # Three dispatchers at once for limit 2, split over the hosts (2+1, then 1+2, ...).
    order = (a, b, a) if attempt % 2 == 0 else (b, a, b)
    procs = [
        h.popen(
            "dispatch",
            "--new",
            "--instance",
            "local-a",
            "--text",
            f"race {attempt}.{i}",
            "--no-record",
        )
        for i, h in enumerate(order)
    ]
    try:
        codes = []
        for p in procs:
            _, err = p.communicate(timeout=120)
            codes.append(p.returncode)
            assert p.returncode in (0, 3), err
            if p.returncode == 3:
                assert "at its limit" in err or "dispatch lock" in err
        assert sorted(codes) == [0, 0, 3]
        assert len(a.hub.busy_ids("local-a")) == 2
        # The winners' reservations are in Redis, tagged with their host; no slot files exist.
        # (The loser may already have dropped a winner from its own host whose process exited:
        # "process gone, same host" — the winner on the other host is always still there.)
        held = slot_entries(rds, a.hub, "local-a")
        assert 1 <= len(held) <= 2
        assert {e["host"] for e in held.values()} <= {"host-a", "host-b"}
        assert all(e["session_id"] for e in held.values())
        assert not any((h.home / "slots").exists() for h in hosts)
    finally:
        abort_all(a.hub, "local-a")


def test_sigkill_leaves_a_reservation_that_redis_expires(
    hosts: tuple[Host, Host], rds: Any
) -> None:
    a, b = hosts
    ttl = 8

    def short_ttl(doc: dict[str, Any]) -> None:
        doc["lock"]["slot_ttl_seconds"] = ttl

    on_both(hosts, short_ttl)
    set_instance(hosts, "lan-c", concurrency_limit=1)
    target = a.hub.server("lan-c").url
    with StallProxy(target, lambda m, p: m == "POST" and p.startswith("/session?")) as proxy:
        # Host A reaches lan-c through a proxy that freezes session creation: A dies holding
        # the lock and a reservation.
        a.hub.set_instance("lan-c", url=proxy.url)
        proc = a.popen("dispatch", "--new", "--instance", "lan-c", "--text", "doomed")
        assert proxy.stalled.wait(60), "the dispatch never reached create"
        held = slot_entries(rds, a.hub, "lan-c")
        assert len(held) == 1
        ((key, entry),) = held.items()
        assert (entry["pid"], entry["host"], entry["session_id"]) == (proc.pid, "host-a", "")
        assert 0 < rds.pttl(key) <= ttl * 1000
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        proxy.released.set()
    a.hub.set_instance("lan-c", url=target)

    # Host B cannot see host A's processes: the orphan counts, and B is refused.
    code, out, err = b.run("status", "--instance", "lan-c", "--json")
    assert code == 0, err
    assert json.loads(out)["instances"][0]["reserved"] == 1
    code, _, err = b.run("dispatch", "--new", "--instance", "lan-c", "--text", "x", "--dry-run")
    assert code == 3 and "at its limit" in err

    # Nobody reads or cleans anything now: the Redis server expires the key on its own.
    b.hub.wait_for(lambda: rds.exists(key) == 0, timeout=ttl + 20, step=0.25)
    try:
        code, out, err = b.run("dispatch", "--new", "--instance", "lan-c", "--text", "after crash")
        assert code == 0, err  # the dead holder's lock lease has lapsed as well
        assert "created session" in out
    finally:
        abort_all(b.hub, "lan-c")


def test_blackout_seen_by_one_hub_stops_the_other(hosts: tuple[Host, Host]) -> None:
    from xaf_hub.config.load import load_config
    from xaf_hub.store.backends import Stores

    a, b = hosts
    args = ("dispatch", "--new", "--instance", "local-a", "--model", "opencode/free-model")
    code, plan = b.hub.cli_json(*args, "--text", "before", "--dry-run")
    assert code == 0 and plan["model"] == "opencode/free-model"  # no blackout yet

    # Hub A sees a rate limit and records the blackout through the one writer.
    cfg_a = load_config(str(a.hub.config_path), env=a.hub.env)
    Stores(cfg_a).model_state().mark_blackout(
        "opencode", "429 free usage limit", "host-a", datetime.now(UTC)
    )
    assert not (a.home / ".model_state.json").exists()  # it went to Redis, not to A's files

    code, out, err = b.hub.cli(*args, "--text", "after the blackout")
    assert code == 0, err
    assert "opencode/free-model is blacked out" in err
    sid = out.split("created session ", 1)[1].split()[0]
    try:
        sent = b.hub.wait_for(
            lambda: [
                r
                for r in b.hub.llm.requests()
                if r["last_user_text"].startswith("after the blackout") and not r["title_call"]
            ],
            timeout=60,
        )
        assert {r["model"] for r in sent} == {"fake-model"}
    finally:
        sandbox.abort(b.hub.server("local-a").url, b.hub.password("local-a"), sid)


def test_doctor_checks_the_shared_redis(hub: Hub, redis_server: RedisServer) -> None:
    hub.env.update(redis_server.env())
    write_redis_config(hub.doc, redis_server, RedisServer.prefix())
    hub.write_config()
    code, doc = hub.cli_json("doctor")
    [line] = [f for f in doc["findings"] if (f["area"], f["subject"]) == ("lock", "redis")]
    assert line["level"] == "ok", line
    assert f"at 127.0.0.1:{redis_server.port}/0 answers" in line["message"]
    assert "dispatch gate and the model state" in line["message"]
    assert redis_server.password not in json.dumps(doc)


def test_unreachable_redis(hub: Hub, redis_server: RedisServer) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hub.env.update(redis_server.env())
    write_redis_config(hub.doc, redis_server, RedisServer.prefix())
    hub.doc["lock"]["redis_url"] = f"redis://127.0.0.1:{port}/0"
    hub.write_config()

    # Commands that need the gate stop with exit 2 and say why.
    code, _, err = hub.cli("dispatch", "--new", "--instance", "local-a", "--text", "x")
    assert code == 2 and "redis: unreachable" in err and "connection refused" in err
    assert "127.0.0.1:" in err and redis_server.password not in err

    # Read-only commands still work; status shows reservations as unknown.
    code, out, err = hub.cli("status", "--json")
    assert code == 0, err
    assert "reservations unknown" in err and "redis: unreachable" in err
    rows = json.loads(out)["instances"]
    assert [r["reserved"] for r in rows] == [None, None, None]
    assert not any(r["dispatchable"] for r in rows)
    code, out, _ = hub.cli("status")
    assert code == 0 and "reservations unknown" in out
    assert hub.cli("sessions", "--instance", "local-a")[0] == 0

    # doctor names Redis as the problem, with the fix, for the gate and the model state.
    code, doc = hub.cli_json("doctor")
    assert code == 2
    failing = {(f["area"], f["subject"]): f for f in doc["findings"] if f["level"] == "error"}
    assert set(failing) == {("lock", "redis"), ("clock", "model state")}
    for finding in failing.values():
        assert "connection refused" in finding["message"]
        assert "redis-server" in finding["fix"] and "XAF_HUB_REDIS_PASSWORD" in finding["fix"]
    assert redis_server.password not in json.dumps(doc)


def test_an_interrupt_on_one_host_holds_for_the_patrol_on_another(
    hosts: tuple[Host, Host],
) -> None:
    from xaf_hub.core.discipline import RESUME_PROMPT

    a, b = hosts
    hub = a.hub
    hub.llm.set_mode("slow-model", "slow", delay=60)
    url, pw = hub.server("lan-c").url, hub.password("lan-c")
    person = hub.session("lan-c", "stopped by a person")
    server = hub.session("lan-c", "stopped without a person")
    for sid in (person, server):
        hub.prompt("lan-c", sid, f"long work in {sid}", "fake/slow-model")
    try:
        hub.wait_for(lambda: {person, server} <= hub.busy_ids("lan-c"), timeout=30)
        # A person stops one run from host A; the other run is aborted with no one's word.
        code, _, err = a.run("interrupt", "--session", person, "--allow-prod")
        assert code == 0, err
        sandbox.abort(url, pw, server)
        hub.wait_for(lambda: not hub.busy_ids("lan-c") & {person, server}, timeout=30)

        # The patrol runs on host B, whose audit log never saw the interrupt.
        assert not (b.home / "audit.log").exists() or person not in (
            b.home / "audit.log"
        ).read_text("utf-8")
        code, _, err = b.run("patrol", "--once", "--no-fill", "--no-design")
        assert code == 0, err
        doc = json.loads((b.home / "patrol" / "report-latest.json").read_text("utf-8"))
        resumed = {r["session"]: r["result"] for r in doc["resumed"]}
        assert resumed == {server: "ok"}, doc["resumed"]
        lines = {s["session"]: s for s in doc["sessions"]["interrupted"]}
        assert "interrupted by" in lines[person]["detail"], lines[person]
        head = RESUME_PROMPT.splitlines()[0]
        # The patrol has sent the resume when it ends; the run reaches the model a moment later.
        resumes = hub.wait_for(lambda: [
            r for r in hub.llm.requests() if not r["title_call"] and head in r["last_user_text"]
        ], timeout=30)
        assert len(resumes) == 1 and hub.busy_ids("lan-c") & {person, server} == {server}
    finally:
        abort_all(hub, "lan-c")


def test_an_interrupt_is_known_before_its_abort_lands(hosts: tuple[Host, Host]) -> None:
    """The abort has stopped the run on the server, but its answer has not reached host A yet
    (a slow link): a round on host B that sees the run stopped must already know a person
    stopped it. (Recorded after the abort, B resumed it: found under CPU load, where the
    interrupting process was slow between the abort and its record.)"""
    from xaf_hub.core.discipline import RESUME_PROMPT

    a, b = hosts
    hub = a.hub
    hub.llm.set_mode("slow-model", "slow", delay=60)
    sid = hub.session("lan-c", "stopped by a person over a slow link")
    hub.prompt("lan-c", sid, "long work", "fake/slow-model")
    target = hub.server("lan-c").url
    head = RESUME_PROMPT.splitlines()[0]
    try:
        hub.wait_for(lambda: sid in hub.busy_ids("lan-c"), timeout=30)
        is_abort = lambda m, p: m == "POST" and p.startswith(f"/session/{sid}/abort")  # noqa: E731
        with StallProxy(target, is_abort, mode="hold-answer") as proxy:
            a.hub.set_instance("lan-c", url=proxy.url)
            proc = a.popen("interrupt", "--session", sid, "--allow-prod")
            assert proxy.stalled.wait(60), "the interrupt never sent its abort"
            hub.wait_for(lambda: sid not in hub.busy_ids("lan-c"), timeout=30)  # stopped there
            code, _, err = b.run("patrol", "--once", "--no-fill", "--no-design")
            assert code == 0, err
            proxy.released.set()
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, (out, err)
        a.hub.set_instance("lan-c", url=target)
        doc = json.loads((b.home / "patrol" / "report-latest.json").read_text("utf-8"))
        assert doc["resumed"] == [], doc["resumed"]
        (line,) = [s for s in doc["sessions"]["interrupted"] if s["session"] == sid]
        assert "interrupted by" in line["detail"], line
        assert not [r for r in hub.llm.requests() if head in r["last_user_text"]]
        assert sid not in hub.busy_ids("lan-c")
    finally:
        a.hub.set_instance("lan-c", url=target)
        abort_all(hub, "lan-c")


def test_a_daemons_live_board_reaches_the_other_host_through_redis(
    hosts: tuple[Host, Host],
) -> None:
    from tests.e2e.daemon import _daemon

    a, b = hosts
    daemon = _daemon(a.hub, "--no-fill")
    try:
        # Host B runs no daemon and holds no board file: its status takes A's board, from Redis.
        doc = b.hub.wait_for(
            lambda: (d := b.hub.cli_json("status")[1])["source"] == "live" and d, timeout=60
        )
        assert doc["live_instances"] == sorted(i["name"] for i in b.hub.doc["instances"])
        assert not list(b.home.glob("live-board-*.json"))
    finally:
        assert daemon.stop() == 0
    # The stopped daemon's last board says nothing is current: B scans at once.
    assert b.hub.cli_json("status")[1]["source"] == "scan"
