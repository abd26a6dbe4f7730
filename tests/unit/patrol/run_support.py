"""A fake fleet and the rounds that read it, shared by the run memory's tests on files
(tests/unit/patrol/test_run_memory.py) and on Redis (tests/unit/store/test_redis_runs.py)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core.runstate import LastRun
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.runner import CycleRun, run_once

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
APP = "/srv/p/app"
E400 = {"name": "APIError", "data": {"message": "bad request: tool schema", "statusCode": 400}}


def run(outcome: str = "succeeded", **kw: Any) -> LastRun:
    return LastRun(outcome, kw.pop("message_id", "msg_1"), "fake/fake-model", **kw)


def assistant(
    mid: str, created: int, *, error: dict[str, Any] | None = None, completed: bool = True
) -> dict[str, Any]:
    info: dict[str, Any] = {
        "id": mid,
        "role": "assistant",
        "providerID": "fake",
        "modelID": "fake-model",
        "time": {"created": created},
    }
    if completed:
        info["time"]["completed"] = created + 1
        if error is None:
            info["finish"] = "stop"
    if error is not None:
        info["error"] = error
    return {"info": info, "parts": []}


@dataclass
class Session:
    sid: str
    updated: int
    last: dict[str, Any]


@dataclass
class FakeFleet:
    """Classic opencode 1.18 answers for N idle sessions per instance; counts message reads."""

    per_instance: int
    sessions: dict[str, dict[str, Session]] = field(default_factory=dict)
    reads: Counter[tuple[str, str]] = field(default_factory=Counter)
    prompts: list[tuple[str, str]] = field(default_factory=list)
    down: set[str] = field(default_factory=set)
    lists: int = 0  # session list requests: one per instance and scan

    def add(self, inst: str, sid: str, updated: int, last: dict[str, Any]) -> None:
        self.sessions.setdefault(inst, {})[sid] = Session(sid, updated, last)

    def transport(self, inst: InstanceConfig) -> httpx.MockTransport:
        return httpx.MockTransport(lambda req: self.answer(inst.name, req))

    def answer(self, inst: str, req: httpx.Request) -> httpx.Response:
        path, q = req.url.path, req.url.params
        mine = self.sessions.get(inst, {})
        if inst in self.down:
            raise httpx.ConnectError("connection refused", request=req)
        if path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        if path == "/experimental/session":
            self.lists += 1
            rows = sorted(mine.values(), key=lambda s: s.updated, reverse=True)
            if "cursor" in q:
                rows = [s for s in rows if s.updated < int(q["cursor"])]
            return httpx.Response(200, json=[self.obj(s) for s in rows[: int(q["limit"])]])
        if path == "/session/status":
            return httpx.Response(200, json={})
        m = re.fullmatch(r"/session/(ses_\w+)(/message|/prompt_async)?", path)
        if m is None or m.group(1) not in mine:
            return httpx.Response(404, json={"name": "NotFoundError"})
        s = mine[m.group(1)]
        if m.group(2) == "/message":
            self.reads[(inst, s.sid)] += 1
            return httpx.Response(200, json=[s.last])
        if m.group(2) == "/prompt_async" and req.method == "POST":
            self.prompts.append((inst, s.sid))
            return httpx.Response(204)
        return httpx.Response(200, json=self.obj(s))

    @staticmethod
    def obj(s: Session) -> dict[str, Any]:
        return {
            "id": s.sid,
            "title": f"work {s.sid}",
            "directory": APP,
            "time": {"created": s.updated - 60_000, "updated": s.updated},
        }


def round_at(cfg: Config, fleet: FakeFleet, when: datetime) -> tuple[CycleRun, int]:
    """One `patrol --once` at ``when``; the result and how many last runs it read."""
    before = sum(fleet.reads.values())
    pctx = OpsContext(cfg, clock=lambda: when, env={}, transport_factory=fleet.transport)
    result = run_once(pctx, skip=("sync_design_tasks",))
    return result, sum(fleet.reads.values()) - before


def line_of(result: CycleRun, sid: str) -> tuple[str, str]:
    assert result.cycle is not None
    (line,) = [s for s in result.cycle.log.sessions if s.session == sid]
    return line.state, line.detail
