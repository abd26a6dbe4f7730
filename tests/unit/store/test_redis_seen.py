"""One chat message per event for every hub of an HA patrol (``store.redis.seen``), against a
real redis-server: two hosts' outboxes derive the same event (a heal both see in the shared
model state after the lease moved back); only the first queues it, the other marks it seen.
Without the lease each host's outbox decides alone, and a Redis that cannot be asked queues
nothing and writes nothing (the next round derives the events again)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.redis_fixture import RedisServer, redis_config
from xaf_hub.config.load import Config
from xaf_hub.config.notify import Webhook
from xaf_hub.errors import UnreachableError
from xaf_hub.notify import outbox
from xaf_hub.notify.events import Event
from xaf_hub.store.backends import Stores

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
HOOK = Webhook("team", "H", "json", events=("healed", "task_done"), url="http://127.0.0.1:9/hook")
HEALED = Event("healed:lan-b:ses_1:msg_7", "healed", NOW.isoformat(), "lan-b", "ses_1")
DONE = Event("task_done:T1", "task_done", NOW.isoformat(), task="T1")


def cfg(redis_server: RedisServer, home: Path, prefix: str, lease: float = 15) -> Config:
    return redis_config(redis_server, home, prefix, lease=lease)


def enqueue(c: Config, events: list[Event]) -> outbox.Queued:
    return outbox.enqueue(
        c.state_dir,
        lambda state: events,
        [HOOK],
        now=NOW,
        queue_limit=100,
        keep_hours=24,
        claim=Stores(c).event_claimer(),
    )


def test_an_event_is_queued_by_one_hub_only(redis_server: RedisServer, tmp_path: Path) -> None:
    prefix = RedisServer.prefix()
    a = cfg(redis_server, tmp_path / "a", prefix)
    b = cfg(redis_server, tmp_path / "b", prefix)
    first = enqueue(a, [HEALED])
    assert [e.id for e in first.new] == [HEALED.id] and len(first.pending) == 1
    # Host B takes the lease and derives the same heal from the shared model state.
    second = enqueue(b, [HEALED, DONE])
    assert [e.id for e in second.new] == [DONE.id]
    assert [p.event.id for p in second.pending] == [DONE.id]
    state = outbox.read_state(b.state_dir)
    assert state is not None and HEALED.id in state["seen"]  # not asked again next round
    assert enqueue(a, [HEALED, DONE]).new == []


def test_without_the_lease_each_outbox_decides_alone(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    prefix = RedisServer.prefix()
    a = cfg(redis_server, tmp_path / "a", prefix, lease=0)
    b = cfg(redis_server, tmp_path / "b", prefix, lease=0)
    assert Stores(a).event_claimer() is None
    assert [e.id for e in enqueue(a, [HEALED]).new] == [HEALED.id]
    assert [e.id for e in enqueue(b, [HEALED]).new] == [HEALED.id]


def test_redis_unreachable_queues_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(UnreachableError):
        enqueue(redis_config(None, tmp_path), [HEALED])
    assert outbox.read_state(tmp_path) is None
