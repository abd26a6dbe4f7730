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
pytest_plugins = ["tests.fleet"]
