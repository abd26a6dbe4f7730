"""How the `xaf-hub` program ends (``cli.main.leave``): its answer and exit handlers complete,
the interpreter's teardown skipped, and the usual exit kept whenever something waits for it (a
thread, a tracer, profiler or debugger, `python -i`, PYTHONMALLOCSTATS).

Each test runs a process; the ones of a watching tool fail when ``leave`` ends the process with
``os._exit`` regardless."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _hub(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None,
         merge: bool = False) -> subprocess.CompletedProcess[bytes]:
    """``python ARGS`` with this checkout's xaf_hub first on the path."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, *args], input=stdin, env=full, cwd=ROOT,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                          timeout=60, check=False)


def test_python_dash_i_still_opens_the_prompt_after_the_program() -> None:
    """`python -i -m xaf_hub ...` (inspect after the run): the usual exit raises SystemExit,
    which -i turns into the interactive prompt; os._exit ends the process before it."""
    done = _hub("-i", "-m", "xaf_hub", "--version", stdin=b"print('INSPECTED')\n")
    assert b"xaf-hub" in done.stdout
    assert b"INSPECTED" in done.stdout, (done.stdout, done.stderr)


def test_pdb_still_sees_the_program_end() -> None:
    """`python -m pdb -m xaf_hub ...` then `c`: pdb no longer traces after `continue`
    (no breakpoints), so sys.gettrace() is None; the usual exit lets pdb report the exit
    status and restart the program, os._exit kills the debugger with it."""
    done = _hub("-m", "pdb", "-m", "xaf_hub", "--version", stdin=b"c\nq\n")
    assert b"xaf-hub" in done.stdout
    assert b"The program exited via sys.exit(). Exit status: 0" in done.stdout, done.stdout


def test_pythonmallocstats_still_prints_the_shutdown_statistics() -> None:
    """PYTHONMALLOCSTATS=1: the interpreter prints pymalloc's statistics at shutdown, after
    it flushed stdout (so after the program's answer); os._exit skips the shutdown."""
    done = _hub("-m", "xaf_hub", "--version", env={"PYTHONMALLOCSTATS": "1"}, merge=True)
    after = done.stdout.split(b"xaf-hub 0.", 1)[1]
    assert b"Small block threshold" in after, done.stdout[-400:]


# A program that ends through ``leave``: a large answer on stdout, an exit handler, and a file
# written but never flushed, whose text only the interpreter's teardown writes out.
_LEAVING = """
import atexit, sys, threading, time
from pathlib import Path
from xaf_hub.cli.main import leave

mark = Path(sys.argv[1])
kept = open(mark.with_suffix(".torn"), "w")
kept.write("torn down")
atexit.register(lambda: mark.with_suffix(".exit").write_text("ran"))
if sys.argv[2] == "thread":  # a thread that outlives the program's last line
    threading.Thread(target=lambda: (time.sleep(0.3), mark.write_text("done"))).start()
if sys.argv[2] == "traced":
    sys.settrace(lambda *a: None)
sys.stdout.write("x" * 1_000_000)
leave(3)
"""


@pytest.mark.parametrize("case", ["plain", "thread", "traced"])
def test_the_program_ends_with_its_output_and_exit_handlers_and_skips_teardown_alone(
    tmp_path: Path, case: str
) -> None:
    """``leave`` writes what is buffered and runs the exit handlers before it ends; it skips
    the interpreter's teardown only when nothing else has to happen at the exit: a thread still
    running is awaited, and a tracer sees the usual end."""
    mark = tmp_path / "mark"
    done = subprocess.run([sys.executable, "-c", _LEAVING, str(mark), case],
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 3
    assert done.stdout == b"x" * 1_000_000
    assert mark.with_suffix(".exit").read_text() == "ran"
    assert (mark.with_suffix(".torn").read_text() == "torn down") is (case != "plain")
    assert mark.exists() is (case == "thread")


def test_a_profiled_run_still_writes_its_profile(tmp_path: Path) -> None:
    """`python -m cProfile -o F -m xaf_hub ...` (the benchmark's profiles): the profiler writes
    F after the program returns, so a profiled run ends the usual way."""
    prof = tmp_path / "run.prof"
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "xaf_hub",
                           "--version"], capture_output=True, cwd=tmp_path, timeout=60,
                          check=False)
    assert done.returncode == 0 and b"xaf-hub" in done.stdout
    assert prof.stat().st_size > 0
