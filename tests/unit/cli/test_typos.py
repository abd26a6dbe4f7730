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


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["dispatch", "--txt", "x"], "did you mean --text?"),  # a required option mistyped
        (["dispatch", "--text", "x", "--instanse", "a"], "did you mean --instance?"),
        (["show", "--sesion", "ses_1"], "did you mean --session?"),
        (["interrupt", "--sesion", "ses_1"], "did you mean --session?"),
        (["confirm", "--sesion", "ses_1"], "did you mean --session?"),
        (["backlog", "add", "--titel", "x"], "did you mean --title?"),
    ],
)
def test_every_mistyped_option_gets_a_suggestion(argv: list[str], hint: str) -> None:
    code, err = error_of(*argv)
    assert code == 4 and len(err.strip().splitlines()) == 1
    assert hint in err, err


def test_a_value_that_starts_with_a_dash_is_told_how_to_give_it() -> None:
    code, err = error_of("dispatch", "--text", "--fix-it")
    assert code == 4 and "a value that starts with '-' is given as --text=VALUE" in err
    assert "did you mean" not in err
    code, err = error_of("sessions", "--limit")  # no value at all: nothing to say about dashes
    assert code == 4 and "expected one argument" in err and "starts with" not in err


def test_a_text_that_looks_like_an_option_is_not_a_typo() -> None:
    # `--text=--fixit` names --text; nothing after `--` is an option.
    p = build_parser(["dispatch"])
    assert p._mistyped(["--text=--fixit"]) == ""  # type: ignore[attr-defined]
    assert p._mistyped(["--", "--txt"]) == ""  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", ["show", "confirm", "interrupt"])
def test_the_session_is_a_positional_or_s(command: str) -> None:
    from xaf_hub.cli.commands._common import the_session

    p = build_parser([command])
    for argv in ([command, "ses_1"], [command, "-s", "ses_1"], [command, "--session", "ses_1"],
                 [command, "ses_1", "-s", "ses_1"]):
        ns = p.parse_args(argv)
        assert the_session(ns.session, ns.session_pos) == "ses_1", argv


@pytest.mark.parametrize("command", ["show", "confirm", "interrupt"])
def test_no_session_or_two_different_ones_is_one_clear_line(command: str) -> None:
    code, err = error_of(command, "--config", "/nonexistent/config.json")
    assert code == 4 and "name the session: SESSION or -s/--session ID" in err
    code, err = error_of(command, "ses_1", "-s", "ses_2", "--config", "/nonexistent/x.json")
    assert code == 4 and "two sessions given (ses_1 and -s ses_2)" in err
