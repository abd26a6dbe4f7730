"""A server that asks for a password the config does not give: its own error, exit 4, from every
command, naming the env var the config says to set (never "check the username and password")."""

from __future__ import annotations

import pytest

from tests.fleet import Hub

pytestmark = pytest.mark.e2e

LINE = "no password configured for lan-c: set LAN_C_SECRET"


@pytest.fixture
def no_pw(hub: Hub) -> Hub:
    hub.env.pop("XAF_HUB_PW_LAN_C")
    hub.set_instance("lan-c", password_env="LAN_C_SECRET")
    return hub


def test_every_command_names_the_variable_and_exits_4(no_pw: Hub) -> None:
    hub = no_pw
    sid = hub.session("lan-c", "needs a password")
    runs = [
        ("instances",),
        ("instances", "--json"),
        ("status",),
        ("status", "--json"),
        ("sessions",),
        ("sessions", "--json"),
        ("cleanup",),
        ("dispatch", "--new", "--instance", "lan-c", "--text", "x"),
        ("dispatch", "--session", sid, "--text", "x"),
        ("interrupt", "--session", sid),
        ("confirm", "--session", sid),
        ("doctor",),
    ]
    for args in runs:
        code, out, err = hub.cli(*args)
        assert code == 4, (args, code, out, err)
        assert LINE in out + err, (args, out, err)
        assert "check the username and password" not in out + err, args
    # The reachable instances are still listed beside the error.
    code, out, _ = hub.cli("instances")
    assert "local-a" in out and "lan-b" in out


def test_doctor_fix_names_the_configured_variable(no_pw: Hub) -> None:
    code, data = no_pw.cli_json("doctor")
    assert code == 4
    mine = [f for f in data["findings"] if f.get("subject") == "lan-c" and f["level"] == "error"]
    assert mine and mine[0]["message"] == LINE
    assert mine[0]["fix"].startswith("Set LAN_C_SECRET to the server's OPENCODE_SERVER_PASSWORD")
    assert "XAF_HUB_PW_LAN_C" not in mine[0]["fix"]


def test_a_wrong_password_is_still_a_rejection(hub: Hub) -> None:
    hub.env["XAF_HUB_PW_LAN_C"] = "wrong"
    code, out, err = hub.cli("instances")
    assert code == 0 and "auth rejected (HTTP 401)" in out and "no password configured" not in err
