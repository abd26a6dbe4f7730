"""The wheel a user installs holds the whole package and nothing of the checkout.

Built once from this tree with `python -m build` (the same as scripts/wheel-check.sh, which then
installs it with pipx and uv and runs it from an empty folder)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import xaf_hub

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "xaf_hub"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # From the tracked files, as a fresh clone has them: building in the checkout would let an
    # editable install's xaf_hub.egg-info/SOURCES.txt lend the wheel files the config leaves out.
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode("utf-8").split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(src)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = out.glob("xaf_hub-*.whl")
    return built


def package_files() -> set[str]:
    """Every file of the package in the checkout that belongs in the wheel."""
    found = set()
    for path in PACKAGE.rglob("*"):
        if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        found.add(path.relative_to(REPO).as_posix())
    return found


def test_every_module_and_template_of_the_package_is_in_the_wheel(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = package_files()
    assert any(n.endswith("/__init__.py") and n.count("/") >= 2 for n in expected)
    assert {"xaf_hub/config.example.json", "xaf_hub/py.typed"} <= expected
    assert any(n.endswith(".j2") for n in expected)
    missing = sorted(expected - names)
    assert not missing, f"left out of the wheel: {missing}"


def test_the_wheel_holds_nothing_of_the_checkout(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    outside = [n for n in names if not n.startswith(("xaf_hub/", "xaf_hub-"))]
    assert not outside, outside
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheel_holds_no_test_harness(wheel: Path) -> None:
    # The fake model, the fleet launcher and the demo are the checkout's (sandbox/), not a
    # user's: no folder of that name and none of its modules anywhere in the wheel.
    harness = {p.name for p in (REPO / "sandbox").glob("*.py")} - {"__init__.py"}
    assert {"fake_llm.py", "fleet.py", "demo.py", "releases.py"} <= harness
    names = zipfile.ZipFile(wheel).namelist()
    found = [n for n in names if "sandbox" in n.split("/")[:-1]
             or (n.endswith(".py") and n.rsplit("/", 1)[-1] in harness - {"releases.py"})]
    assert found == []


def test_wheel_metadata_names_the_version_and_refuses_old_pythons(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(zf.read(meta_name).decode("utf-8"))
        entry = zf.read(meta_name.replace("METADATA", "entry_points.txt")).decode("utf-8")
    assert meta["Version"] == xaf_hub.__version__
    assert meta["Requires-Python"] == ">=3.11"
    assert "xaf-hub = xaf_hub.cli.main:run" in entry


def test_pip_refuses_the_wheel_on_python_3_10(wheel: Path, tmp_path: Path) -> None:
    # pip judges Requires-Python before anything is unpacked: the refusal, not an import crash.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "xaf-hub", "--no-index", "--no-deps",
         "--find-links", str(wheel.parent), "--python-version", "3.10", "--only-binary=:all:",
         "-d", str(tmp_path / "t")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    assert "requires a different Python: 3.10.0 not in '>=3.11'" in proc.stderr, proc.stderr


def test_the_packaged_example_config_is_the_top_level_one() -> None:
    top = (REPO / "config.example.json").read_bytes()
    assert (PACKAGE / "config.example.json").read_bytes() == top, (
        "xaf_hub/config.example.json must be a copy of the top-level config.example.json: "
        "cp config.example.json xaf_hub/"
    )


def test_the_changelog_records_this_version() -> None:
    text = (REPO / "CHANGELOG.md").read_text("utf-8")
    assert f"## [{xaf_hub.__version__}] - " in text
    assert "## [Unreleased]" in text and "## [0.1.0] - " in text
