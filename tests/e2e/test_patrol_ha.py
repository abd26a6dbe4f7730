"""Two patrol daemons on two "hosts" sharing one Redis: one active, one standby.

Real daemons (``xaf-hub patrol``) as processes with their own XAF_HUB_HOME and
XAF_HUB_HOSTNAME, one real redis-server, the real opencode fleet. The attacks: SIGKILL of the
active daemon (the standby must take over within the lease + 10 s and fill the pool), and
SIGSTOP of the active daemon in the middle of a fill, past its lease, then SIGCONT (it must send
nothing: the standby that took over sends the task, once), and SIGKILL of the active daemon in
the middle of a rate-limit heal, its prompt held in a proxy: dropped (the standby heals the
session, once, within the limit), delivered unanswered (the standby leaves the healed session
alone), or dropped after the abort of a stuck retry (the standby resumes the session, once).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.e2e import ha_checks
from tests.e2e import limit_checks as limit
from tests.e2e.ha_checks import LEASE, ha, only_local_a, rounds, sent, start, status
from tests.e2e.patrol_checks import CONTINUE_HEAD, RESUME_HEAD, answered_by, settled
from tests.e2e.proxy import StallMode, StallProxy
from tests.e2e.two_hosts import Host, abort_all, on_both
from tests.notify_capture import Capture

pytestmark = pytest.mark.e2e

# The fixture lives in tests/e2e/ha_checks.py (tests/e2e/conftest.py offers it to every module);
# this name keeps the old import path working.
daemons = ha_checks.daemons


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
        rounds(hosts)  # give a wrongly active A every chance to send
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
    assert "lost the patrol lease" in err_a, (out_a, err_a)  # the fence, not the lock


# -- SIGKILL mid-heal -----------------------------------------------------------------------

TTL = 10.0  # lock.slot_ttl_seconds: how long a dead daemon's prompt in flight keeps its slot
CHAIN = ["opencode/free-model", "backup/good-model"]


def heal_on_lan_c(doc: dict[str, Any]) -> None:
    """One instance (lan-c, limit 2), a chain whose first model is rate limited, a short TTL."""
    doc["instances"] = [i for i in doc["instances"] if i["name"] == limit.NAME]
    doc["instances"][0]["concurrency_limit"] = limit.LIMIT
    doc["models"].update(default_dispatch_model="fake/fake-model", chain=CHAIN)
    doc["lock"]["slot_ttl_seconds"] = TTL


def continue_prompts(host: Host) -> list[dict[str, Any]]:
    """Every heal prompt the fake model received (one failed session in these tests)."""
    return [
        r
        for r in host.hub.llm.requests()
        if not r["title_call"] and CONTINUE_HEAD in r["last_user_text"]
    ]


def run_state(host: Host, sid: str) -> str:
    """A session's run state as the hub reads it (B's config reaches lan-c directly)."""
    code, out, err = host.run("sessions", "--instance", limit.NAME, "--json")
    assert code == 0, err
    return next((s["run_state"] for s in json.loads(out)["sessions"] if s["id"] == sid), "")


def heal_lines(host: Host, sid: str) -> list[dict[str, Any]]:
    return [e for e in audit(host) if e["command"] == "patrol.heal" and e["session"] == sid]


def kill_mid_heal(
    hosts: tuple[Host, Host],
    daemons: list[subprocess.Popen[str]],
    mode: StallMode,
    *,
    stuck: bool = False,
) -> tuple[str, float]:
    """Freeze A's heal of a rate-limited session at its prompt, B standby; SIGKILL A.

    One other session runs on lan-c all along (one of its two slots). A reaches lan-c through a
    proxy that holds the heal's ``prompt_async`` in ``mode``; the proxy is gone when this
    returns. ``stuck``: the session is stuck in retry (a one-hour Retry-After), so A's heal
    aborts the run first (that goes through) and is frozen between the abort and the prompt;
    else its run failed. Returns the session's id and the monotonic time of the kill.
    """
    a, b = hosts
    on_both(hosts, ha)
    on_both(hosts, heal_on_lan_c)
    a.hub.llm.set_mode("slow-model", "slow", delay=600)
    a.hub.llm.set_mode("good-model", "slow", delay=8)  # the healed run is seen running
    a.hub.llm.set_mode("free-model", "429", retry_after=3600 if stuck else 1)
    other = a.hub.session(limit.NAME, "holds the other slot")
    a.hub.prompt(limit.NAME, other, "long work", "fake/slow-model")
    sid = a.hub.session(limit.NAME, "rate limited mid heal")
    a.hub.prompt(limit.NAME, sid, "do the work", "opencode/free-model")
    if stuck:
        a.hub.wait_for(lambda: run_state(b, sid) == "retry", timeout=60)
    else:
        failed = a.hub.wait_for(lambda: settled(a.hub, limit.NAME, sid), timeout=90)
        assert failed["info"]["error"]["data"]["statusCode"] == 429
        assert limit.running(a.hub) == {other}

    with StallProxy(a.hub.server(limit.NAME).url, limit.is_prompt(sid), mode) as proxy:
        # A's heal must still be waiting for its prompt's answer when it is killed.
        a.write(lambda doc: doc.update(timeouts={"connect_seconds": 2, "read_seconds": 120}))
        a.hub.set_instance(limit.NAME, url=proxy.url)
        pa = start(a, daemons)
        assert proxy.stalled.wait(90), "A's heal never sent its prompt"
        assert status(b)["active_host"] == "host-a"
        start(b, daemons)
        a.hub.wait_for(lambda: role_of(status(a), "host-b") == "standby", timeout=60)
        # The prompt is held: the model heard nothing yet (drop), or it runs already.
        delivered = mode == "hold-answer"
        a.hub.wait_for(lambda: bool(continue_prompts(a)) == delivered, timeout=30)
        if stuck:
            assert limit.running(a.hub) == {other}  # A's abort went through
        assert heal_lines(a, sid) == []  # A is mid-heal: it wrote no heal yet
        pa.kill()
        killed = time.monotonic()
        pa.communicate(timeout=30)
    return sid, killed


def test_sigkill_mid_heal_before_the_prompt_arrives_the_standby_heals_once(
    hosts: tuple[Host, Host], daemons: list[subprocess.Popen[str]]
) -> None:
    from xaf_hub.config.load import load_config
    from xaf_hub.store.backends import Stores

    a, b = hosts
    with limit.Sampler(a.hub, a.hub.root / "app") as sampler:
        try:
            since = datetime.now(UTC)
            sid, killed = kill_mid_heal(hosts, daemons, "drop")
            a.hub.wait_for(lambda: status(b)["active_host"] == "host-b", timeout=LEASE + 30)
            took = time.monotonic() - killed
            assert took <= LEASE + 10, f"failover took {took:.1f}s"
            # A's reservation for its prompt counts until the TTL (B cannot know the prompt's
            # fate): with the other run, lan-c stays full until it lapses; B's heal waits.
            a.hub.wait_for(lambda: continue_prompts(a), timeout=TTL + 60)
            healed = time.monotonic() - killed
            a.hub.wait_for(answered_by(a.hub, limit.NAME, sid, CHAIN[1]), timeout=60)
            rounds(hosts)  # B's later rounds: a second heal would show by now
            assert [r["model"] for r in continue_prompts(a)] == ["good-model"]
        finally:
            limit.abort_all(a.hub)
    sampler.check()
    # B healed it: B's audit says so (A's, dead mid-heal, does not), and the shared model
    # state remembers one heal of this session, onto the chain's next model.
    # (Tries refused while lan-c was full are audited as failed: nothing was sent in them.)
    lines = heal_lines(b, sid)
    assert [(e["result"], e["model"]) for e in lines if e["result"] != "failed"] == [
        ("reuse", CHAIN[1])
    ]
    assert heal_lines(a, sid) == []
    state = Stores(load_config(str(b.hub.config_path), env=b.hub.env)).model_state()
    assert [
        (h.who.session, h.from_model, h.to_model) for h in state.healed_since(since)
    ] == [(sid, CHAIN[0], CHAIN[1])]
    print(f"failover {took:.1f}s, heal {healed:.1f}s after the SIGKILL (lease {LEASE:g}s)")


def test_sigkill_mid_heal_after_the_prompt_arrived_the_standby_does_not_heal_again(
    hosts: tuple[Host, Host], daemons: list[subprocess.Popen[str]]
) -> None:
    a, b = hosts
    with limit.Sampler(a.hub, a.hub.root / "app") as sampler:
        try:
            sid, killed = kill_mid_heal(hosts, daemons, "hold-answer")
            a.hub.wait_for(lambda: status(b)["active_host"] == "host-b", timeout=LEASE + 30)
            assert time.monotonic() - killed <= LEASE + 10
            # The prompt A sent before it died runs (or ran) on the next model; B reads the
            # session afresh and sees no failure to heal (A never recorded its heal).
            a.hub.wait_for(answered_by(a.hub, limit.NAME, sid, CHAIN[1]), timeout=60)
            # Past A's reservation (made before the kill), then B's later rounds: B has every
            # chance to heal.
            time.sleep(max(0.0, killed + TTL + 1 - time.monotonic()))
            rounds(hosts)
            assert [r["model"] for r in continue_prompts(a)] == ["good-model"]
        finally:
            limit.abort_all(a.hub)
    sampler.check()
    assert heal_lines(a, sid) == [] and heal_lines(b, sid) == []



def test_sigkill_mid_heal_between_abort_and_prompt_the_standby_resumes_once(
    hosts: tuple[Host, Host], daemons: list[subprocess.Popen[str]]
) -> None:
    a, b = hosts
    with limit.Sampler(a.hub, a.hub.root / "app") as sampler:
        try:
            sid, killed = kill_mid_heal(hosts, daemons, "drop", stuck=True)
            a.hub.wait_for(lambda: status(b)["active_host"] == "host-b", timeout=LEASE + 30)
            assert time.monotonic() - killed <= LEASE + 10
            # A aborted the stuck run and died before its prompt arrived: the session shows an
            # aborted run, no rate limit. B resumes it once, on the next model (the family A
            # blacked out before it died stays out), through the gate.
            a.hub.wait_for(answered_by(a.hub, limit.NAME, sid, CHAIN[1]), timeout=TTL + 90)
            rounds(hosts)  # B's later rounds: a second prompt would show by now
            after = [
                r["model"]
                for r in a.hub.llm.requests()
                if not r["title_call"] and RESUME_HEAD in r["last_user_text"]
            ]
            assert after == ["good-model"] and continue_prompts(a) == []
        finally:
            limit.abort_all(a.hub)
    sampler.check()
    lines = [e for e in audit(b) if e["session"] == sid and e["result"] != "failed"]
    assert [(e["command"], e["result"], e["model"]) for e in lines] == [
        ("patrol.resume", "reuse", CHAIN[1])
    ]
    assert heal_lines(a, sid) == []


def test_sigkill_of_the_active_daemon_mid_fill_sends_the_task_once(
    hosts: tuple[Host, Host], daemons: list[subprocess.Popen[str]]
) -> None:
    a, b = hosts
    on_both(hosts, ha)
    on_both(hosts, only_local_a)
    a.hub.llm.set_mode("fake-model", "slow", delay=60)
    target = a.hub.server("local-a").url
    stall = StallProxy(
        target, lambda m, p: m == "POST" and p.startswith("/session?"), mode="drop"
    )
    with stall as proxy:
        # A reaches local-a through a proxy that freezes session creation: A dies there,
        # holding the dispatch lock and a reservation, the task planned but not claimed.
        a.hub.set_instance("local-a", url=proxy.url)
        pa = start(a, daemons)
        a.hub.wait_for(lambda: status(b)["active_host"] == "host-a", timeout=60)
        start(b, daemons)
        a.hub.wait_for(lambda: role_of(status(a), "host-b") == "standby", timeout=60)
        assert a.run("backlog", "add", "--title", "killed mid fill", "--id", "F1")[0] == 0
        assert proxy.stalled.wait(60), "A's fill never reached session creation"
        pa.kill()
        killed = time.monotonic()
        try:
            a.hub.wait_for(lambda: status(b)["active_host"] == "host-b", timeout=LEASE + 30)
            took = time.monotonic() - killed
            assert took <= LEASE + 10, f"failover took {took:.1f}s"
            a.hub.wait_for(lambda: pool(b)["F1"]["status"] == "dispatched", timeout=90)
            a.hub.wait_for(lambda: sent(a, "killed mid fill"), timeout=60)
            rounds(hosts)  # B's later rounds must not send it again
            proxy.released.set()  # A's frozen create is dropped: it died before it left
            assert len(sent(a, "killed mid fill")) == 1
            row = pool(a)["F1"]
            assert row["status"] == "dispatched" and row["dispatched_to"] == "local-a"
            assert [e for e in audit(a) if e["command"] == "patrol.backlog"] == []
            assert [e["task"] for e in audit(b) if e["command"] == "patrol.backlog"] == ["F1"]
            limit = next(
                i.get("concurrency_limit", 2)
                for i in b.hub.doc["instances"]
                if i["name"] == "local-a"
            )
            assert len(b.hub.busy_ids("local-a")) <= limit
        finally:
            abort_all(b.hub, "local-a")
    print(f"failover after SIGKILL mid-fill: {took:.1f}s (lease {LEASE:g}s)")
