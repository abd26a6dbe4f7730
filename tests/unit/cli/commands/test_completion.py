"""`xaf-hub completion bash|zsh|fish`: each exits 0; the bash script, sourced in a real bash,
completes commands, options, sub-actions and instance names from the config."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from xaf_hub.cli.main import COMMANDS, main

REPO = Path(__file__).resolve().parents[4]


def script(shell: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    assert main(["completion", shell], stdout=out, stderr=err, env={}) == 0, err.getvalue()
    return out.getvalue()


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_every_shell_gets_a_script_naming_every_command(shell: str) -> None:
    text = script(shell)
    for name in COMMANDS:
        assert name in text
    assert "--instance" in text or "-l instance" in text


def test_no_shell_is_a_usage_error() -> None:
    err = io.StringIO()
    assert main(["completion"], stdout=io.StringIO(), stderr=err, env={}) == 4
    assert "bash, zsh or fish" in err.getvalue()


@pytest.fixture
def bash_env(tmp_path: Path) -> dict[str, str]:
    if not shutil.which("bash"):
        pytest.skip("no bash")
    (tmp_path / "completion.bash").write_text(script("bash"), "utf-8")
    # `xaf-hub` on PATH, as an installed console script would be, running this checkout.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "xaf-hub"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m xaf_hub "$@"\n', "utf-8")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"instances": [
        {"name": "local-main", "url": "http://127.0.0.1:4096"},
        {"name": "lan-build", "url": "http://127.0.0.1:4097"},
    ]}), "utf-8")
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "XAF_HUB_CONFIG": str(config),
        "XAF_HUB_HOME": str(tmp_path / "home"),
        "HOME": str(tmp_path),
        "SCRIPT": str(tmp_path / "completion.bash"),
    }


def complete(env: dict[str, str], line: str) -> list[str]:
    """What bash offers after typing ``line`` (words split on spaces) and pressing Tab."""
    words = line.split(" ")
    probe = (
        'source "$SCRIPT"\n'
        f"COMP_WORDS=({' '.join(repr(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n"
        "_xaf_hub\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", probe], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [w for w in proc.stdout.splitlines() if w]


def test_bash_completes_commands(bash_env: dict[str, str]) -> None:
    assert complete(bash_env, "xaf-hub ") == list(COMMANDS)
    assert complete(bash_env, "xaf-hub se") == ["sessions", "serve"]
    assert complete(bash_env, "xaf-hub --config x.json sta") == ["status"]
    assert complete(bash_env, "xaf-hub --d") == ["--debug"]


def test_bash_completes_options_and_actions(bash_env: dict[str, str]) -> None:
    assert complete(bash_env, "xaf-hub sessions --li") == ["--limit"]
    assert set(complete(bash_env, "xaf-hub sessions -")) >= {"-i", "-j", "-n", "-w", "--wide"}
    assert complete(bash_env, "xaf-hub backlog ") [:4] == ["list", "add", "show", "set"]
    assert complete(bash_env, "xaf-hub completion f") == ["fish"]
    assert complete(bash_env, "xaf-hub dispatch --text ") == []  # free text: nothing offered


def test_bash_completes_instance_names_from_the_config(bash_env: dict[str, str]) -> None:
    assert complete(bash_env, "xaf-hub status -i ") == ["local-main", "lan-build"]
    assert complete(bash_env, "xaf-hub sessions --instance la") == ["lan-build"]
    # A broken config must not print anything during Tab.
    Path(bash_env["XAF_HUB_CONFIG"]).write_text("{not json", "utf-8")
    assert complete(bash_env, "xaf-hub status -i ") == []


def test_fish_completes_commands_and_options(tmp_path: Path) -> None:
    if not shutil.which("fish"):
        pytest.skip("no fish shell here")
    path = tmp_path / "xaf-hub.fish"
    path.write_text(script("fish"), "utf-8")

    def offered(line: str) -> list[str]:
        proc = subprocess.run(
            ["fish", "--no-config", "-c", f"source {path}; complete -C '{line}'"],
            capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(tmp_path)},
        )
        assert proc.returncode == 0, proc.stderr
        return [ln.split("\t")[0] for ln in proc.stdout.splitlines()]

    assert offered("xaf-hub se") == ["serve", "sessions"]
    assert offered("xaf-hub sessions --li") == ["--limit"]
    assert set(offered("xaf-hub backlog ")) >= {"list", "add", "show", "set"}


def test_zsh_script_parses(tmp_path: Path) -> None:
    if not shutil.which("zsh"):
        pytest.skip("no zsh here")
    path = tmp_path / "_xaf-hub"
    path.write_text(script("zsh"), "utf-8")
    probe = f"autoload -U compinit && compinit -u -d {tmp_path}/zcd; source {path}; " \
            "print $_comps[xaf-hub]"
    proc = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 0 and proc.stdout.strip() == "_xaf_hub", proc.stderr
