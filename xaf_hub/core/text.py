"""Terminal output helpers: the one table builder, JSON dumps, secret redaction, times.

``redact`` is the one place secrets are taken out of text: everything the hub prints, logs,
exports or serves passes through it (via ``Context.out``/``warn``/``info``, the audit log, the
patrol report, the exports and the served page).
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote, quote_plus

_SGR = re.compile(r"\x1b\[[\d;]*m")  # a colour code: no width on the screen
GAP = 2  # the spaces between a table's columns


def char_cells(ch: str) -> int:
    """One character's width in terminal cells (0 for a control or combining character)."""
    width = _plain_cells(ch)
    if width:
        return width
    from wcwidth import wcwidth  # deferred: start-up, docs/performance.md

    return max(wcwidth(ch), 0)


def cells(text: str) -> int:
    """Display width of ``text`` in terminal cells (wide characters count two)."""
    if text.isascii() and text.isprintable():
        return len(text)  # one cell each
    plain = [_plain_cells(ch) for ch in text]
    if all(plain):
        return sum(plain)
    from wcwidth import wcswidth  # deferred: start-up, docs/performance.md

    width = wcswidth(text)
    # a control or unknown character: count what can be counted
    return int(width) if width >= 0 else sum(char_cells(ch) for ch in text)


def _plain_cells(ch: str) -> int:
    """The cells of a character whose width is certain without wcwidth (and its import):
    printable ASCII, and the wide East Asian ones (CJK, full-width forms); else 0."""
    if " " <= ch <= "~":
        return 1
    kind = unicodedata.category(ch)  # marks and unassigned ones: wcwidth knows better
    wide = unicodedata.east_asian_width(ch) in ("W", "F") and kind[0] != "M" and kind != "Cn"
    return 2 if wide and ch != "\u3164" else 0  # the Hangul filler is wide by class, not drawn


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], *, header_pad: int = 2) -> str:
    """Rows under their headers as tabulate's "simple" format draws them: columns two spaces
    apart, a dashed rule under the headers, cells stripped and left-aligned, a cell of several
    lines spread over as many lines (padded below), colour codes taking no room and wide (CJK)
    characters two cells.

    ``header_pad``: the cells a column keeps beyond its header (tables fitted to a terminal
    use 0)."""
    heads = [str(h) for h in headers]
    body = [["" if v is None else str(v).strip() for v in row] for row in rows]

    def width(cell: str) -> int:
        return max(cells(_SGR.sub("", line)) for line in cell.split("\n"))

    sizes = [max([width(h) + header_pad] + [width(r[i]) for r in body])
             for i, h in enumerate(heads)]

    def lines(row: Sequence[str]) -> list[str]:
        split = [cell.split("\n") for cell in row]
        return [
            (" " * GAP).join(
                (part := s[k] if k < len(s) else "") + " " * (w - width(part))
                for s, w in zip(split, sizes, strict=True)
            ).rstrip()
            for k in range(max(map(len, split), default=0))
        ]

    rule = (" " * GAP).join("-" * w for w in sizes)
    return "\n".join([*lines(heads), rule, *(line for row in body for line in lines(row))])


def dumps(data: Any) -> str:
    """JSON for scripts: UTF-8 text, stable key order as built, never NaN or Infinity."""
    try:
        return _indented(data, "\n")
    except (_Unusual, RecursionError):  # another value, a non-str key, a non-finite float or
        pass  # deep nesting: json's own way
    return _strict(data, 2)


class _Unusual(Exception):
    """A value ``_indented`` leaves to ``json.dumps``."""


_quote = json.encoder.encode_basestring  # the C function json.dumps(ensure_ascii=False) uses


def _indented(data: Any, newline: str) -> str:
    """``json.dumps(data, ensure_ascii=False, indent=2)`` for plain JSON values (exact types
    dict with str keys, list, tuple, str, int, finite float, bool, None), in a third of the
    time: json's indented encoder is pure Python, one generator per container
    (docs/performance.md). Anything else raises _Unusual."""
    kind = type(data)
    if kind is str:
        return _quote(data)
    if data is None:
        return "null"
    if data is True:
        return "true"
    if data is False:
        return "false"
    if kind is int:
        return int.__repr__(data)
    if kind is float:
        if not math.isfinite(data):
            raise _Unusual
        return float.__repr__(data)
    inner = newline + "  "
    if kind is dict:
        if not data:
            return "{}"
        parts = []
        for key, value in data.items():
            if type(key) is not str:
                raise _Unusual
            # The common leaves inline (a record is a flat dict): a call per field costs more.
            vk = type(value)
            if vk is str:
                text = _quote(value)
            elif vk is int:
                text = int.__repr__(value)
            elif value is None:
                text = "null"
            else:
                text = _indented(value, inner)
            parts.append(f"{_quote(key)}: {text}")
        return "{" + inner + ("," + inner).join(parts) + newline + "}"
    if kind is list or kind is tuple:
        if not data:
            return "[]"
        return "[" + inner + ("," + inner).join([_indented(v, inner) for v in data]) + newline + "]"
    raise _Unusual


def dumps_line(data: Any) -> str:
    """Compact one-line JSON (for logs), never NaN or Infinity."""
    return _strict(data, None)


def _strict(data: Any, indent: int | None) -> str:
    """``json.dumps`` of ``data`` as it is, or with every non-finite float null (JSON has no
    word for one)."""
    try:
        return json.dumps(data, ensure_ascii=False, indent=indent, allow_nan=False)
    except ValueError:
        return json.dumps(finite(data), ensure_ascii=False, indent=indent)


def finite(data: Any) -> Any:
    """``data`` with every NaN / Infinity float replaced by None (for strict JSON)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data


# An echoed request header ("Authorization: Basic dXNlcjpwdw==", JSON "authorization":"...")
# loses its credential whatever the value: a proxy may echo one we never configured.
_AUTH_ECHO = re.compile(
    r"""(?i)(\b(?:proxy-)?authorization\b["']?\s*[:=]\s*["']?)"""
    r"""((?:basic|bearer|digest|token|negotiate)\s+)?[^\s"'<>,;\\\]}&]+"""
)


_HTML = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_HTML_QUOTED = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;"})


def secret_forms(secret: str) -> set[str]:
    """How ``secret`` can show up in text: plain, URL-quoted, base64, JSON/HTML/CSV-escaped."""
    b64 = base64.b64encode(secret.encode()).decode()
    forms = {
        secret,
        secret.rstrip("="),  # a base64 secret (a Basic credential) may lose its padding
        quote(secret, safe=""),
        quote_plus(secret),
        b64,
        b64.rstrip("="),
        json.dumps(secret, ensure_ascii=False)[1:-1],
        json.dumps(secret)[1:-1],
        secret.translate(_HTML_QUOTED),  # html.escape, without loading the html package
        secret.translate(_HTML),
        secret.replace('"', '""'),
    }
    return {f for f in forms if f}


@functools.lru_cache(maxsize=32)
def _secret_pattern(secrets: tuple[str, ...]) -> tuple[re.Pattern[str], tuple[str, ...]] | None:
    """The pattern of every form of ``secrets``, and its witnesses: forms such that every form
    contains one of them (a form holding a shorter form needs no search of its own)."""
    forms = {f for s in secrets if s for f in secret_forms(s)}
    if not forms:
        return None
    # Longest first, so a form is never cut short by a shorter one it starts with.
    ordered = sorted(forms, key=len, reverse=True)
    witnesses = tuple(f for i, f in enumerate(ordered) if not any(g in f for g in ordered[i + 1 :]))
    return re.compile("|".join(re.escape(f) for f in ordered)), witnesses


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every secret (in every form ``secret_forms`` knows) and echoed credential by ***."""
    found = _secret_pattern(tuple(sorted(set(secrets))))
    # The pattern runs only on text holding a witness: text without any cannot hold a form
    # (each form contains a witness), and a few plain searches cost a fraction of the
    # alternation's scan of a whole `sessions --json`.
    if found is not None and any(w in text for w in found[1]):
        text = found[0].sub("***", text)
    # The case-blind header pattern is slow on large text (docs/performance.md); text without
    # the word cannot match it. The word is looked for in the UTF-8
    # bytes lowered (ASCII letters only; several times cheaper than str.lower() on text with
    # CJK titles): no other character lowers to these letters (only the Kelvin sign lowers to
    # ASCII, to k, and "İ" to i plus a combining dot). What (?i) folds beyond ASCII case for
    # them is the Turkish "ı" and "İ" (taken for "i"): text holding either always takes the
    # pattern. "surrogatepass": a server's JSON may decode to lone surrogates.
    if (
        b"authorization" not in text.encode("utf-8", "surrogatepass").lower()
        and "\u0131" not in text
        and "\u0130" not in text
    ):
        return text
    return _AUTH_ECHO.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}***", text)


# C0 controls except tab and newline, DEL, and the C1 block: a session title or a server's
# error text holding ESC sequences must not recolour, retitle or rewrite the terminal.
_CONTROLS = {c: "\ufffd" for c in (*range(0x00, 0x20), *range(0x7F, 0xA0)) if c not in (9, 10)}


def terminal_safe(text: str) -> str:
    """Replace terminal control characters (ESC, CR, NUL, C1...) with U+FFFD."""
    return text.translate(_CONTROLS)


def shorten(text: str, width: int) -> str:
    """Cut ``text`` to ``width`` display cells (CJK counts double), adding an ellipsis."""
    out: list[str] = []
    used = 0
    for ch in text.replace("\n", " "):
        w = char_cells(ch)
        if used + w > width - 1:
            return "".join(out) + "…"
        out.append(ch)
        used += w
    return "".join(out)


def shorten_left(text: str, width: int) -> str:
    """Keep the end of ``text`` (the useful part of a long path) within ``width`` cells."""
    if len(text) <= width:
        return text
    return "…" + shorten(text[::-1], width)[:-1][::-1]


# Credentials as they appear in commands and file paths an agent asks leave for: "token=…",
# "--password …", "Bearer …", well-known key shapes. Masked before such text goes to a chat
# service (a person sees it whole in `xaf-hub waiting`, where they decide on it).
_CREDENTIAL_SHAPES = re.compile(
    r"(?i)((?:api[_-]?key|token|secret|passw(?:or)?d|pwd|auth)[\w-]*\s*[=:]\s*"
    r"(?:bearer\s+|basic\s+)?|"
    r"--(?:api[_-]?key|token|secret|password)[= ]|bearer\s+|basic\s+)(\"[^\"]*\"|'[^']*'|\S+)"
    r"|(?<=://)[^\s/@:]+:[^\s/@]+(?=@)"  # user:password@ in a URL
    r"|\b(?:sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}|xox[abp]-[\w-]{10,})"
)


def mask_credentials(text: str) -> str:
    """``text`` with what looks like a credential replaced by *** (for chat notices)."""
    return _CREDENTIAL_SHAPES.sub(lambda m: f"{m.group(1)}***" if m.group(1) else "***", text)
