"""The audit log on a disk that fills up: a line is written whole or not at all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# The child may grow audit.log only 100 bytes past its first line (RLIMIT_FSIZE: a write
# across the limit is cut short, as on a full disk), then appends a line that does not fit
# and, the room back, one more.
_CHILD = """
import resource, sys
from pathlib import Path
from xaf_hub.store import audit
d = Path(sys.argv[1])
audit.append(d, command="first", env={})
size = (d / "audit.log").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, resource.RLIM_INFINITY))
try:
    audit.append(d, command="too long", reason="x" * 300, env={})
except OSError as exc:
    print("refused:", exc.strerror)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
audit.append(d, command="after", env={})
"""


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_line_that_does_not_fit_is_not_half_written(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("refused:")
    lines = (tmp_path / "audit.log").read_text("utf-8").splitlines()
    assert [json.loads(ln)["command"] for ln in lines] == ["first", "after"]
