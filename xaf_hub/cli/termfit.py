"""Tables for a person at a terminal: fitted to its width, with colour for states.

On a TTY a table is cut to the terminal's width in a fixed order of what gives way first
(docs/architecture.md §12), by display width; colour only on a TTY, never with NO_COLOR or a dumb
TERM. A pipe, or --wide, gets the table whole.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from xaf_hub.core.text import GAP, cells, char_cells, table

ELLIPSIS = "…"

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


def fit(text: str, width: int, *, keep_end: bool = False, mark: str = ELLIPSIS) -> str:
    """``text`` within ``width`` cells: whole when it fits, else cut with ``mark`` (an
    ellipsis, "" for an id's start) at the end, or at the start with ``keep_end`` for paths
    whose end matters."""
    if cells(text) <= width:
        return text
    if width <= len(mark):
        return mark[:width]
    chars = reversed(text) if keep_end else iter(text)
    kept: list[str] = []
    used = 0
    for ch in chars:
        w = char_cells(ch)
        if used + w > width - len(mark):
            break
        kept.append(ch)
        used += w
    body = "".join(reversed(kept)) if keep_end else "".join(kept)
    return mark + body if keep_end else body + mark


def widths(
    natural: Sequence[int], floors: Sequence[int], order: Sequence[int], limit: int,
    keep: Mapping[int, int] | None = None, soft: Sequence[int] = (),
) -> list[int]:
    """Column widths whose sum plus gaps fits ``limit`` when the floors allow.

    The columns in ``keep`` (ids to copy: index -> the least width that still tells them
    apart) shrink first, to that width and never below; then the columns in ``order``, one
    after the other, each down to its floor, and again down to its ``soft`` width (its
    header's narrowest form: no header is cut before the last pass); then the column with
    the most to give, one cell at a time, down to its soft width, then down to
    min(natural, 3).
    """
    out = list(natural)
    keep = keep or {}
    budget = limit - GAP * (len(out) - 1)
    softs = list(soft) or [0] * len(out)
    least_soft = [max(m, 3) for m in softs]
    steps = [*((i, keep[i]) for i in keep), *((i, floors[i]) for i in order),
             *((i, min(floors[i], least_soft[i])) for i in order)]
    for i, floor in steps:
        excess = sum(out) - budget
        if excess <= 0:
            return out
        out[i] = max(min(out[i], floor), out[i] - excess)
    for least in (least_soft, [3] * len(out)):
        last = [keep[i] if i in keep else min(n, least[i]) for i, n in enumerate(natural)]
        while sum(out) > budget:
            i = max(range(len(out)), key=lambda k: (out[k] - last[k], out[k]))
            if out[i] <= last[i]:
                break
            out[i] -= 1
    return out


def _splits(header: str) -> list[tuple[str, str]]:
    """Every way to put ``header`` on two lines at a space."""
    return [(header[:i].rstrip(), header[i + 1 :].lstrip()) for i, ch in enumerate(header)
            if ch == " " and header[:i].strip() and header[i + 1 :].strip()]


def narrowest(header: str) -> int:
    """The fewest cells ``header`` needs, on one line or split on two at a space."""
    return min([cells(header)] + [max(cells(a), cells(b)) for a, b in _splits(header)])


def header_in(header: str, width: int) -> str:
    """``header`` within ``width`` cells: whole, else on two lines (the most even split that
    fits), else cut with an ellipsis."""
    if cells(header) <= width:
        return header
    fitting = [(a, b) for a, b in _splits(header) if max(cells(a), cells(b)) <= width]
    if not fitting:
        return fit(header, width)
    a, b = min(fitting, key=lambda ab: (abs(cells(ab[0]) - cells(ab[1])), -cells(ab[0])))
    return f"{a}\n{b}"


def wrap(text: str, width: int, first: str = "", rest: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` cells (display width), broken at spaces, the
    first line led by ``first`` and the others by ``rest``. A word longer than a line (a
    path, a URL, a command to copy) stays whole on a line of its own, never broken."""
    lines: list[str] = []
    line = first
    bare = True  # nothing but the lead on this line yet
    for word in text.split():
        if bare or cells(line) + 1 + cells(word) <= width:
            line += word if bare else " " + word
            bare = False
        else:
            lines.append(line)
            line, bare = rest + word, False
    lines.append(line)
    return lines


def fit_help(text: str, width: int) -> str:
    """A --help description or epilog within ``width`` cells, its layout kept where it fits.

    Lines that fit are left as they are. Running prose (lines at the margin) that does not is
    refilled as one paragraph. An indented line (an example) that does not fit loses the
    padding before its ``# comment``, then puts the comment on a line of its own above it,
    then breaks the command at spaces with a shell continuation (`` \\``), so that what is
    shown can still be pasted.
    """
    out: list[str] = []
    prose: list[str] = []
    examples: list[str] = []

    def flush() -> None:
        if any(cells(line) > width for line in prose):
            out.extend(wrap(" ".join(line.strip() for line in prose), width))
        else:
            out.extend(prose)
        prose.clear()
        out.extend(_fit_examples(examples, width))
        examples.clear()

    for line in text.splitlines():
        if line.strip() and not line[0].isspace():
            if examples:
                flush()
            prose.append(line)
        else:
            if prose:
                flush()
            examples.append(line.rstrip())
    flush()
    return "\n".join(out)


def _fit_examples(lines: Sequence[str], width: int) -> list[str]:
    """A run of indented help lines within ``width``: when one does not fit, the comments
    of the run are first aligned closer (one column for all), then each line on its own."""
    if all(cells(line) <= width for line in lines):
        return list(lines)
    parts = [line.partition("  # ") for line in lines]
    commented = [(body.rstrip(), rest.strip()) for body, sep, rest in parts if sep]
    if commented:
        column = max(cells(body) for body, _ in commented) + 2
        aligned = [f"{body.rstrip()}{' ' * (column - cells(body.rstrip()))}# {rest.strip()}"
                   if sep else body for body, sep, rest in parts]
        if all(cells(line) <= width for line in aligned):
            return aligned
    return [fitted for line in lines for fitted in _fit_example(line, width)]


def _fit_example(line: str, width: int) -> list[str]:
    """One indented help line within ``width`` (see ``fit_help``)."""
    if cells(line) <= width:
        return [line]
    lead = line[: len(line) - len(line.lstrip())]
    body, sep, comment = line.strip().partition("  # ")
    lines: list[str] = []
    if sep:
        body, comment = body.rstrip(), "# " + comment.strip()
        if cells(f"{lead}{body}  {comment}") <= width:
            return [f"{lead}{body}  {comment}"]
        lines.extend(wrap(comment, width, lead, lead + "# "))
    if cells(lead + body) <= width:
        return [*lines, lead + body]

    # Shell words: a quoted argument is never broken (a continuation inside quotes is not one).
    words = re.findall(r"""(?:[^\s"']+|"[^"]*"|'[^']*')+""", body)
    part = lead
    for word in words:
        if part.strip() and cells(part) + 1 + cells(word) + 2 > width:
            lines.append(part + " \\")
            part = lead + "    " + word
        else:
            part += (" " if part.strip() else "") + word
    lines.append(part)
    return lines


Painter = Callable[[str], "str | None"]


def paint(text: str, code: str | None) -> str:
    """``text`` in SGR colour ``code`` (unchanged when None)."""
    return f"\x1b[{code}m{text}\x1b[0m" if code else text


def render(
    rows: Sequence[Sequence[Any]], headers: Sequence[str], screen: Screen, *,
    flexible: Sequence[tuple[str, int]] = (), keep_end: Sequence[str] = (),
    keep: Mapping[str, int | None] | None = None, colors: Mapping[str, Painter] | None = None,
) -> str:
    """The table for ``screen``.

    ``flexible``: (header, floor) pairs, the columns that give way first, in that order (the
    last keeps its room longest); ``keep_end``: columns cut at the start (paths); ``keep``:
    id columns, header -> the fewest characters that tell the ids apart (cut to no less,
    without an ellipsis; None: never cut); ``colors``: header -> value -> SGR code.
    Cells must already be terminal-safe text (no control characters).
    """

    text_rows = [["" if v is None else str(v) for v in row] for row in rows]
    heads = list(headers)
    if screen.width is not None and heads:
        data = [max([0] + [cells(r[i]) for r in text_rows]) for i in range(len(heads))]
        natural = [max(cells(h), d) for h, d in zip(heads, data, strict=True)]
        soft = [narrowest(h) for h in heads]
        if sum(natural) + GAP * (len(heads) - 1) > screen.width:
            natural = [max(m, d) for m, d in zip(soft, data, strict=True)]  # two-line headers
        index = {h: i for i, h in enumerate(heads)}
        floors = list(natural)
        present = [(index[name], floor) for name, floor in flexible if name in index]
        for i, floor in present:
            floors[i] = min(natural[i], max(floor, soft[i]))
        order = [i for i, _ in present]
        kept = {index[h]: min(natural[index[h]], n or natural[index[h]])
                for h, n in (keep or {}).items() if h in index}
        final = widths(natural, floors, order, screen.width, kept, soft)
        ends = {index[h] for h in keep_end if h in index}
        heads = [header_in(h, final[i]) for i, h in enumerate(heads)]
        if any("\n" in h for h in heads):  # the one-line headers sit on the lower line
            heads = [h if "\n" in h else f"\n{h}" for h in heads]
        text_rows = [[fit(v, final[i], keep_end=i in ends, mark="" if i in kept else ELLIPSIS)
                      for i, v in enumerate(r)] for r in text_rows]
    for name, painter in (colors or {}).items() if screen.color else ():
        if name in headers:
            i = list(headers).index(name)
            for r in text_rows:
                r[i] = paint(r[i], painter(r[i]))
    return table(text_rows, heads, header_pad=2 if screen.width is None else 0)


def state_color(value: str) -> str | None:
    """Colour of a state word: ok/idle/succeeded green, busy/retry yellow, failures red."""
    v = value.lower()
    for color, starts in _STATE_STARTS:
        if v.startswith(starts):
            return color
    return GREEN if v in ("ok", "succeeded") else None


_STATE_STARTS = ((RED, ("unreachable", "failed", "aborted", "rate_limited", "error")),
                 (YELLOW, ("busy", "retry", "running", "waiting")))


_TONE_COLORS = {"good": GREEN, "person": YELLOW, "bad": RED}


def tone_painter(tones: Mapping[str, str]) -> Painter:
    """Colour of a cell that shows one of ``tones``' words (words -> ``core.outcomes.Tone``),
    cut or followed by a detail: green only for a good value, yellow for a person's."""

    def painter(cell: str) -> str | None:
        head = cell.rstrip("…")
        for words, tone in tones.items():
            if head.startswith(words) or words.startswith(head):
                return _TONE_COLORS.get(tone)
        return None

    return painter


def yes_no_color(value: str) -> str | None:
    """Colour of a yes/no cell: yes green, no yellow."""
    return GREEN if value == "yes" else YELLOW if value == "no" else None
