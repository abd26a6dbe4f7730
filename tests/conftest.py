"""Shared fixtures: every test gets its own hub home, so nothing touches ~/.xaf_hub."""

from __future__ import annotations

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


# The real-server fleet fixtures (tests/fleet.py) are shared by tests/e2e and tests/browser;
# registering them once here means one fleet per run, not one per folder.
pytest_plugins = ["tests.fleet", "tests.redis_fixture"]


# --- fault matrix summary (tests/e2e/test_fault_matrix.py) -----------------------------------
_MATRIX_TEST = "test_fault_matrix.py::test_cell["


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the fault matrix (faults x commands, pass/fail) when its cells ran."""
    cells: dict[tuple[str, str], str] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for rep in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(rep, "nodeid", "")
            if _MATRIX_TEST not in nodeid or (outcome == "passed" and rep.when != "call"):
                continue
            fault, _, command = nodeid.split("[", 1)[1].rstrip("]").partition("-")
            mark = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "skipped": "skip"}
            # A failure in teardown must not hide behind the call's pass.
            if cells.get((fault, command)) in (None, "pass", "skip"):
                cells[(fault, command)] = mark[outcome]
    if not cells:
        return
    faults = list(dict.fromkeys(f for f, _ in cells))
    commands = list(dict.fromkeys(c for _, c in cells))
    width = max(len(c) for c in commands) + 2
    tr = terminalreporter
    tr.write_sep("=", "fault matrix (faults x commands)")
    tr.write_line("fault".ljust(10) + "".join(c.ljust(width) for c in commands))
    for fault in faults:
        row = "".join(cells.get((fault, c), "-").ljust(width) for c in commands)
        tr.write_line(fault.ljust(10) + row)
    failed = sum(1 for v in cells.values() if v in ("FAIL", "ERROR"))
    tr.write_line(f"{len(cells)} cells, {len(cells) - failed} passed, {failed} failed")
