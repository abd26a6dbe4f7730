"""Real-server fixtures, registered from tests/conftest.py: one fleet for the whole run.

The fleet (a fake model server plus three `opencode serve` processes, each with its own HOME,
database and password) starts once per test session. Each test gets its own project root
under tmp, so the sessions other tests left behind on the same servers are outside its project
and never change its counts.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from sandbox.fake_llm import FakeLLM
from xaf_hub.cli.main import main

MODELS = (
    "fake/fake-model",
    "fake/slow-model",
    "opencode/free-model",
    "backup/good-model",
    "fake/missing-model",
    "fake/priced-model",
)
# USD per million (input, output) tokens: the fake's 10 + 5 tokens cost $0.02 per model call.
PRICES = {"fake/priced-model": (1000.0, 2000.0)}
# Sub-agents a scripted ``task`` call may start, by name, and the model each runs on: a free
# parent can start a priced child. Background sub-agents (``"background": true``) are on.
AGENTS = {"priced": "fake/priced-model"}
SERVER_ENV = {"OPENCODE_EXPERIMENTAL_BACKGROUND_SUBAGENTS": "true"}
NAMES = ("local-a", "lan-b", "lan-c")


@pytest.fixture(scope="session")
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory, llm: FakeLLM) -> Iterator[sandbox.Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    with sandbox.Fleet(
        root, n=3, llm=llm, models=MODELS, prices=PRICES, agents=AGENTS, start_timeout=120.0,
        extra_env=SERVER_ENV,
    ) as f:
        yield f


@dataclass
class Hub:
    """One test's view: a project root, a config, and ways to run the CLI."""

    root: Path
    config_path: Path
    env: dict[str, str]
    fleet: sandbox.Fleet
    llm: FakeLLM
    doc: dict[str, Any] = field(default_factory=dict)

    def server(self, name: str) -> sandbox.OpencodeServer:
        return self.fleet.servers[NAMES.index(name)]

    def password(self, name: str) -> str:
        pw = self.fleet.passwords[NAMES.index(name)]
        assert pw
        return pw

    def secrets(self) -> list[str]:
        return [p for p in self.fleet.passwords if p]

    def write_config(self, **changes: Any) -> None:
        self.doc.update(changes)
        self.config_path.write_text(json.dumps(self.doc, ensure_ascii=False, indent=2), "utf-8")

    def set_instance(self, name: str, **changes: Any) -> None:
        for inst in self.doc["instances"]:
            if inst["name"] == name:
                inst.update(changes)
        self.write_config()

    def cli(self, *args: str) -> tuple[int, str, str]:
        """Run the CLI in this process; returns (exit code, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        code = main(
            ["--config", str(self.config_path), *args], stdout=out, stderr=err, env=self.env
        )
        return code, out.getvalue(), err.getvalue()

    def cli_json(self, *args: str) -> tuple[int, Any]:
        code, out, err = self.cli(*args, "--json")
        assert out.strip(), f"no JSON on stdout (exit {code}): {err}"
        return code, json.loads(out)

    def popen(
        self, *args: str, extra_env: dict[str, str] | None = None, stdin: int | None = None
    ) -> subprocess.Popen[str]:
        """Start the CLI as a separate process."""
        env = {**os.environ, **self.env, **(extra_env or {})}
        return subprocess.Popen(
            [sys.executable, "-m", "xaf_hub", "--config", str(self.config_path), *args],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def project_dir(self, *parts: str) -> Path:
        path = self.root.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def session(self, name: str, title: str, *parts: str, directory: Path | None = None) -> str:
        """Create a real session in a project subdirectory (or ``directory``); return its id."""
        d = directory if directory is not None else self.project_dir(*(parts or ("app",)))
        s = sandbox.create_session(self.server(name).url, self.password(name), str(d), title)
        return str(s["id"])

    def prompt(self, name: str, sid: str, text: str = "work", model: str | None = None) -> None:
        sandbox.prompt_async(self.server(name).url, self.password(name), sid, text, model)

    def status(self, name: str, directory: Path | str) -> dict[str, Any]:
        return sandbox.status(self.server(name).url, self.password(name), str(directory))

    def busy_ids(self, name: str) -> set[str]:
        """Busy/retry project sessions of an instance, straight from the server."""
        code, data = self.cli_json("sessions", "--instance", name)
        assert code == 0
        return {s["id"] for s in data["sessions"] if s["running"]}

    def wait_for(self, predicate: Any, timeout: float = 30.0, step: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
            time.sleep(step)


def make_hub(
    fleet: sandbox.Fleet,
    llm: FakeLLM,
    tmp: Path,
    home: Path,
    project: dict[str, Any],
    **settings: Any,
) -> Hub:
    """A hub over the session fleet: a git project under ``tmp``, one config entry per server
    (password in the env), ``settings`` as further top-level config keys."""
    root = tmp / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    env = {"XAF_HUB_HOME": str(home)}
    instances = []
    for i, name in enumerate(NAMES):
        env[f"XAF_HUB_PW_{name.upper().replace('-', '_')}"] = fleet.passwords[i] or ""
        instances.append(
            {
                "name": name,
                "url": fleet.servers[i].url,
                "roots": [str(root)],
                "default_directory": str(root / "app"),
            }
        )
    doc = {
        "project": project,
        **settings,
        "models": {"default_dispatch_model": "fake/fake-model"},
        "instances": instances,
    }
    h = Hub(root, tmp / "config.json", env, fleet, llm, doc)
    h.write_config()
    (root / "app").mkdir()
    return h


@pytest.fixture
def hub(fleet: sandbox.Fleet, llm: FakeLLM, tmp_path: Path, _isolated_home: Path) -> Iterator[Hub]:
    root = tmp_path / "proj"
    project = {
        "name": "e2e",
        "exclude_dirs": [str(root / "vendor")],
        "exclude_substrings": ["workbuddy"],
    }
    h = make_hub(
        fleet,
        llm,
        tmp_path,
        _isolated_home,
        project,
        timeouts={"connect_seconds": 2, "read_seconds": 10},
        lock={"slot_ttl_seconds": 60, "lock_timeout_seconds": 20, "slot_grace_seconds": 5},
    )
    llm.reset()
    yield h
    llm.reset()
