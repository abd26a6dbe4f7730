"""Two patrol daemons on two "hosts" sharing one Redis: one active, one standby.

Real daemons (``xaf-hub patrol``) as processes with their own XAF_HUB_HOME and
XAF_HUB_HOSTNAME, one real redis-server, the real opencode fleet. The attacks: SIGKILL of the
active daemon (the standby must take over within the lease + 10 s and fill the pool), and
SIGSTOP of the active daemon in the middle of a fill, past its lease, then SIGCONT (it must send
nothing: the standby that took over sends the task, once).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import test_redis_fleet as two_hosts
from tests.e2e.proxy import StallProxy
from tests.e2e.test_redis_fleet import Host, abort_all, on_both
from tests.notify_capture import Capture

pytestmark = pytest.mark.e2e

LEASE = 5.0
hosts = two_hosts.hosts  # the two-host fixture of test_redis_fleet, reused by name


def ha(doc: dict[str, Any]) -> None:
    doc["pool"] = {"backend": "redis"}
    doc.setdefault("patrol", {})["lease_seconds"] = LEASE


def only_local_a(doc: dict[str, Any]) -> None:
    doc["instances"] = [i for i in doc["instances"] if i["name"] == "local-a"]


def status(host: Host) -> dict[str, Any]:
    code, out, err = host.run("patrol", "status", "--json")
    assert code == 0, err
    return dict(json.loads(out))


def role_of(doc: dict[str, Any], host: str) -> str | None:
    roles = [d["role"] for d in doc["daemons"] if d["host"] == host]
    return roles[-1] if roles else None


def pool(host: Host) -> dict[str, dict[str, Any]]:
    code, out, err = host.run("backlog", "list", "--json")
    assert code == 0, err
    return {t["id"]: t for t in json.loads(out)["tasks"]}


def audit(host: Host) -> list[dict[str, Any]]:
    path = host.home / "audit.log"
    return [json.loads(ln) for ln in path.read_text("utf-8").splitlines()] if path.exists() else []


def sent(host: Host, needle: str) -> list[dict[str, Any]]:
    return [
        r
        for r in host.hub.llm.requests()
        if not r["title_call"] and needle in r["last_user_text"]
    ]


@pytest.fixture
def daemons() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            with_signal(p, signal.SIGCONT)
            p.kill()
        p.communicate(timeout=30)


def with_signal(proc: subprocess.Popen[str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)


def start(host: Host, procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    proc = host.popen("patrol", "--interval-seconds", "2", "--no-design", "--no-live")
    procs.append(proc)
    return proc


@pytest.fixture
def capture() -> Iterator[Capture]:
    cap = Capture("json")
    cap.start()
    yield cap
    cap.stop()


def failovers(cap: Capture) -> list[tuple[str, str]]:
    return [
        (e["data"]["from_host"], e["data"]["to_host"])
        for e in cap.events()
        if e["type"] == "failover"
    ]


def test_sigkill_of_the_active_daemon_fails_over_within_the_lease(
    hosts: tuple[Host, Host], daemons: list[subprocess.Popen[str]], capture: Capture
) -> None:
    a, b = hosts
    on_both(hosts, ha)
    for h in hosts:  # both hosts post to one chat
        h.hub.env["HOOK_TEAM"] = capture.url
    on_both(
        hosts,
        lambda doc: doc.update(
            notify={"webhooks": [{"name": "team", "url_env": "HOOK_TEAM", "format": "json"}]}
        ),
    )
    a.hub.llm.set_mode("fake-model", "slow", delay=60)
    pa = start(a, daemons)
    a.hub.wait_for(lambda: status(b)["active_host"] == "host-a", timeout=60)
    start(b, daemons)
    a.hub.wait_for(lambda: role_of(status(a), "host-b") == "standby", timeout=60)
    # While A is active, B never takes the lease (sampled for two lease times).
    until = time.monotonic() + 2 * LEASE
    while time.monotonic() < until:
        doc = status(b)
        assert doc["active_host"] == "host-a"
        assert [d["host"] for d in doc["daemons"] if d["role"] == "active"] == ["host-a"]
        time.sleep(0.5)

    assert failovers(capture) == []  # a first start is no failover
    pa.kill()
    killed = time.monotonic()
    a.hub.wait_for(lambda: status(a)["active_host"] == "host-b", timeout=LEASE + 30)
    took = time.monotonic() - killed
    assert took <= LEASE + 10, f"failover took {took:.1f}s"
    assert role_of(status(a), "host-a") == "silent"
    # One chat notice says the patrol moved (B queued it at the take; its id is B's token).
    a.hub.wait_for(lambda: failovers(capture), timeout=60)
    # The written page names the host that took over (read from the same lease as status).
    page = a.home.parent / "ha-page.html"
    code, _, err = a.run("sessions", "--html", str(page))
    assert code == 0, err
    html = page.read_text("utf-8")
    assert 'id="active-host" data-host="host-b"' in html
    assert "The patrol runs on host host-b;" in html

    # The new holder fills the pool: each task once, by host-b.
    seed = a.home.parent / "ha-seed.json"
    seed.write_text(
        json.dumps({"tasks": [{"id": f"K{n}", "title": f"after the kill {n}"} for n in range(2)]}),
        "utf-8",
    )
    assert a.run("backlog", "import", str(seed))[0] == 0
    try:
        a.hub.wait_for(
            lambda: all(t["status"] == "dispatched" for t in pool(a).values()), timeout=60
        )
        for n in range(2):
            a.hub.wait_for(lambda n=n: sent(a, f"after the kill {n}"), timeout=60)
            assert len(sent(a, f"after the kill {n}")) == 1
        assert sorted(e["task"] for e in audit(b) if e["command"] == "patrol.backlog") == [
            "K0",
            "K1",
        ]
        # Rounds and lease renewals since the take sent no second notice.
        assert failovers(capture) == [("host-a", "host-b")]
    finally:
        abort_all(a.hub, "local-a")
        abort_all(a.hub, "lan-b")
        abort_all(a.hub, "lan-c")
    print(f"failover after SIGKILL: {took:.1f}s (lease {LEASE:g}s)")


def test_a_daemon_paused_past_its_lease_mid_fill_sends_nothing(
    hosts: tuple[Host, Host], daemons: list[subprocess.Popen[str]]
) -> None:
    a, b = hosts
    on_both(hosts, ha)
    on_both(hosts, only_local_a)
    a.hub.llm.set_mode("fake-model", "slow", delay=60)
    target = a.hub.server("local-a").url
    stall = StallProxy(target, lambda m, p: m == "POST" and p.startswith("/session?"))
    with stall as proxy:
        # A reaches local-a through a proxy that freezes session creation: its fill stops
        # there, holding the dispatch lock and a reservation, before the task is claimed.
        # A's answers may take long: its create must come back after the pause, so A really
        # resumes mid-fill with a new session in hand (not a timeout).
        a.write(lambda doc: doc.update(timeouts={"connect_seconds": 2, "read_seconds": 120}))
        a.hub.set_instance("local-a", url=proxy.url)
        pa = start(a, daemons)
        a.hub.wait_for(lambda: status(b)["active_host"] == "host-a", timeout=60)
        start(b, daemons)
        a.hub.wait_for(lambda: role_of(status(a), "host-b") == "standby", timeout=60)
        assert a.run("backlog", "add", "--title", "paused holder task", "--id", "P1")[0] == 0
        assert proxy.stalled.wait(60), "A's fill never reached session creation"
        os.kill(pa.pid, signal.SIGSTOP)
        paused = time.monotonic()
        try:
            a.hub.wait_for(lambda: status(b)["active_host"] == "host-b", timeout=LEASE + 30)
            assert time.monotonic() - paused <= LEASE + 10
            # B fills the task A had planned (A never claimed it); A's dead lock lapses first.
            a.hub.wait_for(lambda: pool(b)["P1"]["status"] == "dispatched", timeout=90)
            a.hub.wait_for(lambda: sent(a, "paused holder task"), timeout=60)
        finally:
            proxy.released.set()  # A's frozen create goes through now...
            os.kill(pa.pid, signal.SIGCONT)  # ...and A wakes up in the middle of its fill
        a.hub.wait_for(lambda: role_of(status(b), "host-a") == "standby", timeout=60)
        time.sleep(2 * LEASE)  # give a wrongly active A every chance to send
    try:
        assert len(sent(a, "paused holder task")) == 1
        row = pool(a)["P1"]
        assert row["status"] == "dispatched"
        assert [e for e in audit(a) if e["command"] == "patrol.backlog"] == []
        assert [e["task"] for e in audit(b) if e["command"] == "patrol.backlog"] == ["P1"]
        assert status(a)["active_host"] == "host-b"
    finally:
        abort_all(b.hub, "local-a")  # B's config reaches local-a directly
    for p in daemons:
        p.send_signal(signal.SIGTERM)
    out_a, err_a = pa.communicate(timeout=30)
    assert "patrol lease: standby" in out_a, (out_a, err_a)
    # It really woke up mid-fill with a session in hand, and was refused before the prompt.
    assert "nothing was sent to session" in err_a, (out_a, err_a)
