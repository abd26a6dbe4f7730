"""One record per opencode message: the shapes servers send, read once (fleet.wire.message_of)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.core.records import Message, Part
from xaf_hub.fleet.wire import message_of, messages_of

REFUSED = json.loads(
    (Path(__file__).parents[1] / "core" / "fixtures" / "refused-1.18.33.json").read_text("utf-8")
)["runs"]

# The answer of POST /session/{id}/message on 1.18.33 (API §4.4), trimmed to what is read.
SYNC_ANSWER = {
    "info": {
        "id": "msg_a", "sessionID": "ses_1", "role": "assistant", "parentID": "msg_u", "cost": 0,
        "tokens": {"total": 15, "input": 10, "output": 5, "reasoning": 0,
                   "cache": {"write": 0, "read": 0}},
        "modelID": "fake-model", "providerID": "fake",
        "time": {"created": 1796038742665, "completed": 1796038743662}, "finish": "stop",
    },
    "parts": [
        {"type": "step-start", "id": "prt_1"},
        {"type": "text", "text": "Hello from fake LLM.", "time": {"start": 1, "end": 2}},
        {"type": "step-finish", "reason": "stop", "cost": 0},
    ],
}
# A user message's info as a message.updated frame carries it (event-samples.txt): no parts,
# its model nested.
USER_INFO = {
    "id": "msg_u", "role": "user", "sessionID": "ses_1", "time": {"created": 1796038742031},
    "agent": "build", "model": {"providerID": "fake", "modelID": "fake-model"},
}
E429 = {"name": "APIError", "data": {"message": "Rate limit exceeded", "statusCode": 429}}
# A run failed after its retries (API §6): no parts, no finish, tokens all 0, completed.
FAILED = {
    "info": {
        "id": "msg_f", "role": "assistant", "providerID": "fake", "modelID": "fake-model",
        "tokens": {"input": 0, "output": 0, "reasoning": 0}, "time": {"created": 5, "completed": 9},
        "error": E429,
    },
    "parts": [],
}
REFUSED_BASH = Part(
    "tool", tool="bash", call_id="call_9647048562509",
    state=REFUSED["denied"][-1]["parts"][1]["state"],
)

CASES: list[tuple[str, Any, Message]] = [
    ("an answer", SYNC_ANSWER, Message(
        "assistant", "msg_a", "ses_1", 1796038742665, 1796038743662, "fake/fake-model", 0.0, 15,
        "stop", None, (Part("step-start"), Part("text", "Hello from fake LLM."),
                       Part("step-finish")),
    )),
    ("a prompt's bare info, its model nested", USER_INFO, Message(
        "user", "msg_u", "ses_1", 1796038742031, model="fake/fake-model",
    )),
    ("a failed answer", FAILED, Message(
        "assistant", "msg_f", "", 5, 9, "fake/fake-model", error=E429,
    )),
    ("a refused tool call", REFUSED["denied"][-1], Message(
        "assistant", "msg_24c00a6ad001FhaeFXu5Jh3mso", "ses_db3ff63b5ffe7KVAQ16LTHHN2y",
        1796571440813, 1796571445794, "fake/fake-model", 0.0, 15, "tool-calls", None,
        (Part("step-start"), REFUSED_BASH, Part("step-finish")),
    )),
    ("tokens without a total are summed", {"info": {
        "role": "assistant", "tokens": {"input": 10, "output": 5, "reasoning": 2},
    }}, Message("assistant", tokens=17)),
    ("a nested model named by id", {"info": {
        "role": "user", "model": {"providerID": "p", "id": "m"},
    }}, Message("user", model="p/m")),
    ("files attached, by source or by name", {"info": {"role": "user"}, "parts": [
        {"type": "file", "source": {"path": "/w/a.py"}, "filename": "a.py"},
        {"type": "file", "filename": "b.py"},
        {"type": "text", "text": "a result", "synthetic": True},
    ]}, Message("user", parts=(
        Part("file", path="/w/a.py"), Part("file", path="b.py"),
        Part("text", "a result", synthetic=True),
    ))),
    ("a hostile server's fields read as unknown", {
        "info": {"role": 7, "id": ["x"], "time": {"created": "soon", "completed": 1e400},
                 "cost": "0.5", "providerID": "p", "finish": {}, "error": "boom",
                 "tokens": "many"},
        "parts": [{"type": "tool", "state": "broken", "synthetic": "yes"}, "broken"],
    }, Message("7", parts=(Part("tool"), Part("")))),
    ("a model without its provider is unknown", {"info": {"modelID": "m"}}, Message("")),
    ("not a message at all", "broken", Message("")),
]


@pytest.mark.parametrize(("case", "wire", "record"), CASES, ids=[c[0] for c in CASES])
def test_a_message_is_read_once_into_its_record(case: str, wire: Any, record: Message) -> None:
    assert message_of(wire) == record, case


def test_a_listing_leaves_out_what_is_not_a_message() -> None:
    assert messages_of([USER_INFO, "broken", None, SYNC_ANSWER]) == [
        message_of(USER_INFO), message_of(SYNC_ANSWER),
    ]
