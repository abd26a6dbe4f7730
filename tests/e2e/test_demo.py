"""The README's first command runs this demo: it must work end to end on real servers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_demo_runs_the_tour(tmp_path: Path) -> None:
    out = tmp_path / "demo-out"
    proc = subprocess.run(
        [sys.executable, "-m", "sandbox.demo", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],  # the README runs it from the checkout's root
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    for command in ("instances", "status", "sessions", "dispatch --dry-run"):
        assert f"$ xaf-hub {command}" in text
    assert "plan: start the idle session on local-main (smart match)" in text
    assert "production instance (needs --allow-prod)" in text
    page = (out / "overview.html").read_text("utf-8")
    assert "修复登录页样式" in page and "scratch experiment" not in page
    assert (out / "sessions.csv").read_bytes().startswith(b"\xef\xbb\xbf")
