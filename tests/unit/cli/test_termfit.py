"""Fitting tables to a terminal: display-width cuts (Chinese counts two cells), column
budgets, when colour and fitting apply (TTY vs pipe, --wide, NO_COLOR, COLUMNS)."""

from __future__ import annotations

import io
import re

from hypothesis import given
from hypothesis import strategies as st

from xaf_hub.cli.termfit import Screen, cells, fit, render, state_color, widths
from xaf_hub.core.text import table

SGR = re.compile(r"\x1b\[[0-9;]*m")


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_cells_counts_chinese_double() -> None:
    assert cells("abc") == 3
    assert cells("登录页") == 6
    assert cells("a登b") == 4


def test_fit_cuts_chinese_by_display_width() -> None:
    title = "修复登录页样式错位"  # 18 cells
    assert fit(title, 18) == title
    assert fit(title, 10) == "修复登录…"  # 8 cells + ellipsis = 9 <= 10
    assert fit(title, 9) == "修复登录…"
    assert fit(title, 8) == "修复登…"
    assert fit("abc", 3) == "abc"  # fits exactly: not cut
    assert fit("abcd", 3) == "ab…"
    assert fit("/srv/shop/web/登录", 10, keep_end=True) == "…/web/登录"


@given(st.text(alphabet="ab登录页样式 x/", max_size=40), st.integers(min_value=1, max_value=30))
def test_fit_never_exceeds_the_width(text: str, width: int) -> None:
    out = fit(text, width)
    assert cells(out) <= width
    assert out == text or out.endswith("…")
    assert cells(fit(text, width, keep_end=True)) <= width


def test_widths_shrink_flexible_columns_first_in_order() -> None:
    # natural 10, 30, 40 + gaps 4 = 84; budget 60 -> 56 cells for columns.
    assert widths([10, 30, 40], [10, 8, 8], [2, 1], 60) == [10, 30, 16]
    assert widths([10, 30, 40], [10, 8, 8], [2, 1], 40) == [10, 18, 8]
    # Floors not enough: the widest shrinks next, never below 3; `keep` is never cut.
    out = widths([10, 30, 40], [10, 30, 40], [], 30, keep=[1])
    assert out[1] == 30 and out[0] >= 3 and out[2] >= 3


def test_screen_of_a_pipe_is_plain() -> None:
    assert Screen.of(io.StringIO(), {"COLUMNS": "80"}) == Screen(None, False)


def test_screen_of_a_tty_fits_and_colours_unless_told_not_to() -> None:
    tty = FakeTty()
    assert Screen.of(tty, {"COLUMNS": "72"}) == Screen(72, True)
    assert Screen.of(tty, {"COLUMNS": "72", "NO_COLOR": "1"}) == Screen(72, False)
    assert Screen.of(tty, {"COLUMNS": "72", "TERM": "dumb"}) == Screen(72, False)
    assert Screen.of(tty, {"COLUMNS": "72"}, wide=True) == Screen(None, True)
    # No COLUMNS and no real terminal behind the stream: 80.
    assert Screen.of(tty, {}).width == 80


ROWS = [
    ["local-main", "ses_dce2f1b5fffeIvTix7rWuG7zXJ", "busy",
     "修复登录页在窄屏幕上的样式错位问题并补充回归测试",
     "/tmp/xaf-hub-demo/shop/services/payments/web"],
    ["lan-build", "ses_dce2f18a5ffeWoansOsS970g1I", "idle", "Refactor the payment callback",
     "/tmp/xaf-hub-demo/shop/api"],
]
HEADERS = ["instance", "session", "state", "title", "directory"]


def test_render_fits_an_80_column_terminal_and_keeps_ids() -> None:
    for columns in (80, 60):
        text = render(ROWS, HEADERS, Screen(columns, False),
                      flexible=[("directory", 8), ("title", 8)],
                      keep_end=["directory"], keep=["session"])
        assert max(cells(line) for line in text.splitlines()) <= columns
        assert "ses_dce2f1b5fffeIvTix7rWuG7zXJ" in text and "…" in text
        assert re.search(r"…\S*/web$", text.splitlines()[2])  # paths keep their end
        assert re.search(r"修复\S*…", text)  # the Chinese title is cut, not dropped


def test_render_on_a_pipe_is_the_plain_table() -> None:
    assert render(ROWS, HEADERS, Screen(None, False)) == table(ROWS, HEADERS)


def test_colour_only_marks_states_and_keeps_alignment() -> None:
    text = render(ROWS, HEADERS, Screen(None, True), colors={"state": state_color})
    assert "\x1b[33mbusy\x1b[0m" in text and "\x1b[" not in text.splitlines()[-1].split("idle")[0]
    assert SGR.sub("", text) == table(ROWS, HEADERS)


def test_state_colours() -> None:
    assert state_color("ok") == "32"
    assert state_color("UNREACHABLE: connection refused") == "31"
    assert state_color("busy") == state_color("retry") == "33"
    assert state_color("failed:model_unavailable") == "31"
    assert state_color("idle") is None
