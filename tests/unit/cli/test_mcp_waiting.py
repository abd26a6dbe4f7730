"""The MCP face of runs waiting for a person (issue 35): `waiting`, `approve`, `deny` and
`answer` are tools a lead agent calls as a person runs the commands, each answer audited with
the agent as the one who answered, a request that no longer waits refused with nothing sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.unit.cli.mcp_support import _call, _text
from tests.unit.ops.waiting_support import fleet_with_both, make_ops


def _hub(tmp_path: Path, server: Any) -> Any:
    from xaf_hub.cli.mcp import Hub

    ops = make_ops(tmp_path, server)  # writes tmp_path/config.json
    return Hub(config=str(tmp_path / "config.json"), env={"XAF_HUB_HOME": str(ops.cfg.state_dir)},
               cwd=tmp_path, transport_factory=lambda _: httpx.MockTransport(server.route))


def test_an_agent_lists_and_answers_what_runs_wait_on(tmp_path: Path) -> None:
    server = fleet_with_both()
    hub = _hub(tmp_path, server)
    listed = _call(hub, "waiting", {})
    assert not listed.is_error, _text(listed)
    ids = [w["id"] for w in listed.structured_content["waiting"]]
    assert sorted(ids) == ["per_aaa1", "que_bbb2"]
    assert _text(listed) == "2 request(s) waiting for a person"

    approved = _call(hub, "approve", {"request": "per_aaa1", "always": True})
    assert not approved.is_error, _text(approved)
    assert approved.structured_content["result"] == "sent"
    assert server.replies == [("/permission/per_aaa1/reply", {"reply": "always"})]

    # Answered already: refused with its class, and nothing more reaches the server.
    again = _call(hub, "approve", {"request": "per_aaa1"})
    assert again.is_error and "no longer waiting: " in _text(again), _text(again)
    assert len(server.replies) == 1

    # A choice is data whatever it looks like (no option parsing on this face).
    answered = _call(hub, "answer", {"request": "que_bbb2", "choices": ["staging"]})
    assert not answered.is_error, _text(answered)
    path, body = server.replies[-1]
    assert path.startswith("/question/que_bbb2/") and "staging" in json.dumps(body)

    audit = (Path(hub.env["XAF_HUB_HOME"]) / "audit.log").read_text("utf-8").splitlines()
    callers = {json.loads(line)["who"]["caller"] for line in audit}
    assert callers == {"mcp:mcp"}, callers  # the agent answered, and says so


def test_a_deny_message_that_starts_with_a_dash_is_text(tmp_path: Path) -> None:
    server = fleet_with_both()
    hub = _hub(tmp_path, server)
    denied = _call(hub, "deny", {"request": "per_aaa1", "message": "--no, commit locally"})
    assert not denied.is_error, _text(denied)
    assert server.replies[-1] == ("/permission/per_aaa1/reply",
                                  {"reply": "reject", "message": "--no, commit locally"})
