"""The run context's printing: every table cell is redacted, as every line is."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from tests.unit.config.projects_support import projects
from xaf_hub.cli.context import Context
from xaf_hub.cli.main import main

SECRET = "s3cret-Passw0rd"


def _ctx(out: io.StringIO) -> Context:
    ns = argparse.Namespace(config=None, debug=False, json=False, wide=False, command="status")
    return Context(args=ns, stdout=out, stderr=io.StringIO(), env={"XAF_HUB_PW_LAN_A": SECRET})


def test_a_table_cell_holding_a_secret_is_redacted_before_the_layout() -> None:
    out = io.StringIO()
    _ctx(out).table(
        [["lan-a", f"fix login {SECRET}"], ["lan-b", "Authorization: Basic Zm9vOmJhcg=="]],
        ["instance", "title"],
    )
    text = out.getvalue()
    assert SECRET not in text and "Zm9vOmJhcg" not in text
    lines = text.splitlines()
    assert lines[2].rstrip() == "lan-a       fix login ***"
    assert lines[3].rstrip() == "lan-b       Authorization: Basic ***"
    # The columns are as wide as the redacted cells, not the secret.
    assert len(lines[1]) == len("lan-a       Authorization: Basic ***")


def test_a_table_without_secrets_is_printed_as_is() -> None:
    out = io.StringIO()
    _ctx(out).table([["lan-a", "fix login", None]], ["instance", "title", "note"])
    assert out.getvalue().splitlines() == [
        "instance    title      note",
        "----------  ---------  ------",
        "lan-a       fix login",
    ]


# The commands whose record needs no server (their instance refuses at once); each record
# names the project it was read as (`status --json` too: its spend is under "spend").
OFFLINE = [
    ("backlog", "add", "--title", "a task"), ("backlog", "list"), ("backlog", "show", "T-1"),
    ("backlog", "set", "T-1", "--status", "pending"), ("models",), ("patrol", "status"),
    ("sessions",), ("instances",), ("waiting",), ("cleanup",), ("status",),
]


@pytest.mark.parametrize("argv", OFFLINE, ids=[" ".join(a[:2]) for a in OFFLINE])
def test_every_record_names_its_project(tmp_path: Path, argv: tuple[str, ...]) -> None:
    doc = projects(state_dir=str(tmp_path / "state"), patrol={"backlog_path": "pool.json"})
    for inst in doc["instances"]:
        inst["url"] = "http://127.0.0.1:9"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(doc), encoding="utf-8")
    (tmp_path / "pool.json").write_text(json.dumps({"schema_version": 1, "tasks": [
        {"id": "T-1", "title": "one", "project": "blog"}]}), encoding="utf-8")
    for project, named in (("blog", "blog"), (None, None)):
        if project is None and argv[0] not in ("sessions", "instances", "waiting", "status"):
            continue  # only a view answers for every project
        out = io.StringIO()
        chosen = ["--project", project] if project else []
        main(["--config", str(config), *chosen, *argv, "--json"], stdout=out,
             stderr=io.StringIO(), cwd=tmp_path, env={})
        got = json.loads(out.getvalue())
        for record in got if isinstance(got, list) else [got]:
            assert record.get("project", "missing") == named, (argv, record)
