"""What the patrol is doing, in plain words, for the overview page's "Autopilot" panel.

Everything here is read from the state folder (the last cycle's report, the pause flag, the
daemon heartbeat, the task pool, the model state); nothing is written and no server is asked.
A file that cannot be read becomes a sentence in ``problems``: the page always renders.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from xaf_hub.config import Config
from xaf_hub.errors import HubError
from xaf_hub.report import humanize_age, local_time_with_zone

# Step names as a reader who never saw the code would put them.
STEP_WORDS = {
    "fix_free_limit": "fixing sessions stopped by a rate limit",
    "check_agents": "checking on the sessions",
    "sync_design_tasks": "reading the design documents",
    "fill_slots": "starting queued work",
}

# (report key, what one of them is called on the page), in the order the page shows them.
ROUND_FIGURES = (
    ("dispatched", "started from the queue"),
    ("tasks_done", "finished"),
    ("healed", "fixed after a rate limit"),
    ("resumed", "resumed after an interruption"),
    ("tasks_requeued", "sent back to the queue"),
    ("design_tasks_added", "added from design documents"),
)

NEXT_UP = 5


@dataclass(frozen=True)
class AutopilotView:
    """The panel's content; every string is plain text (the template escapes it)."""

    state: str  # "active", "paused" or "never"
    headline: str
    last_exact: str = ""
    details: tuple[str, ...] = ()
    figures: tuple[tuple[int, str], ...] = ()
    queue: tuple[tuple[int, str], ...] = ()
    next_up: tuple[tuple[str, str], ...] = ()
    rests: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()


def _ms(iso: object) -> int:
    try:
        when = datetime.fromisoformat(str(iso))
    except ValueError:
        return 0
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _headline(
    cfg: Config, report: dict[str, Any] | None, paused: dict[str, Any] | None, now_ms: int
) -> tuple[str, str, str, list[str]]:
    """(state, headline, exact time of the last round, detail sentences)."""
    details: list[str] = []
    if report is None:
        state, headline, exact = "never", "The autopilot has not run yet.", ""
    else:
        last = _ms(report.get("finished_at") or report.get("started_at"))
        exact = local_time_with_zone(last) if last else ""
        steps = report.get("steps")
        failed = [
            STEP_WORDS.get(str(s.get("name")), str(s.get("name")))
            for s in (steps if isinstance(steps, list) else [])
            if isinstance(s, dict) and s.get("status") == "failed"
        ]
        how = (
            "everything went as planned."
            if not failed
            else "some of it did not work: " + ", ".join(failed) + "."
        )
        state = "active"
        when = humanize_age(last, now_ms) if last else "at a time its report does not say"
        headline = f"The autopilot last looked after the servers {when}; {how}"
    if paused is not None:
        state = "paused"
        since = _ms(paused.get("paused_at"))
        who = f" by {paused['by']}" if paused.get("by") else ""
        when = f" {humanize_age(since, now_ms)}" if since else ""
        details.insert(
            0,
            f"It was paused{when}{who}: it fixes nothing and starts no work until someone "
            "resumes it (xaf-hub patrol resume).",
        )
    every = f"{cfg.patrol.interval_minutes:g} minutes"
    return state, headline, exact, details + [f"It is set to look every {every}."]


def build(cfg: Config, now_ms: int) -> AutopilotView:
    """Read the patrol's files and say what it is doing; never raises.

    The panel is one part of a page that must render: whatever goes wrong reading the
    patrol's state (a file of an unexpected shape included) becomes a line on the panel.
    """
    try:
        return _build(cfg, now_ms)
    except Exception as exc:  # noqa: BLE001 - see above
        return AutopilotView(
            state="never",
            headline="The autopilot's state could not be read.",
            problems=(f"{type(exc).__name__}: {exc}",),
        )


def _build(cfg: Config, now_ms: int) -> AutopilotView:
    from xaf_hub.backlog import Backlog, is_blocked, readiness
    from xaf_hub.ops.models import model_state
    from xaf_hub.ops.patrol_state import daemon_alive, heartbeat, latest_report, pause_info

    folder = cfg.state_dir / "patrol"
    problems: list[str] = []
    try:
        report = latest_report(folder)
    except HubError as exc:
        report = None
        problems.append(f"The last autopilot report could not be read ({exc}).")
    state, headline, exact, details = _headline(cfg, report, pause_info(folder), now_ms)
    if daemon_alive(heartbeat(folder)):
        details.append("It runs in the background on this computer.")

    figures: list[tuple[int, str]] = []
    if report is not None:
        for key, words in ROUND_FIGURES:
            rows = report.get(key)
            if isinstance(rows, list) and rows:
                figures.append((len(rows), words))
        details += _needs_person(report.get("needs_person"))

    queue: list[tuple[int, str]] = []
    next_up: list[tuple[str, str]] = []
    try:
        tasks = Backlog(cfg.backlog_path, lock_timeout=cfg.lock.lock_timeout_seconds).load().tasks
    except HubError as exc:
        problems.append(f"The work queue could not be read ({exc}).")
    else:
        stuck = [t for t in tasks if is_blocked(t, cfg.patrol.max_attempts) or t.parked]
        waiting = [t for t in tasks if t.status == "pending" and t not in stuck]
        queue = [
            (len(waiting), "waiting to start"),
            (sum(1 for t in tasks if t.status == "dispatched"), "in progress"),
            (sum(1 for t in tasks if t.status == "done"), "done"),
            (len(stuck), "stuck after too many failed tries (a person must look)"),
        ]
        # Next = what fill_slots would take first: ready now (not backing off, dependencies
        # done), by priority, then age.
        now = datetime.fromtimestamp(now_ms / 1000, UTC)
        ready = [t for t in waiting if not readiness(t, tasks, now)]
        ready.sort(key=lambda t: (t.priority, t.created_at or ""))
        next_up = [(t.priority, t.title) for t in ready[:NEXT_UP]]
        details += [f"Left for a person: {t.title}: parked: {t.parked}" for t in tasks if t.parked]

    rests: list[str] = []
    try:
        blackouts = model_state(cfg).active_blackouts(datetime.fromtimestamp(now_ms / 1000, UTC))
    except HubError as exc:
        problems.append(f"The list of resting AI providers could not be read ({exc}).")
    else:
        for family, b in sorted(blackouts.items()):
            rests.append(
                f"Models from “{family}” are not used until {local_time_with_zone(b.until_ms)} "
                f"({humanize_age(b.until_ms, now_ms)}): the provider refused for too many "
                "requests."
            )
    return AutopilotView(
        state=state,
        headline=headline,
        last_exact=exact,
        details=tuple(details),
        figures=tuple(figures),
        queue=tuple(queue),
        next_up=tuple(next_up),
        rests=tuple(rests),
        problems=tuple(problems),
    )


def _needs_person(rows: object) -> list[str]:
    """One sentence per session the patrol leaves to a person ("interrupted by ... at ...")."""
    if not isinstance(rows, list):
        return []
    return [
        f"Left for a person: {r.get('title') or r.get('session')}: {r.get('detail')}"
        for r in rows
        if isinstance(r, dict)
    ]
