"""The HA patrol lease and the fence it puts on Redis writes, against a real redis-server.

One lease among daemons; renewed only by its holder; a holder that was away past its lease is
no longer one, locally as well as in Redis. And the point of it: a store handed a fence whose
token is no longer in the lease key writes nothing — not a reservation, not a pool change, and
the gate's last check before a prompt says "not ours", even while the dispatch lock still is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.redis_fixture import RedisServer, pool_keys
from xaf_hub.config.load import Config, LockConfig, PatrolConfig, PoolConfig
from xaf_hub.errors import LockLostError
from xaf_hub.store.backends import Stores
from xaf_hub.store.fence import Fence
from xaf_hub.store.tasks import BacklogData, Task

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def cfg(redis_server: RedisServer, tmp_path: Path) -> Config:
    return Config(
        path=None,
        home=tmp_path,
        state_dir=tmp_path,
        lock=LockConfig(
            backend="redis",
            redis_url=redis_server.url,
            redis_prefix=RedisServer.prefix(),
            redis_password=redis_server.password,
            lock_timeout_seconds=2,
        ),
        pool=PoolConfig(backend="redis"),
        patrol=PatrolConfig(lease_seconds=1.5),
    )


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[Any]:
    client = redis_server.client()
    yield client
    client.close()


def lease(cfg: Config, host: str, seconds: float | None = None) -> Any:
    from xaf_hub.store.redis.client import connect
    from xaf_hub.store.redis.lease import PatrolLease

    return PatrolLease(
        connect(cfg.lock), cfg.lock.redis_prefix, host, seconds or cfg.patrol.lease_seconds
    )


def test_one_holder_renews_and_a_standby_takes_over_after_the_lease(cfg: Config) -> None:
    a, b = lease(cfg, "host-a"), lease(cfg, "host-b")
    assert a.acquire() and a.held
    assert not b.acquire() and not b.held
    assert b.holder() == "host-a" and b.fence().token == ""
    for _ in range(4):  # renewed by its holder, it outlives several lease times
        time.sleep(0.6)
        assert a.acquire() and not b.acquire()
    time.sleep(cfg.patrol.lease_seconds + 0.3)  # a stops renewing (paused): the key expires
    assert not a.held  # locally too, before it asks anyone
    assert b.acquire() and b.holder() == "host-b"
    assert not a.acquire()  # the old holder finds it taken: standby
    assert a.fence() == Fence(a.key, "")
    b.release()
    assert b.holder() is None and not b.held
    assert a.acquire() and a.fence().token.startswith("host-a|")


def test_a_fenced_gate_writes_nothing_once_the_lease_is_lost(cfg: Config, rds: Any) -> None:
    a = lease(cfg, "host-a")
    assert a.acquire()
    gate = Stores(cfg).gate(a.fence())
    with gate.lock("lan-a"):
        res = gate.reserve("lan-a", "ses_1")
        assert gate.owns_lock("lan-a")
        # Another daemon takes the lease (a's ran out while it was paused).
        rds.set(a.key, "host-b|9|beef")
        assert not gate.owns_lock("lan-a")  # the dispatch lock is still ours; the lease is not
        assert any("no longer holds the patrol lease" in w for w in gate.warnings)
        assert gate.fenced_out("lan-a") and not gate.fenced_out("lan-b")
        # What a dispatch stopped here says: the lease, not the dispatch lock, was lost.
        from xaf_hub.ops.send import _lock_lost

        said = str(_lock_lost(gate, "lan-a", "before sending", "ses_1"))
        assert "lost the patrol lease before sending" in said and "dispatch lock" not in said
        assert "nothing was sent to session ses_1" in said
        with pytest.raises(LockLostError, match="patrol lease"):
            gate.reserve("lan-a")
        with pytest.raises(LockLostError, match="patrol lease"):
            gate.attach(res, "ses_1", "sent")
        live = gate.live_reservations("lan-a")
        assert [r.key for r in live] == [res.key]  # only the one made while it held the lease
    # Unfenced (a one-host command) the same gate writes as before.
    plain = Stores(cfg).gate()
    with plain.lock("lan-a"):
        plain.reserve("lan-a")
        assert plain.owns_lock("lan-a")
    assert not plain.fenced_out("lan-a")
    assert "the dispatch lock was lost" in str(_lock_lost(plain, "lan-a", "before sending", ""))


def test_a_fenced_pool_changes_nothing_once_the_lease_is_lost(cfg: Config, rds: Any) -> None:
    a = lease(cfg, "host-a")
    assert a.acquire()
    pool = Stores(cfg).pool(fence=a.fence())
    planned = pool.add(Task(id="T1", title="one"), now=NOW)
    before = pool_keys(rds, cfg.lock.redis_prefix)
    assert f"{cfg.lock.redis_prefix}:pool:task:T1" in before
    rds.set(a.key, "host-b|9|beef")
    with pytest.raises(LockLostError, match="patrol lease"):
        pool.claim(planned, "ses_1", "lan-a", None, NOW)
    with pytest.raises(LockLostError):
        pool.add(Task(id="T2", title="two"), now=NOW)
    with pytest.raises(LockLostError):  # a whole-pool change is fenced too
        pool.import_data(BacklogData(tasks=[Task(id="T3", title="three")]))
    with pytest.raises(LockLostError):
        pool.discard("T1")
    assert pool_keys(rds, cfg.lock.redis_prefix) == before
    assert [t.id for t in pool.load().tasks] == ["T1"]  # reading is still allowed
    # The lease key gone (FLUSHALL, expiry) is no better: nothing written.
    rds.delete(a.key)
    with pytest.raises(LockLostError):
        pool.claim(planned, "ses_1", "lan-a", None, NOW)
    # A standby's fence (empty token) never matches, even when no one holds the lease.
    with pytest.raises(LockLostError):
        Stores(cfg).pool(fence=Fence(a.key, "")).claim(planned, "s", "lan-a", None, NOW)
    assert pool_keys(rds, cfg.lock.redis_prefix) == before


def test_daemons_are_listed_with_role_and_heartbeat(cfg: Config) -> None:
    from xaf_hub.store.redis.client import connect
    from xaf_hub.store.redis.lease import known_daemons

    a, b = lease(cfg, "host-a"), lease(cfg, "host-b")
    a.beat("active", NOW)
    b.beat("standby", NOW)
    client = connect(cfg.lock)
    rows = known_daemons(client, cfg.lock.redis_prefix, int(NOW.timestamp() * 1000) + 1000)
    assert [(r["host"], r["role"], r["heartbeat"]) for r in rows] == [
        ("host-a", "active", "2026-12-02T12:00:00+00:00"),
        ("host-b", "standby", "2026-12-02T12:00:00+00:00"),
    ]
    # A daemon silent for more than a day is forgotten.
    later = int(NOW.timestamp() * 1000) + 25 * 3600 * 1000
    assert known_daemons(client, cfg.lock.redis_prefix, later) == []


def test_a_fenced_model_state_writes_nothing_once_the_lease_is_lost(
    cfg: Config, rds: Any
) -> None:
    from dataclasses import replace

    from xaf_hub.store.backends import Stores

    families = (("opencode", ("opencode/",)), ("other", ("other/",)))
    # The real clock: Redis drops the model state at its last blackout's end, so a blackout
    # marked at a fixed past moment would be gone already. The reset hour is 12 h away, so
    # the blackout outlives the test whatever the time of day.
    now = datetime.now(UTC).replace(microsecond=0)
    cfg = replace(
        cfg,
        models=replace(
            cfg.models,
            state_backend="redis",
            timezone="UTC",
            blackout_families=families,
            blackout_reset_hour=(now.hour + 12) % 24,
        ),
    )
    a = lease(cfg, "host-a")
    assert a.acquire()
    state = Stores(cfg).model_state(a.fence())
    state.mark_blackout("opencode", "429 free usage limit", "lan-a", now)
    state.remember_healed("lan-a/ses_1/msg_1", "opencode/free", "other/model", now)
    assert state.was_healed("lan-a/ses_1/msg_1")
    key = f"{cfg.lock.redis_prefix}:model_state"
    before = rds.get(key)
    rds.set(a.key, "host-b|9|beef")  # the lease changed hands
    with pytest.raises(LockLostError, match="patrol lease"):
        state.mark_blackout("other", "429 quota", "lan-a", now)
    with pytest.raises(LockLostError, match="patrol lease"):
        state.remember_healed("lan-a/ses_2/msg_1", None, None, now)
    assert rds.get(key) == before and not state.was_healed("lan-a/ses_2/msg_1")
    assert set(state.active_blackouts(now)) == {"opencode"}  # reading still works


def test_a_takeover_names_the_host_it_took_the_lease_from_once(cfg: Config, rds: Any) -> None:
    a, b = lease(cfg, "host-a", 0.3), lease(cfg, "host-b", 0.3)
    assert a.acquire() and a.takeover() is None  # a first start is no failover
    assert a.acquire() and a.takeover() is None  # a renewal is no take
    time.sleep(0.5)  # a stops renewing: b takes the lease
    assert b.acquire() and b.takeover() == "host-a"
    assert b.takeover() is None  # told once
    assert b.acquire() and b.takeover() is None
    time.sleep(0.5)  # b lapses and takes it back itself: no move
    assert b.acquire() and b.takeover() is None
    b.release()
    again = lease(cfg, "host-b", 0.3)  # a restart on the same host is no failover either
    assert again.acquire() and again.takeover() is None
    again.release()
    rds.delete(f"{cfg.lock.redis_prefix}:patrol:holder")  # Redis lost its memory (FLUSHALL)
    assert a.acquire() and a.takeover() is None
