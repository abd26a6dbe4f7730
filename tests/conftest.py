"""Shared fixtures: every test gets its own hub home, so nothing touches ~/.xaf_hub."""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hubhome"
    home.mkdir()
    monkeypatch.setenv("XAF_HUB_HOME", str(home))
    monkeypatch.delenv("XAF_HUB_CONFIG", raising=False)
    for key in list(__import__("os").environ):
        if key.startswith("XAF_HUB_PW_"):
            monkeypatch.delenv(key)
    return home


def pytest_configure(config: pytest.Config) -> None:
    from sandbox.fleet import let_children_see_ctrl_c

    let_children_see_ctrl_c()  # the e2e tests stop `watch` and `serve` with Ctrl+C (SIGINT)


# The real-server fleet fixtures (tests/fleet.py) are shared by tests/e2e and tests/browser;
# registering them once here means one fleet per run, not one per folder.
pytest_plugins = ["tests.fleet", "tests.redis_fixture"]


# --- case tables: the fault matrix and the hostile-server cases ------------------------------
_TABLES = (
    ("test_fault_matrix.py::test_cell[", "fault matrix (faults x commands)", "fault"),
    ("test_hostile.py::test_case[", "hostile servers (attacks x commands)", "attack"),
)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print each case table (rows x commands, pass/fail) whose cells ran."""
    for marker, title, row_name in _TABLES:
        _table(terminalreporter, marker, title, row_name)


def _table(tr: pytest.TerminalReporter, marker: str, title: str, row_name: str) -> None:
    cells: dict[tuple[str, str], str] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for rep in tr.stats.get(outcome, []):
            nodeid = getattr(rep, "nodeid", "")
            if marker not in nodeid or (outcome == "passed" and rep.when != "call"):
                continue
            # Row names may hold dashes ("slow-body"); commands never do.
            row, _, command = nodeid.split("[", 1)[1].rstrip("]").rpartition("-")
            mark = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "skipped": "skip"}
            # A failure in teardown must not hide behind the call's pass.
            if cells.get((row, command)) in (None, "pass", "skip"):
                cells[(row, command)] = mark[outcome]
    if not cells:
        return
    rows = list(dict.fromkeys(r for r, _ in cells))
    commands = list(dict.fromkeys(c for _, c in cells))
    width = max(len(c) for c in commands) + 2
    first = max(len(r) for r in [*rows, row_name]) + 2
    tr.write_sep("=", title)
    tr.write_line(row_name.ljust(first) + "".join(c.ljust(width) for c in commands))
    for row in rows:
        line = "".join(cells.get((row, c), "-").ljust(width) for c in commands)
        tr.write_line(row.ljust(first) + line)
    failed = sum(1 for v in cells.values() if v in ("FAIL", "ERROR"))
    tr.write_line(f"{len(cells)} cells, {len(cells) - failed} passed, {failed} failed")


# --- a failed test against real servers shows the end of their logs --------------------------
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the tail of each opencode server's log the failed test used (a hung request or a
    server error is diagnosed from these, on a CI machine that keeps nothing else)."""
    rep = yield
    if rep.when == "call" and rep.failed:
        _hub_sections(item, rep)
    if rep.when == "teardown" and "tests.e2e.daemon" in sys.modules:
        sys.modules["tests.e2e.daemon"].Lines.started.clear()
    if rep.when == "call" and rep.failed:
        seen: set[int] = set()
        for value in getattr(item, "funcargs", {}).values():
            fleet = getattr(value, "fleet", value)  # a Hub carries its fleet
            for server in getattr(fleet, "servers", None) or []:
                if id(server) in seen or not hasattr(server, "log_tail"):
                    continue
                seen.add(id(server))
                try:
                    tail = server.log_tail(40)
                except OSError as exc:
                    tail = f"(log not readable: {exc})"
                rep.sections.append((f"opencode log {server.log_path}", tail))
    return rep


def _hub_sections(item: pytest.Item, rep: pytest.TestReport) -> None:
    """The hub's side of a failed test: its audit log's last lines and what its long-running
    processes (a patrol daemon, watch, serve) printed, each line cut short."""
    from tests.e2e.daemon import Lines

    def cut(lines: list[str], n: int) -> str:
        return "\n".join(ln[:240] for ln in lines[-n:])

    for value in getattr(item, "funcargs", {}).values():
        home = getattr(value, "env", {}).get("XAF_HUB_HOME") if hasattr(value, "fleet") else None
        audit = Path(home) / "audit.log" if home else None
        if audit is not None and audit.exists():
            rep.sections.append(("hub audit", cut(audit.read_text("utf-8").splitlines(), 25)))
    for proc in Lines.started:
        rep.sections.append((f"hub process {proc.proc.args[-8:]}",
                             cut(proc.lines, 15) + "\n--- stderr\n" + cut(proc.err, 15)))
