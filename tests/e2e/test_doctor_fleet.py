"""`doctor` against the real fleet: each problem named with its fix, no secret printed."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.fleet import Hub

pytestmark = pytest.mark.e2e


def lines_about(out: str, subject: str) -> list[str]:
    """The report lines for one subject, each followed by its fix line when it has one."""
    rows = out.splitlines()
    picked = []
    for i, row in enumerate(rows):
        if row[8:].startswith(subject + " "):
            picked.append(row)
            if i + 1 < len(rows) and rows[i + 1].strip().startswith("fix:"):
                picked.append(rows[i + 1])
    return picked


def test_bad_password_and_down_instance_are_named_with_fixes(hub: Hub) -> None:
    hub.env["XAF_HUB_PW_LAN_C"] = "wrong"
    hub.doc["instances"].append({"name": "down-d", "url": "http://127.0.0.1:9",
                                 "roots": [str(hub.root)]})
    hub.write_config()
    hub.session("local-a", "doctor check", "app")

    code, out, err = hub.cli("doctor")
    assert code == 2, out + err

    lan_c = "\n".join(lines_about(out, "lan-c"))
    assert "FAIL" in lan_c and "auth rejected (HTTP 401)" in lan_c
    assert "fix: The password from env:XAF_HUB_PW_LAN_C was refused" in lan_c

    down = "\n".join(lines_about(out, "down-d"))
    assert "FAIL" in down and "connection refused" in down
    assert "fix: Start `opencode serve` at http://127.0.0.1:9" in down

    local_a = lines_about(out, "local-a")
    assert local_a[0].lstrip().startswith("ok")
    assert "auth accepted" in local_a[0] and "classic API" in local_a[0]
    assert "password from env var XAF_HUB_PW_LOCAL_A" in local_a[0]

    assert out.splitlines()[-1].endswith("exit 2")
    for secret in [*hub.secrets(), "wrong"]:
        assert secret not in out + err
    assert "***" not in out  # nothing even needed redacting: no secret was ever formatted

    code, doc = hub.cli_json("doctor")
    assert code == doc["exit_code"] == 2
    failing = {f["subject"] for f in doc["findings"] if f["level"] == "error"}
    assert failing == {"lan-c", "down-d"}
    assert all(f["fix"] for f in doc["findings"] if f["level"] in ("error", "warn"))


def test_healthy_fleet_exits_0(hub: Hub) -> None:
    hub.session("local-a", "doctor a", "app")
    hub.session("lan-c", "doctor c", "app")
    # Without a repository nothing is ever verified: a warning that says how to get it.
    code, out, err = hub.cli("doctor")
    assert code == 0, out + err
    assert "project.repository" in out and "xaf-hub init --root" in out, out
    assert out.splitlines()[-1] == "no problems, 2 warning(s) worth a look"
    remote = hub.root.parent / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    hub.write_config(project={**hub.doc["project"], "repository": str(remote)})
    code, out, err = hub.cli("doctor")
    assert code == 0, out + err
    # lan-b has no session under the root yet: a warning, not a problem.
    lan_b = "\n".join(lines_about(out, "lan-b"))
    assert f"root {hub.root} has no sessions on this instance" in lan_b
    assert out.splitlines()[-1] == "no problems, 1 warning(s) worth a look"

    hub.session("lan-b", "doctor b", "app")
    code, out, _ = hub.cli("doctor")
    assert code == 0
    assert out.splitlines()[-1] == "all well", out
    assert "not paused" in out and "models.timezone" in out
    # No blackout family chosen and none resting: no daily blackouts are reported.
    assert "blackout" not in out and "until 08:00" not in out, out
    # A rest that exists is shown; a family the config names gets its daily reset.
    assert hub.cli("models", "rest", "fake/fake-model", "--until", "2h")[0] == 0
    hub.write_config(models={"default_dispatch_model": "fake/fake-model",
                             "blackout_families": {"free": ["opencode/"]}})
    code, out, _ = hub.cli("doctor")
    assert code == 0
    assert "model fake/fake-model" in out and "resting until" in out
    assert "rests a model of free (opencode/) until 08:00" in out

    # The flag the real `patrol pause` writes is what doctor reads: a warning, still exit 0.
    assert hub.cli("patrol", "pause")[0] == 0
    code, out, _ = hub.cli("doctor")
    assert code == 0
    flag = "\n".join(lines_about(out, "pause flag"))
    assert "WARN" in flag and "patrol paused since" in flag
    assert "fix: Run `xaf-hub patrol resume`" in flag
    assert hub.cli("patrol", "resume")[0] == 0
    assert "not paused" in hub.cli("doctor")[1]


def test_config_error_exits_4_with_file_and_key(hub: Hub) -> None:
    hub.set_instance("lan-b", rootz=[str(hub.root)])
    code, out, err = hub.cli("doctor")
    assert code == 4, out + err
    assert f"{hub.config_path}: key 'instances[1].rootz': unknown key" in out
    assert "fix: Remove the key or correct its spelling" in out

    code, doc = hub.cli_json("doctor")
    assert code == doc["exit_code"] == 4
    assert doc["config"] == str(hub.config_path)
    assert "instances[1].rootz" in json.dumps(doc["findings"])
