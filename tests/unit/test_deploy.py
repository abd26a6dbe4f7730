"""Service definitions under deploy/: they parse, say what they must, and agree with each other."""

from __future__ import annotations

import os
import plistlib
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from xaf_hub.cli.main import COMMANDS, build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNIT = DEPLOY / "systemd" / "xaf-hub-patrol.service"
PLIST = DEPLOY / "launchd" / "com.xafhub.patrol.plist"
TASK = DEPLOY / "windows" / "xaf-hub-patrol.xml"
SERVE_UNIT = DEPLOY / "systemd" / "xaf-hub-serve.service"
SERVE_PLIST = DEPLOY / "launchd" / "com.xafhub.serve.plist"
SERVE_TASK = DEPLOY / "windows" / "xaf-hub-serve.xml"
INSTALL = DEPLOY / "windows" / "install.ps1"
NS = {"t": "http://schemas.microsoft.com/windows/2004/02/mit/task"}
PLACEHOLDER = re.compile(r"@@[A-Z_]+@@")


def placeholders(path: Path) -> set[str]:
    return set(PLACEHOLDER.findall(path.read_text("utf-8")))


def unit_settings(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def fill_unit(tmp_path: Path, unit: Path = UNIT) -> Path:
    """The unit with every placeholder replaced by a real absolute path."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    values = {
        "@@XAF_HUB_BIN@@": sys.executable,  # verify checks that ExecStart is executable
        "@@XAF_HUB_CONFIG@@": str(work / "config.json"),
        "@@XAF_HUB_WORKDIR@@": str(work),
        "@@XAF_HUB_ENV_FILE@@": str(work / "patrol.env"),
    }
    text = unit.read_text("utf-8")
    assert placeholders(unit) == set(values)
    for key, value in values.items():
        text = text.replace(key, value)
    out = tmp_path / "units" / unit.name
    out.parent.mkdir(exist_ok=True)
    out.write_text(text, "utf-8")
    return out


def verify(unit: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    # A user manager needs a runtime dir; CI containers have no login session to provide one.
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run(["systemd-analyze", "--user", "verify", str(unit)],
                          capture_output=True, text=True, env=env, timeout=60, check=False)


needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze not installed")


@needs_systemd
@pytest.mark.parametrize("source", [UNIT, SERVE_UNIT], ids=["patrol", "serve"])
def test_systemd_unit_verifies_clean(tmp_path: Path, source: Path) -> None:
    unit = fill_unit(tmp_path, source)
    result = verify(unit, tmp_path)
    if "Failed to initialize manager" in result.stderr:
        pytest.skip(f"no user manager possible here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    # Bad values are only warnings ("..., ignoring") with exit 0: none may mention our unit.
    assert unit.name not in result.stderr, result.stderr


@needs_systemd
def test_systemd_verify_catches_an_unfilled_or_bad_unit(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(UNIT, raw / UNIT.name)
    result = verify(raw / UNIT.name, tmp_path)
    if "Failed to initialize manager" in result.stderr:
        pytest.skip("no user manager possible here")
    assert result.returncode != 0 and "@@XAF_HUB_WORKDIR@@" in result.stderr
    unit = fill_unit(tmp_path)
    unit.write_text(unit.read_text("utf-8").replace("KillSignal=SIGTERM", "KillSignal=SIGNOPE"))
    assert unit.name in verify(unit, tmp_path).stderr


def test_systemd_unit_settings() -> None:
    s = unit_settings(UNIT.read_text("utf-8"))
    assert s["ExecStart"] == "@@XAF_HUB_BIN@@ --config @@XAF_HUB_CONFIG@@ patrol"
    assert s["KillSignal"] == "SIGTERM"
    assert int(s["TimeoutStopSec"]) >= 120  # a patrol step may take minutes on a slow fleet
    assert s["Restart"] == "on-failure"
    assert s["RestartPreventExitStatus"] == "4"
    assert s["EnvironmentFile"] == "@@XAF_HUB_ENV_FILE@@"
    assert s["StandardOutput"] == s["StandardError"] == "journal"
    assert s["WantedBy"] == "default.target"  # a user unit


def test_launchd_plist() -> None:
    with PLIST.open("rb") as fh:
        doc = plistlib.load(fh)
    assert doc["Label"] == "com.xafhub.patrol"
    assert doc["ProgramArguments"] == ["@@XAF_HUB_BIN@@", "--config", "@@XAF_HUB_CONFIG@@",
                                       "patrol"]
    assert doc["KeepAlive"] == {"SuccessfulExit": False}
    assert doc["RunAtLoad"] is True
    assert doc["ExitTimeOut"] >= 120
    assert doc["StandardOutPath"].startswith("@@XAF_HUB_LOG_DIR@@/")
    assert doc["StandardErrorPath"].startswith("@@XAF_HUB_LOG_DIR@@/")
    assert doc["WorkingDirectory"] == "@@XAF_HUB_WORKDIR@@"
    assert not any("PW" in key for key in doc.get("EnvironmentVariables", {}))


def test_task_scheduler_xml() -> None:
    root = ET.parse(TASK).getroot()
    assert root.tag == f"{{{NS['t']}}}Task"
    triggers = root.find("t:Triggers", NS)
    assert triggers is not None
    assert triggers.find("t:LogonTrigger", NS) is not None
    watchdog = triggers.find("t:TimeTrigger/t:Repetition/t:Interval", NS)
    assert watchdog is not None and watchdog.text == "PT5M"
    settings = root.find("t:Settings", NS)
    assert settings is not None
    assert settings.findtext("t:MultipleInstancesPolicy", namespaces=NS) == "IgnoreNew"
    assert settings.findtext("t:ExecutionTimeLimit", namespaces=NS) == "PT0S"
    count = int(settings.findtext("t:RestartOnFailure/t:Count", namespaces=NS) or 0)
    assert 1 <= count <= 255  # the schema's unsignedByte range
    assert settings.findtext("t:RestartOnFailure/t:Interval", namespaces=NS) == "PT1M"
    exe = root.find("t:Actions/t:Exec", NS)
    assert exe is not None
    assert exe.findtext("t:Command", namespaces=NS) == "@@XAF_HUB_PYTHONW@@"
    assert exe.findtext("t:Arguments", namespaces=NS) == (
        '-m xaf_hub --config "@@XAF_HUB_CONFIG@@" patrol')
    assert exe.findtext("t:WorkingDirectory", namespaces=NS) == "@@XAF_HUB_WORKDIR@@"


def test_install_script_fills_every_task_placeholder_and_its_anchors_exist() -> None:
    script = INSTALL.read_text("utf-8")
    for name in placeholders(TASK):
        assert f"'{name}'" in script, f"install.ps1 does not fill {name}"
    task = TASK.read_text("utf-8")
    # -AtStartup rewrites these two spots; they must exist for the rewrite to take effect.
    assert re.search(r"(?s)<LogonTrigger>.*?</LogonTrigger>", task)
    assert "<LogonType>InteractiveToken</LogonType>" in task
    assert "AppStopMethodConsole" in script and "AppExit 4 Exit" in script


def test_serve_units_run_the_viewer_on_loopback_and_stop_quickly() -> None:
    s = unit_settings(SERVE_UNIT.read_text("utf-8"))
    assert s["ExecStart"] == "@@XAF_HUB_BIN@@ --config @@XAF_HUB_CONFIG@@ serve --port 7317"
    assert "--public" not in s["ExecStart"] and "--host" not in s["ExecStart"]
    assert s["KillSignal"] == "SIGTERM" and int(s["TimeoutStopSec"]) <= 60
    assert s["Restart"] == "on-failure" and s["RestartPreventExitStatus"] == "4"
    assert s["EnvironmentFile"] == "@@XAF_HUB_ENV_FILE@@"
    assert s["WantedBy"] == "default.target"
    # The patrol's unit and the viewer's differ only where they must.
    patrol = unit_settings(UNIT.read_text("utf-8"))
    same = ("Type", "WorkingDirectory", "EnvironmentFile", "KillMode", "Restart", "UMask",
            "NoNewPrivileges", "StandardOutput", "StandardError")
    assert {k: s[k] for k in same} == {k: patrol[k] for k in same}

    with SERVE_PLIST.open("rb") as fh:
        doc = plistlib.load(fh)
    assert doc["Label"] == "com.xafhub.serve"
    assert doc["ProgramArguments"] == ["@@XAF_HUB_BIN@@", "--config", "@@XAF_HUB_CONFIG@@",
                                       "serve", "--port", "7317"]
    assert doc["KeepAlive"] == {"SuccessfulExit": False} and doc["RunAtLoad"] is True
    assert doc["StandardErrorPath"] == "@@XAF_HUB_LOG_DIR@@/serve.err.log"
    assert not any("PASSWORD" in key or "PW" in key for key in doc["EnvironmentVariables"])

    root = ET.parse(SERVE_TASK).getroot()
    exe = root.find("t:Actions/t:Exec", NS)
    assert exe is not None
    assert exe.findtext("t:Command", namespaces=NS) == "@@XAF_HUB_PYTHONW@@"
    assert exe.findtext("t:Arguments", namespaces=NS) == (
        '-m xaf_hub --config "@@XAF_HUB_CONFIG@@" serve --port 7317')
    settings = root.find("t:Settings", NS)
    assert settings is not None
    assert settings.findtext("t:MultipleInstancesPolicy", namespaces=NS) == "IgnoreNew"
    assert placeholders(SERVE_TASK) == placeholders(TASK)
    script = INSTALL.read_text("utf-8")
    assert "[ValidateSet('Patrol', 'Serve')]" in script
    assert '"xaf-hub-$program.xml"' in script and "'serve', '--port', '7317'" in script


def test_serve_command_lines_parse() -> None:
    args = build_parser(["serve"]).parse_args(
        ["--config", "/x/config.json", "serve", "--port", "7317"]
    )
    assert args.command == "serve" and args.port == 7317 and args.host == "127.0.0.1"


def test_every_placeholder_is_documented() -> None:
    readme = (DEPLOY / "README.md").read_text("utf-8")
    assert "xaf-hub-serve.service" in readme and "com.xafhub.serve.plist" in readme
    for path in (UNIT, PLIST, TASK, SERVE_UNIT, SERVE_PLIST, SERVE_TASK):
        for name in placeholders(path):
            assert name in readme, f"{name} from {path.name} is not explained in deploy/README.md"


def test_service_command_lines_parse() -> None:
    if "patrol" not in COMMANDS:
        pytest.skip("the patrol command is not registered yet")
    args = build_parser(["patrol"]).parse_args(["--config", "/x/config.json", "patrol"])
    assert args.command == "patrol" and args.config == "/x/config.json"
