"""What the tests of runs waiting for a person share (tests/unit/ops/test_waiting.py, the
waiting commands' and the live reactor's tests): a fake opencode 1.18.33 server with pending
permission requests and questions, and an ops context on it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from xaf_hub.config.load import Config, load_config
from xaf_hub.ops.context import OpsContext

DIR = "/srv/p/app"
NOW = 1_796_000_000_000
PERM = {
    "id": "per_aaa1",
    "sessionID": "ses_perm",
    "permission": "bash",
    "patterns": ["git push origin main"],
    "metadata": {"command": "git push origin main"},
    "always": ["git push *"],
    "tool": {"messageID": "msg_1", "callID": "call_p"},
}
QUESTION = {
    "id": "que_bbb2",
    "sessionID": "ses_quest",
    "questions": [
        {
            "question": "Which database?",
            "header": "DB",
            "options": [
                {"label": "staging", "description": "s"},
                {"label": "local", "description": "l"},
            ],
        }
    ],
    "tool": {"messageID": "msg_2", "callID": "call_q"},
}


def session(sid: str, directory: str = DIR) -> dict[str, Any]:
    return {"id": sid, "title": f"title {sid}", "directory": directory,
            "time": {"created": NOW, "updated": NOW}}


@dataclass
class Server:
    """A 1.18.33 server: sessions, run state and pending requests; records every reply."""

    sessions: list[dict[str, Any]] = field(default_factory=list)
    busy: set[str] = field(default_factory=set)
    permissions: list[dict[str, Any]] = field(default_factory=list)
    questions: list[dict[str, Any]] = field(default_factory=list)
    replies: list[tuple[str, Any]] = field(default_factory=list)
    broken: str = ""  # a route that answers ``broken_status``
    broken_status: int = 500
    ended: set[str] = field(default_factory=set)  # requests still listed after their run ended
    # Runs once the scan listed the requests (an answer racing the command's look-up).
    on_list: Any = None
    listed: int = 0

    def route(self, req: httpx.Request) -> httpx.Response:
        path = req.url.path
        if path == self.broken:
            return httpx.Response(self.broken_status, text="boom")
        if path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        directory = req.url.params.get("directory")
        if path in ("/experimental/session", "/session") and req.method == "GET":
            return httpx.Response(200, json=self.sessions)
        if path == "/session/status":
            here = [s["id"] for s in self.sessions if s["directory"] == directory]
            return httpx.Response(200, json={s: {"type": "busy"} for s in here if s in self.busy})
        if path in ("/permission", "/question"):
            items = self.permissions if path == "/permission" else self.questions
            here = {s["id"] for s in self.sessions if s["directory"] == directory}
            self.listed += 1
            if self.on_list is not None and self.listed > 2:
                self.on_list(self)
                self.on_list = None
            return httpx.Response(200, json=[r for r in items if r["sessionID"] in here])
        if path.endswith("/message"):
            # The newest message holds the tool call of each request of the session: running
            # while it waits, in error once its run ended (``ended``).
            sid = path.split("/")[2]
            parts = [{"type": "tool", "callID": r["tool"]["callID"], "state": {
                "status": "error" if r["id"] in self.ended else "running",
                "time": {"start": NOW - 60_000}}}
                for r in [*self.permissions, *self.questions] if r["sessionID"] == sid]
            return httpx.Response(200, json=[{"info": {"role": "assistant"}, "parts": parts}])
        if req.method == "POST" and path.startswith(("/permission/", "/question/")):
            rid = path.split("/")[2]
            items = self.permissions if path.startswith("/permission/") else self.questions
            if not any(r["id"] == rid for r in items):
                return httpx.Response(404, json={"_tag": "PermissionNotFoundError"})
            items[:] = [r for r in items if r["id"] != rid]
            self.replies.append((path, json.loads(req.content) if req.content else None))
            return httpx.Response(200, json=True)
        return httpx.Response(404, json={})


def make_ops(tmp_path: Path, server: Server, production: bool = False) -> OpsContext:
    inst = {"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}
    if production:
        inst["danger"] = True
    doc = {"instances": [inst]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    cfg = load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    return OpsContext(cfg, env={}, transport_factory=lambda _: httpx.MockTransport(server.route))


def fleet_with_both() -> Server:
    s = Server(
        sessions=[session("ses_perm"), session("ses_quest"), session("ses_work")],
        busy={"ses_perm", "ses_quest", "ses_work"},
        permissions=[dict(PERM)],
        questions=[dict(QUESTION)],
    )
    return s


def audit_lines(cfg: Config) -> list[dict[str, Any]]:
    path = cfg.state_dir / "audit.log"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
