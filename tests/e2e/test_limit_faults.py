"""The limit under slow links and lost locks, against real opencode servers.

Each scenario samples the instance's own ``GET /session/status`` every 200 ms for its whole
length and asserts that no sample shows more than the limit (2) running:

* a steer whose prompt travels slowly while its session ends (a loopback proxy delays it),
  and a steer whose session ended before the steer took the lock;
* a prompt whose answer times out although the prompt lands later;
* a Redis gate whose lock a host loses mid-dispatch: the host is SIGSTOPped past the lease
  while holding it, or Redis forgets everything (FLUSHALL, a restart) between the host's
  create and its prompt. The host that lost the lock exits 3 and sends nothing.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import pytest

from sandbox import fleet as sandbox
from tests.e2e.faulty import StepProxy
from tests.e2e.limit_checks import LIMIT, NAME, Sampler, abort_all, is_prompt, running
from tests.e2e.proxy import DelayProxy, StallProxy
from tests.fleet import Hub
from tests.redis_fixture import RedisServer, write_redis_config

pytestmark = pytest.mark.e2e



def setup_two_running(hub: Hub, *titles: str) -> list[str]:
    """Limit 2 on lan-c, a slow model, and one running session per title; their ids."""
    hub.llm.set_mode("slow-model", "slow", delay=90)
    hub.doc["models"]["default_dispatch_model"] = "fake/slow-model"
    hub.set_instance(NAME, concurrency_limit=LIMIT)
    ids = [hub.session(NAME, t) for t in titles]
    for sid in ids:
        hub.prompt(NAME, sid, f"work for {sid}", "fake/slow-model")
    hub.wait_for(lambda: set(ids) <= running(hub), timeout=60)
    return ids


# -- steers ------------------------------------------------------------------------------------


def test_a_slow_steer_of_a_run_that_ends_keeps_the_limit(hub: Hub) -> None:
    a, _b = setup_two_running(hub, "steer target", "other work")
    target = hub.server(NAME).url
    try:
        with Sampler(hub, hub.root / "app") as sampler:
            # The steer's prompt takes 6 s to arrive; its session ends meanwhile.
            with DelayProxy(target, lambda m, p: 6.0 if is_prompt(a)(m, p) else 0) as proxy:
                hub.set_instance(NAME, url=proxy.url)
                steer = hub.popen("dispatch", "--session", a, "--text", "one more thing",
                                  "--no-record")
                assert proxy.delayed.wait(60), "the steer never sent its prompt"
                sandbox.abort(target, hub.password(NAME), a)
                hub.wait_for(lambda: a not in running(hub), timeout=30)
                # A free slot, seen from outside the lock: this dispatch must wait for the
                # steer, then find its session running again (or its reservation), and stop.
                code, _, err = hub.cli("dispatch", "--new", "--instance", NAME, "--text",
                                       "new work meanwhile", "--no-record")
                out, steer_err = steer.communicate(timeout=120)
            hub.set_instance(NAME, url=target)
            assert steer.returncode == 0, steer_err
            assert f"steered running session {a} on {NAME}" in out
            assert code == 3 and "at its limit" in err, err
            hub.wait_for(lambda: a in running(hub), timeout=30)  # the late prompt restarted it
            time.sleep(3)  # a few more samples with both runs going
        sampler.check()
        assert max(sampler.samples) == LIMIT
    finally:
        abort_all(hub)


def test_a_steer_of_a_session_that_stopped_goes_through_the_gate(hub: Hub) -> None:
    a, _b = setup_two_running(hub, "steer target", "other work")
    target = hub.server(NAME).url
    lock_file = Path(hub.env["XAF_HUB_HOME"]) / "locks" / f"{NAME}.lock"

    def under_the_lock(m: str, p: str) -> bool:
        # Hold the run-state read the steer makes while holding the dispatch lock.
        return m == "GET" and p.startswith("/session/status") and lock_held(lock_file)

    try:
        with Sampler(hub, hub.root / "app") as sampler:
            with StallProxy(target, under_the_lock) as proxy:
                hub.set_instance(NAME, url=proxy.url)
                steer = hub.popen("dispatch", "--session", a, "--text", "one more thing",
                                  "--no-record")
                assert proxy.stalled.wait(60), "the steer never re-read the run state"
                sandbox.abort(target, hub.password(NAME), a)  # it ends before the re-read
                hub.wait_for(lambda: a not in running(hub), timeout=30)
                proxy.release()
                out, err = steer.communicate(timeout=120)
            hub.set_instance(NAME, url=target)
            assert steer.returncode == 0, err
            assert f"started idle session {a} (it had stopped) on {NAME}" in out
            hub.wait_for(lambda: a in running(hub), timeout=30)
            code, _, err = hub.cli("dispatch", "--new", "--instance", NAME, "--text", "more",
                                   "--no-record")
            assert code == 3 and "at its limit" in err, err
        sampler.check()
        audit = (Path(hub.env["XAF_HUB_HOME"]) / "audit.log").read_text("utf-8").splitlines()
        assert json.loads(audit[0])["result"] == "reuse"
    finally:
        abort_all(hub)


def lock_held(path: Path) -> bool:
    """True when another process holds the file lock at ``path`` (probes without waiting)."""
    import portalocker

    if not path.exists():
        return False
    with open(path, "a+b") as handle:
        try:
            portalocker.lock(handle, portalocker.LOCK_EX | portalocker.LOCK_NB)
        except (portalocker.LockException, BlockingIOError, PermissionError):
            return True
        portalocker.unlock(handle)
        return False


# -- a prompt whose answer is lost -------------------------------------------------------------


def test_a_prompt_that_timed_out_keeps_its_slot_until_it_lands(hub: Hub) -> None:
    setup_two_running(hub, "already running")
    hub.doc["timeouts"]["read_seconds"] = 3
    target = hub.server(NAME).url

    def slow_prompts(m: str, p: str) -> float:
        return 8.0 if m == "POST" and p.split("?")[0].endswith("/prompt_async") else 0

    try:
        with Sampler(hub, hub.root / "app") as sampler:
            with DelayProxy(target, slow_prompts) as proxy:
                hub.set_instance(NAME, url=proxy.url)
                code, _, err = hub.cli("dispatch", "--new", "--instance", NAME, "--text",
                                       "first", "--no-record")
                assert code == 2 and "may still arrive" in err, err
                code2, _, err2 = hub.cli("dispatch", "--new", "--instance", NAME, "--text",
                                         "second", "--no-record")
                assert code2 == 3 and full(err2, 1, 1), err2
                # The first prompt lands late: its session runs, counted once.
                hub.wait_for(lambda: len(running(hub)) == 2, timeout=60)
            hub.set_instance(NAME, url=target)
            code3, _, err3 = hub.cli("dispatch", "--new", "--instance", NAME, "--text", "third",
                                     "--no-record")
            assert code3 == 3 and full(err3, 2, 0), err3
        sampler.check()
    finally:
        abort_all(hub)


def full(err: str, runs: int, reserved: int) -> bool:
    """The refusal at the limit, from the planner or from the re-count under the lock."""
    return f"{runs}+{reserved}/2" in err or f"{runs} running + {reserved} reserved of 2" in err


# -- the Redis gate loses its lock -------------------------------------------------------------


def redis_hub(hub: Hub, server: RedisServer) -> None:
    hub.env.update(server.env())
    write_redis_config(hub.doc, server, RedisServer.prefix())
    hub.write_config()


def host_a(hub: Hub, url: str, tmp: Path) -> subprocess.Popen[str]:
    """``dispatch --new`` on a second "host" (own home and name) that reaches lan-c at ``url``.

    Its timeouts are long: a SIGSTOP must not turn into a read timeout.
    """
    doc = copy.deepcopy(hub.doc)
    doc["timeouts"] = {"connect_seconds": 5, "read_seconds": 120}
    for inst in doc["instances"]:
        if inst["name"] == NAME:
            inst["url"] = url
    (tmp / "host-a" / "home").mkdir(parents=True, exist_ok=True)
    config = tmp / "host-a" / "config.json"
    config.write_text(json.dumps(doc), "utf-8")
    env = {
        **os.environ,
        **hub.env,
        "XAF_HUB_HOME": str(tmp / "host-a" / "home"),
        "XAF_HUB_HOSTNAME": "host-a",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "xaf_hub", "--config", str(config), "dispatch", "--new",
         "--instance", NAME, "--text", "work from host a", "--no-record"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def lock_key(hub: Hub) -> str:
    return f"{hub.doc['lock']['redis_prefix']}:lock:{NAME}"


def test_a_host_paused_past_its_lease_sends_nothing(
    hub: Hub, redis_server: RedisServer, tmp_path: Path
) -> None:
    redis_hub(hub, redis_server)
    rds = redis_server.client()
    setup_two_running(hub, "already running")
    target = hub.server(NAME).url

    def read_under_the_lock(m: str, p: str) -> bool:
        return m == "GET" and p.startswith("/session/status") and bool(rds.exists(lock_key(hub)))

    proc: subprocess.Popen[str] | None = None
    try:
        with Sampler(hub, hub.root / "app") as sampler, StallProxy(
            target, read_under_the_lock
        ) as proxy:
            proc = host_a(hub, proxy.url, tmp_path)
            assert proxy.stalled.wait(60), "host a never re-read the run state under the lock"
            os.kill(proc.pid, signal.SIGSTOP)  # paused while holding the lock (Ctrl+Z, a VM)
            proxy.release()  # its reading is answered now, before host b starts anything
            deadline = time.monotonic() + 60
            while rds.exists(lock_key(hub)) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not rds.exists(lock_key(hub)), "the lease never ran out"
            code, out, err = hub.cli("dispatch", "--new", "--instance", NAME, "--text",
                                     "work from host b", "--no-record")
            assert code == 0, err
            new_b = out.split("created session ", 1)[1].split()[0]
            time.sleep(hub.doc["lock"]["slot_grace_seconds"] + 1)  # b's reservation is old now
            os.kill(proc.pid, signal.SIGCONT)
            a_out, a_err = proc.communicate(timeout=120)
            time.sleep(3)
        sampler.check()
        assert proc.returncode == 3, a_err
        assert "dispatch lock was lost" in a_err and "took no slot" in a_err
        assert "may have been exceeded" not in a_err and "lapsed" not in a_err
        assert new_b in running(hub)
        # Host b's reservation was not judged by host a's stale reading.
        keys = rds.smembers(f"{hub.doc['lock']['redis_prefix']}:slots:{NAME}")
        assert len(keys) == 1
    finally:
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.communicate(timeout=30)
        abort_all(hub)


class PrivateRedis:
    """A redis-server of this test's own, which it can restart (empty, as without persistence)."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.binary = binary
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        self.server = RedisServer(port, secrets.token_hex(16))
        self.conf = folder / "redis.conf"
        self.conf.write_text(
            f'port {port}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {folder}\n'
            f"requirepass {self.server.password}\n",
            encoding="utf-8",
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, str(self.conf)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                if self.server.client().ping():
                    return
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    folder = tmp_path / "redis"
    folder.mkdir()
    with PrivateRedis(folder) as server:
        yield server


@pytest.mark.parametrize("loss", ["flushall", "restart"])
def test_redis_forgetting_the_lock_between_create_and_prompt(
    hub: Hub, private_redis: PrivateRedis, tmp_path: Path, loss: str
) -> None:
    redis_hub(hub, private_redis.server)
    setup_two_running(hub, "already running")
    target = hub.server(NAME).url
    created = lambda m, p: m == "POST" and p.split("?")[0] == "/session"  # noqa: E731
    proc: subprocess.Popen[str] | None = None
    try:
        with Sampler(hub, hub.root / "app") as sampler, StepProxy(target, after=created) as proxy:
            proc = host_a(hub, proxy.url, tmp_path)
            assert proxy.held.wait(60), "host a never created its session"
            if loss == "flushall":
                private_redis.server.client().flushall()
            else:
                private_redis.stop()
                private_redis.start()
            # Redis forgot host a's lock and reservation: host b sees a free slot and uses it.
            code, out, err = hub.cli("dispatch", "--new", "--instance", NAME, "--text",
                                     "work from host b", "--no-record")
            assert code == 0, err
            proxy.release()  # host a gets its new session back and goes on
            a_out, a_err = proc.communicate(timeout=120)
            time.sleep(4)  # a prompt sent anyway would show as a third run by now
        sampler.check()
        assert proc.returncode == 3, a_err
        assert "dispatch lock was lost before sending" in a_err and "nothing was sent" in a_err
        sessions = hub.cli_json("sessions", "--instance", NAME)[1]["sessions"]
        [a_session] = [s["id"] for s in sessions if "host a" in s["title"]]
        assert f"session {a_session}" in a_err  # the message names the session it left idle
        assert a_session not in running(hub)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
        abort_all(hub)
