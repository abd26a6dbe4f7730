"""The tests and the benchmark stop `watch` and `serve` with SIGINT, as Ctrl+C does; started
from a shell without job control (``pytest &``) they would inherit SIGINT ignored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

_CHILD = (
    "import signal, subprocess, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job starts\n"
    "if sys.argv[1] == 'fix':\n"
    "    from sandbox.fleet import let_children_see_ctrl_c\n"
    "    let_children_see_ctrl_c()\n"
    "probe = ('import signal; '\n"
    "         'print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)')\n"
    "print(subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True)"
    ".stdout.strip())\n"
)


@pytest.mark.parametrize(("mode", "sees_ctrl_c"), [("fix", "True"), ("as-is", "False")])
def test_processes_started_by_the_tests_see_ctrl_c(mode: str, sees_ctrl_c: str) -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True,
                          timeout=60, check=True, cwd=REPO)  # the harness: the checkout's
    assert done.stdout.strip() == sees_ctrl_c, done.stderr
