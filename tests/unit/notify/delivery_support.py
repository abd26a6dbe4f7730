"""A config with a webhook, an operations context and the notify state file, shared by
the delivery tests (test_delivery.py) and the failover notice's (test_failover_notice.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from xaf_hub.config.load import Config, load_config
from xaf_hub.notify import outbox
from xaf_hub.ops.context import OpsContext

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def make_cfg(tmp_path: Path, url: str, **notify: Any) -> Config:
    doc = {
        "instances": [{"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}],
        "notify": {
            "webhooks": [{"name": "team", "url_env": "HOOK", "format": "json"}],
            "timeout_seconds": 1,
            "retries": 0,
            **notify,
        },
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    env = {"XAF_HUB_HOME": str(tmp_path / "home"), "HOOK": url}
    return load_config(str(path), env=env, cwd=tmp_path)


def ctx(cfg: Config, clock: list[datetime] | None = None) -> OpsContext:
    now = clock if clock is not None else [NOW]
    return OpsContext(cfg, clock=lambda: now[0], env={})


def state(cfg: Config) -> dict[str, Any]:
    found = outbox.read_state(cfg.state_dir)
    assert found is not None
    return found
