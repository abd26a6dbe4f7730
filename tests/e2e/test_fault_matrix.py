"""The fault matrix: every command with one instance failing in each way a real one fails.

lan-c is replaced by a fault (tests/e2e/faulty.py) while local-a and lan-b stay real, healthy
opencode servers. For every (fault, command) cell the test checks the exit code, the one-line
reason naming the fault, that the healthy instances are still reported (and still served),
and that nothing was written where a write was not completed. Commands aimed at the faulty
instance alone (``--instance lan-c``) must exit 2.

Timeouts are small (connect 1 s, read 3 s, no retry) so the "never answers" and "slow
endpoint" cells end quickly; each invocation is asserted to end well within a loose bound
(no hang), which is behaviour, not a speed target. tests/conftest.py prints the matrix as a
table at the end of the run.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from sandbox.fake_llm import FakeLLM
from tests.e2e.faulty import FAULTS, FaultKit
from tests.fleet import Hub, make_hub

pytestmark = pytest.mark.e2e

COMMANDS = (
    "instances",
    "sessions",
    "status",
    "dispatch",
    "cleanup",
    "interrupt",
    "watch",
    "patrol",
)
BAD = "lan-c"
HEALTHY = ("local-a", "lan-b")
READ_TIMEOUT = 3
# Loose: a hung request must end at its timeout; a whole command must never take this long.
NO_HANG_SECONDS = 30.0

REASONS = {
    "refused": r"connection refused",
    "dns": r"DNS lookup failed",
    "hang": rf"no answer within {READ_TIMEOUT}s \(timed out\)",
    "401": r"auth rejected \(HTTP 401\)",
    "500": r"server error \(HTTP 500\)",
    "truncated": r"truncated",
    "html": r"HTML page instead of JSON",
    "shape": r"unexpected response shape",
    "slow": rf"no answer within {READ_TIMEOUT}s \(timed out\)",
}


@dataclass
class Result:
    code: int
    out: str
    err: str
    seconds: float

    def json(self) -> Any:
        assert self.out.strip(), f"no JSON on stdout (exit {self.code}): {self.err}"
        return json.loads(self.out)


@dataclass
class Matrix:
    """The shared set-up: one hub, the fault servers, and the sessions the cells look for."""

    hub: Hub
    kit: FaultKit
    real_c: str
    busy_a: str = ""
    idle_b: str = ""
    idle_c: str = ""
    pinned_task: str = "MX-C"
    fault: str = ""
    audit_mark: int = 0
    secrets: list[str] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return Path(self.hub.env["XAF_HUB_HOME"])

    def inject(self, fault: str) -> None:
        self.fault = fault
        self.hub.set_instance(BAD, url=self.kit.url(fault))

    def cli(self, *args: str) -> Result:
        t0 = time.monotonic()
        code, out, err = self.hub.cli(*args)
        r = Result(code, out, err, time.monotonic() - t0)
        assert r.seconds < NO_HANG_SECONDS, f"{args} took {r.seconds:.1f}s (hung?)"
        assert "Traceback" not in err, err
        for pw in self.secrets:
            assert pw not in out + err
        return r

    def reason_ok(self, reason: str) -> None:
        """The reason is one short line that names this fault."""
        assert reason and "\n" not in reason and len(reason) < 200, reason
        assert re.search(REASONS[self.fault], reason), (self.fault, reason)

    def error_line(self, r: Result) -> str:
        """The single `xaf-hub: error:` line of a failed run (it names the instance)."""
        lines = [ln for ln in r.err.splitlines() if ln.startswith("xaf-hub: error:")]
        assert len(lines) == 1, r.err
        assert BAD in lines[0], lines[0]
        self.reason_ok(lines[0].split("unreachable: ", 1)[-1])
        return lines[0]

    def files(self) -> dict[str, bytes]:
        """Every state file under the hub home except the audit log, reports and locks."""
        out = {}
        for p in sorted(self.home.rglob("*")):
            rel = p.relative_to(self.home).as_posix()
            skip = rel.endswith(".lock") or rel.startswith("patrol/") or rel == "audit.log"
            if p.is_file() and not skip:
                out[rel] = p.read_bytes()
        return out

    def audit(self) -> list[dict[str, Any]]:
        path = self.home / "audit.log"
        if not path.exists():
            return []
        return [json.loads(ln) for ln in path.read_text("utf-8").splitlines()]

    def bad_writes(self) -> list[dict[str, Any]]:
        """Audit lines (after the set-up) that claim a completed write on the faulty instance."""
        return [
            e
            for e in self.audit()[self.audit_mark :]
            if e["instance"] == BAD and e["result"] != "failed"
        ]

    def slots(self, instance: str = BAD) -> list[Path]:
        return sorted((self.home / "slots").glob(f"{instance}.*.slot"))

    def task(self, task_id: str) -> dict[str, Any]:
        pool = json.loads((self.home / "tasks_backlog.json").read_text("utf-8"))
        return next(t for t in pool["tasks"] if t["id"] == task_id)


def _hub(fleet: sandbox.Fleet, llm: FakeLLM, tmp: Path) -> Hub:
    home = tmp / "hubhome"
    home.mkdir()
    return make_hub(
        fleet,
        llm,
        tmp,
        home,
        {"name": "matrix"},
        timeouts={"connect_seconds": 2, "read_seconds": READ_TIMEOUT},
        retries=0,
        lock={"slot_ttl_seconds": 60, "lock_timeout_seconds": 10, "slot_grace_seconds": 1},
    )


@pytest.fixture(scope="module")
def mx(
    fleet: sandbox.Fleet, llm: FakeLLM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Matrix]:
    llm.reset()
    hub = _hub(fleet, llm, tmp_path_factory.mktemp("matrix"))
    real_c = hub.server(BAD).url
    with FaultKit(slow_target=real_c) as kit:
        m = Matrix(hub, kit, real_c, secrets=hub.secrets())
        # A run that stays busy on local-a all along, so "running" has something to report.
        llm.set_mode("slow-model", "slow", delay=600)
        m.busy_a = hub.session("local-a", "matrix busy work")
        hub.prompt("local-a", m.busy_a, "keep going", "fake/slow-model")
        hub.wait_for(lambda: m.busy_a in hub.status("local-a", hub.root / "app"), timeout=60)
        m.idle_b = hub.session("lan-b", "matrix idle work b")
        # A session on the real lan-c gives the slow proxy a /session/status call to stall.
        m.idle_c = hub.session(BAD, "matrix idle work c")
        # A task dispatched to lan-c: while lan-c is down the patrol must leave it alone.
        code, out, err = hub.cli(
            "backlog", "add", "--title", "pinned to c", "--id", m.pinned_task, "--instance", BAD
        )
        assert code == 0, err
        code, out, err = hub.cli(
            "backlog",
            "set",
            m.pinned_task,
            "--status",
            "dispatched",
            "--session",
            m.idle_c,
            "--to",
            BAD,
        )
        assert code == 0, err
        m.audit_mark = len(m.audit())
        try:
            yield m
        finally:
            sandbox.abort(hub.server("local-a").url, hub.password("local-a"), m.busy_a)
            llm.reset()


# ---------------------------------------------------------------------------------------------
# One check per command


def check_instances(m: Matrix) -> None:
    r = m.cli("instances", "--json")
    assert r.code == 0, r.err
    rows = {i["name"]: i for i in r.json()}
    assert not rows[BAD]["reachable"]
    m.reason_ok(rows[BAD]["reason"])
    for name in HEALTHY:
        assert rows[name]["reachable"] and rows[name]["project_sessions"] >= 1, rows[name]
    assert rows["local-a"]["running_project"] >= 1

    r = m.cli("instances", "--instance", BAD)
    assert r.code == 2, r.err
    row = next(ln for ln in r.out.splitlines() if ln.startswith(BAD))
    m.reason_ok(row.split("UNREACHABLE: ", 1)[1])


def check_sessions(m: Matrix) -> None:
    r = m.cli("sessions", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert [u["instance"] for u in doc["unreachable"]] == [BAD]
    m.reason_ok(doc["unreachable"][0]["reason"])
    ids = {(s["instance"], s["id"]) for s in doc["sessions"]}
    assert {("local-a", m.busy_a), ("lan-b", m.idle_b)} <= ids
    assert not any(inst == BAD for inst, _ in ids)
    warned = [ln for ln in r.err.splitlines() if ln.startswith(f"warning: {BAD} unreachable")]
    assert len(warned) == 1

    r = m.cli("sessions", "--instance", BAD, "--json")
    assert r.code == 2
    assert r.json()["sessions"] == []


def check_status(m: Matrix) -> None:
    r = m.cli("status", "--json")
    assert r.code == 0, r.err
    rows = {i["instance"]: i for i in r.json()["instances"]}
    bad = rows[BAD]
    assert not bad["reachable"] and not bad["dispatchable"]
    m.reason_ok(bad["reason"].removeprefix("unreachable: "))
    for name in HEALTHY:
        assert rows[name]["reachable"], rows[name]
    assert rows["local-a"]["running_project"] >= 1

    r = m.cli("status", "--instance", BAD)
    assert r.code == 2
    line = next(ln for ln in r.err.splitlines() if ln.startswith(f"warning: {BAD} unreachable"))
    m.reason_ok(line.split("unreachable: ", 1)[1])


def check_dispatch(m: Matrix) -> None:
    # Aimed at the faulty instance: exit 2, one line, and no slot, task or write left behind.
    before = m.files()
    audit_before = len(m.audit())
    r = m.cli("dispatch", "--new", "--instance", BAD, "--text", f"matrix {m.fault} aimed at c")
    assert r.code == 2, r.err
    m.error_line(r)
    assert m.files() == before
    assert not m.slots()
    assert all(e["result"] == "failed" for e in m.audit()[audit_before:])

    # Not aimed: the healthy instances take the work.
    text = f"matrix {m.fault} dispatch"
    r = m.cli("dispatch", "--new", "--text", text, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["instance"] in HEALTHY and doc["action"] == "create"
    task = m.task(doc["task_id"])
    assert (task["status"], task["session_id"], task["dispatched_to"]) == (
        "dispatched",
        doc["session_id"],
        doc["instance"],
    )
    assert not m.slots()
    assert not m.bad_writes()


def check_cleanup(m: Matrix) -> None:
    r = m.cli("cleanup", "--ttl-days", "0", "--json")
    assert r.code == 0, r.err
    entries = {e["instance"]: e for e in r.json()["instances"]}
    m.reason_ok(entries[BAD]["skipped"].removeprefix("unreachable: "))
    assert not entries["lan-b"]["skipped"]
    assert m.idle_b in {s["id"] for s in entries["lan-b"]["stale"]}  # preview: listed, kept
    assert all(not e["deleted"] for e in entries.values())

    audit_before = len(m.audit())
    r = m.cli("cleanup", "--instance", BAD, "--ttl-days", "0", "--execute", "--json")
    assert r.code == 2, r.err
    assert r.json()["instances"][0]["deleted"] == []
    assert m.audit()[audit_before:] == []
    # The real lan-c still has its session: nothing was deleted behind the fault.
    assert sandbox.messages(m.real_c, m.hub.password(BAD), m.idle_c) == []


def check_interrupt(m: Matrix) -> None:
    r = m.cli("interrupt", "--session", m.idle_b, "--json")
    assert r.code == 0, r.err
    assert r.json()["instance"] == "lan-b"

    audit_before = len(m.audit())
    r = m.cli("interrupt", "--session", m.idle_c, "--instance", BAD)
    assert r.code == 2, r.err
    m.error_line(r)
    # Searched everywhere: not found on the instances that answered is not "no such session".
    r = m.cli("interrupt", "--session", m.idle_c)
    assert r.code == 2, r.err
    assert "may be there" in m.error_line(r)
    assert m.audit()[audit_before:] == []


def check_watch(m: Matrix) -> None:
    r = m.cli("watch", "--once", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert [u["instance"] for u in doc["unreachable"]] == [BAD]
    m.reason_ok(doc["unreachable"][0]["reason"])
    assert ("local-a", m.busy_a) in {(s["instance"], s["id"]) for s in doc["running"]}

    r = m.cli("watch", "--once", "--instance", BAD)
    assert r.code == 2
    line = next(ln for ln in r.err.splitlines() if ln.startswith(f"warning: {BAD} unreachable"))
    m.reason_ok(line.split("unreachable: ", 1)[1])


def check_patrol(m: Matrix) -> None:
    before = m.task(m.pinned_task)
    r = m.cli("patrol", "--once", "--no-design")
    assert r.code == 0, r.err + r.out
    doc = json.loads((m.home / "patrol" / "report-latest.json").read_text("utf-8"))
    assert all(s["status"] in ("ok", "skipped") for s in doc["steps"]), doc["steps"]
    rows = {i["name"]: i for i in doc["instances"]}
    assert not rows[BAD]["reachable"]
    m.reason_ok(rows[BAD]["reason"])
    assert all(rows[name]["reachable"] for name in HEALTHY)
    running = {(s["instance"], s["session"]) for s in doc["sessions"]["running"]}
    assert ("local-a", m.busy_a) in running
    # The task on the unreachable instance is neither settled nor sent back.
    assert m.task(m.pinned_task) == before
    assert not m.bad_writes()
    assert not m.slots()


CHECKS: dict[str, Callable[[Matrix], None]] = {
    "instances": check_instances,
    "sessions": check_sessions,
    "status": check_status,
    "dispatch": check_dispatch,
    "cleanup": check_cleanup,
    "interrupt": check_interrupt,
    "watch": check_watch,
    "patrol": check_patrol,
}

CELLS = [(f, c) for f in FAULTS for c in COMMANDS]


@pytest.mark.parametrize(("fault", "command"), CELLS, ids=[f"{f}-{c}" for f, c in CELLS])
def test_cell(mx: Matrix, fault: str, command: str) -> None:
    mx.inject(fault)
    CHECKS[command](mx)


def test_healthy_again(mx: Matrix) -> None:
    """With the fault gone every instance answers again: no state was poisoned by the faults."""
    mx.hub.set_instance(BAD, url=mx.real_c)
    r = mx.cli("status", "--json")
    assert r.code == 0 and all(i["reachable"] for i in r.json()["instances"])
