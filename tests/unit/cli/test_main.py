"""The CLI surface: every command documented, usage errors exit 4, errors are one line."""

from __future__ import annotations

import gc
import importlib
import io
import json
import sys
from pathlib import Path

import pytest

from xaf_hub.cli.main import COMMANDS, GC_THRESHOLD, build_parser, command_module, main


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_and_examples(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    module = importlib.import_module(command_module(name))
    assert COMMANDS[name] and module.__doc__ and "example" in module.EXAMPLES
    with pytest.raises(SystemExit):
        build_parser([name]).parse_args([name, "--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and "--config" in text


def test_top_level_help_lists_every_command_without_importing_them() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, io\n"
        "from xaf_hub.cli.main import main\n"
        "main(['--help'], stdout=io.StringIO())\n"
        "print(sorted(m for m in sys.modules if m.startswith('xaf_hub.cli.commands.')))\n"
        "print(sorted(m for m in ('httpx', 'sklearn', 'jinja2', 'apscheduler', 'portalocker',"
        " 'starlette', 'uvicorn') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-2:] == ["[]", "[]"]
    for name in COMMANDS:
        assert name in out


def test_serve_s_web_stack_loads_only_when_it_runs() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, io, contextlib\n"
        "from xaf_hub.cli.main import main\n"
        "with contextlib.suppress(SystemExit):\n"
        "    main(['serve', '--help'], stdout=io.StringIO())\n"
        "print(sorted(m for m in ('starlette', 'uvicorn', 'xaf_hub.page.asgi')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_a_command_that_talks_http_does_not_load_httpx_s_own_cli() -> None:
    import subprocess
    import sys

    pytest.importorskip("click")  # installed beside the mcp extra: httpx would load it
    pytest.importorskip("rich")
    probe = (
        "import sys\n"
        "from xaf_hub.cli.main import main\n"
        "import xaf_hub.fleet.client, httpx\n"
        "print(sorted(m for m in ('click', 'rich', 'httpx._main') if sys.modules.get(m)))\n"
        "print(httpx.AsyncClient.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["[]", "AsyncClient"]


def test_status_loads_only_what_it_shows(tmp_path: Path) -> None:
    # The error patterns, the commit-claim patterns, html and secrets are other commands'
    # (start-up, docs/performance.md); an unreachable instance makes the run short.
    import json
    import os
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"project": {"name": "x"}, "instances": [
        {"name": "a", "url": "http://127.0.0.1:9", "roots": [str(tmp_path)]}]}))
    probe = (
        "import sys, io\n"
        "from xaf_hub.cli.main import main\n"
        f"code = main(['--config', {str(cfg)!r}, 'status'], stdout=io.StringIO(),"
        " stderr=io.StringIO())\n"
        "print(code, sorted(m for m in ('xaf_hub.core.runstate', 'xaf_hub.core.commits', 'html',"
        " 'secrets') if m in sys.modules))\n"
    )
    env = {**os.environ, "XAF_HUB_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env=env).stdout
    assert out.split() == ["2", "[]"]


def test_usage_errors_exit_4(tmp_path: Path) -> None:
    err = io.StringIO()
    assert main(["status", "--no-such-flag"], stdout=io.StringIO(), stderr=err) == 4
    assert err.getvalue().count("\n") == 1 and "unrecognized arguments" in err.getvalue()
    assert main(["frobnicate"], stdout=io.StringIO(), stderr=io.StringIO()) == 4
    assert main([], stdout=io.StringIO(), stderr=io.StringIO()) == 4


def test_missing_config_is_exit_4_one_line(tmp_path: Path) -> None:
    err = io.StringIO()
    code = main(
        ["--config", str(tmp_path / "none.json"), "status"],
        stdout=io.StringIO(),
        stderr=err,
        cwd=tmp_path,
    )
    assert code == 4
    assert err.getvalue().strip().count("\n") == 0 and "config file not found" in err.getvalue()


def test_internal_error_is_one_line_and_debug_redacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"instances": [{"name": "lan-a", "url": "http://127.0.0.1:9"}]}))
    import xaf_hub.cli.commands.status as status

    def boom(ctx: object) -> int:
        raise RuntimeError("kaboom with sekrit-pw inside")

    monkeypatch.setattr(status, "run", boom)
    env = {"XAF_HUB_PW_LAN_A": "sekrit-pw"}
    for debug in ([], ["--debug"]):
        err = io.StringIO()
        code = main(
            ["--config", str(cfg), *debug, "status"], stdout=io.StringIO(), stderr=err, env=env
        )
        assert code == 1
        text = err.getvalue()
        assert "kaboom" in text and "sekrit-pw" not in text
        if not debug:
            assert text.count("\n") == 1 and "--debug" in text
        else:
            assert "Traceback" in text


def test_a_reader_that_stops_early_ends_the_hub_quietly_as_sigpipe_does(tmp_path: Path) -> None:
    """`xaf-hub sessions --json | head`: the reader closes the pipe; the hub ends with 141
    (128 + SIGPIPE, as a shell reports any tool its reader stopped) and says nothing."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("XAF_HUB_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "xaf_hub", "completion", "bash"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the hub writes a byte: its write meets a pipe with no reader
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""
    # The same command with its reader present prints the script and exits 0.
    done = subprocess.run(
        [sys.executable, "-m", "xaf_hub", "completion", "bash"],
        capture_output=True, cwd=tmp_path, env=env, timeout=60, check=False,
    )
    assert done.returncode == 0 and "complete" in done.stdout.decode()


def test_a_broken_pipe_that_is_not_stdout_stays_an_internal_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"instances": [{"name": "lan-a", "url": "http://127.0.0.1:9"}]}))
    import xaf_hub.cli.commands.status as status

    def boom(ctx: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")  # a socket of its own, say; stdout is fine

    monkeypatch.setattr(status, "run", boom)
    err = io.StringIO()
    code = main(["--config", str(cfg), "status"], stdout=io.StringIO(), stderr=err, env={})
    assert code == 1 and "internal error: BrokenPipeError" in err.getvalue()


def test_a_command_line_run_collects_garbage_less_often(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = gc.get_threshold()
    try:
        assert main(["--version"]) == 0
        assert gc.get_threshold() == before  # a caller's own process is left as it was
        monkeypatch.setattr(sys, "argv", ["xaf-hub", "--version"])
        assert main() == 0
        assert gc.get_threshold() == GC_THRESHOLD != before
    finally:
        gc.set_threshold(*before)
    assert "xaf-hub" in capsys.readouterr().out

