"""Exports of a fleet snapshot: JSON document, CSV sheet and a self-contained HTML page.

The HTML page is meant for people who have never heard of opencode, so every value shown
there is precomputed into plain words (``page_view``, in the reader's language from
``page_text``); the template only lays it out. Pages are
"sealed" with a Content-Security-Policy that forbids every network request and allows only
the page's own inline style and script (by hash), so even a escaping slip could neither run
injected script nor call home.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xaf_hub import __version__
from xaf_hub.core.clock import iso_time, local_time
from xaf_hub.core.records import Snapshot
from xaf_hub.core.text import dumps
from xaf_hub.errors import UsageError
from xaf_hub.store.statefile import write_text_atomic

CSV_COLUMNS: tuple[str, ...] = (
    "instance",
    "session id",
    "directory",
    "run state",
    "updated",
    "created",
    "outcome",
    "title",
    "cost",
)

EXPORT_SUFFIXES: tuple[str, ...] = (".json", ".csv", ".html", ".htm")

# Placeholder the base template carries in its CSP <meta>; sealing replaces the first one.
_CSP_PLACEHOLDER = "__XAF_HUB_CSP__"
_INLINE_BLOCK = re.compile(r"<(style|script)>(.*?)</\1>", re.DOTALL)



# --------------------------------------------------------------------------- JSON / CSV


def snapshot_document(snap: Snapshot) -> dict[str, Any]:
    """Build the JSON export document (architecture §6 `sessions`)."""

    return {
        "generated_at": iso_time(snap.generated_at),
        "xaf_hub_version": __version__,
        # Counted from the rows (not the summaries) so every figure matches the tables below.
        "by_instance": {
            name: {"project_sessions": n, "running": busy}
            for name, (n, busy) in snap.counts().items()
        },
        "unreachable": snap.unreachable,
        "instances": [i.to_json() for i in snap.instances],
        "sessions": [s.to_json() for s in snap.project_sessions()],
        # Where the sessions come from: a live view (the live board, with its age) or a scan.
        **snap.source_json(),
    }


# A spreadsheet reads a cell starting with one of these as a formula (=HYPERLINK, @SUM, +1+1,
# -2+3; tab and CR hide the start): a leading quote makes it plain text (OWASP's advice).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(text: str) -> str:
    """Return ``text`` safe for a spreadsheet cell: never read as a formula."""
    return "'" + text if text.startswith(_FORMULA_START) else text


def csv_text(snap: Snapshot) -> str:
    """Return the CSV export (with a leading BOM so spreadsheet programs detect UTF-8)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for s in snap.project_sessions():
        cells = (s.instance, s.id, s.directory, s.run_state, local_time(s.updated),
                 local_time(s.created), s.outcome, s.title)
        # A cost without float noise ("0.0123", "0"); an unknown cost is an empty cell.
        cost = "" if s.cost is None else f"{s.cost:.6f}".rstrip("0").rstrip(".") or "0"
        writer.writerow([*map(csv_cell, cells), cost])
    return "\ufeff" + buffer.getvalue()


Redact = Callable[[str], str]


# --------------------------------------------------------------------------- HTML


def _template_source(name: str) -> str | None:
    """Load a template's text from this source checkout, else from the installed package."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.j2", name):
        return None  # Template names are ours; refuse anything path-like.
    try:
        from importlib.resources import files  # deferred: start-up, docs/performance.md

        return files("xaf_hub.page.templates").joinpath(name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        return None


def _csp(html: str, connect_self: bool = False) -> str:
    """Return a policy allowing no network and only the page's own inline blocks.

    ``connect_self`` lets the page's script fetch from its own origin (a served page that
    updates itself); a saved page may reach nothing at all.
    """
    hashes: dict[str, list[str]] = {"style": [], "script": []}
    for match in _INLINE_BLOCK.finditer(html):
        digest = hashlib.sha256(match.group(2).encode("utf-8")).digest()
        hashes[match.group(1)].append(f"'sha256-{base64.b64encode(digest).decode('ascii')}'")
    style = " ".join(hashes["style"]) or "'none'"
    script = " ".join(hashes["script"]) or "'none'"
    connect = "connect-src 'self'; " if connect_self else ""
    return (
        f"default-src 'none'; style-src {style}; script-src {script}; {connect}"
        "img-src data:; base-uri 'none'; form-action 'none'"
    )


def seal_html(html: str, connect_self: bool = False) -> str:
    """Fill the page's CSP placeholder so only its own inline style and script may run."""
    if _CSP_PLACEHOLDER not in html:
        raise ValueError("page has no CSP placeholder; extend _base.html.j2")
    return html.replace(_CSP_PLACEHOLDER, _csp(html, connect_self), 1)


def render_page(template: str, context: dict[str, Any], connect_self: bool = False) -> str:
    """Render one page template (extending _base.html.j2) and seal it."""
    import jinja2  # deferred: start-up, docs/performance.md

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_template_source),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    return seal_html(env.get_template(template).render(context), connect_self)


def render_html(snap: Snapshot, *, now_ms: int, **view: Any) -> str:
    """Render the self-contained HTML overview page; ``view`` holds the overview's options
    (``page.view.overview_context``: its title, language, autopilot panel, links...), and a
    ``live_seconds`` above 0 renders the served variant that fetches itself again that often.
    """
    from xaf_hub.page.view import overview_context  # deferred: start-up, docs/performance.md

    context = overview_context(snap, now_ms=now_ms, **view)
    return render_page("overview.html.j2", context, connect_self=view.get("live_seconds", 0) > 0)


def write_html(snap: Snapshot, path: Path, *, now_ms: int, redact: Redact = str,
               **view: Any) -> None:
    """Write the HTML overview page (``render_html`` of ``view``) to ``path`` atomically."""
    write_text_atomic(path, redact(render_html(snap, now_ms=now_ms, **view)), private=False)


# --------------------------------------------------------------------------- dispatch


def export(snap: Snapshot, path: Path, *, redact: Redact = str) -> None:
    """Write ``snap`` to ``path`` atomically in the format its suffix names, through
    ``redact`` (JSON strict: no NaN; CSV: ``csv_text``)."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        body = dumps(snapshot_document(snap)) + "\n"
    elif suffix == ".csv":
        body = csv_text(snap)
    elif suffix in (".html", ".htm"):
        # Ages on the page are relative to the snapshot, which is what the reader sees.
        body = render_html(snap, now_ms=snap.generated_at or int(time.time() * 1000))
    else:
        raise UsageError(
            f"unsupported export format {path.suffix or '(no suffix)'!r} for {path}; "
            f"use one of {', '.join(EXPORT_SUFFIXES)}"
        )
    write_text_atomic(path, redact(body), private=False)
