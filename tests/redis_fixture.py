"""A real redis-server on loopback for the shared-gate tests: one per test session.

Registered from tests/conftest.py. It runs Debian's ``redis-server`` on a free port with a
password (so every test also goes through XAF_HUB_REDIS_PASSWORD), no persistence, and stops
it at the end. Tests are skipped when redis-server is not installed — except under CI, where a
missing server is a failure (scripts/setup.sh --test installs it).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.config.load import Config, LockConfig, PatrolConfig, PoolConfig


@dataclass(frozen=True)
class RedisServer:
    """Where the test server listens and how to log in."""

    port: int
    password: str

    @property
    def url(self) -> str:
        """The URL for config.json (no password in it)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def env(self) -> dict[str, str]:
        """The env a hub needs to reach it."""
        return {"XAF_HUB_REDIS_PASSWORD": self.password}

    def client(self) -> Any:
        """A plain redis-py client, for looking at keys directly."""
        import redis

        return redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, decode_responses=True
        )

    @staticmethod
    def prefix() -> str:
        """A fresh key prefix, so tests sharing the server never see each other's keys."""
        return f"t{uuid.uuid4().hex[:12]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int, password: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(f"AUTH {password}\r\nPING\r\n".encode())
            s.settimeout(1)
            got = b""
            while b"PONG" not in got:
                chunk = s.recv(64)
                if not chunk:
                    return False
                got += chunk
            return True
    except OSError:
        return False


def start_redis(
    folder: Path, port: int = 0, password: str = ""
) -> tuple[RedisServer, subprocess.Popen[bytes]]:
    """Start redis-server with its config and log in ``folder``: on ``port`` (0: a free one,
    retried if someone takes it) with ``password`` (empty: a fresh one); the server and its
    process. Raises RuntimeError with the log when it does not answer."""
    binary = shutil.which("redis-server") or "redis-server"
    password = password or secrets.token_hex(16)
    for _ in range(5 if not port else 50):
        use = port or _free_port()
        conf = folder / f"redis-{use}.conf"
        conf.write_text(
            f'port {use}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {folder}\n'
            f"requirepass {password}\nlogfile {folder / f'redis-{use}.log'}\n",
            encoding="utf-8",
        )
        proc = subprocess.Popen([binary, str(conf)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers(use, password):
                break
            time.sleep(0.05)
        if proc.poll() is None and _answers(use, password):
            return RedisServer(use, password), proc
        _stop(proc)
        time.sleep(0.2 if port else 0)  # a port of our own: wait until the old one let it go
    log = "\n".join(p.read_text(errors="replace")[-2000:] for p in folder.glob("*.log"))
    raise RuntimeError(f"redis-server did not start:\n{log}")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        message = "redis-server is not installed (scripts/setup.sh --test installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    pytest.importorskip("redis", reason="the 'redis' package is missing: pip install -e '.[test]'")
    try:
        server, proc = start_redis(tmp_path_factory.mktemp("redis"))
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def write_redis_config(doc: dict[str, Any], server: RedisServer, prefix: str) -> None:
    """Point a config document's gate and model state at ``server`` under ``prefix``."""
    doc.setdefault("lock", {}).update(
        {"backend": "redis", "redis_url": server.url, "redis_prefix": prefix}
    )
    doc.setdefault("models", {})["state_backend"] = "redis"


def pool_keys(client: Any, prefix: str) -> dict[str, Any]:
    """Every key of the task pool under ``prefix`` with its content: the text of a string key,
    the (member, score) pairs of a sorted set. Empty when the pool has no key at all."""
    found: dict[str, Any] = {}
    for key in sorted(client.scan_iter(f"{prefix}:pool*", count=1000)):
        if client.type(key) == "zset":
            found[key] = client.zrange(key, 0, -1, withscores=True)
        else:
            found[key] = client.get(key)
    return found


__all__ = ["RedisServer", "pool_keys", "redis_server", "start_redis", "write_redis_config"]


def redis_config(
    server: RedisServer | None,
    home: Path,
    prefix: str = "xaf-hub",
    *,
    lock: str = "redis",
    pool: str = "redis",
    lease: float = 15.0,
) -> Config:
    """A hub config whose state folder is ``home`` and whose Redis stores are ``server``
    (None: a closed loopback port, so every Redis call fails at once)."""
    return Config(
        path=None,
        home=home,
        state_dir=home,
        lock=LockConfig(
            backend=lock,
            redis_url=server.url if server is not None else "redis://127.0.0.1:9/0",
            redis_prefix=prefix,
            redis_password=server.password if server is not None else "s3cret-pw",
            lock_timeout_seconds=2,
        ),
        pool=PoolConfig(backend=pool),
        patrol=PatrolConfig(lease_seconds=lease),
    )
