"""The rounds' memory of last runs in Redis (``RedisRunMemory``), against a real redis-server.

With the HA lease the daemon that runs the rounds may change host, so the memory lives in
Redis: what one host's round read, the next round on another host recalls. Saves write only the
entries that changed, a damaged field is a clear error that leaves the hash alone, and a daemon
whose lease is gone writes nothing. The last test is whole rounds (``run_once``, the real
jobs) on two "hosts" over a mock fleet of 3 × 300 sessions where one session changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.redis_fixture import RedisServer, redis_config
from tests.unit.patrol.run_support import (
    E400,
    NOW,
    NOW_MS,
    FakeFleet,
    assistant,
    line_of,
    round_at,
    run,
)
from xaf_hub.config.load import Config, load_config
from xaf_hub.errors import LockLostError, StateFileError, UnreachableError
from xaf_hub.store.backends import Stores
from xaf_hub.store.fence import Fence
from xaf_hub.store.patrol_state import RUNS_FILE, RunMemory
from xaf_hub.store.redis.runs import RedisRunMemory


def shared(redis_server: RedisServer, home: Path, prefix: str, lease: float = 15) -> Config:
    """One host's config: its own state folder, the memory shared through the lease's Redis."""
    return redis_config(redis_server, home, prefix, lease=lease)


@pytest.fixture
def prefix() -> str:
    return RedisServer.prefix()


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[Any]:
    client = redis_server.client()
    yield client
    client.close()


def test_the_memory_is_in_redis_only_when_daemons_share_the_rounds(
    redis_server: RedisServer, tmp_path: Path, prefix: str
) -> None:
    cfg = shared(redis_server, tmp_path, prefix)
    assert isinstance(Stores(cfg).run_memory(tmp_path), RedisRunMemory)
    no_lease = shared(redis_server, tmp_path, prefix, lease=0)  # lease off: one host's rounds
    assert type(Stores(no_lease).run_memory(tmp_path)) is RunMemory
    files = Config(path=None, home=tmp_path, state_dir=tmp_path)
    assert type(Stores(files).run_memory(tmp_path)) is RunMemory


def test_what_one_host_read_another_recalls(
    redis_server: RedisServer, tmp_path: Path, prefix: str, rds: Any
) -> None:
    a = shared(redis_server, tmp_path / "a", prefix)
    b = shared(redis_server, tmp_path / "b", prefix)
    failed = run("failed", error=E400, created_ms=5)
    mem = Stores(a).run_memory(tmp_path / "a")
    mem.remember("lan-a", "ses_1", 100, "idle", failed)
    mem.remember("lan-b", "ses_2", 200, "retry", run())
    mem.save()
    assert not (tmp_path / "a" / RUNS_FILE).exists()  # nothing on host A's disk
    other = Stores(b).run_memory(tmp_path / "b")
    assert len(other) == 2
    assert other.recall("lan-a", "ses_1", 100, "idle") == failed
    assert other.recall("lan-a", "ses_1", 101, "idle") is None  # updated moved
    assert other.recall("lan-b", "ses_2", 200, "idle") is None  # run state moved
    other.forget([("lan-a", "ses_1")])
    other.remember("lan-c", "ses_3", 300, "busy", run())
    other.save()
    assert rds.hlen(f"{prefix}:last_runs") == 2
    assert rds.pttl(f"{prefix}:last_runs") > 0  # an abandoned memory goes away by itself
    again = Stores(a).run_memory(tmp_path / "a")
    assert again.recall("lan-a", "ses_1", 100, "idle") is None
    assert again.recall("lan-c", "ses_3", 300, "busy") == run()


def test_a_save_writes_only_what_changed(
    redis_server: RedisServer, tmp_path: Path, prefix: str, rds: Any
) -> None:
    cfg = shared(redis_server, tmp_path, prefix)
    mem = Stores(cfg).run_memory(tmp_path)
    for i in range(3):
        mem.remember("lan-a", f"ses_{i}", 100 + i, "idle", run())
    mem.save()
    key = f"{prefix}:last_runs"
    marked = json.loads(rds.hget(key, json.dumps(["lan-a", "ses_0"])))
    marked["marker"] = "kept"  # a field nobody rewrites keeps this
    rds.hset(key, json.dumps(["lan-a", "ses_0"]), json.dumps(marked))
    again = Stores(cfg).run_memory(tmp_path)
    again.remember("lan-a", "ses_0", 100, "idle", run())  # unchanged
    again.remember("lan-a", "ses_1", 999, "idle", run())  # moved
    again.keep_only([("lan-a", "ses_0"), ("lan-a", "ses_1")])  # ses_2 is gone
    again.save()
    fields = rds.hgetall(key)
    assert sorted(json.loads(f)[1] for f in fields) == ["ses_0", "ses_1"]
    assert json.loads(fields[json.dumps(["lan-a", "ses_0"])])["marker"] == "kept"
    assert json.loads(fields[json.dumps(["lan-a", "ses_1"])])["updated"] == 999


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ('["lan-a", "ses_1"]', "{not json", "not JSON"),
        ("ses_1", "{}", "not JSON"),
        ('["lan-a"]', "{}", "not an [instance, session] pair"),
        ('["lan-a", "ses_1"]', '{"updated": "x"}', "updated is not an integer"),
        (
            '["lan-a", "ses_1"]',
            '{"updated": 1, "run_state": "waiting", "run": {}}',
            "run_state 'waiting' is not one of busy, retry, idle",
        ),
    ],
)
def test_a_damaged_field_is_a_clear_error_and_left_alone(
    redis_server: RedisServer,
    tmp_path: Path,
    prefix: str,
    rds: Any,
    field: str,
    value: str,
    message: str,
) -> None:
    key = f"{prefix}:last_runs"
    rds.hset(key, field, value)
    with pytest.raises(StateFileError) as info:
        Stores(shared(redis_server, tmp_path, prefix)).run_memory(tmp_path)
    text = str(info.value)
    assert f"key {key}" in text and message in text and redis_server.password not in text
    assert rds.hgetall(key) == {field: value}


def test_a_daemon_without_the_lease_writes_nothing(
    redis_server: RedisServer, tmp_path: Path, prefix: str, rds: Any
) -> None:
    cfg = shared(redis_server, tmp_path, prefix)
    lease_key = f"{prefix}:patrol:lease"
    rds.set(lease_key, "host-b|token-b")
    lost = Stores(cfg).run_memory(tmp_path, Fence(lease_key, "host-a|token-a"))
    lost.remember("lan-a", "ses_1", 100, "idle", run())
    with pytest.raises(LockLostError, match="no longer holds the patrol lease"):
        lost.save()
    assert rds.exists(f"{prefix}:last_runs") == 0
    holder = Stores(cfg).run_memory(tmp_path, Fence(lease_key, "host-b|token-b"))
    holder.remember("lan-a", "ses_1", 100, "idle", run())
    holder.save()
    assert rds.hlen(f"{prefix}:last_runs") == 1


def test_redis_unreachable_is_an_unreachable_error(tmp_path: Path) -> None:
    with pytest.raises(UnreachableError) as info:
        Stores(redis_config(None, tmp_path)).run_memory(tmp_path)
    assert "s3cret-pw" not in str(info.value)


# --------------------------------------------------------------------------- whole rounds


def host_cfg(
    tmp_path: Path, host: str, redis_server: RedisServer, prefix: str, names: list[str]
) -> Config:
    doc = {
        "instances": [
            {"name": n, "url": f"http://127.0.0.1:{9 + i}", "roots": ["/srv/p"]}
            for i, n in enumerate(names)
        ],
        "concurrency_limit": 2,
        "models": {"default_dispatch_model": "fake/fake-model"},
        "lock": {"backend": "redis", "redis_url": redis_server.url, "redis_prefix": prefix},
        "pool": {"backend": "redis"},
    }
    folder = tmp_path / host
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    env = {"XAF_HUB_HOME": str(folder / "home"), **redis_server.env()}
    return load_config(str(path), env=env, cwd=folder)


def test_a_round_on_another_host_reads_only_what_changed(
    redis_server: RedisServer, tmp_path: Path, prefix: str
) -> None:
    names = ["lan-a", "lan-b", "lan-c"]
    a = host_cfg(tmp_path, "host-a", redis_server, prefix, names)
    b = host_cfg(tmp_path, "host-b", redis_server, prefix, names)
    fleet = FakeFleet(300)
    for inst in names:
        for i in range(fleet.per_instance):
            updated = NOW_MS - 3_600_000 + i * 1000
            fleet.add(inst, f"ses_{inst[-1]}{i:04d}", updated, assistant(f"msg_{i}", updated))
    total = 3 * fleet.per_instance

    first, reads = round_at(a, fleet, NOW)
    assert first.code == 0, first.cycle and first.cycle.log.errors
    assert reads == total
    # Host B has never run a round: its first one recalls what A read.
    second, reads = round_at(b, fleet, NOW + timedelta(minutes=10))
    assert second.code == 0 and reads == 0, second.cycle and second.cycle.log.errors
    assert second.cycle is not None and second.cycle.recalled == total

    changed = fleet.sessions["lan-b"]["ses_b0150"]
    changed.updated = NOW_MS + 11 * 60_000
    changed.last = assistant("msg_new", changed.updated - 5000, error=E400)
    third, reads = round_at(b, fleet, NOW + timedelta(minutes=20))
    assert third.code == 0 and reads == 1 and fleet.reads[("lan-b", changed.sid)] == 2
    assert line_of(third, changed.sid)[0] == "failed"
    # And back on A: what B read is not read again.
    fourth, reads = round_at(a, fleet, NOW + timedelta(minutes=30))
    assert fourth.code == 0 and reads == 0
    assert line_of(fourth, changed.sid)[0] == "failed"
    assert not (a.state_dir / "patrol" / RUNS_FILE).exists()
    assert fleet.prompts == []
