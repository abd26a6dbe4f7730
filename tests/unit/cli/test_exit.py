"""What the usual exit does for a tool watching the program, which the `xaf-hub` program's
``leave`` keeps by ending the usual way then (it skips the teardown otherwise).

Each test runs ``python -m xaf_hub`` (``cli.main.run``) as a process; each fails when ``leave``
ends the process with ``os._exit`` regardless."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
