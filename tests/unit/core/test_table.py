"""The hub's one table drawer against its oracle, tabulate's "simple" format (which the hub no
longer installs): the same text for any cells a table can hold, wide characters, colour codes
and cells of several lines included."""

from __future__ import annotations

import subprocess
import sys

import tabulate as oracle
from hypothesis import example, given, settings
from hypothesis import strategies as st

from xaf_hub.core.text import _plain_cells, cells, table

WORDS = ["a", "bb", "x y", " lead", "trail ", "中文", "ｆｕｌｌ", "é", "3.50", "-1", "None",
         "\x1b[32mok\x1b[0m", "l1\nl2", "\nlow", "top\n", "a\n\nb", "", " "]
HEADS = ["h", "head", "two\nlines", "\nh", "中", "\x1b[31mred\x1b[0m", "long header"]


def drawn_by_tabulate(rows: list[list[str | int | None]], headers: list[str], pad: int) -> str:
    oracle.WIDE_CHARS_MODE = True
    saved, oracle.MIN_PADDING = oracle.MIN_PADDING, pad
    try:
        return str(oracle.tabulate(rows, headers=headers, tablefmt="simple",
                                   disable_numparse=True))
    finally:
        oracle.MIN_PADDING = saved


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[list[str | int | None]], list[str], int]:
    width = draw(st.integers(1, 4))
    headers = draw(st.lists(st.sampled_from(HEADS), min_size=width, max_size=width))
    cell = st.one_of(st.sampled_from(WORDS), st.none(), st.integers(-5, 500))
    rows = draw(st.lists(st.lists(cell, min_size=width, max_size=width), max_size=5))
    # A row with nothing in it is one blank line here; tabulate drops it in some layouts.
    rows = [r for r in rows if any(str(v).strip() for v in r if v is not None)]
    return rows, headers, draw(st.sampled_from([0, 2]))


@settings(max_examples=400, deadline=None)
@given(tables())
@example(([["ccc", " x "], ["中文", "\x1b[32myes\x1b[0m"]], ["h1", "h2"], 2))
@example(([["a", "b"]], ["\nh1", "two\nlines"], 0))
@example(([], ["a", "b"], 2))
def test_the_table_is_drawn_as_tabulate_draws_it(
    case: tuple[list[list[str | int | None]], list[str], int],
) -> None:
    rows, headers, pad = case
    assert table(rows, headers, header_pad=pad) == drawn_by_tabulate(rows, headers, pad)


def test_wide_characters_and_colour_codes_keep_the_columns_aligned() -> None:
    drawn = table([["中文", "\x1b[32myes\x1b[0m", "1"], ["ab", "no", "2"]], ["title", "ok", "n"],
                   header_pad=0)
    assert drawn.splitlines() == [
        "title  ok   n",
        "-----  ---  -",
        "中文   \x1b[32myes\x1b[0m  1",
        "ab     no   2",
    ]


def test_a_blank_row_is_a_blank_line() -> None:
    assert table([["", ""], ["a", "b"]], ["x", "y"], header_pad=0) == "x  y\n-  -\n\na  b"


def test_the_widths_known_without_wcwidth_are_wcwidths() -> None:
    """Printable ASCII and the wide East Asian characters are measured without wcwidth; for
    every character so measured (the first four planes), wcwidth says the same."""
    from wcwidth import wcwidth

    measured = [(ch, n) for ch in map(chr, range(0x40000)) if (n := _plain_cells(ch))]
    assert len(measured) > 100_000
    assert [ch for ch, n in measured if n != wcwidth(ch)] == []
    assert _plain_cells("\u0301") == 0 and _plain_cells("\x07") == 0  # left to wcwidth
    assert cells("e\u0301") == 1 and cells("a\x07b") == 2


def test_chinese_text_is_measured_without_importing_wcwidth() -> None:
    probe = ("import sys; from xaf_hub.core.text import cells; "
             "print(cells('修复登录页样式，好。'), 'wcwidth' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["20", "False"]
