"""Fitting tables to a terminal: display-width cuts (Chinese counts two cells), column
budgets, when colour and fitting apply (TTY vs pipe, --wide, NO_COLOR, COLUMNS)."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xaf_hub.cli.termfit import (
    ELLIPSIS,
    Screen,
    cells,
    fit,
    header_in,
    narrowest,
    render,
    state_color,
    widths,
)
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
    # Floors not enough: the widest shrinks next, never below 3; `keep` never below its width.
    out = widths([10, 30, 40], [10, 30, 40], [], 30, keep={1: 30})
    assert out[1] == 30 and out[0] >= 3 and out[2] >= 3
    # Ids give way first, to the start that tells them apart; then the flexible columns to
    # their floors, then again to their headers (soft), in order: the last keeps room longest.
    assert widths([10, 30, 40], [10, 30, 8], [2], 60, keep={1: 12}) == [10, 12, 34]
    assert widths([10, 30, 40], [10, 30, 20], [0, 2], 40, keep={1: 12},
                  soft=[4, 7, 5]) == [4, 12, 20]


def test_the_column_named_last_keeps_its_room_longest() -> None:
    heads = ["instance", "session", "state", "updated", "title", "directory"]
    rows = [["local-main", "ses_dce2f1b5fffeIvTix7rWuG7zXJ", "idle", "2 min ago",
             "Tidy the README and add a troubleshooting section", "/srv/shop/frontend/web"]]
    text = render(rows, heads, Screen(80, False), keep_end=["directory"],
                  flexible=[("directory", 10), ("instance", 10), ("title", 12)],
                  keep={"session": 12})
    line = text.splitlines()[2]
    assert line.split()[:2] == ["local-main", "ses_dce2f1b5"]  # a start, no ellipsis
    assert "Tidy the README and add" in line and cells(line) <= 80


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
                      keep_end=["directory"], keep={"session": 30})
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


def test_tone_colours_paint_only_a_good_value_green() -> None:
    from xaf_hub.cli.termfit import tone_painter
    from xaf_hub.core.outcomes import TASK_STATES, task_words, tone

    paint = tone_painter({task_words(s): tone(s) for s in TASK_STATES})
    assert paint("done and verified") == "32" and paint("landed") == "32"
    assert paint("finished, not verified") == "33"  # a person still has to look
    assert paint("needs a person (parked: boom)") == "33"  # a detail after the words
    assert paint("finished, not…") == "33"  # cut to fit
    assert paint("in progress") is None and paint("something else") is None


# `status` against three servers at 80 columns: the headers used to be cut to
# `instan…  runnin…  reserv…  projec…  spent t…` while the numbers beside them had room.
STATUS_HEADERS = ["instance", "running", "running project", "reserved", "project sessions",
                  "limit", "spent today", "takes work", "reason"]
STATUS_ROWS = [
    ["local-a", "0", "0", "0", "3", "2", "$0.00", "yes", ""],
    ["lan-b", "1", "1", "0", "12", "2", "$0.12", "yes", ""],
    ["lan-unreachable", "-", "-", "?", "-", "2", "-", "no",
     "unreachable: connection refused (http://127.0.0.1:9)"],
]


def header_block(text: str) -> list[str]:
    lines = text.splitlines()
    return lines[: next(i for i, ln in enumerate(lines) if set(ln) <= {"-", " "})]


def test_headers_go_on_two_lines_instead_of_being_cut_while_the_data_fits() -> None:
    text = render(STATUS_ROWS, STATUS_HEADERS, Screen(80, False),
                  flexible=[("reason", 16), ("project sessions", 8), ("running project", 8)])
    assert max(cells(line) for line in text.splitlines()) <= 80
    top, bottom = header_block(text)
    assert ELLIPSIS not in top + bottom
    # Every header word is there, the one-line headers on the lower line, over the dashes.
    assert top.split() == ["running", "project", "spent", "takes"]
    assert bottom.split() == ["instance", "running", "project", "reserved", "sessions", "limit",
                              "today", "work", "reason"]
    assert "$0.12" in text and "12" in text.split("lan-b")[1]
    assert "unreachable: connection refused" not in text  # the long reason gave way instead


def test_a_table_that_fits_keeps_one_line_headers() -> None:
    text = render(STATUS_ROWS[:2], STATUS_HEADERS, Screen(120, False))
    assert header_block(text) == [text.splitlines()[0]] and ELLIPSIS not in text
    assert text.splitlines()[0].split()[:3] == ["instance", "running", "running"]


def test_headers_are_cut_only_when_no_column_has_room_beyond_its_header() -> None:
    # The narrowest headers alone need 75 cells: at 50, headers must be cut, and are.
    text = render(STATUS_ROWS, STATUS_HEADERS, Screen(50, False))
    assert max(cells(line) for line in text.splitlines()) <= 50
    assert ELLIPSIS in "".join(header_block(text))


@pytest.mark.parametrize(("header", "width", "shown"), [
    ("running project", 15, "running project"),
    ("running project", 10, "running\nproject"),
    ("running project", 7, "running\nproject"),
    ("running project", 6, "runni…"),
    ("running all/proj", 8, "running\nall/proj"),
    ("a b c d", 3, "a b\nc d"),  # the most even split
    ("dispatchable", 8, "dispatc…"),  # one word: only a cut
    ("项目 会话", 4, "项目\n会话"),
])
def test_header_in(header: str, width: int, shown: str) -> None:
    assert header_in(header, width) == shown
    assert narrowest(header) <= width or ELLIPSIS in shown


@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(1, 20)), min_size=1, max_size=8),
    st.integers(10, 120),
)
def test_no_header_is_cut_while_another_column_has_room_beyond_its_header(
    cols: list[tuple[int, int]], limit: int
) -> None:
    data = [d for d, _ in cols]
    soft = [h for _, h in cols]
    natural = [max(d, h) for d, h in cols]
    out = widths(natural, natural, [], limit, soft=soft)
    if sum(out) + 2 * (len(out) - 1) > limit:  # could not fit: everything is down to 3
        assert all(w == min(n, 3) for w, n in zip(out, natural, strict=True))
    if any(w < h for w, (_, h) in zip(out, cols, strict=True)):  # a header is cut...
        # ...only when no column keeps more than its header (or 3) needs.
        assert all(w <= max(h, 3) for w, (_, h) in zip(out, cols, strict=True)), (out, cols)
    assert all(w <= n for w, n in zip(out, natural, strict=True)) and data is not None
