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


def _ticks(host: Host) -> int:
    """Rounds this host's daemon ran while it held the lease (its heartbeat file)."""
    try:
        beat = json.loads((host.home / "patrol" / "daemon.json").read_text("utf-8"))
    except (OSError, ValueError):
        return 0
    return int(beat.get("ticks", 0))


def rounds(hosts: tuple[Host, Host], n: int = 3) -> None:
    """Wait until the lease holder, whichever host it is, ran ``n`` whole rounds from now: the
    window in which a wrong send, heal or resume would show (a round under way now may have
    read the fleet before, so it does not count)."""
    start_ticks = sum(_ticks(h) for h in hosts)
    hosts[0].hub.wait_for(
        lambda: sum(_ticks(h) for h in hosts) >= start_ticks + n + 1, timeout=60 + 20 * n
    )
