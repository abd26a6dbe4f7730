"""A patrol config and context, shared by the runner's tests (test_runner.py) and the
lease runner's (test_lease_runner.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from xaf_hub.config.load import Config, load_config
from xaf_hub.ops.context import OpsContext

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def make_cfg(tmp_path: Path, **extra: Any) -> Config:
    doc = {
        "instances": [{"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}],
        **extra,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    return load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)


def pctx_for(cfg: Config, lines: list[str] | None = None) -> OpsContext:
    sink = lines if lines is not None else []
    return OpsContext(cfg, clock=lambda: NOW, env={}, log=sink.append)
