"""One instance at its concurrency limit: its name and limit, a sampler of its running sessions,
a matcher for a prompt; shared by the limit-fault and patrol-HA tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from sandbox import fleet as sandbox
from tests.fleet import Hub

NAME = "lan-c"


LIMIT = 2


class Sampler:
    """Count the sessions the server reports running in ``directory``, every 200 ms."""

    def __init__(self, hub: Hub, directory: Path) -> None:
        self.url, self.password = hub.server(NAME).url, hub.password(NAME)
        self.directory = directory
        self.samples: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                status = sandbox.status(self.url, self.password, self.directory)
            except Exception:  # noqa: BLE001 - a missed sample is retried, never invented
                continue
            self.samples.append(sum(1 for v in status.values() if v.get("type") != "idle"))
            self.stop.wait(0.2)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # A short scenario still gets at least ten samples: keep sampling (the state after
        # the scenario counts too: a late prompt would show there) before stopping.
        deadline = time.monotonic() + 30
        while len(self.samples) < 10 and time.monotonic() < deadline:
            time.sleep(0.2)
        self.stop.set()
        self.thread.join(timeout=30)

    def check(self) -> None:
        assert len(self.samples) >= 10, "too few samples to judge"
        assert max(self.samples) <= LIMIT, f"over the limit: {self.samples}"


def running(hub: Hub) -> set[str]:
    return set(hub.status(NAME, hub.root / "app"))


def abort_all(hub: Hub) -> None:
    for sid in running(hub):
        sandbox.abort(hub.server(NAME).url, hub.password(NAME), sid)


def is_prompt(sid: str) -> Callable[[str, str], bool]:
    return lambda m, p: m == "POST" and f"/session/{sid}/prompt_async" in p
