"""Runs that wait for a person, against real opencode (issue 35).

The sandbox's servers read no project config, so each session gets its own rules
(``"bash": ask``) when it is created; the fake model calls bash, or the question tool, and the
run stops on the request while the server keeps calling the session busy. One test covers the
whole path, so the shared fleet serves it once: the requests appear in `status`, `sessions`,
`show` and `waiting` within seconds, count against the limit, an approval lets the run finish
with the tool's output, a denial ends the wait, a question is answered with its option, and a
request that no longer waits is refused with nothing sent; `watch` prints a line when each
request appears and when it is answered, from the event stream; a `permissions.rules` rule
answers one with no person, in a `patrol --once` round, audited with the rule, and leaves to a
person a command it sees only part of.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import fleet as sandbox
from tests.e2e.daemon import Lines
from tests.fleet import Hub

pytestmark = pytest.mark.e2e

ASK_BASH = [{"permission": "bash", "pattern": "*", "action": "ask"}]
INSTANCE = "local-a"


def start(hub: Hub, title: str, permission: Any = None, model: str = "fake/fake-model") -> str:
    d = hub.project_dir("app")
    s = sandbox.create_session(
        hub.server(INSTANCE).url, hub.password(INSTANCE), str(d), title, permission
    )
    sid = str(s["id"])
    sandbox.prompt_async(hub.server(INSTANCE).url, hub.password(INSTANCE), sid, "go", model, d)
    return sid


def waiting_of(hub: Hub) -> dict[str, dict[str, Any]]:
    """session id -> its ``waiting`` record, from `sessions --json`."""
    code, data = hub.cli_json("sessions", "--instance", INSTANCE)
    assert code == 0, data
    return {s["id"]: s["waiting"] for s in data["sessions"] if s["waiting"]}


def idle(hub: Hub, sid: str) -> bool:
    return sid not in hub.status(INSTANCE, hub.project_dir("app"))


def audit(hub: Hub) -> list[dict[str, Any]]:
    path = Path(hub.env["XAF_HUB_HOME"]) / "audit.log"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_waiting_run_is_seen_counted_and_answered(hub: Hub) -> None:
    hub.set_instance(INSTANCE, concurrency_limit=3)
    hub.llm.set_mode(
        "fake-model",
        "tools",
        calls=[["bash", {"command": "echo approved-$((20+22))", "description": "say it"}]],
        text="Done:",
    )
    watch = Lines(hub.popen("watch", "--json", "--instance", INSTANCE))
    try:
        hub.wait_for(lambda: any("watching 1 instance" in e for e in watch.err), timeout=120)
        t0 = time.monotonic()
        a, b = start(hub, "needs approval", ASK_BASH), start(hub, "will be denied", ASK_BASH)
        approve_and_deny(hub, a, b, t0)
    finally:
        watch.stop()
    for sid in (a, b):
        asked = [e for e in watch.events() if e["event"] == "asked" and e["session"]["id"] == sid]
        answered = [e["detail"] for e in watch.events()
                    if e["event"] == "answered" and e["session"]["id"] == sid]
        assert len(asked) == 1 and asked[0]["source"] == "stream", watch.events()
        assert asked[0]["session"]["waiting"]["kind"] == "permission"
        assert len(answered) == 1, watch.events()
    assert [e["answer"] for e in watch.events()
            if e["event"] == "answered"] == ["replied once", "replied reject"]
    ask_a_question(hub)
    a_rule_answers(hub)


def approve_and_deny(hub: Hub, a: str, b: str, t0: float) -> None:

    # --- seen: both wait, in every view, within seconds of the request
    seen = hub.wait_for(lambda: len(w := waiting_of(hub)) == 2 and w, timeout=90, step=0.5)
    print(f"both requests seen {time.monotonic() - t0:.1f}s after the prompts")
    assert {w["kind"] for w in seen.values()} == {"permission"}
    assert all(w["request_id"].startswith("per_") and w["since"] > 0 for w in seen.values())
    assert seen[a]["permission"] == "bash" and "approved-" in seen[a]["asked"]
    per_a, per_b = seen[a]["request_id"], seen[b]["request_id"]

    code, data = hub.cli_json("status", "--instance", INSTANCE)
    row = data["instances"][0]
    # Still counted (the run goes on once answered), and the reason says what it is.
    assert (row["waiting"], row["running_project"]) == (2, 2), row
    assert "2 waiting for a person" in row["reason"]
    code, out, _ = hub.cli("show", a)
    assert code == 0 and "state:     waiting for a person since" in out
    assert f"xaf-hub approve {per_a}" in out
    code, listed = hub.cli_json("waiting")
    assert code == 0 and {w["id"] for w in listed["waiting"]} >= {per_a, per_b}
    page = hub.root.parent / "page.html"
    code, _, err = hub.cli("sessions", "--instance", INSTANCE, "--html", str(page))
    html = page.read_text("utf-8")
    assert code == 0 and 'id="waiting-for-you"' in html, err
    assert f'data-request="{per_a}"' in html and f'data-request="{per_b}"' in html

    # --- approve lets the run finish with the tool's output
    code, out, err = hub.cli("approve", per_a)
    assert code == 0, err
    assert out.startswith(f"approved once: {per_a} of {a} on {INSTANCE}")
    hub.wait_for(lambda: idle(hub, a), timeout=60, step=0.5)
    outputs = [str(r["tool_results"]) for r in hub.llm.requests() if r["tool_results"]]
    assert any("approved-42" in o for o in outputs), outputs

    # --- deny ends the wait; the agent hears the message
    code, out, err = hub.cli("deny", per_b, "--message", "not now")
    assert code == 0, err
    hub.wait_for(lambda: idle(hub, b), timeout=60, step=0.5)
    assert not any("approved-42" in str(r["tool_results"]) and b in str(r)
                   for r in hub.llm.requests())

    # --- a request that no longer waits: refused, nothing sent
    before = len(audit(hub))
    code, out, err = hub.cli("approve", per_a)
    assert code == 4 and out == ""
    assert f"request {per_a} is not waiting on any instance" in err and "nothing sent" in err
    assert len(audit(hub)) == before
    sent = [(x["command"], x["request"], x["result"]) for x in audit(hub) if "request" in x]
    assert sent == [("approve", per_a, "sent"), ("deny", per_b, "sent")]



def ask_a_question(hub: Hub) -> None:
    """A question, answered with one of its options."""
    hub.llm.set_mode(
        "fake-model",
        "tools",
        calls=[["question", {"questions": [{
            "question": "Which colour?", "header": "Colour",
            "options": [{"label": "red", "description": "r"},
                        {"label": "blue", "description": "b"}]}]}]],
        text="Got:",
    )
    q = start(hub, "asks a question")
    seen = hub.wait_for(lambda: (w := waiting_of(hub)).get(q) and w, timeout=90, step=0.5)
    assert (seen[q]["kind"], seen[q]["asked"], seen[q]["options"]) == (
        "question", "Which colour?", [["red", "blue"]]
    )
    code, _, err = hub.cli("answer", seen[q]["request_id"], "purple")
    assert code == 4 and "'purple' is not an option" in err
    # An option named in another case is that option, sent as offered.
    code, out, err = hub.cli("answer", seen[q]["request_id"], "Blue")
    assert code == 0, err
    assert out.startswith(f"answered blue: {seen[q]['request_id']}"), out
    hub.wait_for(lambda: idle(hub, q), timeout=60, step=0.5)
    assert waiting_of(hub) == {}


def a_rule_answers(hub: Hub) -> None:
    """An allow rule answers in the patrol's round; a request no rule covers is left alone,
    and so is one a rule sees only part of: 20 `git status` and a `touch` after them."""
    hub.write_config(permissions={"rules": [
        {"kind": "bash", "pattern": "echo policy-*", "action": "allow"},
        {"kind": "bash", "pattern": "git status*", "action": "allow"},
    ]})
    twenty = "; ".join(f"git status -s f{i}" for i in range(1, 21))
    asks = {
        "fake-model": "echo policy-ok",
        "slow-model": "git status",
        "missing-model": f"{twenty}; touch m_21th",
    }
    for model, command in asks.items():
        hub.llm.set_mode(
            model, "tools", calls=[["bash", {"command": command, "description": "d"}]],
            text="Done:",
        )
    r, plain, attack = (start(hub, f"asks {m}", ASK_BASH, f"fake/{m}") for m in asks)
    seen = hub.wait_for(lambda: len(w := waiting_of(hub)) == 3 and w, timeout=90, step=0.5)
    # The server names each of the 21 commands; the hub keeps 20 patterns and the command.
    assert seen[attack]["asked"] == asks["missing-model"] and len(seen[attack]["patterns"]) == 20
    code, _, err = hub.cli("patrol", "--once", "--no-design")
    assert code == 0, err
    report = json.loads((Path(hub.env["XAF_HUB_HOME"]) / "patrol" / "report-latest.json")
                        .read_text("utf-8"))
    by = {a["session"]: a["detail"] for a in report["answered"]}
    assert set(by) == {r, plain}, report["answered"]
    assert "by permissions.rules[0]" in by[r] and "by permissions.rules[1]" in by[plain]
    for sid in (r, plain):
        hub.wait_for(lambda s=sid: idle(hub, s), timeout=60, step=0.5)
    [line] = [x for x in audit(hub) if x.get("request") == seen[r]["request_id"]]
    assert (line["command"], line["result"]) == ("approve", "sent")
    assert line["by"] == "rule permissions.rules[0] bash 'echo policy-*' allow"
    # Left for a person: still waiting, nothing answered, the touch never ran.
    assert waiting_of(hub)[attack]["request_id"] == seen[attack]["request_id"]
    assert not [x for x in audit(hub) if x.get("request") == seen[attack]["request_id"]]
    assert not (hub.project_dir("app") / "m_21th").exists()
    code, _, err = hub.cli("deny", seen[attack]["request_id"])
    assert code == 0, err
    hub.wait_for(lambda: idle(hub, attack), timeout=60, step=0.5)


def test_a_request_left_over_from_an_interrupted_run_is_not_a_wait_of_the_next(hub: Hub) -> None:
    """opencode keeps listing a request after its run is aborted; a new run of the session
    does not wait on it, and every view says so (running, not waiting for a person)."""
    hub.set_instance(INSTANCE, concurrency_limit=3)
    hub.llm.set_mode("fake-model", "tools", text="Done:",
                     calls=[["bash", {"command": "echo left-over", "description": "say it"}]])
    sid = start(hub, "asks, then is stopped", ASK_BASH)
    per = hub.wait_for(lambda: waiting_of(hub).get(sid), timeout=90, step=0.5)["request_id"]
    code, _, err = hub.cli("interrupt", sid)
    assert code == 0, err
    hub.wait_for(lambda: idle(hub, sid), timeout=60, step=0.5)
    hub.llm.set_mode("slow-model", "slow", delay=30)
    d = hub.project_dir("app")
    sandbox.prompt_async(hub.server(INSTANCE).url, hub.password(INSTANCE), sid, "again",
                         "fake/slow-model", d)
    hub.wait_for(lambda: not idle(hub, sid), timeout=60, step=0.5)
    with httpx.Client(auth=("opencode", hub.password(INSTANCE))) as c:  # the server still lists it
        listed = c.get(hub.server(INSTANCE).url + "/permission", params={"directory": str(d)})
    assert per in {p["id"] for p in listed.json()}
    code, doc = hub.cli_json("waiting")
    assert code == 0 and per not in {w["id"] for w in doc["waiting"]}, doc
    assert sid not in waiting_of(hub)
    code, out, _ = hub.cli("show", sid)
    assert "waiting for a person" not in out and "state:     busy" in out, out
