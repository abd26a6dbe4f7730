"""What a user's install relies on: the bundled example config, lean runtime dependencies, and a
demo that explains (in one line, no traceback) how to get opencode when it is missing."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from xaf_hub.config.load import load_config
from xaf_hub.sandbox import demo

REPO = Path(__file__).resolve().parents[2]


def test_example_config_is_package_data() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))
    data = pyproject["tool"]["setuptools"]["package-data"]["xaf_hub"]
    assert "config.example.json" in data
    assert demo.EXAMPLE_CONFIG.is_file()
    assert demo.EXAMPLE_CONFIG.parent == Path(demo.__file__).resolve().parents[1]
    assert load_config(str(demo.EXAMPLE_CONFIG), env={}, cwd=REPO).instances


def test_runtime_dependencies_leave_out_the_test_oracle() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["project"]
    runtime = " ".join(project["dependencies"])
    assert "scikit-learn" not in runtime and "scipy" not in runtime
    assert any(d.startswith("scikit-learn") for d in project["optional-dependencies"]["test"])
    assert project["license"] == "MIT" and (REPO / "LICENSE").is_file()


def test_demo_without_opencode_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As from an installed wheel: no checkout around the package, nothing on PATH.
    monkeypatch.delenv("XAF_HUB_OPENCODE_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.chdir(tmp_path)
    assert demo._find_opencode(tmp_path / "site-packages") is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "opencode not found" in err[0] and "npm install -g opencode-ai@" in err[0]


def test_demo_in_a_checkout_points_at_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "setup.sh").write_text("", "utf-8")
    monkeypatch.delenv("XAF_HUB_OPENCODE_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert demo._find_opencode(tmp_path) is None
    assert "scripts/setup.sh" in capsys.readouterr().err


def test_demo_process_exits_1_with_one_line(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "XAF_HUB_OPENCODE_BIN": str(tmp_path / "no-such-opencode")}
    proc = subprocess.run(
        [sys.executable, "-m", "xaf_hub.sandbox.demo", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, env={**env, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "XAF_HUB_OPENCODE_BIN=" in proc.stderr


# The README states the install-size budget on one line; scripts/wheel-check.sh reads it from
# there (so the two cannot disagree) and fails above it.
def budget_line(readme: str) -> str:
    lines = [line for line in readme.splitlines() if line.startswith("Install-size budget")]
    assert len(lines) == 1, "README.md states the install-size budget on exactly one line"
    return lines[0]


def test_wheel_check_reads_the_budget_the_readme_states() -> None:
    line = budget_line((REPO / "README.md").read_text("utf-8"))
    out = subprocess.run(["bash", str(REPO / "scripts" / "wheel-check.sh"), "--budget"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    plain, mcp = out.stdout.split()[1], out.stdout.split()[4]
    assert out.stdout == f"plain {plain} MB, mcp {mcp} MB\n"
    assert f"plain install {plain} MB" in line and f"`[mcp]` install {mcp} MB" in line


@pytest.mark.parametrize("readme", [
    "# xaf-hub\n",  # no budget line at all
    "Install-size budget: plain install 120 MB.\n",  # the [mcp] budget missing
    "Install-size budget: plain install MB, `[mcp]` install 160 MB.\n",  # no number
])
def test_wheel_check_refuses_without_a_budget(tmp_path: Path, readme: str) -> None:
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "wheel-check.sh"
    script.write_bytes((REPO / "scripts" / "wheel-check.sh").read_bytes())
    (tmp_path / "README.md").write_text(readme, "utf-8")
    out = subprocess.run(["bash", str(script), "--budget"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 4
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1
    assert "README.md has no line 'Install-size budget" in out.stderr


def test_readme_opens_with_the_two_setup_commands_and_stays_short() -> None:
    lines = (REPO / "README.md").read_text("utf-8").splitlines()
    assert lines[2] == "```bash"
    assert lines[3].startswith(
        "bash scripts/setup.sh && .venv/bin/python -m xaf_hub.sandbox.demo   #")
    assert lines[4].startswith("bash scripts/test.sh   ")
    assert lines[5] == "```"
    assert len(lines) <= 400, "reference material belongs in docs/"


def test_every_local_link_of_the_readme_and_docs_leads_to_a_file() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text("utf-8")):
            path = target.split("#")[0]
            if path and "://" not in path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert broken == []


def test_the_mcp_hint_adds_the_extras_own_requirement() -> None:
    from xaf_hub.cli.commands._common import ADD_MCP, MCP_REQUIREMENT
    from xaf_hub.cli.mcp_command import INSTALL_HINT

    extras = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["project"]
    assert extras["optional-dependencies"]["mcp"] == [MCP_REQUIREMENT]
    # Over a plain pipx install a second `pipx install` is refused: the hint injects instead
    # (scripts/wheel-check.sh runs it, and the README's [mcp] line, over a plain install).
    assert ADD_MCP == "pipx inject xaf-hub 'mcp>=2.3,<3'" and INSTALL_HINT.startswith(ADD_MCP)


def test_setup_installs_what_the_demo_needs_and_the_tests_bring_the_rest(tmp_path: Path) -> None:
    repo, fake, log = tmp_path / "repo", tmp_path / "bin", tmp_path / "calls.log"
    (repo / "scripts").mkdir(parents=True)
    fake.mkdir()
    for name in ("setup.sh", "opencode-releases.sh", "opencode-bin.sh"):
        (repo / "scripts" / name).write_bytes((REPO / "scripts" / name).read_bytes())
        (repo / "scripts" / name).chmod(0o755)
    # Stand-ins that only log: python3 (a venv is a copy of it), npm, apt-get.
    stubs = {
        "python3": 'echo "python $*" >>"$CALLS"\nif [ "$1 $2" = "-m venv" ]; then\n'
                   '  mkdir -p "$3/bin"; cp "$0" "$3/bin/python"\nfi',
        "npm": 'echo "npm $*" >>"$CALLS"',
        "apt-get": 'echo "apt-get $*" >>"$CALLS"',
    }
    for name, body in stubs.items():
        (fake / name).write_text(f"#!/bin/bash\n{body}\n", "utf-8")
        (fake / name).chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "CALLS": str(log), "XAF_HUB_SKIP_BROWSER": "1",
           "HOME": str(tmp_path)}

    def setup(*args: str) -> list[str]:
        log.write_text("", "utf-8")
        done = subprocess.run(["bash", "scripts/setup.sh", *args], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return log.read_text("utf-8").splitlines()

    demo = setup()
    assert any(c.endswith("pip install --quiet --disable-pip-version-check -e .") for c in demo)
    installs = [c for c in demo if c.startswith("npm install")]
    assert len(installs) == 1 and installs[0].endswith("opencode-ai@1.18.33"), demo
    tests = setup("--test")
    assert any(c.endswith("-e .[test]") for c in tests), tests
    assert not any("1.14.41" in c or "1.2.27" in c for c in demo + tests)  # the matrix's own
