"""Exports of a fleet snapshot: JSON document, CSV sheet and a self-contained HTML page.

The HTML page is meant for people who have never heard of opencode, so every value shown
there is precomputed here into plain words; the template only lays it out. Pages are
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xaf_hub.errors import UsageError
from xaf_hub.records import MAX_TIME_MS, InstanceSummary, SessionRecord, Snapshot
from xaf_hub.statefile import write_text_atomic

if TYPE_CHECKING:  # jinja2 is imported lazily: `status` and `instances` must not pay for it.
    import jinja2

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

_MINUTE = 60_000
_HOUR = 60 * _MINUTE
_DAY = 24 * _HOUR

_RUN_STATE_WORDS: dict[str, tuple[str, str]] = {
    # state -> (label, css class)
    "busy": ("working", "working"),
    "retry": ("waiting to retry (rate limit)", "waiting"),
    "idle": ("idle", "idle"),
}

_OUTCOME_WORDS: dict[str, tuple[str, str, str]] = {
    # outcome -> (label, css class, explanation shown on hover; "" where the word says it all,
    # since a hover repeated on thousands of rows weighs on the page)
    "succeeded": ("succeeded", "ok", ""),
    "rate_limited": (
        "rate-limited",
        "warn",
        "The AI provider refused the last run because of too many requests.",
    ),
    "aborted": ("stopped early", "muted", "The last run was stopped before it finished."),
    "running": ("still running", "info", ""),
    "unknown": ("unknown", "muted", "The result of the last run could not be determined."),
    "": ("unknown", "muted", "The result of the last run was not checked."),
}

# Lower-case fragments of a scan failure reason -> the same thing in plain words.
_REASON_WORDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("401", "403", "auth", "unauthori", "forbidden"), "the server refused our login"),
    (
        ("dns", "name or service", "getaddrinfo", "resolve", "nodename"),
        "the server's address could not be found",
    ),
    (("refused",), "nothing is answering at the server's address (it may be switched off)"),
    (("timeout", "timed out"), "the server did not answer in time"),
    (("html",), "the address answers, but not as a coding-assistant server (wrong address?)"),
    (
        ("5xx", "500", "502", "503", "504", "server error", "internal error"),
        "the server reported an internal error",
    ),
    (("truncated", "invalid", "json", "incomplete"), "the server sent a garbled answer"),
    (("ssl", "tls", "certificate"), "a secure connection to the server could not be made"),
)


# --------------------------------------------------------------------------- time words


def humanize_age(ms: int, now_ms: int) -> str:
    """Describe how long ago ``ms`` was, relative to ``now_ms``, in plain words."""
    if not 0 < ms <= MAX_TIME_MS:
        return "unknown"
    delta = now_ms - ms
    if abs(delta) < _MINUTE:
        return "just now"
    span = _span_words(abs(delta))
    # A time ahead of "now" is clock skew between machines; say so rather than hide it.
    return f"{span} ago" if delta > 0 else f"in {span}"


def _span_words(ms: int) -> str:
    """Return ``ms`` (at least a minute) as "N units" with the largest fitting unit."""
    for size, unit, upto in (
        (_MINUTE, "minute", 60),
        (_HOUR, "hour", 24),
        (_DAY, "day", 60),
        (30 * _DAY, "month", 12),
    ):
        count = ms // size
        if count < upto:
            return f"{count} {unit}" + ("" if count == 1 else "s")
    years = ms // (365 * _DAY)
    return f"{years} year" + ("" if years == 1 else "s")


def local_time(ms: int) -> str:
    """Return ``ms`` as local "YYYY-MM-DD HH:MM:SS", or "" when unknown (0 or absurd)."""
    if not 0 < ms <= MAX_TIME_MS:
        return ""
    # time.localtime/strftime: several times cheaper than datetime for thousands of rows.
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))
    except (OverflowError, OSError, ValueError):  # beyond what the C library can show
        return ""


def local_time_with_zone(ms: int) -> str:
    """Return ``ms`` as local time with its UTC offset ("... UTC+08:00"), or "unknown"."""
    if not 0 < ms <= MAX_TIME_MS:
        return "unknown"
    try:
        moment = time.localtime(ms / 1000)
    except (OverflowError, OSError, ValueError):
        return "unknown"
    offset = moment.tm_gmtoff or 0
    sign = "-" if offset < 0 else "+"
    hours, minutes = divmod(abs(offset) // 60, 60)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", moment)
    return f"{stamp} UTC{sign}{hours:02d}:{minutes:02d}"


def _utc_iso(ms: int) -> str:
    """Return ``ms`` as ISO 8601 UTC with a trailing Z."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- JSON / CSV


def _is_running(session: SessionRecord) -> bool:
    """Return whether the server reports the session busy or retrying."""
    return session.running or session.run_state != "idle"


def _counts(snap: Snapshot) -> dict[str, dict[str, int]]:
    """Count project sessions and running ones per instance, from the exported rows."""
    # Counted from the rows (not the summaries) so every figure matches the tables below it.
    counts = {i.name: {"project_sessions": 0, "running": 0} for i in snap.instances}
    for session in snap.project_sessions():
        entry = counts.setdefault(session.instance, {"project_sessions": 0, "running": 0})
        entry["project_sessions"] += 1
        entry["running"] += int(_is_running(session))
    return counts


def snapshot_document(snap: Snapshot) -> dict[str, Any]:
    """Build the JSON export document (architecture §6 `sessions`)."""
    return {
        "generated_at": _utc_iso(snap.generated_at),
        "by_instance": _counts(snap),
        "unreachable": snap.unreachable,
        "instances": [i.to_json() for i in snap.instances],
        "sessions": [s.to_json() for s in snap.project_sessions()],
    }


def _cost_text(cost: float) -> str:
    """Return a cost without float noise ("0.0123", "0")."""
    return f"{cost:.6f}".rstrip("0").rstrip(".") or "0"


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
        writer.writerow(
            [
                csv_cell(s.instance),
                csv_cell(s.id),
                csv_cell(s.directory),
                s.run_state,
                local_time(s.updated),
                local_time(s.created),
                csv_cell(s.outcome),
                csv_cell(s.title),
                _cost_text(s.cost),
            ]
        )
    return "\ufeff" + buffer.getvalue()


Redact = Callable[[str], str]


def _same(text: str) -> str:
    return text


def write_json(snap: Snapshot, path: Path, redact: Redact = _same) -> None:
    """Write the JSON export to ``path`` atomically (strict JSON: no NaN)."""
    from xaf_hub.output import dumps

    write_text_atomic(path, redact(dumps(snapshot_document(snap))) + "\n", private=False)


def write_csv(snap: Snapshot, path: Path, redact: Redact = _same) -> None:
    """Write the CSV export to ``path`` atomically."""
    write_text_atomic(path, redact(csv_text(snap)), private=False)


# --------------------------------------------------------------------------- HTML


def _template_source(name: str) -> str | None:
    """Load a template's text from the installed package, else from a source checkout."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.j2", name):
        return None  # Template names are ours; refuse anything path-like.
    try:
        from importlib.resources import files

        return files("xaf_hub.templates").joinpath(name).read_text(encoding="utf-8")
    except ModuleNotFoundError:
        # Not installed: `templates/` is only mapped to xaf_hub.templates by the wheel build.
        source = Path(__file__).resolve().parent.parent / "templates" / name
        return source.read_text(encoding="utf-8") if source.is_file() else None
    except FileNotFoundError:
        return None


def _environment() -> jinja2.Environment:
    """Build the Jinja2 environment every page uses."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FunctionLoader(_template_source),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _csp(html: str) -> str:
    """Return a policy allowing no network and only the page's own inline blocks."""
    hashes: dict[str, list[str]] = {"style": [], "script": []}
    for match in _INLINE_BLOCK.finditer(html):
        digest = hashlib.sha256(match.group(2).encode("utf-8")).digest()
        hashes[match.group(1)].append(f"'sha256-{base64.b64encode(digest).decode('ascii')}'")
    style = " ".join(hashes["style"]) or "'none'"
    script = " ".join(hashes["script"]) or "'none'"
    return (
        f"default-src 'none'; style-src {style}; script-src {script}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )


def seal_html(html: str) -> str:
    """Fill the page's CSP placeholder so only its own inline style and script may run."""
    if _CSP_PLACEHOLDER not in html:
        raise ValueError("page has no CSP placeholder; extend _base.html.j2")
    return html.replace(_CSP_PLACEHOLDER, _csp(html), 1)


def render_page(template: str, context: dict[str, Any]) -> str:
    """Render one page template (extending _base.html.j2) and seal it."""
    return seal_html(_environment().get_template(template).render(context))


def plain_reason(reason: str) -> str:
    """Translate a scan failure reason into words for a non-technical reader."""
    lowered = reason.lower()
    for fragments, words in _REASON_WORDS:
        if any(fragment in lowered for fragment in fragments):
            return words
    return "the server could not be reached"


@dataclass(frozen=True, slots=True)
class Badge:
    """A coloured word, with an optional explanation shown on hover."""

    label: str
    css: str
    hover: str = ""


@dataclass(frozen=True, slots=True)
class RowView:
    """One session as the page shows it; every field is display-ready text."""

    id: str
    title: str
    directory: str
    key: str  # lower-cased title, folder and id: what the page's filter searches
    state: Badge
    updated_words: str
    updated_exact: str
    created: str
    outcome: Badge
    cost: str


@dataclass(frozen=True, slots=True)
class SectionView:
    """One server's part of the page."""

    name: str
    reachable: bool
    reason_words: str
    reason: str
    production: bool
    note: str
    limit: int
    running: int
    rows: tuple[RowView, ...]


@dataclass(frozen=True, slots=True)
class BarView:
    """One server's bar in the distribution card; widths are 0-100."""

    name: str
    total: int
    running: int
    width: float
    running_width: float


@dataclass(frozen=True, slots=True)
class CardsView:
    """The summary figures at the top of the page."""

    healthy: int
    servers: int
    sessions: int
    running: int
    waiting: int


# Fixed badges are built once and shared by every row that shows them.
_STATE_BADGES = {state: Badge(label, css) for state, (label, css) in _RUN_STATE_WORDS.items()}
_OUTCOME_BADGES = {key: Badge(*words) for key, words in _OUTCOME_WORDS.items()}


def _state_badge(s: SessionRecord, now_ms: int) -> Badge:
    """Return the run-state badge; a retry carries the provider's message on hover."""
    if s.run_state != "retry":
        return _STATE_BADGES.get(s.run_state) or Badge(s.run_state or "idle", "idle")
    parts = []
    if s.retry_message:
        parts.append(f"The AI provider said: {s.retry_message}")
    if s.retry_next > 0:
        when = "now" if s.retry_next <= now_ms else humanize_age(s.retry_next, now_ms)
        parts.append(f"Next try: {when}, {local_time_with_zone(s.retry_next)}.")
    hover = " ".join(parts) or "The AI provider asked us to slow down; it retries by itself."
    return Badge(_RUN_STATE_WORDS["retry"][0], _RUN_STATE_WORDS["retry"][1], hover)


def outcome_badge(outcome: str) -> Badge:
    """Put a session's last outcome (architecture §3 values) into plain words."""
    if outcome.startswith("failed"):
        detail = outcome.partition(":")[2]
        return Badge(
            "failed",
            "bad",
            f"The last run ended with an error: {detail}."
            if detail
            else "The last run ended with an error.",
        )
    return _OUTCOME_BADGES.get(outcome) or Badge(outcome, "muted")


def _row_view(s: SessionRecord, now_ms: int) -> RowView:
    """Precompute everything one table row shows."""
    return RowView(
        id=s.id,
        title=s.title.strip() or "(untitled)",
        directory=s.directory,
        key=f"{s.title}\n{s.directory}\n{s.id}".lower(),
        state=_state_badge(s, now_ms),
        updated_words=humanize_age(s.updated, now_ms),
        updated_exact=local_time_with_zone(s.updated),
        created=local_time(s.created)[:16] or "unknown",
        outcome=outcome_badge(s.outcome),
        cost=f"${s.cost:,.2f}",
    )


def _bars(sections: Iterable[SectionView]) -> list[BarView]:
    """Return per-server bars for the distribution card, scaled to the busiest server."""
    items = [s for s in sections if s.reachable]
    peak = max((len(s.rows) for s in items), default=0) or 1
    return [
        BarView(
            name=s.name,
            total=len(s.rows),
            running=s.running,
            # A server with any session keeps a visible sliver next to a much larger one.
            width=max(len(s.rows) * 100 / peak, 1.5 if s.rows else 0.0),
            running_width=s.running * 100 / peak,
        )
        for s in items
    ]


def overview_context(
    snap: Snapshot, *, now_ms: int, title: str, autopilot: Any = None
) -> dict[str, Any]:
    """Precompute the plain data the overview template lays out.

    ``autopilot`` is an ``xaf_hub.ops.autopilot.AutopilotView`` (the patrol panel), or None
    to leave the panel out.
    """
    counts = _counts(snap)
    rows: dict[str, list[RowView]] = {name: [] for name in counts}
    waiting = 0
    for s in snap.project_sessions():
        rows[s.instance].append(_row_view(s, now_ms))
        waiting += s.run_state == "retry"
    summaries = {i.name: i for i in snap.instances}
    sections = []
    for name, views in rows.items():
        # A session of an instance missing from the summaries still gets a section.
        info = summaries.get(name) or InstanceSummary(name=name, url="", reachable=True)
        sections.append(
            SectionView(
                name=name,
                reachable=info.reachable,
                reason_words=plain_reason(info.reason),
                reason=info.reason,
                production=info.danger,
                note=info.note,
                limit=info.limit,
                running=counts[name]["running"],
                rows=tuple(views),
            )
        )
    generated = snap.generated_at or now_ms
    total = sum(len(s.rows) for s in sections)
    return {
        "title": title,
        "generated_exact": local_time_with_zone(generated),
        "generated_words": humanize_age(generated, now_ms),
        "cards": CardsView(
            healthy=sum(1 for i in snap.instances if i.reachable),
            servers=len(snap.instances),
            sessions=total,
            running=sum(c["running"] for c in counts.values()),
            waiting=waiting,
        ),
        "bars": _bars(sections),
        "sections": sections,
        "total_rows": total,
        "warnings": list(snap.warnings),
        "autopilot": autopilot,
    }


def render_html(
    snap: Snapshot, *, now_ms: int, title: str = "project", autopilot: Any = None
) -> str:
    """Render the self-contained HTML overview page (with the patrol panel when given)."""
    context = overview_context(snap, now_ms=now_ms, title=title, autopilot=autopilot)
    return render_page("overview.html.j2", context)


def write_html(
    snap: Snapshot,
    path: Path,
    *,
    now_ms: int,
    title: str = "project",
    autopilot: Any = None,
    redact: Redact = _same,
) -> None:
    """Write the HTML overview page to ``path`` atomically."""
    html = render_html(snap, now_ms=now_ms, title=title, autopilot=autopilot)
    write_text_atomic(path, redact(html), private=False)


# --------------------------------------------------------------------------- dispatch


def export(
    snap: Snapshot,
    path: Path,
    *,
    now_ms: int | None = None,
    title: str = "project",
    redact: Redact = _same,
) -> None:
    """Write ``snap`` to ``path`` in the format its suffix names, through ``redact``."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        write_json(snap, path, redact)
    elif suffix == ".csv":
        write_csv(snap, path, redact)
    elif suffix in (".html", ".htm"):
        # Ages on the page are relative to the snapshot, which is what the reader sees.
        now = now_ms if now_ms is not None else snap.generated_at or int(time.time() * 1000)
        write_html(snap, path, now_ms=now, title=title, redact=redact)
    else:
        raise UsageError(
            f"unsupported export format {path.suffix or '(no suffix)'!r} for {path}; "
            f"use one of {', '.join(EXPORT_SUFFIXES)}"
        )
