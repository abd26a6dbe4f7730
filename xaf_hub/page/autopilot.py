"""What the patrol is doing, in plain words, for the overview page's "Autopilot" panel.

It only reads the state folder (or Redis for what is shared), never writes and never asks a
server; an unreadable file becomes a sentence in ``problems``, so the page always renders. The
badge says "on" only while a daemon's heartbeat is fresh.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import quote

from xaf_hub.config.load import Config
from xaf_hub.core.catalogue import TEXT, Lang, text
from xaf_hub.core.clock import instant_ms
from xaf_hub.core.outcomes import TASK_STATES, TaskState, task_state
from xaf_hub.core.records import Snapshot
from xaf_hub.errors import HubError
from xaf_hub.ops.budget import BudgetLine, budget_lines, money
from xaf_hub.ops.models import models_view
from xaf_hub.page.words import WHEN, Line, ago, clean, local_time_with_zone
from xaf_hub.store.backends import Stores
from xaf_hub.store.patrol_state import daemon_alive, heartbeat, latest_report, pause_info
from xaf_hub.store.pick import count_states, is_blocked, readiness
from xaf_hub.store.tasks import Task

T = TypeVar("T")

# Step names (report) -> catalogue key of how a reader who never saw the code would put them.
STEP_KEYS = ("run_ceiling", "fix_free_limit", "check_agents", "sync_design_tasks", "fill_slots")

# Report keys of the round's figures, in the order the page shows them.
ROUND_FIGURES = (
    "dispatched",
    "tasks_done",
    "tasks_finished",
    "healed",
    "resumed",
    "tasks_requeued",
    "design_tasks_added",
    "over_run_ceiling",
)

NEXT_UP = 5
# A heartbeat older than this many intervals (plus the slack) means the daemon is gone.
_FRESH_INTERVALS = 2.0
_FRESH_SLACK_MS = 10 * 60_000


@dataclass(frozen=True)
class AutopilotView:
    """The panel's content; every string is plain text (the template escapes it)."""

    state: str  # "on", "off", "paused" or "never"
    headline: Line
    details: tuple[Line, ...] = ()
    figures: tuple[tuple[int, str], ...] = ()
    queue: tuple[tuple[int, str, TaskState], ...] = ()  # (count, words, state)
    next_up: tuple[tuple[str, str], ...] = ()
    rests: tuple[Line, ...] = ()
    problems: tuple[str, ...] = ()
    done: tuple[DoneTask, ...] = ()  # the latest tasks finished, newest first
    spend: tuple[str, ...] = ()  # today's spend against the daily budgets (ops.budget)
    # The HA patrol (store.backends.Stores.lease_status): the host holding the lease ("" when
    # none or no lease is used) and the sentence that says so (None when no lease is used).
    active_host: str = ""
    ha: Line | None = None


@dataclass(frozen=True)
class DoneTask:
    """A finished task as the panel lists it: its state, its commit linked when the patrol
    found it."""

    title: str
    commit: str = ""  # the short hash; "" when not verified
    url: str = ""  # project.commit_url filled in, for a verified commit only
    verified: bool = False
    judged: str = ""  # which rule decided (new work, check passed...)
    state: TaskState = "unverified"


# How many finished tasks the panel lists.
DONE_SHOWN = 5


def done_tasks(tasks: Sequence[Task], commit_url: str, lang: Lang = "en") -> tuple[DoneTask, ...]:
    """The latest finished tasks, newest first, each with its state, each verified one linked
    by ``commit_url``, how each was judged in the hub's words (marked as English on a page in
    another) (pure).

    The hash is hex as git gave it, quoted all the same before it goes into the URL; the
    template escapes the attribute.
    """
    done = [t for t in tasks if t.status == "done"]
    done.sort(key=lambda t: str(t.done_at or ""), reverse=True)
    out = []
    for t in done[:DONE_SHOWN]:
        state = task_state(
            status=t.status, landing=t.landing, parked=False, person=False, blocked=False,
            verified=t.verified,
        )
        judged = reason(lang, t.judged) if t.judged else ""
        commit = t.commit or "" if t.verified else ""  # linked only when the patrol verified it
        url = commit_url.replace("{commit}", quote(commit, safe="")) if commit else ""
        out.append(DoneTask(clean(t.title), commit[:7], url, bool(commit), judged, state))
    return tuple(out)


def heartbeat_fresh(beat: Mapping[str, Any] | None, now_ms: int) -> bool:
    """Whether a patrol daemon is running now, judged from its heartbeat file.

    Not stopped, and written (at start or after a round) within two of its intervals plus
    ten minutes; on this host its process must also be alive.
    """
    if not beat or beat.get("stopped_at"):
        return False
    last = max(instant_ms(beat.get("tick_at") or ""), instant_ms(beat.get("started_at") or ""))
    interval = beat.get("interval_seconds")
    if not last or not isinstance(interval, int | float) or interval <= 0:
        return False
    if now_ms - last > interval * 1000 * _FRESH_INTERVALS + _FRESH_SLACK_MS:
        return False
    return beat.get("host") != socket.gethostname() or daemon_alive(dict(beat))


def _headline(
    lang: Lang,
    report: Mapping[str, Any] | None,
    beat: Mapping[str, Any] | None,
    paused: Mapping[str, Any] | None,
    now_ms: int,
    interval_minutes: float,
    for_person: int = 0,
) -> tuple[str, Line, list[Line]]:
    """(state, headline, detail sentences); ``for_person``: how many lines below it are left
    for a person (then the round did not all go as planned)."""
    running = heartbeat_fresh(beat, now_ms)
    if running and beat is not None:
        interval_minutes = float(beat["interval_seconds"]) / 60
    every = text(lang, "ap.minutes", n=f"{interval_minutes:g}")
    if report is None:
        state = "on" if running else "never"
        headline = Line(text(lang, "ap.on_first" if running else "ap.never", every=every))
    else:
        last = instant_ms(report.get("finished_at") or report.get("started_at"))
        steps = report.get("steps")
        failed = [
            text(lang, f"step.{s['name']}") if s.get("name") in STEP_KEYS else str(s.get("name"))
            for s in (steps if isinstance(steps, list) else [])
            if isinstance(s, dict) and s.get("status") == "failed"
        ]
        sep = "、" if lang == "zh" else ", "
        how = (
            text(lang, "ap.some_failed", steps=sep.join(failed))
            if failed
            else text(lang, "ap.left_for_person", n=for_person)
            if for_person
            else text(lang, "ap.all_ok")
        )
        when = WHEN if last else text(lang, "ap.when_unknown")
        state = "on" if running else "off"
        headline = Line(text(lang, f"ap.{state}", every=every, when=when, how=how), last)
    if paused is None:
        return state, headline, []
    since = instant_ms(paused.get("paused_at"))
    by = clean(str(paused.get("by") or ""))
    who = text(lang, "ap.by", who=by) if by else text(lang, "ap.by_unknown")
    key = "ap.paused" if since else "ap.paused_nowhen"
    return "paused", headline, [Line(text(lang, key, when=WHEN, who=who), since)]


def build(
    cfg: Config, now_ms: int, lang: Lang = "en", snap: Snapshot | None = None
) -> AutopilotView:
    """Read the patrol's files and say what it is doing; never raises.

    ``snap`` is the scan the page shows: with it, the panel shows today's spend against budget
    (of the instances it reached).

    The panel is one part of a page that must render: whatever goes wrong reading the
    patrol's state (a file of an unexpected shape included) becomes a line on the panel.
    """
    try:
        with Stores(cfg) as stores:  # one Redis client for the pool, the lease and the rests
            view = _built(stores, cfg, now_ms, lang)
        return view if snap is None else replace(view, spend=spend_lines(cfg, lang, snap, now_ms))
    except Exception as exc:  # noqa: BLE001 - see above
        return AutopilotView(
            state="never",
            headline=Line(text(lang, "ap.unreadable")),
            problems=(f"{type(exc).__name__}: {exc}",),
        )


def spend_lines(cfg: Config, lang: Lang, snap: Snapshot, now_ms: int) -> tuple[str, ...]:
    """Today's spend for the project, then each instance with a budget of its own, counted
    from the sessions of ``snap`` (an instance it did not reach: not counted)."""
    answered = {i.name for i in snap.instances if i.reachable}
    seen = [
        (i, [s for s in snap.sessions if s.instance == i.name] if i.name in answered else None)
        for i in cfg.instances
    ]
    project, lines = budget_lines(cfg, seen, datetime.fromtimestamp(now_ms / 1000, UTC))
    silent = sum(1 for x in lines if not x.known)
    out = [_spend_words(lang, project, silent)]
    out += [_spend_words(lang, x) for x in lines if x.budget is not None]
    return tuple(out)


def _spend_words(lang: Lang, line: BudgetLine, silent: int = 0) -> str:
    if not line.known:
        return text(lang, "ap.spend_silent", name=clean(line.instance))
    spent, share = money(line.spent.usd), line.share  # share: None without a budget
    if line.budget is None or share is None:
        parts = [text(lang, "ap.spend", spent=spent)]
    else:
        budget = money(line.budget)
        parts = [text(lang, "ap.spend_of", spent=spent, budget=budget, share=f"{share:.0f}")]
        if share >= 100:
            parts.append(text(lang, "ap.spend_reached"))
    if line.spent.unknown:
        parts.append(text(lang, "ap.spend_unknown", n=line.spent.unknown))
    if silent:
        parts.append(text(lang, "ap.spend_not_counted", n=silent))
    lead = f"{clean(line.instance)}: " if line.instance else ""
    return lead + ("" if lang == "zh" else " ").join(parts)


def task_ids_by_session(cfg: Config) -> dict[str, str]:
    """{session id: task id} for every task of the pool sent to a session; {} if unreadable."""

    try:
        with Stores(cfg) as stores:
            tasks = stores.pool().load().tasks
    except HubError:
        return {}
    return {t.session_id: t.id for t in tasks if t.session_id}


def _built(stores: Stores, cfg: Config, now_ms: int, lang: Lang) -> AutopilotView:

    folder = cfg.state_dir / "patrol"
    now = datetime.fromtimestamp(now_ms / 1000, UTC)
    problems: list[str] = []

    def read(what: str, load: Callable[[], T]) -> T | None:
        """``load()``; None when it fails, said in ``problems`` as ``what`` unreadable."""
        try:
            return load()
        except HubError as exc:
            problems.append(text(lang, f"ap.{what}_unreadable", error=exc))
            return None

    report = read("report", lambda: latest_report(folder))
    got = report or {}
    figures = [(len(got[key]), text(lang, f"fig.{key}"))
               for key in ROUND_FIGURES if isinstance(got.get(key), list) and got[key]]
    # One sentence per session the patrol leaves to a person ("interrupted by ... at ...").
    rows = got.get("needs_person")
    person = [Line(text(lang, "ap.needs_person",
                        title=clean(str(r.get("title") or r.get("session"))),
                        detail=reason(lang, str(r.get("detail")), str(r.get("why") or ""))))
              for r in (rows if isinstance(rows, list) else []) if isinstance(r, dict)]

    queue: list[tuple[int, str, TaskState]] = []
    next_up: list[tuple[str, str]] = []
    done: tuple[DoneTask, ...] = ()
    tasks = read("queue", lambda: stores.pool().load().tasks)
    if tasks is not None:
        counts = count_states(tasks, now, cfg.patrol.max_attempts)
        # The work queue's rows: the states that hold a task (at least "waiting to start"), in
        # the order a task goes through them (``TASK_STATES``).
        queue = [(counts[s], text(lang, f"task.{s}"), s) for s in TASK_STATES if counts[s]]
        queue = queue or [(0, text(lang, "task.waiting"), "waiting")]
        # Next = what fill_slots would take first: ready now (not backing off, dependencies
        # done), by priority, then age.
        waiting = [
            t for t in tasks
            if t.status == "pending" and not t.parked and not is_blocked(t, cfg.patrol.max_attempts)
        ]
        ready = [t for t in waiting if not readiness(t, tasks, now)]
        ready.sort(key=lambda t: (t.priority, t.created_at or ""))
        next_up = [(t.priority, t.title) for t in ready[:NEXT_UP]]
        done = done_tasks(tasks, cfg.repository.commit_url, lang)
        person += [
            Line(text(lang, "ap.parked", title=clean(t.title), why=reason(lang, str(t.parked))))
            for t in tasks
            if t.parked
        ]
        if not cfg.repository.url and counts["unverified"]:
            person.append(Line(text(lang, "ap.no_repository", n=counts["unverified"])))
    state, headline, details = _headline(
        lang, report, heartbeat(folder), pause_info(folder), now_ms, cfg.patrol.interval_minutes,
        len(person),
    )
    details += person

    active_host, ha = "", None
    lease = stores.lease_status(now_ms)
    if lease is not None:
        if "lease_error" in lease:
            problems.append(text(lang, "ap.ha_unreadable", error=lease["lease_error"]))
        elif lease["active_host"]:
            active_host = clean(lease["active_host"])
            standby = sum(1 for d in lease["daemons"] if d["role"] == "standby")
            ha = Line(text(lang, "ap.ha_active", host=active_host, standby=standby))
        else:
            ha = Line(text(lang, "ap.ha_none"))

    rests: list[Line] = []
    view = read("rests", lambda: models_view(cfg, now, stores.model_state()))
    for b in view.rests if view is not None else ():
        exact = local_time_with_zone(b.until_ms)
        key = {"stated": "ap.rest_stated", "person": "ap.rest_person"}.get(b.why, "ap.rest")
        words = text(lang, key, family=clean(b.family), exact=exact, when=WHEN)
        rests.append(Line(words, b.until_ms))
    return AutopilotView(
        state=state,
        headline=headline,
        details=tuple(details),
        figures=tuple(figures),
        queue=tuple(queue),
        next_up=tuple(next_up),
        rests=tuple(rests),
        problems=tuple(problems),
        done=done,
        active_host=active_host,
        ha=ha,
    )


def reason(lang: Lang, words: str, why: str = "") -> str:
    """A reason in the hub's own English words, for ``lang``: said by its code (``why``) when
    the catalogue has it, the words kept beside (they name who, when, which commit); marked as
    English when no code translates it."""
    words = clean(words)
    if lang == "en":
        return words
    if f"why.{why}" in TEXT:
        return text(lang, "ap.as_written", said=text(lang, f"why.{why}"), words=words)
    return text(lang, "ap.english", words=words)


def plain(view: AutopilotView, lang: Lang, now_ms: int) -> list[str]:
    """The panel's sentences as plain text, relative times filled in (for tests and chat)."""
    ha = [view.ha] if view.ha is not None else []
    lines = [view.headline, *ha, *view.details, *view.rests]
    return [line.text.replace(WHEN, ago(lang, line.ms, now_ms)) for line in lines]
