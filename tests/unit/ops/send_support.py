"""A fake client, a gate that records what it was asked and the files a send leaves,
shared by the sending tests (test_send.py) and the budget's (test_send_budget.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from xaf_hub.config.load import Config
from xaf_hub.core.records import SessionRecord
from xaf_hub.fleet.client import RawStatus, ServerSession
from xaf_hub.fleet.releases import classify
from xaf_hub.store.gate import PROMPT_ACCEPTED, FileGate, Reservation

ROOT = "/srv/demo"


class FakeClient:
    """Answers like an opencode server holding ``sessions`` with ``busy`` ones running."""

    dialect = "classic"
    version = "1.18.33"
    release = classify(version)

    def __init__(self, log: list[str], sessions: list[str], busy: set[str]) -> None:
        self.log = log
        self.sessions = {sid: ServerSession(sid, sid, ROOT, 1, 1, 0.0, "", "") for sid in sessions}
        self.busy = busy
        self.fail_prompt: Exception | None = None
        self.fail_create: Exception | None = None
        self.fail_delete: Exception | None = None
        self.placed: dict[str, str] = {}  # a folder the server resolves elsewhere (a link)
        self.deadline = 30.0  # what scan_instance reads from a real client
        self.notes: list[str] = []

    async def detect(self) -> str:
        return "classic"

    async def list_sessions(self) -> list[ServerSession]:
        self.log.append("read")
        return list(self.sessions.values())

    async def status(self, directory: str) -> dict[str, RawStatus]:
        here = [sid for sid in self.busy if self.sessions[sid].directory == directory]
        return {sid: {"type": "busy"} for sid in here}

    async def running(
        self, directories: list[str], fan_out: int = 16, seen: Any = None
    ) -> dict[str, RawStatus]:
        merged: dict[str, RawStatus] = {}
        for d in directories:
            part = await self.status(d)
            if seen is not None:
                seen(part)
            merged.update(part)
        return merged

    async def get_session(self, session_id: str) -> ServerSession:
        return self.sessions[session_id]

    async def pending_requests(self, directory: str) -> list[Any]:
        return []  # no run waits for a person here

    async def create_session(self, directory: str, title: str) -> ServerSession:
        if self.fail_create is not None:
            raise self.fail_create
        sid = f"ses_new{len(self.sessions)}"
        directory = self.placed.get(directory, directory)
        self.sessions[sid] = ServerSession(sid, title, directory, 2, 2, 0.0, "", "")
        self.log.append(f"create {sid}")
        return self.sessions[sid]

    async def delete(self, session_id: str, directory: str | None = None) -> None:
        self.log.append(f"delete {session_id}")
        if self.fail_delete is not None:
            raise self.fail_delete
        del self.sessions[session_id]

    async def prompt_async(
        self, session_id: str, text: str, model: str | None, directory: str | None = None
    ) -> None:
        if self.fail_prompt is not None:
            self.log.append(f"prompt {session_id} failed")
            raise self.fail_prompt
        self.log.append(f"prompt {session_id}")
        self.busy.add(session_id)


class SpyGate(FileGate):
    """The file gate, logging each step into the shared log, and in ``on_loop`` each call made
    on an event loop's thread (every store call should run in a worker thread)."""

    def __init__(
        self,
        root: Path,
        cfg: Config,
        log: list[str],
        clock: Callable[[], float] = time.time,
        alive: Callable[[int], bool] = lambda pid: True,
    ) -> None:
        self.on_loop: list[str] = []
        self._clock = clock
        super().__init__(root, cfg.lock, host="h1", clock=self._timed, alive=alive)
        self.log = log
        self.ownership: list[bool] = []  # answers of owns_lock, in order (then: really held)

    def _timed(self) -> float:
        self._on_loop("clock")
        return self._clock()

    def _on_loop(self, call: str) -> None:
        with contextlib.suppress(RuntimeError):  # no loop runs in this thread: a worker's
            asyncio.get_running_loop()
            self.on_loop.append(call)

    def owns_lock(self, instance: str) -> bool:
        self._on_loop("owns_lock")
        owned = self.ownership.pop(0) if self.ownership else super().owns_lock(instance)
        self.log.append("owned" if owned else "lost")
        return owned

    def holds(self, res: Reservation) -> bool:
        self._on_loop("holds")
        return super().holds(res)

    def live_reservations(
        self,
        instance: str,
        running_ids: set[str] | None = None,
        observed_at: float | None = None,
    ) -> list[Reservation]:
        self._on_loop("live_reservations")
        return super().live_reservations(instance, running_ids, observed_at)

    @contextlib.contextmanager
    def lock(self, instance: str) -> Iterator[None]:
        self._on_loop("lock")
        with super().lock(instance):
            self.log.append("lock")
            try:
                yield
            finally:
                self.log.append("unlock")

    def reserve(
        self, instance: str, session_id: str = "", prompt: str = "", project: str = ""
    ) -> Reservation:
        self._on_loop("reserve")
        self.log.append(f"reserve {session_id}".strip())
        return super().reserve(instance, session_id, prompt, project)

    def attach(self, res: Reservation, session_id: str, prompt: str | None = None) -> Reservation:
        self._on_loop("attach")
        self.log.append(f"attach {session_id}" if prompt != PROMPT_ACCEPTED else "accepted")
        return super().attach(res, session_id, prompt)

    def release(self, res: Reservation) -> None:
        self._on_loop("release")
        self.log.append("release")
        super().release(res)


def record(sid: str, state: str = "idle") -> SessionRecord:
    return SessionRecord(
        "a", sid, sid, ROOT, 1, 1, 0.0, running=state != "idle", run_state=state, project=True  # type: ignore[arg-type]
    )


def slot_files(cfg: Config) -> list[Path]:
    return sorted((cfg.state_dir / "slots").glob("*.slot"))


def audit_results(cfg: Config) -> list[str]:
    path = cfg.state_dir / "audit.log"
    return [json.loads(line)["result"] for line in path.read_text().splitlines()]
