"""The pure parts of `confirm` and `dispatch --confirm-wait`: reading a session, the wait loop
(with a fake clock and fake looks), and the lines they print."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC
from typing import Any

import pytest

from xaf_hub.cli.commands._common import healing_text, verdict_text, wait_exit, wait_text
from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.records import Message
from xaf_hub.core.rules import ProjectRules
from xaf_hub.errors import BusyError, UnreachableError
from xaf_hub.fleet.client import RawStatus, ServerSession
from xaf_hub.fleet.wire import message_of
from xaf_hub.ops.confirm import (
    MAX_HEALS,
    Sighting,
    WaitResult,
    answered,
    judge,
    messages_since,
    sighting,
    wait_for_run,
    wait_step,
)
from xaf_hub.ops.heal import HealCandidate, Healing
from xaf_hub.ops.rooms import in_room

ROOT = "/srv/proj"
INST = InstanceConfig(
    name="lan-b", url="http://127.0.0.1:1", rules=ProjectRules.build(roots=[ROOT])
)
SESSION = ServerSession("ses_1", "fix login", f"{ROOT}/app", 1, 2, 0.0, "", "")
RATE = "Rate limit exceeded: free usage limit reached. Please try again later."
ERR_429 = {"name": "APIError", "data": {"message": RATE, "statusCode": 429}}
ERR_404 = {
    "name": "APIError",
    "data": {"message": "The model `missing` does not exist", "statusCode": 404},
}
ERR_401 = {"name": "APIError", "data": {"message": "Incorrect API key", "statusCode": 401}}


def user(mid: str, model: str = "opencode/free-model") -> Message:
    provider, _, ident = model.partition("/")
    return message_of({
        "info": {
            "id": mid,
            "role": "user",
            "time": {"created": 1},
            "model": {"providerID": provider, "modelID": ident},
        },
        "parts": [{"type": "text", "text": "do it"}],
    })


def assistant(
    mid: str,
    model: str = "opencode/free-model",
    *,
    parts: int = 0,
    completed: bool = False,
    finish: str | None = None,
    error: dict[str, Any] | None = None,
) -> Message:
    provider, _, ident = model.partition("/")
    info: dict[str, Any] = {
        "id": mid,
        "role": "assistant",
        "providerID": provider,
        "modelID": ident,
        "time": {"created": 2, **({"completed": 3} if completed else {})},
    }
    if finish:
        info["finish"] = finish
    if error:
        info["error"] = error
    return message_of({"info": info, "parts": [{"type": "step-start"}] * parts})


def see(
    status: RawStatus | None, messages: Sequence[Message], baseline: str | None = None
) -> Sighting:
    return sighting(INST, SESSION, status, messages, baseline)


RETRY: RawStatus = {"type": "retry", "attempt": 2, "message": RATE, "next": 1_900_000_000_000}
BUSY: RawStatus = {"type": "busy"}


# ---------------------------------------------------------------------------------------------
# reading


def test_messages_since_the_baseline() -> None:
    msgs = [user("m1"), assistant("m2"), user("m3"), assistant("m4")]
    assert messages_since(msgs, None) == msgs
    assert messages_since(msgs, "") == msgs
    assert messages_since(msgs, "m2") == msgs[2:]
    assert messages_since(msgs, "m4") == []
    # A baseline that fell out of the window: everything read is new.
    assert messages_since(msgs, "m0") == msgs


def test_answered_needs_an_assistant_message_with_parts() -> None:
    assert not answered([])
    assert not answered([user("m1")])
    assert not answered([user("m1"), assistant("m2")])  # waiting between retries
    assert answered([user("m1"), assistant("m2", parts=1)])


def test_sighting_reads_retry_and_the_next_baseline() -> None:
    s = see(RETRY, [assistant("m0", completed=True, finish="stop"), user("m1"), assistant("m2")])
    assert (s.rec.run_state, s.rec.retry_message, s.rec.retry_next) == (
        "retry",
        RATE,
        1_900_000_000_000,
    )
    assert (s.attempt, s.newest_id, s.rec.project) == (2, "m2", True)
    assert (s.run.message_id, s.run.model, s.answered) == ("m2", "opencode/free-model", False)
    # Nothing new since the baseline: the run is "not_started" but the baseline is kept.
    s = see(None, [user("m1")], baseline="m1")
    assert (s.run.outcome, s.newest_id) == ("not_started", "m1")


def test_a_session_in_a_worktree_is_the_projects_through_its_checkout() -> None:
    """A task's room lies outside the roots; its checkout makes it the project's, so a heal
    during the wait prompts it as a room's session."""
    room = ServerSession("ses_2", "fix login", "/data/worktree/t-1", 1, 2, 0.0, "", "",
                         checkout=f"{ROOT}/app")
    s = sighting(INST, room, None, [user("m1")])
    assert s.rec.project and in_room(INST, s.rec)
    outside = replace(room, checkout="/elsewhere")
    assert not sighting(INST, outside, None, [user("m1")]).rec.project


@pytest.mark.parametrize(
    ("status", "messages", "state", "detail", "signal"),
    [
        (RETRY, [user("m1"), assistant("m2")], "retrying", RATE, "rate_limited"),
        (
            {"type": "retry", "attempt": 1, "message": "Cannot connect to API", "next": 5},
            [user("m1"), assistant("m2")],
            "retrying",
            "Cannot connect to API",
            "other",
        ),
        (BUSY, [user("m1"), assistant("m2", parts=1)], "running", "the model is answering", "none"),
        (BUSY, [user("m1")], "running", "busy; no answer from the model yet", "none"),
        (
            None,
            [user("m1"), assistant("m2", completed=True, finish="stop", parts=2)],
            "finished",
            "the last run finished",
            "none",
        ),
        (
            None,
            [user("m1"), assistant("m2", completed=True, error=ERR_429)],
            "failed",
            f"APIError: HTTP 429: {RATE}",
            "rate_limited",
        ),
        (
            None,
            [user("m1"), assistant("m2", completed=True, error=ERR_404)],
            "failed",
            "APIError: HTTP 404: The model `missing` does not exist",
            "model_unavailable",
        ),
        (None, [user("m1"), assistant("m2", completed=True)], "aborted", "", "none"),
        (None, [user("m1"), assistant("m2")], "interrupted", "", "none"),
        (None, [user("m1")], "pending", "", "none"),
        (None, [], "idle", "no run yet", "none"),
    ],
)
def test_judge(
    status: RawStatus | None,
    messages: list[Message],
    state: str,
    detail: str,
    signal: str,
) -> None:
    v = judge(see(status, messages))
    assert v.state == state
    assert detail in v.detail
    assert v.signal == signal
    if state == "retrying":
        assert v.next_ms == status["next"] and v.attempt == status["attempt"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("status", "messages", "step", "cand_state"),
    [
        (RETRY, [user("m1"), assistant("m2")], "heal", "retry"),
        (
            {"type": "retry", "attempt": 1, "message": "server error (HTTP 500)", "next": 5},
            [user("m1"), assistant("m2")],
            "wait",
            None,
        ),
        (None, [user("m1"), assistant("m2", completed=True, error=ERR_429)], "heal", "failed"),
        (None, [user("m1"), assistant("m2", completed=True, error=ERR_404)], "heal", "failed"),
        (None, [user("m1"), assistant("m2", completed=True, error=ERR_401)], "failed", None),
        # Busy before the model answers: a 429 may still come, however long it takes.
        (BUSY, [user("m1"), assistant("m2")], "wait", None),
        (BUSY, [user("m1"), assistant("m2", parts=1)], "started", None),
        (None, [user("m1"), assistant("m2", completed=True, finish="stop")], "finished", None),
        (None, [user("m1"), assistant("m2", completed=True)], "failed", None),
        (None, [user("m1")], "wait", None),
        (None, [], "wait", None),
        (None, [user("m1"), assistant("m2")], "wait", None),
    ],
)
def test_wait_step(
    status: RawStatus | None,
    messages: list[Message],
    step: str,
    cand_state: str | None,
) -> None:
    s = see(status, messages)
    got, cand = wait_step(s, judge(s))
    assert got == step
    assert (cand.state if cand else None) == cand_state
    if cand is not None:
        assert cand.key == "heal:lan-b:ses_1:m2" and cand.model == "opencode/free-model"


# ---------------------------------------------------------------------------------------------
# the wait loop, with a fake clock


class Script:
    """Hands out scripted sightings, one per look; the clock moves on each sleep."""

    def __init__(self, sightings: list[Sighting | Exception], heal: list[Healing | Exception]):
        self.sightings = sightings
        self.heal = heal
        self.now = 100.0
        self.baselines: list[str | None] = []
        self.fixed: list[HealCandidate] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.5)

    async def look(self, baseline: str | None) -> Sighting:
        self.baselines.append(baseline)
        item = self.sightings.pop(0) if len(self.sightings) > 1 else self.sightings[0]
        if isinstance(item, Exception):
            raise item
        return item

    async def fix(self, seen: Sighting, cand: HealCandidate) -> Healing:
        self.fixed.append(cand)
        item = self.heal.pop(0) if len(self.heal) > 1 else self.heal[0]
        if isinstance(item, Exception):
            raise item
        return item

    async def run(self, window: float = 20.0, baseline: str | None = "m0") -> WaitResult:
        return await wait_for_run(
            self.look,
            self.fix,
            window=window,
            baseline=baseline,
            clock=self.clock,
            sleep=self.sleep,
        )


HEALED = Healing(
    "failed", "rate_limited", "opencode/free-model", "backup/good-model", "429", "opencode", 99
)
FAILED_429 = [user("m1"), assistant("m2", completed=True, error=ERR_429)]
GOOD_RUN = [*FAILED_429, user("m3", "backup/good-model")]


def test_failed_429_is_healed_and_the_new_run_confirmed() -> None:
    script = Script(
        [
            see(BUSY, [user("m1"), assistant("m2")], "m0"),
            see(None, FAILED_429, "m0"),
            see(None, GOOD_RUN, "m2"),
            see(BUSY, [*GOOD_RUN, assistant("m4", "backup/good-model", parts=1)], "m2"),
        ],
        [HEALED],
    )
    result = asyncio.run(script.run())
    assert (result.state, result.model, result.heals) == ("running", "backup/good-model", (HEALED,))
    assert [c.state for c in script.fixed] == ["failed"]
    # After the heal, only what came after the failed message counts.
    assert script.baselines == ["m0", "m0", "m2", "m2"]


def test_a_stuck_retry_is_healed_once_then_finishes() -> None:
    healed = Healing("retry", "rate_limited", "opencode/free-model", "backup/good-model", RATE)
    script = Script(
        [
            see(RETRY, [user("m1"), assistant("m2")]),
            see(None, [user("m3", "backup/good-model")]),
            see(
                None,
                [
                    user("m3", "backup/good-model"),
                    assistant("m4", "backup/good-model", completed=True, finish="stop", parts=3),
                ],
            ),
        ],
        [healed],
    )
    result = asyncio.run(script.run())
    assert (result.state, result.model) == ("finished", "backup/good-model")
    assert [c.state for c in script.fixed] == ["retry"]


def test_no_usable_model_left_fails() -> None:
    nothing = Healing("failed", "rate_limited", "backup/good-model", None, "429", "opencode", 99)
    script = Script([see(None, FAILED_429)], [nothing])
    result = asyncio.run(script.run())
    assert result.state == "failed" and "no usable model left" in result.detail
    assert wait_exit(result) == 1


def test_heals_stop_after_max_heals() -> None:
    script = Script([see(None, FAILED_429, "m0")], [HEALED])
    result = asyncio.run(script.run(window=600))
    assert result.state == "failed" and "after 3 heals" in result.detail
    assert len(result.heals) == MAX_HEALS == len(script.fixed)


def test_a_failure_healed_elsewhere_is_not_healed_again() -> None:
    already = Healing("failed", "rate_limited", "opencode/free-model", None, "429", already=True)
    script = Script(
        [
            see(None, FAILED_429, "m0"),
            see(BUSY, [*GOOD_RUN, assistant("m4", "backup/good-model", parts=1)], "m0"),
        ],
        [already],
    )
    result = asyncio.run(script.run())
    assert (result.state, result.model, result.heals) == ("running", "backup/good-model", ())


def test_no_free_slot_is_tried_again_then_reported() -> None:
    script = Script([see(None, FAILED_429)], [BusyError("lan-b is at its limit")])
    result = asyncio.run(script.run(window=3))
    assert result.state == "failed" and "no free slot to re-send: lan-b is at its limit" in (
        result.detail
    )
    assert len(script.fixed) > 1  # retried on every look while the window lasted


def test_a_slow_start_is_not_taken_for_a_run_that_settled() -> None:
    # A loaded server shows the session busy long before the model's step begins; the 429 that
    # step then meets is still healed, not taken for a run that settled.
    slow = [see(BUSY, [user("m1"), assistant("m2")], "m0")] * 20  # 10 s
    script = Script(
        [
            *slow,
            see(RETRY, [user("m1"), assistant("m2")], "m0"),
            see(BUSY, [*GOOD_RUN, assistant("m4", "backup/good-model", parts=1)], "m2"),
        ],
        [HEALED],
    )
    result = asyncio.run(script.run())
    assert [c.state for c in script.fixed] == ["retry"], result
    assert (result.state, result.model) == ("running", "backup/good-model")


def test_busy_without_an_answer_is_running_when_the_window_ends() -> None:
    script = Script([see(BUSY, [user("m1"), assistant("m2")])], [HEALED])
    result = asyncio.run(script.run(window=20))
    assert result.state == "running" and not script.fixed
    assert result.seconds >= 20


@pytest.mark.parametrize(
    ("sightings", "state", "code"),
    [
        ([see(None, [])], "no_sign", 1),
        ([see(None, [user("m1")])], "no_sign", 1),
        ([see({"type": "retry", "message": "HTTP 500", "next": 7}, [user("m1")])], "retrying", 1),
        ([see(BUSY, [user("m1")])], "running", 0),  # busy when the window ends
        ([UnreachableError("lan-b", "connection refused")], "unreachable", 2),
        ([see(None, [user("m1"), assistant("m2", completed=True, error=ERR_401)])], "failed", 1),
    ],
)
def test_how_a_wait_without_heal_ends(
    sightings: list[Sighting | Exception], state: str, code: int
) -> None:
    result = asyncio.run(Script(sightings, [HEALED]).run(window=2))
    assert result.state == state and wait_exit(result) == code


# ---------------------------------------------------------------------------------------------
# wording


def test_wait_text() -> None:
    tz = UTC
    until = 1_767_254_400_000  # 2026-01-01 08:00 UTC
    healed = Healing(
        "retry", "rate_limited", "opencode/free-model", "backup/good-model", RATE, "opencode", until
    )
    running = WaitResult("running", "backup/good-model", "", 3.0, (healed,))
    assert wait_text(running, 20, tz, 0) == (
        "rate-limited on opencode/free-model, healed: now running on backup/good-model "
        "(blackout of family opencode until 2026-01-01 08:00)"
    )
    unavailable = Healing("failed", "model_unavailable", "fake/missing", "backup/good-model", "x")
    done = WaitResult("finished", "backup/good-model", "", 3.0, (unavailable,))
    assert wait_text(done, 20, tz, 0) == (
        "model unavailable on fake/missing, healed: ran on backup/good-model and already finished"
    )
    assert wait_text(WaitResult("running", "fake/fake-model", "", 1.0), 20, tz, 0) == (
        "running on fake/fake-model"
    )
    assert wait_text(WaitResult("no_sign", "", "", 20.0), 20, tz, 0) == (
        "no sign of a run within 20 s"
    )
    failed = WaitResult("failed", "x/y", "APIError: HTTP 401: bad key", 1.0)
    assert wait_text(failed, 20, tz, 0) == "failed: APIError: HTTP 401: bad key"
    again = WaitResult("failed", "backup/good-model", "APIError: HTTP 401", 9.0, (healed,))
    assert wait_text(again, 20, tz, 0) == (
        "rate-limited on opencode/free-model, re-sent on backup/good-model; "
        "failed: APIError: HTTP 401 (blackout of family opencode until 2026-01-01 08:00)"
    )


def test_verdict_and_healing_text() -> None:
    s = see(RETRY, [user("m1"), assistant("m2")])
    line = verdict_text(judge(s), UTC, 1_900_000_000_000 - 3_599_000)
    assert line == (
        f"retrying on opencode/free-model (attempt 2): {RATE}; "
        "next try at 2030-03-17 17:46:40 (in 59 min)"
    )
    none_left = Healing("failed", "rate_limited", "backup/good-model", None, "429", "opencode", 0)
    assert healing_text(none_left, UTC) == (
        "rate-limited on backup/good-model: no usable model left in the chain "
        "(blackout of family opencode until ?)"  # 0: no readable end
    )


def test_a_run_waiting_for_a_person_has_started_and_is_not_healed() -> None:
    from dataclasses import replace

    from xaf_hub.core.records import Waiting

    s = see(BUSY, [user("m1"), assistant("m2")])
    waiting = replace(s, rec=replace(s.rec, waiting=Waiting("permission", "per_1", "ls",
                                                            permission="bash")))
    v = judge(waiting)
    assert (v.state, v.detail) == ("waiting", "waiting for a person: permission bash: ls")
    assert wait_step(waiting, v) == ("started", None)
