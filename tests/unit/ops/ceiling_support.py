"""A fake opencode 1.18.33 server holding runs with sub-agents, for the run ceiling's tests
(tests/unit/ops/test_ceiling.py, the round's job and the daemon's live watch): sessions with
``parentID``, their messages and run state, and what an abort does to each."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from xaf_hub.config.load import load_config
from xaf_hub.ops.context import OpsContext

APP = "/srv/p/app"
T0 = 1_796_000_000_000  # the prompt's time (epoch ms)


def user(at: int, *, synthetic: bool = False) -> dict[str, Any]:
    """A user message: a prompt, or (synthetic) a background sub-agent's result."""
    part: dict[str, Any] = {"type": "text", "text": "work"}
    if synthetic:
        part["synthetic"] = True
    return {"info": {"role": "user", "time": {"created": at}}, "parts": [part]}


def step(at: int, cost: float) -> dict[str, Any]:
    """An assistant message (one step) created at ``at`` that cost ``cost``."""
    info = {"role": "assistant", "cost": cost, "time": {"created": at, "completed": at + 1}}
    return {"info": info, "parts": []}


@dataclass
class Node:
    sid: str
    parent: str = ""
    updated: int = T0
    messages: list[dict[str, Any]] = field(default_factory=list)
    busy: bool = False
    stubborn: int = 0  # aborts this session shrugs off before it stops
    created: int = T0 - 60_000
    cost: float | None = None  # the session's own total (1.18 lists it; older releases not)


@dataclass
class Family:
    """The server: sessions by id; records every abort, in order."""

    nodes: dict[str, Node] = field(default_factory=dict)
    aborts: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)  # sessions whose messages were asked

    def add(self, sid: str, parent: str = "", **kw: Any) -> Node:
        node = Node(sid, parent, **kw)
        self.nodes[sid] = node
        return node

    def transport(self, _inst: object = None) -> httpx.MockTransport:
        return httpx.MockTransport(self.route)

    def obj(self, n: Node) -> dict[str, Any]:
        out: dict[str, Any] = {"id": n.sid, "title": f"work {n.sid}", "directory": APP,
                               "time": {"created": n.created, "updated": n.updated}}
        if n.parent:
            out["parentID"] = n.parent
        if n.cost is not None:
            out["cost"] = n.cost
        return out

    def route(self, req: httpx.Request) -> httpx.Response:
        path = req.url.path
        if path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        if path == "/experimental/session":
            return httpx.Response(200, json=[self.obj(n) for n in self.nodes.values()])
        if path == "/session/status":
            return httpx.Response(200, json={n.sid: {"type": "busy"}
                                             for n in self.nodes.values() if n.busy})
        m = re.fullmatch(r"/session/(ses_\w+)(/\w+)?", path)
        node = self.nodes.get(m.group(1)) if m else None
        if m is None or node is None:
            return httpx.Response(404, json={"name": "NotFoundError"})
        what = m.group(2)
        if what == "/children":
            kids = [self.obj(n) for n in self.nodes.values() if n.parent == node.sid]
            return httpx.Response(200, json=kids)
        if what == "/message":
            self.reads.append(node.sid)
            return httpx.Response(200, json=node.messages[-int(req.url.params["limit"]):])
        if what == "/abort":
            self.aborts.append(node.sid)
            if node.stubborn:
                node.stubborn -= 1
            else:
                node.busy = False
            return httpx.Response(200, json=True)
        return httpx.Response(200, json=self.obj(node))


def priced_run(server: Family, root_busy: bool = False) -> None:
    """A free root whose prompt came at T0; a child (two priced steps since, still working),
    its own child (one step), a child of an earlier run (quiet since before T0)."""
    server.add("ses_root", busy=root_busy, updated=T0 + 50,
               messages=[user(T0 - 9_000), step(T0 - 8_000, 1.0), user(T0),
                         step(T0 + 10, 0.0), user(T0 + 40, synthetic=True),
                         step(T0 + 50, 0.0)])
    server.add("ses_old", "ses_root", updated=T0 - 7_000,
               messages=[user(T0 - 7_500), step(T0 - 7_000, 5.0)])
    server.add("ses_kid", "ses_root", busy=True, updated=T0 + 30,
               messages=[user(T0 + 11), step(T0 + 20, 0.02), step(T0 + 30, 0.02)])
    server.add("ses_grandkid", "ses_kid", updated=T0 + 25,
               messages=[user(T0 + 21), step(T0 + 25, 0.02)])



def context(tmp_path: Path, family: Family, run_usd: float | None = 0.05) -> OpsContext:
    """An ops context over ``family`` for one instance "a" with root ``/srv/p``."""
    doc: dict[str, Any] = {
        "instances": [{"name": "a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}],
        "models": {"timezone": "UTC"},
    }
    if run_usd is not None:
        doc["budget"] = {"run_usd": run_usd}
    (tmp_path / "config.json").write_text(json.dumps(doc), "utf-8")
    cfg = load_config(str(tmp_path / "config.json"),
                      env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    return OpsContext(cfg, env={}, transport_factory=family.transport)
