"""The live board in Redis (``store.redis.board``), against a real redis-server: a board one
host's follower publishes is read by a hub on another host (another state folder, the same
Redis) as a fresh view; with the stores in files nothing goes to Redis, and a Redis that
cannot be asked leaves the host's own board file standing."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.redis_fixture import RedisServer, redis_config
from xaf_hub.config.load import Config, load_config
from xaf_hub.core.records import SessionRecord
from xaf_hub.fleet.live_view import LiveInstance
from xaf_hub.fleet.scan import InstanceScan
from xaf_hub.ops.live_board import publish, read_board
from xaf_hub.store.backends import Stores


def instances(tmp_path: Path) -> Config:
    doc = {"instances": [{"name": "a", "url": "http://a.test:4096", "roots": ["/srv/proj"]}]}
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(doc), "utf-8")
    return load_config(path, env={"XAF_HUB_HOME": str(tmp_path / "unused")})


def host(server: RedisServer | None, home: Path, prefix: str, fleet: Config,
         **backends: str) -> Config:
    return replace(redis_config(server, home, prefix, **backends), instances=fleet.instances)


def view(cfg: Config) -> list[LiveInstance]:
    inst = cfg.instances[0]
    rec = SessionRecord("a", "s1", "t", "/srv/proj/app", created=1, updated=2, cost=None,
                        running=True, run_state="busy", project=True)
    scan = InstanceScan(inst, reachable=True, version="1.18.33", sessions=[rec])
    return [LiveInstance(scan, "global", int(time.time() * 1000) - 1000)]


def test_another_hosts_board_is_read_from_redis(redis_server: RedisServer, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = instances(tmp_path)
    prefix = RedisServer.prefix()
    a = host(redis_server, tmp_path / "a", prefix, fleet)
    b = host(redis_server, tmp_path / "b", prefix, fleet)
    monkeypatch.setenv("XAF_HUB_HOSTNAME", "host-a")
    with Stores(a) as stores:
        publish(a, view(a), "patrol", stores)
        assert stores.redis().pttl(f"{prefix}:live_board:patrol:host-a") > 50_000
        assert stores.redis().pttl(f"{prefix}:live_summary:patrol:host-a") > 50_000
    with Stores(b) as stores:
        got = read_board(b, b.instances, stores=stores)
        short = read_board(b, b.instances, stores=stores, summary=True).scans["a"]
    assert list(got.scans) == ["a"] and got.scans["a"].sessions[0].running
    assert short.tally is not None and short.tally.running_project == 1  # the summary's
    assert 0.5 < got.ages["a"] < 10
    # Host b's own state folder holds no board: without Redis it has nothing to read.
    assert read_board(b, b.instances).scans == {}


def test_file_stores_put_nothing_in_redis(redis_server: RedisServer, tmp_path: Path) -> None:
    fleet = instances(tmp_path)
    prefix = RedisServer.prefix()
    files = host(redis_server, tmp_path / "f", prefix, fleet, lock="file", pool="file")
    shared = host(redis_server, tmp_path / "r", prefix, fleet)
    with Stores(files) as stores:
        publish(files, view(files), "serve", stores)
        assert stores.live_boards() == []
    with Stores(shared) as stores:
        assert stores.live_boards() == []  # nothing was written there
        assert list(read_board(files, files.instances, stores=stores).scans) == ["a"]  # file


def test_an_unreachable_redis_leaves_this_hosts_own_board(tmp_path: Path) -> None:
    fleet = instances(tmp_path)
    down = host(None, tmp_path / "d", "p", fleet)  # a closed loopback port
    files = host(None, tmp_path / "d", "p", fleet, lock="file", pool="file")
    publish(files, view(files), "patrol")  # the file only
    with Stores(down) as stores:
        got = read_board(down, down.instances, stores=stores)
    assert list(got.scans) == ["a"]


def test_an_older_hosts_board_beside_another_hosts_summary_is_read_whole(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host "old" runs a hub from before the summaries (its board only, fresh); host "new"
    writes a board and a summary, but its view is a minute old. `status` (the summaries)
    takes the older hub's board whole, as it does a writer without a summary file, instead
    of leaving it out because some other host wrote a summary (and scanning the instance)."""
    from xaf_hub.ops.live_board import document

    fleet = instances(tmp_path)
    prefix = RedisServer.prefix()
    new = host(redis_server, tmp_path / "new", prefix, fleet)
    reader = host(redis_server, tmp_path / "r", prefix, fleet)
    monkeypatch.setenv("XAF_HUB_HOSTNAME", "host-new")
    old_view = view(new)
    stale = [replace(old_view[0], confirmed_at_ms=int(time.time() * 1000) - 60_000)]
    with Stores(new) as stores:
        publish(new, stale, "patrol", stores)
        stores.redis().set(f"{prefix}:live_board:patrol:host-old",
                           json.dumps(document(new, old_view, "patrol")), px=60_000)
    with Stores(reader) as stores:
        got = read_board(reader, reader.instances, stores=stores, summary=True)
    assert list(got.scans) == ["a"] and got.ages["a"] < 10, got.stale
    assert got.scans["a"].tally is None  # the whole board: its sessions are all there are
