"""Terminal output helpers: the one table builder, JSON dumps, secret redaction, times."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], *, header_pad: int = 2) -> str:
    """Render rows with tabulate; wide (CJK) characters count double so columns line up.

    ``header_pad``: the cells a column keeps beyond its header (tabulate's default is 2;
    tables fitted to a terminal use 0)."""
    import tabulate as tab

    tab.WIDE_CHARS_MODE = True  # needs wcwidth; CJK titles would otherwise misalign
    saved, tab.MIN_PADDING = tab.MIN_PADDING, header_pad
    try:
        return str(
            tab.tabulate(rows, headers=list(headers), tablefmt="simple", disable_numparse=True)
        )
    finally:
        tab.MIN_PADDING = saved


def dumps(data: Any) -> str:
    """JSON for scripts: UTF-8 text, stable key order as built."""
    return json.dumps(data, ensure_ascii=False, indent=2)


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every secret (and its obvious encodings) in ``text`` with ***."""
    import base64
    from urllib.parse import quote

    for secret in secrets:
        if not secret:
            continue
        for form in {secret, quote(secret, safe=""), base64.b64encode(secret.encode()).decode()}:
            if form:
                text = text.replace(form, "***")
    return text


# C0 controls except tab and newline, DEL, and the C1 block: a session title or a server's
# error text holding ESC sequences must not recolour, retitle or rewrite the terminal.
_CONTROLS = {c: "\ufffd" for c in (*range(0x00, 0x20), *range(0x7F, 0xA0)) if c not in (9, 10)}


def terminal_safe(text: str) -> str:
    """Replace terminal control characters (ESC, CR, NUL, C1...) with U+FFFD."""
    return text.translate(_CONTROLS)


def fmt_time(ms: int) -> str:
    """Local 'YYYY-MM-DD HH:MM' or '-' for an unknown time."""
    if ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ms / 1000))


def iso_time(ms: int) -> str | None:
    """ISO 8601 in UTC with its offset ('2026-12-01T14:05:09Z'), the one time format of every
    JSON document; None for an unknown time (0)."""
    if ms <= 0:
        return None
    # time.gmtime/strftime: several times cheaper than datetime for thousands of records.
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def ago(ms: int, now_ms: int) -> str:
    """'3h ago' style, compact for tables."""
    if ms <= 0:
        return "-"
    secs = max(0, (now_ms - ms) // 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit} ago"
    return f"{secs}s ago"


def shorten(text: str, width: int) -> str:
    """Cut ``text`` to ``width`` display cells (CJK counts double), adding an ellipsis."""
    from wcwidth import wcwidth

    out: list[str] = []
    used = 0
    for ch in text.replace("\n", " "):
        w = max(wcwidth(ch), 0)
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
