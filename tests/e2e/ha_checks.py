"""Two patrol daemons on two simulated hosts behind one lease: the lease length, the config
changes, starting a daemon, the HA status and what was sent; shared by the patrol-HA tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.two_hosts import Host

LEASE = 5.0


def ha(doc: dict[str, Any]) -> None:
    doc["pool"] = {"backend": "redis"}
    doc.setdefault("patrol", {})["lease_seconds"] = LEASE


def only_local_a(doc: dict[str, Any]) -> None:
    doc["instances"] = [i for i in doc["instances"] if i["name"] == "local-a"]


def status(host: Host) -> dict[str, Any]:
    code, out, err = host.run("patrol", "status", "--json")
    assert code == 0, err
    return dict(json.loads(out))


def sent(host: Host, needle: str) -> list[dict[str, Any]]:
    return [
        r
        for r in host.hub.llm.requests()
        if not r["title_call"] and needle in r["last_user_text"]
    ]


@pytest.fixture
def daemons() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            with_signal(p, signal.SIGCONT)
            p.kill()
        p.communicate(timeout=30)


def with_signal(proc: subprocess.Popen[str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)


def start(host: Host, procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    proc = host.popen("patrol", "--interval-seconds", "2", "--no-design", "--no-live")
    procs.append(proc)
    return proc
