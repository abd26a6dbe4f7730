"""Whether the check's sandbox (bubblewrap) works on this machine: the tests that run a check
need it and are skipped without it (scripts/setup.sh installs it where it can)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from xaf_hub.store.contain import Reach, prove


def _works() -> bool:
    with tempfile.TemporaryDirectory() as state:
        return prove(Path(state), Reach()).contained == "contained"


WORKS = _works()
needs_sandbox = pytest.mark.skipif(
    not WORKS, reason="no working bubblewrap here (apt-get install bubblewrap)"
)
