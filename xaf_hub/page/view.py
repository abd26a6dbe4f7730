"""What the overview page shows, precomputed into display-ready text in the reader's language.

``overview_context`` turns a fleet snapshot into the plain values the template lays out: cards,
one section per server, one row per session, the summary of servers that did not answer. Every
word comes from ``xaf_hub.page.words``; every badge a session gets comes from one function,
``session_badges``: where its run stands now, and its last run's outcome
(``core.outcomes.Run``), coloured by the value's tone, so nothing a person still has to look at
shows green.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from xaf_hub.core.catalogue import Lang, text
from xaf_hub.core.clock import local_time
from xaf_hub.core.outcomes import RUNS, TONES, Run, run_outcome, tone
from xaf_hub.core.records import InstanceSummary, SessionRecord, Snapshot, Waiting
from xaf_hub.core.runstate import answer_hint, asked_line
from xaf_hub.errors import Cause
from xaf_hub.page.words import WHEN, ago, clean, clock_words, local_time_with_zone

# A task id the patrol puts in front of a session's title ("T-20261130-7275 Fix login").
_TASK_ID = re.compile(r"^\s*\[?(T-\d{8}-[0-9A-Za-z]{2,12})\]?[\s:：·-]*")

# Why a server could not be used (its cause) -> the catalogue's plain words for it.
_REASON_KEYS: dict[Cause | None, str] = {
    "auth": "reason.auth", "forbidden": "reason.auth", "no_password": "reason.auth",
    "dns": "reason.dns", "refused": "reason.refused", "timeout": "reason.timeout",
    "html": "reason.html", "server_error": "reason.5xx", "garbled": "reason.garbled",
    "dropped": "reason.garbled", "tls": "reason.tls",
}

# Above this many rows the page is far too long to capture whole (docs/overview-page.md), and
# rows off screen may skip rendering so the filter stays instant.
MANY_ROWS = 500

Phase = Literal["working", "asking", "waiting", "idle"]

# A value's tone (``core.outcomes.Tone``) -> its badge's class.
TONE_CSS = {"good": "ok", "person": "warn", "bad": "bad", "neutral": "muted"}


@dataclass(frozen=True, slots=True)
class Badge:
    """A coloured word, with an optional explanation (shown under the word, not on hover)."""

    label: str
    css: str
    note: str = ""
    note_ms: int = 0  # the time a ``page_text.WHEN`` mark in ``note`` stands for


@dataclass(frozen=True, slots=True)
class RowView:
    """One session as the page shows it; every field is display-ready text."""

    id: str
    title: str
    task: str  # the work queue's task id, shown as a chip ("" when none)
    directory: str
    branch: str  # its worktree's branch ("" when it works in the project's checkout)
    key: str  # lower-cased title, folder and ids: what the page's filter searches
    state: Badge
    updated_ms: int
    updated_words: str
    updated_exact: str
    created: str
    outcome: Badge
    cost: str
    link: str  # the session in its server's own web page, or ""
    project: str = ""  # the configured project it belongs to ("" none)


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
    login: str = ""  # the user name its rows' links ask for with the server's password


@dataclass(frozen=True, slots=True)
class BarView:
    """One server's bar in the distribution card; widths are 0-100."""

    name: str
    total: int
    running: int
    width: float
    running_width: float


@dataclass(frozen=True, slots=True)
class ProjectView:
    """One project's line in the page's summary ("" for sessions of no configured project)."""

    name: str
    sessions: int
    running: int


@dataclass(frozen=True, slots=True)
class CardsView:
    """The summary figures at the top of the page."""

    healthy: int
    servers: int
    sessions: int
    running: int
    waiting: int


def session_phase(s: SessionRecord) -> Phase:
    """Where a session's run stands now: working, asking a person, waiting to retry, idle."""
    if s.running and s.waiting is not None:
        return "asking"
    if s.run_state == "retry":
        return "waiting"
    return "working" if s.running or s.run_state == "busy" else "idle"


def session_badges(s: SessionRecord, lang: Lang, now_ms: int) -> tuple[Badge, Badge]:
    """The (run state, last result) badges of one session: the page's whole mapping."""
    phase = session_phase(s)
    if phase == "asking" and s.waiting is not None:
        state = Badge(text(lang, "state.asking"), "warn", asking_words(s.waiting, lang))
    elif phase == "waiting":
        parts = []
        if s.retry_message:
            parts.append(text(lang, "state.retry_said", message=clean(s.retry_message)))
        if s.retry_next > 0:
            # A live time the page's script keeps current, unless the try is already due.
            when = text(lang, "state.retry_now") if s.retry_next <= now_ms else WHEN
            exact = local_time_with_zone(s.retry_next)
            parts.append(text(lang, "state.retry_next", when=when, exact=exact))
        note = " ".join(parts) or text(lang, "state.retry_plain")
        state = Badge(text(lang, "state.retry"), "waiting", note, s.retry_next)
    else:  # working or idle, each its own colour
        state = Badge(text(lang, "state.busy" if phase == "working" else "state.idle"), phase)
    return state, outcome_badge(run_outcome(s.outcome, running=s.running), lang)


def outcome_badge(outcome: Run | None, lang: Lang = "en") -> Badge:
    """A session's last outcome in plain words, coloured by its tone (None: not read)."""
    if outcome is None:
        return Badge(text(lang, "result.not_checked"), "muted", text(lang, "result.not_checked_d"))
    return Badge(
        text(lang, f"run.{outcome}"), TONE_CSS[tone(outcome)], text(lang, f"run.{outcome}_d")
    )


def split_task(title: str, task_id: str = "") -> tuple[str, str]:
    """(task id, title without it) for a title the patrol led with its task id."""
    if task_id and title.lstrip().startswith(task_id):
        rest = title.lstrip()[len(task_id):]
        return task_id, rest.lstrip(" :：·-]").strip() or title.strip()
    match = _TASK_ID.match(title)
    if match and match.end() < len(title):
        return match.group(1), title[match.end():].strip()
    return task_id, title.strip()


def _row_view(s: SessionRecord, lang: Lang, now_ms: int, link: str, task_id: str) -> RowView:
    state, outcome = session_badges(s, lang, now_ms)
    task, title = split_task(s.title, task_id)
    return RowView(
        id=s.id, title=title or text(lang, "row.untitled"), task=task, directory=s.directory,
        branch=s.branch,
        key=(f"{s.title}\n{s.directory}\n{s.id}" + (f"\n{s.branch}" if s.branch else "")).lower(),
        state=state, updated_ms=s.updated, updated_words=ago(lang, s.updated, now_ms),
        updated_exact=local_time_with_zone(s.updated),
        created=local_time(s.created)[:16] or text(lang, "time.unknown"), outcome=outcome,
        cost=text(lang, "cost.unknown") if s.cost is None else f"${s.cost:,.2f}", link=link,
        project=s.owner,
    )


def asking_words(w: Waiting, lang: Lang) -> str:
    """What a waiting session asks, in the page's words."""
    if w.kind == "permission":
        return text(lang, "asking.permission", kind=w.permission or "?", what=asked_line(w.asked))
    return text(lang, "asking.question", what=asked_line(w.asked))


@dataclass(frozen=True, slots=True)
class AskingView:
    """One line of the "Waiting for you" list: which session, what it wants, for how long."""

    instance: str
    session: str
    title: str
    what: str
    since: str
    since_ms: int
    request: str
    hint: str


def asking_views(snap: Snapshot, lang: Lang, now_ms: int) -> list[AskingView]:
    """The project sessions whose run waits for a person, longest waiting first."""

    out = []
    for s in snap.project_sessions():
        w = s.waiting
        if w is None or not s.running:
            continue
        since = (
            text(lang, "asking.since", when=ago(lang, w.since, now_ms))
            if w.since
            else text(lang, "asking.since_unknown")
        )
        out.append(
            AskingView(s.instance, s.id, split_task(s.title)[1] or text(lang, "row.untitled"),
                       asking_words(w, lang), since, w.since, w.request_id, answer_hint(w))
        )
    return sorted(out, key=lambda a: (a.since_ms or now_ms, a.instance, a.request))


def _bars(sections: Iterable[SectionView]) -> list[BarView]:
    """Per-server bars for the distribution card, scaled to the busiest server."""
    items = [s for s in sections if s.reachable]
    peak = max((len(s.rows) for s in items), default=0) or 1
    return [
        BarView(name=s.name, total=len(s.rows), running=s.running,
                # A server with any session keeps a visible sliver next to a much larger one.
                width=max(len(s.rows) * 100 / peak, 1.5 if s.rows else 0.0),
                running_width=s.running * 100 / peak)
        for s in items
    ]


# A served page that hears change notices (/api/events) refreshes on each change; its timer
# then only runs every QUIET_REFRESH_FACTOR x live_seconds, as a safety net.
QUIET_REFRESH_FACTOR = 6


def source_words(snap: Snapshot, lang: Lang = "en") -> str:
    """Where the page's sessions come from, when some came from a live view ("Source: live,
    2 s old."); "" when everything was scanned (``Snapshot.source_words`` for a terminal)."""
    if snap.live_age is None:
        return ""
    age = f"{snap.live_age:.0f}"
    if snap.source == "live":
        return text(lang, "page.source_live", age=age)
    return text(lang, "page.source_mixed", names=", ".join(sorted(snap.live)), age=age)


def overview_context(
    snap: Snapshot, *, now_ms: int, title: str = "project", lang: Lang = "en",
    autopilot: Any = None, live_seconds: int = 0, links: Mapping[str, Any] | None = None,
    tasks: Mapping[str, str] | None = None, projects: Sequence[str] = (),
) -> dict[str, Any]:
    """Precompute the plain data the overview template lays out.

    ``autopilot`` is an ``xaf_hub.page.autopilot.AutopilotView`` or None; ``live_seconds`` > 0
    makes the page fetch itself again that often (served pages only); ``links`` maps an
    instance name to a ``web_ui.WebUI`` that builds session links; ``tasks`` maps a session
    id to its task id in the work queue; ``projects`` names the configured projects when the
    page shows several (a summary line and a filter each, a label on each row).
    """
    links = links or {}
    tasks = tasks or {}
    counts = snap.counts()
    rows: dict[str, list[RowView]] = {name: [] for name in counts}
    waiting = 0
    for s in snap.project_sessions():
        ui = links.get(s.instance)
        link = ui.session_url(s.directory, s.id) if ui is not None else ""
        rows[s.instance].append(_row_view(s, lang, now_ms, link, tasks.get(s.id, "")))
        waiting += s.run_state == "retry"
    summaries = {i.name: i for i in snap.instances}
    sections = []
    for name, views in rows.items():
        # A session of an instance missing from the summaries still gets a section.
        info = summaries.get(name) or InstanceSummary(name=name, url="", reachable=True)
        sections.append(SectionView(
            name=name, reachable=info.reachable,
            reason_words=text(lang, _REASON_KEYS.get(info.cause, "reason.other")),
            reason=info.reason, production=info.danger, note=info.note, limit=info.limit,
            running=counts[name][1], rows=tuple(views),
            login=getattr(links.get(name), "login", "") if any(r.link for r in views) else "",
        ))
    generated = snap.generated_at or now_ms
    total = sum(len(s.rows) for s in sections)
    healthy = sum(1 for i in snap.instances if i.reachable)
    return {
        "lang": lang,
        "html_lang": "zh-CN" if lang == "zh" else "en",
        "t": lambda key, **values: text(lang, key, **values),
        "ago": lambda ms: ago(lang, ms, now_ms),
        "exact": local_time_with_zone,
        "mark": WHEN,
        "words": clock_words(lang),
        "title": title,
        "generated_ms": generated,
        "generated_exact": local_time_with_zone(generated),
        "generated_words": ago(lang, generated, now_ms),
        "source_words": source_words(snap, lang),
        "live_seconds": live_seconds,
        "quiet_seconds": live_seconds * QUIET_REFRESH_FACTOR,
        "cards": CardsView(healthy=healthy, servers=len(snap.instances), sessions=total,
                           running=sum(busy for _, busy in counts.values()), waiting=waiting),
        "fleet_down": bool(snap.instances) and healthy == 0,
        "down": [s for s in sections if not s.reachable],
        "bars": _bars(sections),
        "projects": [
            ProjectView(name, n, busy) for name, (n, busy) in snap.counts("owner", projects).items()
        ] if projects else [],
        "sections": sections,
        "total_rows": total,
        "many_rows": MANY_ROWS,
        "warnings": list(snap.warnings),
        "autopilot": autopilot,
        "asking": asking_views(snap, lang, now_ms),
        "runs": RUNS,
        "tone_css": {value: TONE_CSS[t] for value, t in TONES.items()},
    }
