"""Typos: one line with "did you mean ...?", exit 4, no doubled "xaf-hub:" prefix; the short
flags mean the same as the long ones."""

from __future__ import annotations

import io

import pytest

from xaf_hub.cli.main import build_parser, main


def error_of(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    code = main(list(argv), stdout=io.StringIO(), stderr=err, env={})
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["sesions"], "xaf-hub: error: unknown command 'sesions'; did you mean 'sessions'? "
                      "(see xaf-hub --help)"),
        (["stauts"], "did you mean 'status'?"),
        (["instances", "--jsno"], "unrecognized arguments: --jsno; did you mean --json?"),
        (["backlog", "lst"], "xaf-hub: error: backlog: argument ACTION: invalid choice: 'lst' "
                             "(choose from 'list', 'add', 'show', 'set', 'export', 'import'); "
                             "did you mean 'list'?"),
        (["completion", "bsh"], "did you mean 'bash'?"),
    ],
)
def test_typos_get_a_suggestion(argv: list[str], line: str) -> None:
    code, err = error_of(*argv)
    assert code == 4
    assert len(err.strip().splitlines()) == 1
    assert line in err
    assert "xaf-hub: error: xaf-hub" not in err


def test_nothing_close_lists_the_commands() -> None:
    code, err = error_of("zzzz")
    assert code == 4 and "did you mean" not in err and "the commands are: init, instances" in err


def test_short_flags_match_the_long_ones() -> None:
    p = build_parser(["sessions"])
    short = p.parse_args(["sessions", "-i", "a", "-k", "登录", "-n", "5", "-j", "-w"])
    long = p.parse_args(["sessions", "--instance", "a", "--keyword", "登录", "--limit", "5",
                         "--json", "--wide"])
    assert vars(short) == vars(long)
    d = build_parser(["dispatch"])
    assert vars(d.parse_args(["dispatch", "-t", "x", "-s", "ses_1", "-i", "b", "-j"])) == vars(
        d.parse_args(["dispatch", "--text", "x", "--session", "ses_1", "--instance", "b", "--json"])
    )
