"""A person's decision (ops.decisions) and how fill_slots settles around it (pure parts)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from xaf_hub.core.outcomes import Stop
from xaf_hub.core.records import SessionRecord
from xaf_hub.core.runstate import LastRun
from xaf_hub.ops.decisions import Decision, decisions_from, operator_interrupts
from xaf_hub.patrol.settle import Sighting, failure_of, settle
from xaf_hub.store.tasks import Task, format_instant

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
E401 = {"name": "APIError", "data": {"message": "Incorrect API key", "statusCode": 401}}
E500 = {"name": "APIError", "data": {"message": "upstream", "statusCode": 500}}
NOT_FOUND = {"name": "ProviderModelNotFoundError", "data": {"message": "model not found"}}


def row(*, ago: timedelta = timedelta(minutes=10), steered: timedelta | None = None) -> Task:
    return Task(
        id="T1",
        title="build the export",
        status="dispatched",
        session_id="ses_1",
        dispatched_to="lan-b",
        dispatched_at=format_instant(NOW - ago),
        steered_at=None if steered is None else format_instant(NOW - steered),
    )


def idle() -> SessionRecord:
    return SessionRecord(instance="lan-b", id="ses_1", title="t", directory="/p/app")


def stop(ago: timedelta, who: str = "alice@box") -> Stop:
    return Stop("person", (NOW - ago).timestamp(), who)


def test_operator_interrupts_reads_the_audit_tail(tmp_path: Path) -> None:
    lines = [
        "{torn line",
        json.dumps(
            {
                "time": "2026-11-30T12:00:00+0000",
                "command": "interrupt",
                "instance": "lan-b",
                "session": "ses_1",
                "result": "aborted",
            }
        ),
        json.dumps(
            {
                "time": "2026-11-30T12:05:00+0000",
                "command": "interrupt",
                "instance": "lan-b",
                "session": "ses_1",
                "result": "aborted",
            }
        ),
        json.dumps(
            {
                "time": "2026-11-30T12:06:00+0000",
                "command": "interrupt",
                "instance": "lan-b",
                "session": "ses_2",
                "result": "failed",
            }
        ),
        json.dumps(
            {
                "time": "2026-11-30T12:07:00+0000",
                "command": "dispatch",
                "instance": "lan-b",
                "session": "ses_3",
                "result": "create",
                "reason": "interrupt",
            }
        ),
    ]
    (tmp_path / "audit.log").write_text("\n".join(lines) + "\n", "utf-8")
    found = operator_interrupts(tmp_path)
    at = datetime(2026, 11, 30, 12, 5, tzinfo=UTC).timestamp()
    assert found == {("lan-b", "ses_1"): Stop("person", at, "someone")}
    assert operator_interrupts(tmp_path / "missing") == {}


def test_an_interrupt_counts_from_before_its_abort(tmp_path: Path) -> None:
    """`xaf-hub interrupt` writes "stopping" before its abort: a round that sees the run stopped
    must find it already. A failed abort keeps it (a timed-out one may have reached the server)."""

    def line(minute: int, session: str, result: str) -> str:
        return json.dumps({"time": f"2026-11-30T12:{minute:02d}:00+0000", "command": "interrupt",
                           "instance": "lan-b", "session": session, "result": result})

    def at(minute: int) -> Stop:
        when = datetime(2026, 11, 30, 12, minute, tzinfo=UTC).timestamp()
        return Stop("person", when, "someone")

    audit = tmp_path / "audit.log"
    audit.write_text(line(1, "ses_1", "stopping") + "\n", "utf-8")
    assert operator_interrupts(tmp_path) == {("lan-b", "ses_1"): at(1)}  # the abort under way
    lines = [
        line(1, "ses_1", "stopping"), line(2, "ses_1", "aborted"),
        line(3, "ses_2", "stopping"), line(3, "ses_2", "failed"),
        line(4, "ses_3", "failed"),  # a failure alone (an old hub's line) is no interrupt
    ]
    audit.write_text("\n".join(lines) + "\n", "utf-8")
    assert operator_interrupts(tmp_path) == {("lan-b", "ses_1"): at(2), ("lan-b", "ses_2"): at(3)}


def test_the_run_ceiling_stop_is_read_from_the_audit_as_a_decision(tmp_path: Path) -> None:
    """The hub's own stop past a run ceiling (either origin) is a stop of kind ceiling: no
    patrol job resumes the run, and every view says the run was stopped at its ceiling."""

    def line(minute: int, command: str, session: str, result: str) -> str:
        return json.dumps({"time": f"2026-11-30T12:{minute:02d}:00+0000", "command": command,
                           "instance": "lan-b", "session": session, "result": result})

    lines = [
        line(1, "patrol.run_ceiling", "ses_1", "aborted"),
        line(2, "patrol.live.run_ceiling", "ses_2", "abort failed"),
        line(4, "run_ceiling", "ses_4", "aborted"),  # not the hub's command
    ]
    (tmp_path / "audit.log").write_text("\n".join(lines) + "\n", "utf-8")
    found = operator_interrupts(tmp_path)
    assert {k[1]: (v.kind, v.who) for k, v in found.items()} == {
        "ses_1": ("ceiling", "the run ceiling"), "ses_2": ("ceiling", "the run ceiling"),
    }
    decided = decisions_from(found, []).for_session("lan-b", "ses_1", 0)
    assert decided is not None and decided.kind == "ceiling"
    assert decided.text.startswith("stopped over its run ceiling at ")
    assert decisions_from(found, []).for_session("lan-b", "ses_4", 0) is None


def test_a_stop_at_the_run_ceiling_is_a_decision_from_before_its_abort(tmp_path: Path) -> None:
    """The ceiling's stop (round or daemon) writes "stopping" before its abort: from then on
    no job resumes or heals the run it stopped, whatever its abort did; a new prompt after it
    is a new run, which the stop does not govern."""

    def line(minute: int, command: str, result: str) -> str:
        return json.dumps({"time": f"2026-11-30T12:{minute:02d}:00+0000", "command": command,
                           "instance": "lan-b", "session": "ses_1", "result": result})

    audit = tmp_path / "audit.log"
    for command in ("patrol.run_ceiling", "patrol.live.run_ceiling"):
        for result in ("stopping", "aborted", "abort failed"):
            audit.write_text(line(5, command, result) + "\n", "utf-8")
            at = datetime(2026, 11, 30, 12, 5, tzinfo=UTC).timestamp()
            assert operator_interrupts(tmp_path) == {
                ("lan-b", "ses_1"): Stop("ceiling", at, "the run ceiling")
            }
    people = decisions_from(operator_interrupts(tmp_path), [])
    run_at = int(datetime(2026, 11, 30, 12, 1, tzinfo=UTC).timestamp() * 1000)
    decision = people.for_session("lan-b", "ses_1", run_at)
    assert decision is not None and decision.kind == "ceiling"
    assert decision.text.startswith("stopped over its run ceiling at ")
    assert people.for_session("lan-b", "ses_1", run_at + 10 * 60_000) is None  # a new prompt
    assert people.for_task(row(ago=timedelta(minutes=70))) is not None


def test_operator_interrupts_keep_who_stopped_it(tmp_path: Path) -> None:
    entry = {
        "time": "2026-11-30T12:05:00+0000",
        "who": {"caller": "", "user": "alice", "host": "box"},
        "command": "interrupt",
        "instance": "lan-b",
        "session": "ses_1",
        "result": "aborted",
    }
    (tmp_path / "audit.log").write_text(json.dumps(entry) + "\n", "utf-8")
    [(key, found)] = operator_interrupts(tmp_path).items()
    assert key == ("lan-b", "ses_1") and found.who == "alice@box"
    entry["who"] = {"caller": "lead-agent", "user": "alice", "host": "box"}
    (tmp_path / "audit.log").write_text(json.dumps(entry) + "\n", "utf-8")
    assert operator_interrupts(tmp_path)[key].who == "lead-agent@box"


def test_an_interrupt_after_the_last_prompt_is_a_decision() -> None:
    people = decisions_from({("lan-b", "ses_1"): stop(timedelta(minutes=1))}, [])
    decision = people.for_task(row(ago=timedelta(minutes=5)))
    assert decision is not None and decision.kind == "interrupted"
    assert decision.text.startswith("interrupted by alice@box at 2026-11-30 ")
    # An interrupt before the row's (last) prompt was answered by a new dispatch: not a decision.
    earlier = decisions_from({("lan-b", "ses_1"): stop(timedelta(minutes=9))}, [])
    assert earlier.for_task(row(ago=timedelta(minutes=5))) is None
    # Another session's interrupt says nothing about this one.
    other = decisions_from({("lan-b", "ses_2"): stop(timedelta(minutes=1))}, [])
    assert other.for_task(row()) is None


def test_a_row_steered_by_hand_is_a_decision_for_its_session_too() -> None:
    steered = row(steered=timedelta(minutes=2))
    people = decisions_from({}, [steered, row()])
    decision = people.for_task(steered)
    assert decision is not None and decision.kind == "steered"
    assert "steered by hand" in decision.text
    assert people.for_task(row()) is None
    by_session = people.for_session("lan-b", "ses_1", None)
    assert by_session is not None and by_session.kind == "steered"
    assert people.for_session("lan-c", "ses_1", None) is None
    # A session interrupted after its run started: interrupted wins over steered.
    both = decisions_from({("lan-b", "ses_1"): stop(timedelta(minutes=1))}, [steered])
    run_ms = int((NOW - timedelta(minutes=3)).timestamp() * 1000)
    found = both.for_session("lan-b", "ses_1", run_ms)
    assert found is not None and found.kind == "interrupted"
    # An interrupt before the run it would stop does not cover that run.
    late_ms = int(NOW.timestamp() * 1000)
    assert (
        decisions_from({("lan-b", "ses_1"): stop(timedelta(minutes=1))}, []).for_session(
            "lan-b", "ses_1", late_ms
        )
        is None
    )


DECIDED = "interrupted by alice@box at 2026-11-30 12:00 UTC"


@pytest.mark.parametrize(
    "run",
    [
        LastRun("pending"),  # the steers queued behind the stopped run: "never answered"
        LastRun("interrupted"),
        LastRun("failed", error=E500),
        None,
    ],
)
def test_a_decision_turns_every_requeue_into_needs_a_person(run: LastRun | None) -> None:
    seen = Sighting(session=idle(), run=run, decision=DECIDED)
    verdict = settle(row(), seen, NOW, 90.0, timedelta(seconds=1))
    if run is None:
        assert verdict.action == "keep" and not verdict.person  # unreadable: no judgement
        return
    assert (verdict.action, verdict.person, verdict.reason) == ("keep", True, DECIDED)
    # Without the decision the same sighting is requeued (or kept for a human).
    plain = settle(row(), Sighting(session=idle(), run=run), NOW, 90.0, timedelta(seconds=1))
    assert plain.action in ("requeue", "keep") and not plain.person


def test_a_decided_task_that_finished_is_still_done() -> None:
    seen = Sighting(session=idle(), run=LastRun("succeeded"), decision=DECIDED)
    assert settle(row(), seen, NOW, 90.0).action == "done"


def test_a_decision_about_a_gone_session_keeps_the_row() -> None:
    verdict = settle(row(), Sighting(session=None, decision=DECIDED), NOW, 90.0)
    assert (verdict.action, verdict.person) == ("keep", True)


def test_no_answer_grace_is_the_callers() -> None:
    seen = Sighting(session=idle(), run=LastRun("pending"))
    young = row(ago=timedelta(seconds=30))
    assert settle(young, seen, NOW, 90.0).action == "keep"  # default grace: 2 minutes
    assert settle(young, seen, NOW, 90.0, timedelta(seconds=20)).action == "requeue"


def test_the_young_row_rule_is_the_callers() -> None:
    seen = Sighting(session=idle(), run=LastRun("succeeded"))
    fresh = row(ago=timedelta(seconds=5))
    kept = settle(fresh, seen, NOW, 90.0)  # default: 10 s
    assert (kept.action, kept.reason) == ("keep", "just dispatched; its prompt may not show yet")
    short = settle(fresh, seen, NOW, 90.0, young=timedelta(seconds=2))
    assert short.action == "done"


@pytest.mark.parametrize(
    ("error", "named"),
    [
        (E401, True),
        ({"name": "APIError", "data": {"statusCode": 403, "message": "forbidden"}}, True),
        ({"name": "ProviderAuthError", "data": {"providerID": "x", "message": "bad key"}}, True),
        (NOT_FOUND, True),
        (E500, False),
        ({"name": "APIError", "data": {"statusCode": 429, "message": "rate"}}, False),
        (None, False),
    ],
)
def test_failures_that_name_the_model(error: dict[str, object] | None, named: bool) -> None:
    assert failure_of(error)[1] is named
    if error is not None:
        verdict = settle(row(), Sighting(session=idle(), run=LastRun("x", error=error)), NOW, 90.0)
        assert verdict.action == "requeue" and verdict.model_named is named


def test_a_prompt_the_hub_never_sent_is_resent_without_back_off() -> None:
    seen = Sighting(session=idle(), run=LastRun("not_started"))
    verdict = settle(row(), seen, NOW, 90.0)
    assert (verdict.action, verdict.infrastructure, verdict.backoff) == ("requeue", True, False)


def test_decision_text_names_the_kind() -> None:
    assert Decision("steered", "", 0.0).text.startswith("steered by hand at ")
