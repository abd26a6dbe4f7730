"""One context, one Redis client: the stores a command or an MCP call uses share the client
its ``Stores`` opened, and it is closed when the command ends (``store.backends.Stores``)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.redis_fixture import RedisServer
from xaf_hub.cli.main import main
from xaf_hub.config.load import load_config
from xaf_hub.ops.context import OpsContext
from xaf_hub.store import backends
from xaf_hub.store.backends import Stores


class Opened:
    """Every client ``connect`` made, and which of them were closed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from xaf_hub.store.redis import client as redis_client

        self.clients: list[Any] = []
        self.closed: list[Any] = []
        real = redis_client.connect

        def connect(cfg: Any) -> Any:
            made = real(cfg)
            close = made.close

            def closing() -> None:
                self.closed.append(made)
                close()

            made.close = closing
            self.clients.append(made)
            return made

        monkeypatch.setattr(redis_client, "connect", connect)


def write_config(tmp_path: Path, server: RedisServer) -> Path:
    doc = {
        "state_dir": str(tmp_path / "state"),
        "lock": {"backend": "redis", "redis_url": server.url,
                 "redis_prefix": RedisServer.prefix()},
        "pool": {"backend": "redis"},
        "models": {"state_backend": "redis", "chain": ["fake/a", "fake/b"]},
        # A closed loopback port: the scan fails at once, the stores are still read.
        "instances": [{"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    return path


def run(path: Path, server: RedisServer, *argv: str) -> int:
    env = {"XAF_HUB_HOME": str(path.parent / "home"), **server.env()}
    return main(["--config", str(path), *argv], stdout=io.StringIO(), stderr=io.StringIO(),
                env=env)


@pytest.mark.parametrize("argv", [
    ("status", "--json", "--fresh"),  # the gate and the pool
    ("models", "--json"),  # the model state
    ("backlog", "list", "--json"),  # the pool
])
def test_a_command_opens_one_redis_client_and_closes_it(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
) -> None:
    opened = Opened(monkeypatch)
    path = write_config(tmp_path, redis_server)
    run(path, redis_server, *argv)
    assert len(opened.clients) == 1, argv
    assert opened.closed == opened.clients


def test_every_store_of_a_context_shares_one_client_until_it_closes(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened = Opened(monkeypatch)
    cfg = load_config(write_config(tmp_path, redis_server),
                      env={"XAF_HUB_HOME": str(tmp_path / "home"), **redis_server.env()})
    with OpsContext(cfg) as ops:
        ops.gate().live_reservations("lan-a")
        ops.backlog().load()
        ops.model_state().resting(ops.now())
        ops.stores.interrupts()
        fenced = ops.but(stop_requested=lambda: True)
        assert fenced.stores is ops.stores
        fenced.backlog().load()
        assert len(opened.clients) == 1 and not opened.closed
    assert opened.closed == opened.clients
    ops.backlog().load()  # used after its end: a new client, closed at the next close
    assert len(opened.clients) == 2
    ops.close()
    assert opened.closed == opened.clients


def test_file_stores_open_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"state_dir": str(tmp_path / "s"), "instances": [
        {"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}]}), "utf-8")
    stores = Stores(load_config(path, env={"XAF_HUB_HOME": str(tmp_path / "h")}))
    monkeypatch.setattr(backends.Stores, "redis", lambda self: pytest.fail("redis asked"))
    stores.gate(), stores.pool().load(), stores.model_state(), stores.interrupts()
    stores.close()
