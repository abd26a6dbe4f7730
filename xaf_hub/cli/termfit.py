"""Tables for a person at a terminal: fitted to its width, with colour for states.

On a TTY a table is cut to the terminal's width: the columns a command names as flexible give
way first, in its order, down to a floor; then every column shares what is left. Cells are
shortened by display width (Chinese and other wide characters count two cells) with an
ellipsis. Colour marks states (ok / unreachable / busy / failed) on a TTY only, never when
NO_COLOR is set or TERM is dumb. A pipe, or --wide, gets the table exactly as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

ELLIPSIS = "…"
GAP = 2  # tabulate's "simple" format puts two spaces between columns

GREEN, YELLOW, RED, DIM = "32", "33", "31", "2"


@dataclass(frozen=True)
class Screen:
    """Where a table goes: ``width`` None means print it whole; ``color`` allows SGR codes."""

    width: int | None = None
    color: bool = False

    @classmethod
    def of(cls, stream: TextIO, env: Mapping[str, str], *, wide: bool = False) -> Screen:
        """The screen behind ``stream``: a plain one unless it is a terminal."""
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        if not tty:
            return cls()
        color = not env.get("NO_COLOR") and env.get("TERM", "") != "dumb"
        return cls(None if wide else terminal_width(stream, env), color)


def terminal_width(stream: TextIO, env: Mapping[str, str]) -> int:
    """$COLUMNS when it is a positive number, else the terminal's own width, else 80."""
    raw = env.get("COLUMNS", "")
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    try:
        return max(os.get_terminal_size(stream.fileno()).columns, 20)
    except (AttributeError, ValueError, OSError):
        return 80


def cells(text: str) -> int:
    """Display width of ``text`` in terminal cells (wide characters count two)."""
    from wcwidth import wcswidth

    width = wcswidth(text)
    if width >= 0:
        return int(width)
    from wcwidth import wcwidth  # a control or unknown character: count what can be counted

    return sum(max(wcwidth(ch), 0) for ch in text)


def fit(text: str, width: int, *, keep_end: bool = False) -> str:
    """``text`` within ``width`` cells: whole when it fits, else cut with an ellipsis
    (at the end, or at the start with ``keep_end`` for paths whose end matters)."""
    from wcwidth import wcwidth

    if cells(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    chars = reversed(text) if keep_end else iter(text)
    kept: list[str] = []
    used = 0
    for ch in chars:
        w = max(wcwidth(ch), 0)
        if used + w > width - 1:
            break
        kept.append(ch)
        used += w
    body = "".join(reversed(kept)) if keep_end else "".join(kept)
    return ELLIPSIS + body if keep_end else body + ELLIPSIS


def widths(
    natural: Sequence[int],
    floors: Sequence[int],
    order: Sequence[int],
    limit: int,
    keep: Sequence[int] = (),
) -> list[int]:
    """Column widths whose sum plus gaps fits ``limit`` when the floors allow.

    The columns in ``order`` shrink first, one after the other, each down to its floor; then
    the widest column left shrinks, one cell at a time, down to min(natural, 3). Columns in
    ``keep`` (ids to copy) are never cut.
    """
    out = list(natural)
    budget = limit - GAP * (len(out) - 1)
    for i in order:
        excess = sum(out) - budget
        if excess <= 0:
            return out
        out[i] = max(floors[i], out[i] - excess)
    last = [n if i in keep else min(n, 3) for i, n in enumerate(natural)]
    while sum(out) > budget:
        i = max(range(len(out)), key=lambda k: (out[k] - last[k], out[k]))
        if out[i] <= last[i]:
            break
        out[i] -= 1
    return out


Painter = Callable[[str], "str | None"]


def paint(text: str, code: str | None) -> str:
    """``text`` in SGR colour ``code`` (unchanged when None)."""
    return f"\x1b[{code}m{text}\x1b[0m" if code else text


def render(
    rows: Sequence[Sequence[Any]],
    headers: Sequence[str],
    screen: Screen,
    *,
    flexible: Sequence[tuple[str, int]] = (),
    keep_end: Sequence[str] = (),
    keep: Sequence[str] = (),
    colors: Mapping[str, Painter] | None = None,
) -> str:
    """The table for ``screen``.

    ``flexible``: (header, floor) pairs, the columns that give way first, in that order;
    ``keep_end``: columns cut at the start (paths); ``keep``: columns never cut (ids);
    ``colors``: header -> value -> SGR code.
    Cells must already be terminal-safe text (no control characters).
    """
    from xaf_hub.core.text import table

    text_rows = [["" if v is None else str(v) for v in row] for row in rows]
    heads = list(headers)
    if screen.width is not None and heads:
        natural = [
            max([cells(h)] + [cells(r[i]) for r in text_rows]) for i, h in enumerate(heads)
        ]
        index = {h: i for i, h in enumerate(heads)}
        floors = list(natural)
        present = [(index[name], floor) for name, floor in flexible if name in index]
        for i, floor in present:
            floors[i] = min(natural[i], floor)
        order = [i for i, _ in present]
        kept = [index[h] for h in keep if h in index]
        final = widths(natural, floors, order, screen.width, kept)
        ends = {index[h] for h in keep_end if h in index}
        heads = [fit(h, final[i]) for i, h in enumerate(heads)]
        text_rows = [
            [fit(v, final[i], keep_end=i in ends) for i, v in enumerate(r)] for r in text_rows
        ]
    if screen.color and colors:
        for name, painter in colors.items():
            if name not in headers:
                continue
            i = list(headers).index(name)
            for r in text_rows:
                r[i] = paint(r[i], painter(r[i]))
    return table(text_rows, heads, header_pad=2 if screen.width is None else 0)


def state_color(value: str) -> str | None:
    """Colour of a state word: ok/idle/succeeded green, busy/retry yellow, failures red."""
    v = value.lower()
    if v.startswith(("unreachable", "failed", "aborted", "rate_limited", "error")):
        return RED
    if v.startswith(("busy", "retry", "running", "waiting")):
        return YELLOW
    if v in ("ok", "succeeded"):
        return GREEN
    return None


def yes_no_color(value: str) -> str | None:
    """Colour of a yes/no cell: yes green, no yellow."""
    return GREEN if value == "yes" else YELLOW if value == "no" else None
