"""People's interrupts kept in Redis (``store.redis.interrupts``) for the patrol on any host,
against a real redis-server, and how ``ops.decisions.people_interrupts`` merges them with this
host's audit log: the latest interrupt wins wherever it was made, an unreadable field is
skipped, and a Redis that cannot be asked is an error, never "no interrupts"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.redis_fixture import RedisServer, redis_config
from xaf_hub.config.load import Config
from xaf_hub.errors import UnreachableError
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.decisions import people_interrupts
from xaf_hub.store.audit import append
from xaf_hub.store.backends import Stores

AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC).timestamp()
ALICE = {"caller": "", "user": "alice", "host": "box-a"}


def cfg(redis_server: RedisServer, home: Path, prefix: str, *, lock: str = "redis") -> Config:
    return redis_config(redis_server, home, prefix, lock=lock, pool="file")


@pytest.fixture
def prefix() -> str:
    return RedisServer.prefix()


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[Any]:
    client = redis_server.client()
    yield client
    client.close()


def test_an_interrupt_on_one_host_is_read_on_another(
    redis_server: RedisServer, tmp_path: Path, prefix: str, rds: Any
) -> None:
    a = cfg(redis_server, tmp_path / "a", prefix)
    b = cfg(redis_server, tmp_path / "b", prefix)
    Stores(a).record_interrupt("lan-b", "ses_1", AT, ALICE)
    Stores(a).record_interrupt("lan-b", "ses_1", AT + 60, {**ALICE, "user": "bob"})
    Stores(a).record_interrupt("lan-c", "ses_2", AT, ALICE)
    Stores(a).record_interrupt("lan-c", "ses_3", AT, ALICE, "ceiling")  # the run ceiling's stop
    found = Stores(b).interrupts()
    assert found == {
        ("lan-b", "ses_1"): (AT + 60, {**ALICE, "user": "bob"}, "interrupted"),
        ("lan-c", "ses_2"): (AT, ALICE, "interrupted"),
        ("lan-c", "ses_3"): (AT, ALICE, "ceiling"),
    }
    assert rds.pttl(f"{prefix}:interrupts") > 0  # forgotten 14 days after the last one
    people = people_interrupts(OpsContext(b, env={}))
    assert people[("lan-b", "ses_1")].who == "bob@box-a"
    assert people[("lan-b", "ses_1")].at == AT + 60
    assert (people[("lan-b", "ses_1")].kind, people[("lan-c", "ses_3")].kind) == (
        "person", "ceiling"
    )


def test_without_redis_stores_nothing_is_kept_there(
    redis_server: RedisServer, tmp_path: Path, prefix: str, rds: Any
) -> None:
    files = cfg(redis_server, tmp_path, prefix, lock="file")
    Stores(files).record_interrupt("lan-b", "ses_1", AT, ALICE)
    assert rds.exists(f"{prefix}:interrupts") == 0
    assert Stores(files).interrupts() == {}


def test_the_latest_interrupt_wins_wherever_it_was_made(
    redis_server: RedisServer, tmp_path: Path, prefix: str
) -> None:
    here = cfg(redis_server, tmp_path, prefix)
    # This host's audit log has an interrupt now; another host's is older, then newer.
    append(
        tmp_path,
        command="interrupt",
        instance="lan-b",
        session="ses_1",
        result="aborted",
        env={"XAF_HUB_CALLER": "lead-agent"},
    )
    ops = OpsContext(here, env={})
    mine = people_interrupts(ops)[("lan-b", "ses_1")]
    assert mine.who.startswith("lead-agent@")
    Stores(here).record_interrupt("lan-b", "ses_1", mine.at - 3600, ALICE)
    assert people_interrupts(ops)[("lan-b", "ses_1")] == mine
    Stores(here).record_interrupt("lan-b", "ses_1", mine.at + 5, ALICE)
    assert people_interrupts(ops)[("lan-b", "ses_1")].who == "alice@box-a"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("not json", json.dumps({"at": AT})),
        (json.dumps("ses_1"), json.dumps({"at": AT})),
        (json.dumps(["lan-b"]), json.dumps({"at": AT})),
        (json.dumps(["lan-b", "ses_1"]), "{torn"),
        (json.dumps(["lan-b", "ses_1"]), json.dumps({"at": "soon"})),
        (json.dumps(["lan-b", "ses_1"]), json.dumps({"who": ALICE})),
        (json.dumps(["lan-b", "ses_1"]), '{"at": NaN}'),
        (json.dumps(["lan-b", "ses_1"]), '{"at": Infinity}'),
    ],
)
def test_an_unreadable_field_is_skipped(
    redis_server: RedisServer, tmp_path: Path, prefix: str, rds: Any, field: str, value: str
) -> None:
    here = cfg(redis_server, tmp_path, prefix)
    rds.hset(f"{prefix}:interrupts", field, value)
    Stores(here).record_interrupt("lan-c", "ses_9", AT, ALICE)
    assert list(Stores(here).interrupts()) == [("lan-c", "ses_9")]


def test_redis_unreachable_is_an_error_not_no_interrupts(tmp_path: Path) -> None:
    down = redis_config(None, tmp_path, pool="file")
    with pytest.raises(UnreachableError):
        people_interrupts(OpsContext(down, env={}))
    with pytest.raises(UnreachableError):
        Stores(down).record_interrupt("lan-b", "ses_1", AT, ALICE)
