"""Two simulated hosts over one real redis-server and the session fleet: each its own hub home
and XAF_HUB_HOSTNAME (the `hosts` fixture), shared by the Redis fleet, pool and patrol-HA tests."""

from __future__ import annotations

import copy
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.fleet import Hub
from tests.redis_fixture import RedisServer, write_redis_config


@dataclass
class Host:
    """One simulated host: a hub with its own home and host name."""

    name: str
    hub: Hub

    @property
    def home(self) -> Path:
        return Path(self.hub.env["XAF_HUB_HOME"])

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return self.hub.popen(*args, extra_env={"XAF_HUB_HOSTNAME": self.name})

    def run(self, *args: str) -> tuple[int, str, str]:
        proc = self.popen(*args)
        out, err = proc.communicate(timeout=120)
        return proc.returncode, out, err

    def write(self, change: Any) -> None:
        change(self.hub.doc)
        self.hub.write_config()


def two_hosts(hub: Hub, redis_server: RedisServer, folder: Path) -> tuple[Host, Host]:
    """``hub`` as host-a and a copy with its own home under ``folder`` as host-b, both on
    ``redis_server`` under a fresh prefix."""
    prefix = RedisServer.prefix()
    b_dir = folder / "host-b"
    (b_dir / "home").mkdir(parents=True)
    hub_b = replace(
        hub,
        config_path=b_dir / "config.json",
        env={**hub.env, "XAF_HUB_HOME": str(b_dir / "home")},
        doc=copy.deepcopy(hub.doc),
    )
    for h in (hub, hub_b):
        h.env.update(redis_server.env())
        write_redis_config(h.doc, redis_server, prefix)
        h.write_config()
    return Host("host-a", hub), Host("host-b", hub_b)


@pytest.fixture
def hosts(hub: Hub, redis_server: RedisServer, tmp_path: Path) -> tuple[Host, Host]:
    return two_hosts(hub, redis_server, tmp_path)


def on_both(hosts: tuple[Host, Host], change: Any) -> None:
    for h in hosts:
        h.write(change)


def abort_all(hub: Hub, name: str) -> None:
    for sid in hub.busy_ids(name):
        sandbox.abort(hub.server(name).url, hub.password(name), sid)


@pytest.fixture
def rds(redis_server: RedisServer) -> Any:
    client = redis_server.client()
    yield client
    client.close()
