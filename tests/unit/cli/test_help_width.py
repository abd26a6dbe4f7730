"""Every --help fits an 80-column terminal: descriptions and epilogs are fitted by
termfit.fit_help, which keeps what fits as written and keeps examples pasteable."""

from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest

from xaf_hub.cli.main import COMMANDS, main
from xaf_hub.cli.termfit import cells, fit_help

HELPS = [(), *((c,) for c in COMMANDS),
         *(("backlog", sub) for sub in ("list", "add", "show", "set", "export", "import"))]


@pytest.mark.parametrize("argv", HELPS, ids=lambda a: " ".join(a) or "xaf-hub")
def test_every_help_fits_80_columns(argv: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--help"], stderr=io.StringIO(), env={})
    text = out.getvalue()
    assert code == 0 and text.startswith("usage: xaf-hub")
    wide = [line for line in text.splitlines() if cells(line) > 80]
    assert not wide, "\n".join(wide)


def test_lines_that_fit_are_kept_as_written() -> None:
    text = "examples:\n  xaf-hub a          # one\n  xaf-hub bb         # two\nexit codes: 0 ok"
    assert fit_help(text, 78) == text


def test_prose_that_does_not_fit_is_refilled_with_every_word_kept() -> None:
    text = ("Smart matching compares the task with every project session's title and directory. "
            "A related\nsession that is running is steered at once.\n\nSecond paragraph.")
    fitted = fit_help(text, 40)
    assert all(cells(line) <= 40 for line in fitted.splitlines())
    first, second = fitted.split("\n\n")
    assert first.split() == text.split("\n\n")[0].split() and second == "Second paragraph."


def pasted(lines: str) -> list[list[str]]:
    """What a shell runs for these example lines: continuations joined, comments dropped."""
    joined = re.sub(r" \\\n\s*", " ", lines)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if
            shlex.split(line, comments=True)]


def comments(lines: str) -> list[str]:
    return [w for line in lines.splitlines() if "# " in line
            for w in line.split("# ", 1)[1].split()]


def test_an_example_too_wide_stays_pasteable() -> None:
    text = ("examples:\n"
            "  xaf-hub backlog add --title \"清理旧 CF 值\" --priority P1 --prompt "
            "\"Remove the old CF values\"\n"
            "  xaf-hub backlog set F-8 --status pending --reset     # unblock: attempts cleared\n"
            "  xaf-hub backlog list                                 # short\n")
    for width in (78, 50, 36):
        fitted = fit_help(text, width)
        assert all(cells(line) <= width for line in fitted.splitlines()), fitted
        assert pasted(fitted) == pasted(text)  # the same commands, word for word
        assert comments(fitted) == comments(text)  # and the same comments
        assert '"Remove the old CF values"' in fitted  # a quoted argument is never broken


def test_comments_move_closer_in_one_column_before_anything_else() -> None:
    text = ("  xaf-hub backlog set F-8 --status pending --reset          # unblock: cleared\n"
            "  xaf-hub backlog list                                      # short")
    assert fit_help(text, 72).splitlines() == [
        "  xaf-hub backlog set F-8 --status pending --reset  # unblock: cleared",
        "  xaf-hub backlog list                              # short",
    ]
