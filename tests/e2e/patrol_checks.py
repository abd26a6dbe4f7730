"""What the patrol's end-to-end tests read back: the audit log, a session's messages and last
run, which model answered, a patrol round's report; shared by the patrol test modules."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fleet import Hub
from xaf_hub.core.discipline import CONTINUE_PROMPT, RESUME_PROMPT
from xaf_hub.sandbox import fleet as sandbox

CONTINUE_HEAD = CONTINUE_PROMPT.splitlines()[0]


RESUME_HEAD = RESUME_PROMPT.splitlines()[0]


FAKE_TEXT = "Hello from fake LLM."


def home(hub: Hub) -> Path:
    return Path(hub.env["XAF_HUB_HOME"])


def audit_lines(hub: Hub) -> list[dict[str, Any]]:
    path = home(hub) / "audit.log"
    return [json.loads(ln) for ln in path.read_text("utf-8").splitlines()] if path.exists() else []


def messages(hub: Hub, name: str, sid: str) -> list[dict[str, Any]]:
    return sandbox.messages(hub.server(name).url, hub.password(name), sid)


def settled(hub: Hub, name: str, sid: str) -> dict[str, Any] | None:
    """The newest assistant message once the session is idle and that message completed."""
    msgs = messages(hub, name, sid)
    if not msgs or msgs[-1]["info"]["role"] != "assistant":
        return None
    if not msgs[-1]["info"].get("time", {}).get("completed"):
        return None
    d = str(hub.root / "app")
    if sid in hub.status(name, d):
        return None
    return msgs[-1]


def answered_by(hub: Hub, name: str, sid: str, model: str) -> Callable[[], bool]:
    def check() -> bool:
        msg = settled(hub, name, sid)
        if msg is None or msg["info"].get("error"):
            return False
        info = msg["info"]
        text = "".join(p.get("text", "") for p in msg["parts"] if p.get("type") == "text")
        return f"{info['providerID']}/{info['modelID']}" == model and FAKE_TEXT in text

    return check


def patrol(hub: Hub, *flags: str) -> dict[str, Any]:
    code, out, err = hub.cli("patrol", "--once", *flags)
    assert code == 0, err
    assert not any(pw in out + err for pw in hub.secrets())
    doc = json.loads((home(hub) / "patrol" / "report-latest.json").read_text("utf-8"))
    assert not any(pw in json.dumps(doc) for pw in hub.secrets())
    return doc


def agent_requests(hub: Hub, model: str, needle: str) -> list[dict[str, Any]]:
    return [
        r
        for r in hub.llm.requests()
        if r["model"] == model and not r["title_call"] and needle in r["last_user_text"]
    ]


def use_models(hub: Hub, **models: Any) -> None:
    hub.doc["models"] = {"default_dispatch_model": "fake/fake-model", **models}
    hub.write_config()


def delegating(hub: Hub, *, background: bool = False, step_seconds: float = 1.0) -> None:
    """Script the fake model: an agent on the free ``fake-model`` hands its work to the priced
    sub-agent (opencode's ``task`` tool; ``background``: without waiting for it), which takes
    $0.02 steps of ``step_seconds`` each for as long as it is let."""
    task = {"description": "sub work", "prompt": "do the sub work", "subagent_type": "priced"}
    if background:
        task["background"] = True
    hub.llm.set_mode("fake-model", "tools", calls=[["task", task]], text="parent done")
    step = ["bash", {"command": f"sleep {step_seconds}", "description": "one step"}]
    hub.llm.set_mode("priced-model", "tools", calls=[step] * 40, text="child done")


def children(hub: Hub, name: str, sid: str) -> list[dict[str, Any]]:
    """The sessions a session's sub-agents run in, as the server lists them."""
    with sandbox._client(hub.server(name).url, hub.password(name)) as c:
        kids: list[dict[str, Any]] = c.get(f"/session/{sid}/children").json()
    return kids
