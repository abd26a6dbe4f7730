"""`xaf-hub init`: a starter config that loads, never an overwrite without --force."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

from xaf_hub.cli.main import main
from xaf_hub.config.load import load_config
from xaf_hub.errors import ExitCode

REPO = Path(__file__).resolve().parents[4]


def run(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err, env=env or {"XAF_HUB_HOME": str(cwd / "h")},
                cwd=cwd)
    return code, out.getvalue(), err.getvalue()


def test_init_without_flags_writes_the_bundled_example(tmp_path: Path) -> None:
    code, out, err = run(tmp_path, "init")
    assert code == 0, err
    written = tmp_path / "config.json"
    example = REPO / "config.example.json"  # the top-level one
    assert written.read_text("utf-8") == example.read_text("utf-8")
    assert f"wrote {written}" in out and "next:" in out and "xaf-hub doctor" in out
    # The demo it names is the checkout's harness (the wheel has none): that module, run from
    # a clone's root, is the demo.
    [module] = re.findall(r"python -m (\S+) --keep", out)
    assert not module.startswith("xaf_hub")
    assert (REPO / (module.replace(".", "/") + ".py")).is_file()


def test_init_from_flags_loads_and_names_the_password_variables(tmp_path: Path) -> None:
    (tmp_path / "shop").mkdir()
    code, out, err = run(
        tmp_path, "init", "-i", "dev-box=http://127.0.0.1:4096/", "--instance",
        "build=http://127.0.0.1:4097", "--root", "shop", "--project", "商店",
    )
    assert code == 0, err
    cfg = load_config(str(tmp_path / "config.json"), env={}, cwd=tmp_path)
    assert [i.name for i in cfg.instances] == ["dev-box", "build"]
    assert cfg.instances[0].url == "http://127.0.0.1:4096"
    assert cfg.instances[1].roots == (str(tmp_path / "shop"),)
    assert cfg.project_name == "商店"
    assert "XAF_HUB_PW_DEV_BOX=" in out and "XAF_HUB_PW_BUILD=" in out
    assert "`xaf-hub doctor`" in out  # ./config.json is found without --config


def test_init_root_only_means_one_local_instance(tmp_path: Path) -> None:
    code, _, err = run(tmp_path, "init", "--root", "/srv/shop")
    assert code == 0, err
    doc = json.loads((tmp_path / "config.json").read_text("utf-8"))
    assert doc["instances"] == [{
        "name": "local", "url": "http://127.0.0.1:4096",
        "roots": ["/srv/shop"], "default_directory": "/srv/shop",
    }]
    assert doc["project"]["name"] == "shop"


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    target.write_text('{"mine": true}', "utf-8")
    code, out, err = run(tmp_path, "init", "--root", "/srv/shop")
    assert code == ExitCode.USAGE and out == ""
    assert err.strip() == f"xaf-hub: error: {target} already exists: pass --force to overwrite it"
    assert target.read_text("utf-8") == '{"mine": true}'
    code, _, _ = run(tmp_path, "init", "--root", "/srv/shop", "--force")
    assert code == 0 and "instances" in json.loads(target.read_text("utf-8"))


def test_init_writes_where_config_points_and_says_so(tmp_path: Path) -> None:
    dest = tmp_path / "deep" / "hub.json"
    code, out, err = run(tmp_path, "--config", str(dest), "init", "--root", "/srv/shop")
    assert code == 0, err
    assert dest.is_file() and not (tmp_path / "config.json").exists()
    assert f"xaf-hub --config {dest} doctor" in out
    code, out, err = run(tmp_path, "init", "--root", "/srv/x",
                         env={"XAF_HUB_CONFIG": str(tmp_path / "env.json")})
    assert code == 0 and (tmp_path / "env.json").is_file()
    assert not [p for p in os.listdir(tmp_path / "deep") if p.endswith(".tmp")]


def test_init_bad_flags_are_one_line_exit_4(tmp_path: Path) -> None:
    for argv, message in (
        (["-i", "nourl"], "--instance 'nourl': expected NAME=URL"),
        (["-i", "a=ftp://127.0.0.1:1"], "must start with http:// or https://"),
        (["-i", "a=http://127.0.0.1:1", "-i", "a=http://127.0.0.1:2"], "given twice"),
    ):
        code, _, err = run(tmp_path, "init", *argv)
        assert code == ExitCode.USAGE, argv
        assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "config.json").exists()
    (tmp_path / "folder.json").mkdir()
    code, _, err = run(tmp_path, "--config", str(tmp_path / "folder.json"), "init")
    assert code == ExitCode.USAGE and "is a folder" in err


def test_init_ends_with_the_lines_to_paste_for_an_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shlex
    import sys

    script = tmp_path / "bin" / "xaf-hub"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n", "utf-8")
    for argv0, head in ((str(script), [str(script)]),
                        ("/x/pytest", [sys.executable, "-m", "xaf_hub"])):
        monkeypatch.setattr(sys, "argv", [argv0])
        (tmp_path / "the config").mkdir(exist_ok=True)
        code, out, err = run(tmp_path, "--config", "the config/c.json", "init", "--root", "/s",
                             "--force")
        assert code == 0, err
        lines = out.splitlines()
        words = [*head, "--config", str(tmp_path / "the config" / "c.json"), "mcp"]
        # opencode's key, whole and valid JSON: the config's absolute path, this very hub.
        assert json.loads(lines[-3]) == {"mcp": {"xafhub": {"type": "local", "command": words}}}
        claude = lines[-1].strip()
        assert claude.startswith("claude mcp add xafhub -- ")
        assert shlex.split(claude)[5:] == words


def test_init_prod_marks_the_named_instance_production_and_only_it(tmp_path: Path) -> None:
    code, out, err = run(
        tmp_path, "init", "-i", "dev=http://127.0.0.1:4096", "-i", "live=http://127.0.0.1:4097",
        "--root", "/srv/shop", "--prod", "live",
    )
    assert code == 0, err
    doc = json.loads((tmp_path / "config.json").read_text("utf-8"))
    assert doc["instances"][1]["danger"] is True
    assert doc["instances"][1]["readonly_default"] is True
    assert "danger" not in doc["instances"][0] and "readonly_default" not in doc["instances"][0]
    cfg = load_config(str(tmp_path / "config.json"), env={}, cwd=tmp_path)
    assert [i.production for i in cfg.instances] == [False, True]


def test_init_prod_of_an_unknown_name_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    for argv in (
        ("-i", "dev=http://127.0.0.1:4096", "--prod", "live"),
        ("--root", "/srv/shop", "--prod", "dev"),  # the implied instance is named local
        ("--prod", "live",),  # the bundled example: no instance named on the command line
    ):
        code, out, err = run(tmp_path, "init", *argv)
        assert code == ExitCode.USAGE and out == "", argv
        assert err.startswith("xaf-hub: error: --prod ") and err.count("\n") == 1, err
        assert not (tmp_path / "config.json").exists()
    code, _, err = run(tmp_path, "init", "--root", "/srv/shop", "--prod", "local")
    assert code == 0, err
    cfg = load_config(str(tmp_path / "config.json"), env={}, cwd=tmp_path)
    assert cfg.instances[0].production


def test_init_fills_the_repository_from_the_roots_origin_without_its_token(
    tmp_path: Path,
) -> None:
    """A root that is a git checkout with an ``origin`` gives ``project.repository``; a token
    in the remote's URL never reaches config.json nor the output."""
    from tests.gitrepo import git

    shop = tmp_path / "shop"
    shop.mkdir()
    git(shop, "init", "-q")
    git(shop, "remote", "add", "origin", "https://alice:s3cr3t-t0ken@git.example/shop.git")
    code, out, err = run(tmp_path, "init", "--root", "shop")
    assert code == 0, err
    written = (tmp_path / "config.json").read_text("utf-8")
    assert json.loads(written)["project"]["repository"] == "https://git.example/shop.git"
    assert "s3cr3t" not in written and "alice" not in written and "s3cr3t" not in out + err
    said = f"project.repository: https://git.example/shop.git (the 'origin' remote of {shop})"
    assert said in out
    assert "git's own credential store" in out
    cfg = load_config(str(tmp_path / "config.json"), env={}, cwd=tmp_path)
    assert cfg.repository.url == "https://git.example/shop.git"
    # An ssh remote is kept as it is, and nothing is said of credentials.
    git(shop, "remote", "set-url", "origin", "git@git.example:team/shop.git")
    code, out, _ = run(tmp_path, "init", "--root", "shop", "--force")
    doc = json.loads((tmp_path / "config.json").read_text("utf-8"))
    assert code == 0 and doc["project"]["repository"] == "git@git.example:team/shop.git"
    assert "credential" not in out


def test_init_says_when_the_root_gives_no_repository(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    code, out, err = run(tmp_path, "init", "--root", "plain")
    assert code == 0, err
    assert "repository" not in json.loads((tmp_path / "config.json").read_text("utf-8"))["project"]
    assert "project.repository: not set" in out and "finished, not verified" in out


def test_init_adds_a_project_to_a_one_project_config_keeping_it_valid(tmp_path: Path) -> None:
    code, _, err = run(tmp_path, "init", "-i", "dev=http://127.0.0.1:4096", "--root", "/srv/shop")
    assert code == 0, err
    path = tmp_path / "config.json"
    code, out, err = run(tmp_path, "init", "--add-project", "blog", "--root", "/srv/blog")
    assert code == 0, err
    assert "added project blog" in out and "shop, blog" in out
    cfg = load_config(str(path), env={}, cwd=tmp_path)
    assert [p.name for p in cfg.projects] == ["shop", "blog"]
    assert cfg.choose("shop").instances[0].roots == ("/srv/shop",)
    assert cfg.choose("blog").instances[0].default_directory == "/srv/blog"
    before = path.read_text("utf-8")
    code, _, err = run(tmp_path, "init", "--add-project", "blog", "--root", "/srv/x")
    assert code == ExitCode.USAGE and "already has that project" in err
    code, _, err = run(tmp_path, "init", "--add-project", "9bad", "--root", "/srv/x")
    assert code == ExitCode.USAGE and "short identifier" in err
    assert path.read_text("utf-8") == before  # nothing half-written
