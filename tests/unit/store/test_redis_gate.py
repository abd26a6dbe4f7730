"""The Redis gate and model state against a real redis-server (tests/redis_fixture.py).

Same liveness table as the file gate (SPEC §6a), plus what only Redis does: key expiry, a
leased lock that survives long holds and frees itself after a crash, one model state for
several hubs, and clear errors when the server is away. The config keys are checked too.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.redis_fixture import RedisServer
from tests.unit.store.cases import LIVENESS_CASES, PROMPT_CASES
from xaf_hub.config.load import Config, LockConfig, parse_config
from xaf_hub.core.clock import to_ms
from xaf_hub.errors import BusyError, ConfigError, ExitCode, StateFileError, UnreachableError
from xaf_hub.store.backends import Stores
from xaf_hub.store.gate import FileGate
from xaf_hub.store.model_state import FileModelState

if TYPE_CHECKING:
    from xaf_hub.store.redis.gate import RedisGate
    from xaf_hub.store.redis.model_state import RedisModelState

FAMILIES = {"opencode": ["opencode/", "opencode-go/"]}


def config(doc: dict[str, Any], env: dict[str, str] | None = None) -> Config:
    return parse_config(doc, path=Path("/cfg/config.json"), env=env or {})


def wait_for(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s")
        time.sleep(0.05)


# -- config ------------------------------------------------------------------------------------


def test_defaults_are_file_backends() -> None:
    cfg = config({})
    assert (cfg.lock.backend, cfg.lock.redis_url, cfg.models.state_backend) == ("file", "", "file")
    assert type(Stores(cfg).gate()) is FileGate


@pytest.mark.parametrize(
    ("lock", "models", "message"),
    [
        ({"backend": "redis"}, {}, "'lock.redis_url': required when lock.backend is 'redis'"),
        ({"backend": "Redis"}, {}, "'lock.backend': must be 'file' or 'redis'"),
        (
            {"backend": "redis", "redis_url": "redis://:s3cret@h:6379/0"},
            {},
            "XAF_HUB_REDIS_PASSWORD",
        ),
        ({"redis_url": "redis://u:s3cret@h/0"}, {}, "must not carry a password"),
        ({"redis_url": "unix:///run/redis.sock?password=s3cret"}, {}, "must not carry a password"),
        ({"redis_url": "http://h:6379"}, {}, "redis://, rediss:// or unix://"),
        ({"redis_url": "redis://h:99999/0"}, {}, "bad port"),
        ({"redis_url": "redis:///0"}, {}, "names no host"),
        ({"redis_url": "redis://h/0", "redis_prefix": "my hub"}, {}, "'lock.redis_prefix'"),
        ({"redis_pasword": "x"}, {}, "unknown key"),
        ({}, {"state_backend": "redis"}, "needs lock.redis_url"),
        ({"redis_url": "redis://h/0"}, {"state_backend": "db"}, "must be 'file' or 'redis'"),
    ],
)
def test_bad_redis_settings_are_config_errors(
    lock: dict[str, Any], models: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        config({"lock": lock, "models": models})
    assert "s3cret" not in str(err.value)
    assert err.value.exit_code == ExitCode.USAGE


def test_password_in_url_exits_4_through_the_cli(tmp_path: Path) -> None:
    from io import StringIO

    from xaf_hub.cli.main import main

    path = tmp_path / "config.json"
    doc = {"lock": {"backend": "redis", "redis_url": "redis://:s3cret@127.0.0.1:6379/0"}}
    path.write_text(json.dumps(doc), "utf-8")
    out, err = StringIO(), StringIO()
    code = main(["--config", str(path), "status"], stdout=out, stderr=err, env={})
    assert code == 4 and "XAF_HUB_REDIS_PASSWORD" in err.getvalue()
    assert "s3cret" not in err.getvalue() + out.getvalue()


def test_password_comes_from_env_and_is_a_secret() -> None:
    doc = {"lock": {"backend": "redis", "redis_url": "rediss://user@r.example:6380/2"}}
    cfg = config(doc, {"XAF_HUB_REDIS_PASSWORD": "pw-123456"})
    assert cfg.lock.redis_password == "pw-123456"
    assert "pw-123456" in cfg.secrets() and "pw-123456" not in repr(cfg.lock)
    assert config(doc).lock.redis_password is None


_SYSMODULES_SCRIPT = """
import sys
from datetime import UTC, datetime
from pathlib import Path

home, url, password, block = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "block"
tried = []


class NoRedis:
    # Refuse `import redis` and note which module asked (the frame running the import).
    def find_spec(self, name, path=None, target=None):
        if name != "redis" and not name.startswith("redis."):
            return None
        frame = sys._getframe(1)
        while frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen")):
            frame = frame.f_back
        tried.append(frame.f_globals.get("__name__"))
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)


if block:
    sys.meta_path.insert(0, NoRedis())

from xaf_hub.config.load import parse_config
from xaf_hub.store.backends import Stores
from xaf_hub.errors import HubError
from xaf_hub.store.backends import Stores


def run(doc):
    env = {"XAF_HUB_HOME": home, "XAF_HUB_REDIS_PASSWORD": password}
    cfg = parse_config(doc, path=Path(home) / "c.json", env=env)
    try:
        gate = Stores(cfg).gate()
        with gate.lock("lan-a"):
            res = gate.attach(gate.reserve("lan-a"), "ses_1")
            assert len(gate.pending("lan-a", set())) == 1
            gate.release(res)
        Stores(cfg).model_state().mark_blackout("opencode", "429", "test", datetime.now(UTC))
    except HubError as exc:
        return f"exit {int(exc.exit_code)}: {exc}"
    return "ok, backend loaded: " + str("xaf_hub.store.redis" in sys.modules)


print(run({}))
print("redis import tried by:", sorted(set(tried)))
lock = {"backend": "redis", "redis_url": url, "redis_prefix": "sysmod"}
print(run({"lock": lock, "models": {"state_backend": "redis"}}))
"""


@pytest.mark.parametrize("block", [True, False])
def test_file_backend_needs_no_redis(
    tmp_path: Path, redis_server: RedisServer, block: bool
) -> None:
    # A fresh interpreter runs the file gate and file model state through a whole dispatch
    # cycle, then the Redis ones. With `redis` made unimportable, the file backend still works
    # and no xaf_hub module even tries the import (portalocker probes for it on its own, for
    # its optional RedisLock); the Redis backend then stops with exit 4 and the install hint.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _SYSMODULES_SCRIPT,
            str(tmp_path),
            redis_server.url,
            redis_server.password,
            "block" if block else "allow",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 0, done.stderr
    file_run, tried, redis_run = done.stdout.splitlines()
    assert file_run == "ok, backend loaded: False"
    if block:
        askers = ast.literal_eval(tried.removeprefix("redis import tried by: "))
        assert askers and all(a.split(".")[0] == "portalocker" for a in askers), askers
        assert redis_run.startswith("exit 4: ") and "pip install 'xaf-hub[redis]'" in redis_run
    else:
        assert redis_run == "ok, backend loaded: True"


# -- the gate ----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def lock_cfg(redis_server: RedisServer) -> LockConfig:
    return LockConfig(
        slot_ttl_seconds=60,
        lock_timeout_seconds=0.3,
        slot_grace_seconds=5,
        backend="redis",
        redis_url=redis_server.url,
        redis_prefix=RedisServer.prefix(),
        redis_password=redis_server.password,
    )


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[Any]:
    client = redis_server.client()
    yield client
    client.close()


def make(cfg: LockConfig, alive: set[int] | None = None, host: str = "h1", **kw: Any) -> RedisGate:
    from xaf_hub.store.redis.client import connect
    from xaf_hub.store.redis.gate import RedisGate

    pids = alive if alive is not None else set()
    return RedisGate(cfg, connect(cfg), host=host, alive=lambda p: p in pids, **kw)


def test_make_gate_picks_redis(lock_cfg: LockConfig) -> None:
    from xaf_hub.store.redis.gate import RedisGate

    gate = Stores(Config(path=None, home=Path("/h"), state_dir=Path("/h"), lock=lock_cfg)).gate()
    assert isinstance(gate, RedisGate)


def test_reserve_attach_release(lock_cfg: LockConfig, rds: Any) -> None:
    gate = make(lock_cfg, {os.getpid()})
    res = gate.reserve("lan-a")
    data = json.loads(rds.get(res.key))
    assert (data["pid"], data["host"], data["session_id"]) == (os.getpid(), "h1", "")
    assert abs(data["created"] - gate.server_time()) < 5  # the server's clock, not ours
    assert 0 < rds.pttl(res.key) <= 60_000
    rds.pexpire(res.key, 5_000)
    res = gate.attach(res, "ses_1")
    assert json.loads(rds.get(res.key))["session_id"] == "ses_1"
    assert rds.pttl(res.key) > 5_000  # attach restarted the timer
    assert [r.key for r in gate.live_reservations("lan-a", set())] == [res.key]  # within grace
    gate.release(res)
    assert rds.exists(res.key) == 0 and gate.live_reservations("lan-a") == []
    assert rds.smembers(gate.index_key("lan-a")) == set()


@pytest.mark.parametrize(("age", "session", "running", "alive", "host", "live"), LIVENESS_CASES)
def test_liveness(
    lock_cfg: LockConfig,
    rds: Any,
    age: float,
    session: str,
    running: set[str] | None,
    alive: bool,
    host: str,
    live: bool,
) -> None:
    clock = Clock()
    gate = make(lock_cfg, {4242} if alive else set(), clock=clock)
    key = gate.slot_key("lan-a", "t1")
    doc = {"instance": "lan-a", "pid": 4242, "host": host, "created": clock.t - age}
    rds.set(key, json.dumps({**doc, "session_id": session}), px=60_000)
    rds.sadd(gate.index_key("lan-a"), "t1")
    assert bool(gate.live_reservations("lan-a", running)) is live
    assert bool(rds.exists(key)) is live  # dead ones are removed when the gate is read
    assert (rds.smembers(gate.index_key("lan-a")) == {"t1"}) is live


def test_pending_counts_a_running_session_once(lock_cfg: LockConfig) -> None:
    gate = make(lock_cfg, {os.getpid()})
    gate.attach(gate.reserve("lan-a"), "ses_run")
    gate.reserve("lan-a")
    assert len(gate.live_reservations("lan-a", {"ses_run"})) == 2
    assert len(gate.pending("lan-a", {"ses_run"})) == 1


def test_redis_expires_a_reservation_by_itself(lock_cfg: LockConfig, rds: Any) -> None:
    from dataclasses import replace

    gate = make(replace(lock_cfg, slot_ttl_seconds=1), alive={os.getpid()})
    res = gate.reserve("lan-a")
    assert len(gate.live_reservations("lan-a")) == 1
    wait_for(lambda: rds.exists(res.key) == 0)  # nobody read the gate: the server did it
    assert gate.live_reservations("lan-a") == []
    assert rds.exists(gate.index_key("lan-a")) == 0  # the index expires with its last key


def test_unreadable_reservation_counts_until_it_expires(lock_cfg: LockConfig, rds: Any) -> None:
    gate = make(lock_cfg)
    key = gate.slot_key("lan-a", "cut")
    rds.set(key, '{"instance": "lan-a", "pi', px=60_000)
    rds.sadd(gate.index_key("lan-a"), "cut")
    assert len(gate.live_reservations("lan-a")) == 1 and rds.exists(key)


def test_instances_do_not_share_slots(lock_cfg: LockConfig) -> None:
    gate = make(lock_cfg, {os.getpid()})
    gate.reserve("lan-a")
    gate.reserve("lan-a:b")
    gate.reserve("lan-a:b")
    assert len(gate.live_reservations("lan-a")) == 1
    assert len(gate.live_reservations("lan-a:b")) == 2


def test_a_slot_rewritten_in_between_survives(lock_cfg: LockConfig, rds: Any) -> None:
    # The dead-slot delete compares content: a slot rewritten after it was read is kept.
    gate = make(lock_cfg)
    key, index = gate.slot_key("lan-a", "t9"), gate.index_key("lan-a")
    rds.set(key, "fresh content", px=60_000)
    rds.sadd(index, "t9")
    assert gate._delete_if_unchanged(keys=[key, index], args=["stale content", "t9"]) == 0
    assert rds.exists(key) and rds.sismember(index, "t9")


def test_lock_times_out_with_busy_error(lock_cfg: LockConfig) -> None:
    gate, other = make(lock_cfg), make(lock_cfg, host="h2")
    with gate.lock("lan-a"):
        with pytest.raises(BusyError, match="dispatch lock"), other.lock("lan-a"):
            pass
        with other.lock("lan-b"):
            pass  # another instance's lock is independent
    with other.lock("lan-a"):
        pass


def test_lock_outlives_its_lease_while_held(lock_cfg: LockConfig) -> None:
    holder = make(lock_cfg, lease_seconds=0.6)
    other = make(lock_cfg, host="h2")
    with holder.lock("lan-a"):
        start = time.monotonic()
        while time.monotonic() - start < 2.0:  # more than three leases
            with pytest.raises(BusyError), other.lock("lan-a"):
                pass
    assert holder.warnings == []
    with other.lock("lan-a"):
        pass


def test_lock_of_a_crashed_holder_frees_itself(lock_cfg: LockConfig, rds: Any) -> None:
    from dataclasses import replace

    # A holder that died without releasing: its key carries a lease and nobody renews it.
    gate = make(replace(lock_cfg, lock_timeout_seconds=15))
    rds.set(f"{lock_cfg.redis_prefix}:lock:lan-a", "dead-token", px=800)
    with gate.lock("lan-a"):
        assert rds.get(f"{lock_cfg.redis_prefix}:lock:lan-a") != "dead-token"


def test_a_lost_lock_is_reported(lock_cfg: LockConfig, rds: Any) -> None:
    gate = make(lock_cfg)
    with gate.lock("lan-a"):
        rds.delete(f"{lock_cfg.redis_prefix}:lock:lan-a")
    [warning] = gate.warnings
    assert "lost before it was released" in warning and "lease" in warning
    assert "out of reach for over" not in warning  # it does not claim what it cannot know


@pytest.mark.parametrize("how", ["flushed", "taken"])
def test_a_lost_lock_writes_no_reservation(lock_cfg: LockConfig, rds: Any, how: str) -> None:
    from xaf_hub.errors import LockLostError

    gate = make(lock_cfg, {os.getpid()})
    lock_key = f"{lock_cfg.redis_prefix}:lock:lan-a"
    with gate.lock("lan-a"):
        assert gate.owns_lock("lan-a")
        res = gate.reserve("lan-a")  # still ours: written
        if how == "flushed":
            rds.delete(lock_key, res.key)  # what FLUSHALL or a restart does to our keys
        else:
            rds.set(lock_key, "another-host-token")  # the lease ran out; someone took it
        assert not gate.owns_lock("lan-a")
        with pytest.raises(LockLostError) as err:
            gate.reserve("lan-a")
        assert err.value.exit_code == ExitCode.BUSY
        with pytest.raises(LockLostError):
            gate.attach(res, "ses_1")
        kept = [] if how == "flushed" else [res.key]
        assert [r.key for r in gate.live_reservations("lan-a")] == kept
        gate.accepted(res)  # the prompt went out anyway: its run must count (written back)
        assert gate.holds(res)
    assert gate.warnings == []  # the caller was told through owns_lock / LockLostError


@pytest.mark.parametrize(("age", "prompt", "running", "alive", "seen", "live"), PROMPT_CASES)
def test_liveness_by_prompt_state(
    lock_cfg: LockConfig,
    rds: Any,
    age: float,
    prompt: str,
    running: set[str] | None,
    alive: bool,
    seen: float | None,
    live: bool,
) -> None:
    clock = Clock()
    gate = make(lock_cfg, {4242} if alive else set(), clock=clock)
    key = gate.slot_key("lan-a", "t1")
    created = clock.t - age
    doc = {"instance": "lan-a", "pid": 4242, "host": "h1", "created": created,
           "session_id": "ses_1", "prompt": prompt}
    rds.set(key, json.dumps(doc), px=60_000)
    rds.sadd(gate.index_key("lan-a"), "t1")
    observed = None if seen is None else created + seen
    assert bool(gate.live_reservations("lan-a", running, observed)) is live
    assert bool(rds.exists(key)) is live


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_redis_is_exit_2_with_the_reason(lock_cfg: LockConfig) -> None:
    from dataclasses import replace

    cfg = replace(lock_cfg, redis_url=f"redis://127.0.0.1:{_closed_port()}/0")
    gate = make(cfg)
    for action in (
        lambda: gate.live_reservations("lan-a"),
        lambda: gate.reserve("lan-a"),
        lambda: gate.lock("lan-a").__enter__(),
    ):
        with pytest.raises(UnreachableError, match="connection refused") as err:
            action()
        assert err.value.instance == "redis" and err.value.exit_code == ExitCode.UNREACHABLE
    from xaf_hub.store.gate import Reservation

    gate.release(Reservation(None, "lan-a", 1, "h1", 0.0, key=gate.slot_key("lan-a", "x")))
    assert "could not release" in gate.warnings[-1]  # failure paths never raise from release


def test_wrong_password_is_named(lock_cfg: LockConfig) -> None:
    from dataclasses import replace

    for password in ("wrong", None):
        gate = make(replace(lock_cfg, redis_password=password))
        with pytest.raises(UnreachableError, match="authentication failed") as err:
            gate.reserve("lan-a")
        assert "XAF_HUB_REDIS_PASSWORD" in str(err.value)
        assert str(lock_cfg.redis_password) not in str(err.value)


# -- model state -------------------------------------------------------------------------------


def states(cfg: LockConfig, n: int = 2) -> list[RedisModelState]:
    from xaf_hub.store.redis.client import connect
    from xaf_hub.store.redis.model_state import RedisModelState

    return [RedisModelState(connect(cfg), cfg.redis_prefix, 8, UTC, FAMILIES) for _ in range(n)]


def test_blackout_is_shared_and_a_repeat_never_extends(lock_cfg: LockConfig, rds: Any) -> None:
    hub_a, hub_b = states(lock_cfg)
    now = datetime.now(UTC).replace(microsecond=0)
    until = hub_a.mark_blackout("opencode", "429 free usage", "hub-a", now)
    assert hub_b.blacked_out_families(now) == {"opencode"}  # the other hub sees it at once
    later = now + timedelta(minutes=30)
    if later < datetime.fromtimestamp(until / 1000, UTC):
        assert hub_b.mark_blackout("opencode", "again", "hub-b", later) == until
    entry = hub_a.active_blackouts(now)["opencode"]
    assert (entry.until_ms, entry.reason, entry.source) == (until, "429 free usage", "hub-a")
    assert 0 < rds.pttl(hub_a.key) <= until - int(time.time() * 1000) + 2_000  # ends itself
    after = datetime.fromtimestamp(until / 1000, UTC) + timedelta(seconds=1)
    assert hub_b.blacked_out_families(after) == set()


def test_a_stated_model_rest_is_shared_and_ended_for_every_hub(
    lock_cfg: LockConfig, rds: Any
) -> None:
    hub_a, hub_b = states(lock_cfg)
    now = datetime.now(UTC).replace(microsecond=0)
    end = to_ms(now + timedelta(seconds=300))
    model = "opencode/big-pickle"
    assert hub_a.mark_rest(model, scope="model", until_ms=end, why="stated", reason="429",
                           source="hub-a", now=now) == end
    seen = hub_b.active_blackouts(now)[model]
    assert (seen.scope, seen.why, seen.until_ms) == ("model", "stated", end)
    assert hub_b.resting(now) == {model} and hub_b.blacked_out_families(now) == set()
    assert 0 < rds.pttl(hub_a.key) <= 302_000  # Redis drops it at the stated end, not 08:00
    assert [b.family for b in hub_b.end_rests([model], now)] == [model]
    assert hub_a.resting(now) == set()


def test_concurrent_marks_agree(lock_cfg: LockConfig) -> None:
    hubs = states(lock_cfg, 8)
    now = datetime.now(UTC)
    results: list[int] = []
    errors: list[BaseException] = []

    def mark(i: int) -> None:
        try:
            results.append(hubs[i].mark_blackout("opencode", f"r{i}", f"hub{i}", now))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=mark, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(results)) == 1 and len(results) == 8
    assert len(hubs[0].active_blackouts(now)) == 1


def test_a_write_in_between_makes_the_other_hub_retry(lock_cfg: LockConfig) -> None:
    # Hub B marks the blackout while hub A is between its read and its write. A's write must
    # fail (WATCH), re-read, and keep B's entry: the first cause stays, nothing is overwritten.
    hub_a, hub_b = states(lock_cfg)
    now = datetime.now(UTC)
    reads = 0
    parse = hub_a._parse

    def parse_then_interfere(raw: str | None) -> dict[str, Any]:
        nonlocal reads
        reads += 1
        data = parse(raw)
        if reads == 1:
            hub_b.mark_blackout("opencode", "429 seen by B", "hub-b", now)
        return data

    hub_a._parse = parse_then_interfere  # type: ignore[method-assign]
    hub_a.mark_blackout("opencode", "429 seen by A", "hub-a", now + timedelta(seconds=1))
    assert reads == 2
    assert hub_b.active_blackouts(now)["opencode"].source == "hub-b"


def test_healed_memory_is_shared_and_expires(lock_cfg: LockConfig, rds: Any) -> None:
    hub_a, hub_b = states(lock_cfg)
    assert not hub_b.was_healed("lan-a/ses_1/msg_9")
    hub_a.remember_healed("lan-a/ses_1/msg_9", "opencode/free", "backup/good", datetime.now(UTC))
    assert hub_b.was_healed("lan-a/ses_1/msg_9")
    ttl = rds.pttl(hub_a.healed_prefix + "lan-a/ses_1/msg_9")
    assert 13 * 86_400_000 < ttl <= 14 * 86_400_000


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema_version": 1, "blackouts": {', "line 1 column"),
        ('{"schema_version": 9, "blackouts": {}, "healed": {}}', "schema_version"),
        ('{"schema_version": 1, "blackouts": {"opencode": 5}, "healed": {}}', "expected an object"),
    ],
)
def test_corrupt_state_is_an_error_never_a_reset(
    lock_cfg: LockConfig, rds: Any, content: str, message: str
) -> None:
    (hub,) = states(lock_cfg, 1)
    rds.set(hub.key, content)
    for action in (
        lambda: hub.blacked_out_families(datetime.now(UTC)),
        lambda: hub.mark_blackout("opencode", "429", "x", datetime.now(UTC)),
    ):
        with pytest.raises(StateFileError, match=message) as err:
            action()
        assert hub.key in str(err.value)
    assert rds.get(hub.key) == content


def test_model_state_factory(lock_cfg: LockConfig, tmp_path: Path) -> None:
    from dataclasses import replace

    from xaf_hub.config.load import ModelsConfig
    from xaf_hub.store.backends import Stores
    from xaf_hub.store.redis.model_state import RedisModelState

    cfg = Config(path=None, home=tmp_path, state_dir=tmp_path, lock=lock_cfg)
    # the gate on Redis does not move the state
    assert type(Stores(cfg).model_state()) is FileModelState
    shared = replace(cfg, models=ModelsConfig(state_backend="redis"))
    assert isinstance(Stores(shared).model_state(), RedisModelState)


def test_unreachable_model_state(lock_cfg: LockConfig) -> None:
    from dataclasses import replace

    cfg = replace(lock_cfg, redis_url=f"redis://127.0.0.1:{_closed_port()}/0")
    (hub,) = states(cfg, 1)
    with pytest.raises(UnreachableError, match="redis: unreachable"):
        hub.blacked_out_families(datetime.now(UTC))


def test_heals_are_listed_for_every_hub_since_a_moment(lock_cfg: LockConfig, rds: Any) -> None:
    """What the notifications re-derive a lost ``healed`` notice from, on Redis."""
    from xaf_hub.store.model_state import HealedSession

    a, b = states(lock_cfg)
    t0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    a.remember_healed("heal:lan-a:s1:m1", "x/free", "y/good", t0, who=HealedSession("lan-a", "s1"))
    b.remember_healed(
        "heal:lan-b:s2:m2", "x/free", "y/good", t0 + timedelta(minutes=1),
        who=HealedSession("lan-b", "s2", "title"),
    )
    b.remember_healed("resume:lan-b:s3", None, None, t0)  # a resume: no heal
    b.remember_healed("heal:lan-b:s4:m4", None, "y/good", t0)  # written without its session
    got = a.healed_since(t0 + timedelta(seconds=30))
    assert [(h.key, h.who.title, h.to_model) for h in got] == [
        ("heal:lan-b:s2:m2", "title", "y/good")
    ]
    assert [h.key for h in b.healed_since(t0)] == ["heal:lan-a:s1:m1", "heal:lan-b:s2:m2"]
