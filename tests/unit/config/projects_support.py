"""A config of two projects, shop and blog, on two instances, for the tests that need one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xaf_hub.config.load import Config, load_config

INSTANCES = [
    {"name": "dev", "url": "http://127.0.0.1:4096"},
    {"name": "lan", "url": "http://127.0.0.1:4097"},
]


def projects(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "projects": {
            "shop": {
                "roots": {"dev": ["/src/shop"], "lan": ["/srv/shop"]},
                "default_directory": {"dev": "/src/shop/app"},
                "exclude_dirs": ["/src/shop/vendor"],
                "share": 1,
            },
            "blog": {"roots": {"dev": ["/src/blog"]}, "repository": "/git/blog.git"},
        },
        "instances": json.loads(json.dumps(INSTANCES)),
    }
    doc.update(changes)
    return doc


def load(tmp_path: Path, doc: Any) -> Config:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return load_config(str(path), env={}, cwd=tmp_path)
