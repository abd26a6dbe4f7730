"""Hub processes that run on (watch, serve, the patrol daemon) and a server of a test's own that it
stops and starts again: their output lines, the daemon's heartbeat and audit, a restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import fleet as sandbox
from sandbox.fleet import SandboxError
from tests.fleet import MODELS, Hub


class Lines:
    """A child process's stdout lines, collected by a thread as they come."""

    started: list[Lines] = []  # this test's, for its failure report (tests/conftest.py)

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        Lines.started.append(self)
        self.lines: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, self.err), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in list(self.lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def about(self, sid: str) -> list[str]:
        return [e["event"] for e in self.events() if (e.get("session") or {}).get("id") == sid]

    def instance_kinds(self, name: str) -> list[str]:
        return [e["event"] for e in self.events() if e["instance"] == name and not e["session"]]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)  # generous for CI; promptness is tested apart
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for t in self._threads:
            t.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return int(self.proc.returncode)


@pytest.fixture
def own_server(hub: Hub, tmp_path: Path) -> Iterator[sandbox.OpencodeServer]:
    """A fourth server only this test uses (restarting a shared one would upset others)."""
    config = sandbox.fake_provider_config(hub.llm.url, MODELS)
    # An explicit free port: with port 0 opencode first tries 4096, which another server on
    # this shared machine may take while ours is stopped for the restart.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = sandbox.OpencodeServer(
        sandbox.find_opencode_binary(), home=tmp_path / "own" / "home",
        cwd=tmp_path / "own" / "cwd", password="own-" + os.urandom(6).hex(), config=config,
        start_timeout=180.0, port=port,
    )
    server.start()
    hub.doc["instances"] = [{"name": "own", "url": server.url, "roots": [str(hub.root)],
                             "default_directory": str(hub.root / "app")}]
    hub.env["XAF_HUB_PW_OWN"] = server.password or ""
    hub.write_config()
    try:
        yield server
    finally:
        server.stop()


def start_again(server: sandbox.OpencodeServer, port: int) -> None:
    """Start a stopped server on its old port; wait until it answers (its log still holds the
    old "listening" line, so ``start`` alone may return early)."""
    server.requested_port = port
    server.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            sandbox.health(url, server.password)
            return
        except (httpx.HTTPError, SandboxError):
            time.sleep(0.2)
    raise AssertionError("the restarted server never answered")


def _home(hub: Hub) -> Path:
    return Path(hub.env["XAF_HUB_HOME"])


def _beat(hub: Hub) -> dict[str, Any]:
    path = _home(hub) / "patrol" / "daemon.json"
    try:
        return dict(json.loads(path.read_text("utf-8")))
    except (OSError, ValueError):
        return {}


def _audit(hub: Hub, command: str) -> list[dict[str, Any]]:
    path = _home(hub) / "audit.log"
    if not path.exists():
        return []
    rows = [json.loads(ln) for ln in path.read_text("utf-8").splitlines()]
    return [r for r in rows if r["command"] == command]


def _daemon(hub: Hub, *flags: str) -> Lines:
    """A patrol daemon whose next round is an hour away once its first one ran."""
    lines = Lines(hub.popen("patrol", "--interval-seconds", "3600", "--no-design", *flags))
    hub.wait_for(lambda: _beat(hub).get("pid") == lines.proc.pid and _beat(hub)["ticks"] >= 1,
                 timeout=120)
    return lines
