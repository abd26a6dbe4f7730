"""Hostile servers: one instance attacks, the others are still shown, nothing leaks.

lan-c is replaced by a ``HostileServer`` (tests/e2e/hostile.py) that misbehaves in one way per
mode, while local-a and lan-b stay real, healthy opencode servers. For every (mode, command)
case the command runs as its own process and must:

* end: a generous subprocess timeout is the failure signal (a hang fails the case; there is
  no assertion on speed), since every scan is bounded by ``timeouts.scan_seconds``;
* exit with the documented code (0: some instance answered);
* show the healthy instance and its session, and report the hostile one either unreachable
  with a one-line reason or with its odd values made harmless (unknown time, zero cost);
* leave no password, in any form, in stdout, stderr or any file it wrote;
* write strict JSON (no NaN / Infinity) and CSV cells no spreadsheet runs as a formula.

tests/conftest.py prints the case table at the end of the run.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import fleet as sandbox
from sandbox.fake_llm import FakeLLM
from tests.e2e.hostile import FORMULAS, MODES, HostileServer
from tests.e2e.leaks import leaks
from tests.fleet import Hub, make_hub

pytestmark = pytest.mark.e2e

BAD = "lan-c"
HEALTHY = ("local-a", "lan-b")
# The scan deadline ends the "endless" and "slow-body" cases (about 11 runs each), so it is most
# of this module's time; 5 s is still well above a healthy instance's scan on a loaded machine.
SCAN_SECONDS = 5
# Far beyond any scan deadline: reaching it means the command hung, which fails the case.
HANG_SECONDS = 240
COMMANDS = ("instances", "status", "sessions", "exports", "serve", "patrol")

# Per mode: None when the instance must still be shown (its odd values made harmless), else
# fragments of the one-line reason it is reported unreachable with (any one of them).
UNREACHABLE: dict[str, tuple[str, ...] | None] = {
    # The session cap (100k) ends it, or the scan deadline first on a loaded machine.
    "endless": ("endless pagination?", "timed out"),
    "slow-body": ("timed out",),
    "huge-body": ("answer larger than 64 MB",),
    "bad-next": None,
    "time-inf": None,
    "time-huge": None,
    "nan-cost": None,
    "types": None,
    "echo-auth": ("HTTP 400: bad request; you sent Authorization: Basic *** (***)",),
    "formula": None,
}


@dataclass
class Run:
    code: int
    out: str
    err: str


@dataclass
class Case:
    hub: Hub
    server: HostileServer
    exports: Path
    healthy_id: str
    secrets: list[str]

    @property
    def home(self) -> Path:
        return Path(self.hub.env["XAF_HUB_HOME"])

    def run(self, *args: str) -> Run:
        proc = self.hub.popen(*args)
        try:
            out, err = proc.communicate(timeout=HANG_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"{args} did not end within {HANG_SECONDS}s (hung)")
        self.clean(out + err, args)
        assert "Traceback" not in err and "internal error" not in err, err
        return Run(proc.returncode, out, err)

    def clean(self, text: str, where: object) -> None:
        found = leaks(text, self.secrets)
        assert not found, (where, found)

    def files_clean(self) -> None:
        for p in [*self.home.rglob("*"), *self.exports.rglob("*")]:
            if p.is_file():
                self.clean(p.read_bytes().decode("utf-8", "replace"), p)

    def check_bad(self, mode: str, reachable: bool, reason: str) -> None:
        """The hostile instance: unreachable with its one-line reason, or shown as expected."""
        expected = UNREACHABLE[mode]
        if expected is None:
            assert reachable, (mode, reason)
        else:
            assert not reachable, mode
            assert any(e in reason for e in expected), (mode, reason)
            assert "\n" not in reason and len(reason) < 300, reason


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def case(
    fleet: sandbox.Fleet, llm: FakeLLM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Case]:
    llm.reset()
    tmp = tmp_path_factory.mktemp("hostile")
    home = tmp / "hubhome"
    home.mkdir()
    hub = make_hub(
        fleet,
        llm,
        tmp,
        home,
        {"name": "hostile"},
        timeouts={"connect_seconds": 2, "read_seconds": 3, "scan_seconds": SCAN_SECONDS},
        retries=0,
    )
    exports = tmp / "exports"
    exports.mkdir()
    healthy = hub.session("local-a", "hostile healthy a")
    with HostileServer(str(hub.root / "app")) as server:
        hub.set_instance(BAD, url=server.url)
        yield Case(hub, server, exports, healthy, hub.secrets())


# ---------------------------------------------------------------------------------------------
# One check per command


def check_instances(c: Case, mode: str) -> None:
    r = c.run("instances", "--json")
    assert r.code == 0, r.err
    rows = {i["name"]: i for i in strict_json(r.out)}
    assert all(rows[n]["reachable"] for n in HEALTHY), rows
    assert rows["local-a"]["project_sessions"] >= 1
    c.check_bad(mode, rows[BAD]["reachable"], rows[BAD]["reason"])


def check_status(c: Case, mode: str) -> None:
    r = c.run("status", "--json")
    assert r.code == 0, r.err
    rows = {i["instance"]: i for i in strict_json(r.out)["instances"]}
    assert all(rows[n]["reachable"] for n in HEALTHY), rows
    c.check_bad(mode, rows[BAD]["reachable"], rows[BAD]["reason"].removeprefix("unreachable: "))
    r = c.run("status")  # the table too
    assert r.code == 0 and "local-a" in r.out, r.err


def _sessions(c: Case, mode: str, doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rows = {s["id"]: s for s in doc["sessions"]}
    assert c.healthy_id in rows
    down = {u["instance"]: u["reason"] for u in doc["unreachable"]}
    c.check_bad(mode, BAD not in down, down.get(BAD, ""))
    bad = {k: v for k, v in rows.items() if v["instance"] == BAD}
    if mode in ("time-inf", "time-huge"):
        assert bad["ses_hostileodd"]["updated"] == 0  # unknown, not year 3 billion
    if mode == "nan-cost":
        assert bad["ses_hostileodd"]["cost"] is None  # unknown, never a silent 0
    if mode == "bad-next":
        assert (bad["ses_hostileretry"]["run_state"], bad["ses_hostileretry"]["retry_next"]) == (
            "retry",
            0,
        )
    if mode == "types":
        assert set(bad) == {"ses_hostiletypes", "ses_hostilemodel"}
    if mode == "formula":
        assert {v["title"] for v in bad.values()} == set(FORMULAS)  # JSON keeps them as sent
    return rows


def check_sessions(c: Case, mode: str) -> None:
    r = c.run("sessions", "--json")
    assert r.code == 0, r.err
    _sessions(c, mode, strict_json(r.out))
    r = c.run("sessions")  # the table too
    assert r.code == 0 and c.healthy_id in r.out, r.err
    if mode == "types":
        assert "skipped 3 entries of /experimental/session" in r.err


def check_exports(c: Case, mode: str) -> None:
    out = c.exports / mode
    out.mkdir()
    r = c.run("sessions", "--out", str(out / "s.csv"), "--html", str(out / "s.html"))
    assert r.code == 0, r.err
    r = c.run("sessions", "--out", str(out / "s.json"))
    assert r.code == 0, r.err
    _sessions(c, mode, strict_json((out / "s.json").read_text("utf-8")))
    rows = list(csv.reader(io.StringIO((out / "s.csv").read_text("utf-8-sig"), newline="")))
    titles = {row[1]: row[7] for row in rows[1:]}
    assert titles[c.healthy_id] == "hostile healthy a"
    # A spreadsheet would run none of these cells.
    assert not any(cell[:1] in "=+-@\t\r" and cell for row in rows for cell in row if cell)
    if mode == "formula":
        assert sorted(v for k, v in titles.items() if "formula" in k) == sorted(
            "'" + t for t in FORMULAS
        )
    page = (out / "s.html").read_text("utf-8")
    assert "hostile healthy a" in page
    if mode in ("time-inf", "time-huge"):
        assert "unknown" in page


def check_serve(c: Case, mode: str) -> None:
    proc = c.hub.popen("serve", "--port", "0", "--cache-seconds", "0")
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        # Generous client timeout: only a hang reaches it.
        with httpx.Client(timeout=HANG_SECONDS, trust_env=False) as client:
            health = client.get(url + "health")
            page = client.get(url)
            api = client.get(url + "api/snapshot")
        assert health.status_code == 200, health.text
        doc = strict_json(health.text)
        assert doc["ok"] and doc["reachable"] >= len(HEALTHY)
        assert page.status_code == 200 and "hostile healthy a" in page.text
        _sessions(c, mode, strict_json(api.text))
        c.clean(page.text + api.text, "served page")
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=HANG_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail("serve did not stop")
    c.clean(err, "serve stderr")


def check_patrol(c: Case, mode: str) -> None:
    r = c.run("patrol", "--once", "--no-design", "--no-fill")
    assert r.code == 0, r.err + r.out
    doc = strict_json((c.home / "patrol" / "report-latest.json").read_text("utf-8"))
    rows = {i["name"]: i for i in doc["instances"]}
    assert all(rows[n]["reachable"] for n in HEALTHY), rows
    c.check_bad(mode, rows[BAD]["reachable"], rows[BAD]["reason"])


CHECKS = {
    "instances": check_instances,
    "status": check_status,
    "sessions": check_sessions,
    "exports": check_exports,
    "serve": check_serve,
    "patrol": check_patrol,
}
CASES = [(m, c) for m in MODES for c in COMMANDS]


@pytest.mark.parametrize(("mode", "command"), CASES, ids=[f"{m}-{c}" for m, c in CASES])
def test_case(case: Case, mode: str, command: str) -> None:
    case.server.mode = mode
    CHECKS[command](case, mode)
    case.files_clean()
