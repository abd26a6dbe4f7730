"""A 401 with no password configured is MissingPassword (exit 4, names the variable to set);
with a password it stays "auth rejected" (exit 2). Over httpx.MockTransport; the same through
the CLI against real servers is tests/e2e/test_missing_password.py."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import httpx
import pytest

from xaf_hub.cli.main import main
from xaf_hub.config.credentials import password_var
from xaf_hub.config.load import InstanceConfig, load_config
from xaf_hub.errors import ExitCode, MissingPassword, UnreachableError
from xaf_hub.fleet.client import OpencodeClient
from xaf_hub.fleet.instance_scan import InstanceScan
from xaf_hub.ops.interrupt import session_not_found


def _list(inst: InstanceConfig) -> None:
    async def go() -> None:
        transport = httpx.MockTransport(lambda r: httpx.Response(401))
        async with OpencodeClient(inst, transport=transport, retries=2) as c:
            await c.list_sessions()

    asyncio.run(go())


def test_401_without_a_password_names_the_conventional_variable() -> None:
    with pytest.raises(MissingPassword) as err:
        _list(InstanceConfig(name="lan-x.2", url="http://127.0.0.1:1"))
    assert str(err.value) == "no password configured for lan-x.2: set XAF_HUB_PW_LAN_X_2"
    assert err.value.exit_code == ExitCode.USAGE
    assert isinstance(err.value, UnreachableError)  # scans still list the other instances


def test_401_without_a_password_names_the_configured_variable() -> None:
    with pytest.raises(MissingPassword, match=r"for lan-x: set TEAM_PW$"):
        _list(InstanceConfig(name="lan-x", url="http://127.0.0.1:1", password_env="TEAM_PW"))


def test_401_with_a_password_is_a_rejection() -> None:
    with pytest.raises(UnreachableError) as err:
        _list(InstanceConfig(name="lan-x", url="http://127.0.0.1:1", password="pw"))
    assert not isinstance(err.value, MissingPassword)
    assert "auth rejected (HTTP 401)" in err.value.reason
    assert err.value.exit_code == ExitCode.UNREACHABLE


def test_password_env_is_kept_from_the_config(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"instances": [
        {"name": "a", "url": "http://127.0.0.1:1", "password_env": "A_PW"},
        {"name": "b-1", "url": "http://127.0.0.1:2"},
    ]}), "utf-8")
    cfg = load_config(str(path), env={}, cwd=tmp_path)
    assert [password_var(i.name, i.password_env) for i in cfg.instances] == [
        "A_PW", "XAF_HUB_PW_B_1"
    ]
    cfg = load_config(str(path), env={"A_PW": "x"}, cwd=tmp_path)
    assert cfg.instances[0].password == "x" and cfg.instances[0].password_source == "env:A_PW"


def test_a_recorded_cause_is_the_error_whatever_its_words_say() -> None:
    inst = InstanceConfig(name="lan-x", url="http://127.0.0.1:1", password_env="TEAM_PW")
    # The recorded reason's words are not read: the cause decides, reworded or not.
    scan = InstanceScan(inst, reason="the server wants a login", cause="no_password")
    up = scan.failure()
    assert isinstance(up, MissingPassword) and str(up).endswith("lan-x: set TEAM_PW")
    other = InstanceScan(inst, reason="no password configured: set TEAM_PW", cause="refused")
    assert not isinstance(other.failure(), MissingPassword)
    down = [UnreachableError("a", "connection refused"), scan.failure()]
    err = session_not_found("ses_1", down)
    assert isinstance(err, MissingPassword)
    assert str(err) == "no password configured for lan-x: set TEAM_PW"


def test_the_cli_prints_one_line_and_exits_4(tmp_path: Path) -> None:
    # A real listening socket is not needed: the transport answers 401 to everything.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"instances": [
        {"name": "solo", "url": "http://127.0.0.1:1", "password_env": "SOLO_PW"},
    ]}), "utf-8")
    out, err = io.StringIO(), io.StringIO()
    code = main(
        ["--config", str(path), "status"], stdout=out, stderr=err, env={},
        transport_factory=lambda inst: httpx.MockTransport(lambda r: httpx.Response(401)),
    )
    assert code == 4
    assert "xaf-hub: error: no password configured for solo: set SOLO_PW" in err.getvalue()
    assert "unreachable" not in err.getvalue()
