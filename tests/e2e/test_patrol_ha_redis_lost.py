"""Redis restarted, then flushed, under two HA patrol daemons (two "hosts", real opencode).

The Redis of this module is its own (the session one must not lose its keys): started here,
killed and started again on the same port (no persistence: every key is gone), then FLUSHALL
while both daemons run. The promises attacked: at any sample at most one daemon believes it is
active (each daemon's own heartbeat file) except for the old holder's lag until its next
renewal (at most a third of the lease), a daemon holds the lease again within the lease
+ 10 s of each loss, nothing is sent twice, and the instance limit holds although every
reservation vanished with Redis (the busy session on the server still counts). Then a person
interrupts the busy run from host A: whichever host's daemon is active leaves that session
alone (the interrupt is kept in Redis too, before the abort) and sends the task imported after
the losses exactly once.
(Aborting the run behind the hub's back instead makes the active daemon resume it, which
takes the freed slot again: the run was interrupted and no person said so.)
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.ha_checks import LEASE, ha, only_local_a, rounds, sent, start, status
from tests.e2e.patrol_checks import messages, patrol
from tests.e2e.two_hosts import Host, abort_all, on_both
from tests.redis_fixture import RedisServer, _answers, _stop
from xaf_hub.core.discipline import RESUME_PROMPT

pytestmark = pytest.mark.e2e

RESUME_HEAD = RESUME_PROMPT.splitlines()[0]


class OwnRedis:
    """A redis-server this test may kill and start again on one port."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.binary, self.folder = binary, folder
        self.password = secrets.token_hex(16)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        conf = self.folder / "redis.conf"
        conf.write_text(
            f'port {self.port}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {self.folder}\n'
            f"requirepass {self.password}\nlogfile {self.folder / 'redis.log'}\n",
            encoding="utf-8",
        )
        self.proc = subprocess.Popen([self.binary, str(conf)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not _answers(self.port, self.password):
            assert time.monotonic() < deadline and self.proc.poll() is None, "no redis-server"
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    folder = tmp_path / "redis"
    folder.mkdir()
    server = OwnRedis(folder)
    yield server
    server.stop()


@pytest.fixture
def redis_server(own_redis: OwnRedis) -> RedisServer:
    """This module's hosts use the Redis the test may restart (overrides the session one)."""
    return RedisServer(own_redis.port, own_redis.password)


class Roles:
    """Samples each daemon's own view of its role (its heartbeat file) in the background."""

    def __init__(self, hosts: tuple[Host, Host]) -> None:
        self.files = [h.home / "patrol" / "daemon.json" for h in hosts]
        self.samples = 0
        self.both_active: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _role(self, path: Path) -> str:
        try:
            return str(json.loads(path.read_text("utf-8")).get("role"))
        except (OSError, ValueError):
            return ""

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            roles = [self._role(p) for p in self.files]
            self.samples += 1
            if roles.count("active") > 1:
                self.both_active.append(time.monotonic())

    def windows(self) -> list[float]:
        """How long each run of consecutive "both active" samples lasted, in seconds."""
        out: list[float] = []
        first = last = None
        for t in self.both_active:
            if last is not None and t - last > 0.5:
                out.append(last - first + 0.1)  # type: ignore[operator]
                first = None
            first = t if first is None else first
            last = t
        if first is not None and last is not None:
            out.append(last - first + 0.1)
        return out

    def __enter__(self) -> Roles:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_redis_restarted_and_flushed_under_two_daemons(
    hosts: tuple[Host, Host],
    daemons: list[subprocess.Popen[str]],
    own_redis: OwnRedis,
) -> None:
    a, b = hosts
    on_both(hosts, ha)
    on_both(hosts, only_local_a)
    on_both(
        hosts,
        lambda doc: [i.update(concurrency_limit=1) for i in doc["instances"]],
    )
    a.hub.llm.set_mode("fake-model", "slow", delay=120)
    start(a, daemons)
    a.hub.wait_for(lambda: status(b)["active_host"] == "host-a", timeout=60)
    start(b, daemons)
    a.hub.wait_for(
        lambda: [d["role"] for d in status(a)["daemons"] if d["host"] == "host-b"] == ["standby"],
        timeout=60,
    )
    seed = a.home.parent / "lost-seed.json"
    seed.write_text(
        json.dumps({"tasks": [{"id": f"R{n}", "title": f"before the loss {n}"} for n in range(3)]}),
        "utf-8",
    )
    rds = RedisServer(own_redis.port, own_redis.password)
    try:
        with Roles(hosts) as roles:
            assert a.run("backlog", "import", str(seed))[0] == 0
            # One task goes out (limit 1); its session stays busy (the model answers slowly).
            a.hub.wait_for(
                lambda: sum(len(sent(a, f"before the loss {n}")) for n in range(3)) == 1,
                timeout=90,
            )
            for loss in ("restart", "flushall"):
                if loss == "restart":
                    own_redis.kill()
                    time.sleep(LEASE / 2)  # both daemons meet a dead Redis
                    own_redis.start()
                else:
                    client = rds.client()
                    client.flushall()
                    client.close()
                lost = time.monotonic()
                a.hub.wait_for(lambda: status(a)["active_host"] is not None, timeout=LEASE + 30)
                took = time.monotonic() - lost
                assert took <= LEASE + 10, f"no holder {took:.1f}s after the {loss}"
                rounds(hosts)  # rounds run on the emptied stores
            # The pool went with Redis: new work comes in again; the instance is still full.
            again = a.home.parent / "lost-again.json"
            again.write_text(
                json.dumps({"tasks": [{"id": "S0", "title": "after the loss"}]}), "utf-8"
            )
            assert a.run("backlog", "import", str(again))[0] == 0
            rounds(hosts, 4)  # several rounds by whoever holds the lease
            assert sent(a, "after the loss") == []  # the instance is still full
            (busy,) = a.hub.busy_ids("local-a")
            code, _, err = a.run("interrupt", "--session", busy, "--allow-prod")
            assert code == 0, err
            # Whoever holds the lease fills the freed slot with it, and nothing resumes.
            a.hub.wait_for(lambda: sent(a, "after the loss"), timeout=12 * LEASE)
            rounds(hosts)  # more rounds: a resume, or a second send?
        assert roles.samples > 50
        # The lease key names one holder at a time by construction; what a daemon *believes*
        # can lag: after Redis lost the key, the old holder learns it at its next renewal
        # (every third of the lease) while the other may already hold the new lease. Such a
        # window is bounded by the renewal period, and the fence keeps it from sending.
        windows = roles.windows()
        print(f"both daemons said active: {[f'{w:.1f}s' for w in windows]} (lease {LEASE:g}s)")
        assert all(w <= LEASE / 3 + 2 for w in windows), windows
        # Nothing sent twice, and the limit held: one busy session, no second prompt.
        counts = [len(sent(a, f"before the loss {n}")) for n in range(3)]
        assert sorted(counts) == [0, 0, 1], counts
        # The person's interrupt holds on whichever host is active: never resumed (it once was,
        # under load, when the interrupt was recorded after its abort: the resumed run took the
        # slot, and the task imported after the losses stayed pending). That task went once.
        assert [r for r in a.hub.llm.requests() if RESUME_HEAD in r["last_user_text"]] == []
        assert len(sent(a, "after the loss")) == 1
        assert busy not in a.hub.busy_ids("local-a") and len(a.hub.busy_ids("local-a")) <= 1
    finally:
        abort_all(a.hub, "local-a")


def test_a_run_stopped_at_its_ceiling_is_not_resumed_after_redis_lost_the_stop(
    hosts: tuple[Host, Host], redis_server: RedisServer
) -> None:
    """Host A's round stops a run past its ceiling (the stop kept in Redis and A's audit); Redis
    is flushed; host B's round, which never saw the stop, reads the run's cost from the server
    and leaves the run stopped instead of resuming it (the soak, seed 53, caught B paying on)."""
    a, b = hosts
    on_both(hosts, lambda doc: doc.update(budget={"run_usd": 0.01}))
    calls = [["bash", {"command": "true", "description": "look"}],
             ["bash", {"command": "sleep 90", "description": "wait"}]]
    a.hub.llm.set_mode("priced-model", "tools", calls=calls, text="done")
    code, doc = a.hub.cli_json("dispatch", "--new", "--instance", "lan-b", "--text", "costly",
                               "--model", "fake/priced-model", "--no-record")
    assert code == 0, doc
    sid = doc["session_id"]
    try:
        a.hub.wait_for(lambda: any(m["info"]["role"] == "assistant" and m["info"].get("cost")
                                   for m in messages(a.hub, "lan-b", sid)), timeout=90)
        stopped = patrol(a.hub, "--no-fill")["over_run_ceiling"]
        assert [(s["session"], s["result"]) for s in stopped] == [(sid, "ok")]
        client = redis_server.client()
        client.flushall()
        client.close()
        a.hub.llm.clear_log()
        patrol(b.hub, "--no-fill")
        assert not [r for r in a.hub.llm.requests()
                    if not r["title_call"] and RESUME_HEAD in r["last_user_text"]]
        assert sid not in a.hub.busy_ids("lan-b")
    finally:
        abort_all(a.hub, "lan-b")


def test_a_run_past_its_ceiling_is_stopped_while_redis_is_away(
    hosts: tuple[Host, Host], daemons: list[subprocess.Popen[str]], own_redis: OwnRedis
) -> None:
    """Redis dies while a priced run works under host A's daemon: no daemon holds the lease
    and the pool cannot be written, yet the daemon stops the run at the step that passed its
    ceiling (the soak, seed 7, saw it pay on until a daemon held the lease again)."""
    a, _ = hosts
    on_both(hosts, ha)
    on_both(hosts, lambda doc: doc.update(budget={"run_usd": 0.05}))
    a.hub.llm.set_mode("priced-model", "tools",
                       calls=[["bash", {"command": "sleep 1", "description": "a step"}]] * 30)
    daemons.append(a.popen("patrol", "--interval-seconds", "2", "--no-design"))
    a.hub.wait_for(lambda: status(a)["active_host"] == "host-a", timeout=60)
    code, doc = a.hub.cli_json("dispatch", "--new", "--instance", "lan-b", "--text", "costly",
                               "--model", "fake/priced-model", "--no-record")
    assert code == 0, doc
    sid = doc["session_id"]

    def costs() -> list[float]:
        return [float(m["info"].get("cost") or 0) for m in messages(a.hub, "lan-b", sid)
                if m["info"]["role"] == "assistant"]

    try:
        a.hub.wait_for(lambda: any(costs()), timeout=90)
        own_redis.kill()
        a.hub.wait_for(lambda: sid not in a.hub.busy_ids("lan-b"), timeout=120)
        spent = costs()
        assert sum(spent) <= 0.05 + max(spent) + 1e-9, spent
    finally:
        abort_all(a.hub, "lan-b")
        own_redis.start()
