"""Reservation liveness rules (SPEC §6a) with an injected clock and process table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.store.cases import LIVENESS_CASES, PROMPT_CASES
from xaf_hub.config.load import LockConfig
from xaf_hub.errors import BusyError
from xaf_hub.store.gate import FileGate, Gate, safe_name

CFG = LockConfig(slot_ttl_seconds=60, lock_timeout_seconds=0.2, slot_grace_seconds=5)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(tmp_path: Path, alive: set[int] | None = None, host: str = "h1") -> tuple[Gate, Clock]:
    clock = Clock()
    pids = alive if alive is not None else set()
    return FileGate(tmp_path, CFG, host=host, clock=clock, alive=lambda p: p in pids), clock


def test_reserve_attach_release(tmp_path: Path) -> None:
    import os

    gate, clock = make(tmp_path, {os.getpid()})
    res = gate.reserve("lan-a")
    data = json.loads(res.path.read_text())
    assert data["pid"] == os.getpid() and data["host"] == "h1" and data["session_id"] == ""
    clock.t += 30
    res = gate.attach(res, "ses_1")
    assert json.loads(res.path.read_text())["created"] == clock.t  # timer restarted
    assert len(gate.live_reservations("lan-a", set())) == 1  # within grace
    gate.release(res)
    assert gate.live_reservations("lan-a") == []


@pytest.mark.parametrize(("age", "session", "running", "alive", "host", "live"), LIVENESS_CASES)
def test_liveness(
    tmp_path: Path,
    age: float,
    session: str,
    running: set[str] | None,
    alive: bool,
    host: str,
    live: bool,
) -> None:
    gate, clock = make(tmp_path, {4242} if alive else set())
    slots = tmp_path / "slots"
    slots.mkdir()
    path = slots / "lan-a.t.slot"
    path.write_text(
        json.dumps(
            {
                "instance": "lan-a",
                "pid": 4242,
                "host": host,
                "created": clock.t - age,
                "session_id": session,
            }
        )
    )
    assert bool(gate.live_reservations("lan-a", running)) is live
    assert path.exists() is live  # dead ones are removed when the gate is read


@pytest.mark.parametrize(("age", "prompt", "running", "alive", "seen", "live"), PROMPT_CASES)
def test_liveness_by_prompt_state(
    tmp_path: Path,
    age: float,
    prompt: str,
    running: set[str] | None,
    alive: bool,
    seen: float | None,
    live: bool,
) -> None:
    gate, clock = make(tmp_path, {4242} if alive else set())
    created = clock.t - age
    doc = {"instance": "lan-a", "pid": 4242, "host": "h1", "created": created,
           "session_id": "ses_1", "prompt": prompt}
    slots = tmp_path / "slots"
    slots.mkdir()
    (slots / "lan-a.t.slot").write_text(json.dumps(doc))
    observed = None if seen is None else created + seen
    assert bool(gate.live_reservations("lan-a", running, observed)) is live
    assert (slots / "lan-a.t.slot").exists() is live


def test_file_lock_is_owned_while_held(tmp_path: Path) -> None:
    gate, _ = make(tmp_path)
    assert not gate.owns_lock("lan-a")
    with gate.lock("lan-a"):
        assert gate.owns_lock("lan-a") and not gate.owns_lock("lan-b")
    assert not gate.owns_lock("lan-a")


def test_pending_counts_a_running_session_once(tmp_path: Path) -> None:
    import os

    gate, _ = make(tmp_path, {os.getpid()})
    gate.attach(gate.reserve("lan-a"), "ses_run")
    gate.reserve("lan-a")
    assert len(gate.live_reservations("lan-a", {"ses_run"})) == 2
    assert len(gate.pending("lan-a", {"ses_run"})) == 1


def test_truncated_slot_counts_until_ttl(tmp_path: Path) -> None:
    gate, clock = make(tmp_path)
    slots = tmp_path / "slots"
    slots.mkdir()
    bad = slots / "lan-a.cut.slot"
    bad.write_text('{"instance": "lan-a", "pi')
    clock.t = bad.stat().st_mtime + 1
    assert len(gate.live_reservations("lan-a")) == 1
    clock.t += 120
    assert gate.live_reservations("lan-a") == [] and not bad.exists()


def test_instances_do_not_share_slots(tmp_path: Path) -> None:
    import os

    gate, _ = make(tmp_path, {os.getpid()})
    gate.reserve("lan-a")
    gate.reserve("lan-a.b/c")
    assert len(gate.live_reservations("lan-a")) == 1
    assert len(gate.live_reservations("lan-a.b/c")) == 1
    assert safe_name("lan-a.b/c") == "lan-a.b_c"


def test_lock_times_out_with_busy_error(tmp_path: Path) -> None:
    gate, _ = make(tmp_path)
    other = FileGate(tmp_path, CFG)
    with gate.lock("lan-a"):
        with pytest.raises(BusyError, match="dispatch lock"), other.lock("lan-a"):
            pass
        with other.lock("lan-b"):
            pass  # another instance's lock is independent
    with other.lock("lan-a"):
        pass
