"""The benchmark's command line builds: every option is declared once (argparse refuses a
second declaration of a flag, and then no benchmark starts, the soak in scripts/test.sh among
them)."""

from __future__ import annotations

import pytest

from bench.__main__ import parse_args


def test_the_command_line_builds_and_reads_each_mode() -> None:
    assert parse_args([]).projects == 1
    assert parse_args(["--soak", "--minutes", "3", "--seed", "53"]).seed == 53
    assert parse_args(["--rounds", "--projects", "3"]).projects == 3


def test_help_prints(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        parse_args(["--help"])
    assert done.value.code == 0 and "--soak" in capsys.readouterr().out
