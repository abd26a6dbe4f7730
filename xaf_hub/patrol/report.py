"""The patrol report: one JSON document and one markdown page per round, in the state dir
(``report-latest.*`` plus the newest ``KEEP_REPORTS`` timestamped pairs).

Building the document and the markdown is pure; ``write_report`` does the I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from xaf_hub.core.clock import fmt_time, format_instant, local_iso
from xaf_hub.core.outcomes import TaskState, task_words
from xaf_hub.errors import HubError
from xaf_hub.notify.record import RoundLog
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.context import project_views
from xaf_hub.store.patrol_state import LATEST, latest_report
from xaf_hub.store.pick import count_states, readiness
from xaf_hub.store.statefile import write_json_atomic, write_text_atomic
from xaf_hub.store.tasks import Task, of_project, project_of

__all__ = ["LATEST", "latest_report", "render_markdown", "report_document", "write_report"]

Rows = list[dict[str, Any]]  # a report section's rows, as JSON
SCHEMA_VERSION = 1
KEEP_REPORTS = 200
_MAX_LEAD_ITEMS = 100

# A list line: its checkbox, if any (group 1), and its text (group 2).
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+(?:\[([ xX])\]\s*)?(.*?)\s*$")

# Action kinds -> report sections, in the order the markdown shows them.
SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("ceiling", "over_run_ceiling", "Runs stopped over their ceiling (run_ceiling)"),
    ("heal", "healed", "Healed (fix_free_limit)"),
    ("resume", "resumed", "Resumed (check_agents)"),
    ("add", "design_tasks_added", "Design tasks added (sync_design_tasks)"),
    ("done", "tasks_done", "Tasks done and verified (fill_slots)"),
    ("finished", "tasks_finished",
     "Tasks finished, not verified: no project.repository to check them (fill_slots)"),
    ("verified", "ready_to_land", "Verified, ready to land on the base branch (fill_slots)"),
    ("landed", "tasks_landed", "Landed on the base branch: done (land)"),
    ("requeue", "tasks_requeued", "Tasks sent back to the pool (fill_slots)"),
    ("keep", "tasks_kept", "Dispatched tasks left as they are (fill_slots)"),
    ("retry", "sent_back", "Sent back to their session: the project's check failed (fill_slots)"),
    ("person", "needs_person", "Needs a person (the patrol leaves these alone)"),
    ("answer", "answered", "Requests answered by a rule (permissions)"),
    ("dispatch", "dispatched", "Dispatched (fill_slots)"),
)
SESSION_STATES: tuple[tuple[str, str], ...] = (
    ("running", "Running"),
    ("waiting", "Waiting for a person (the patrol leaves these alone)"),
    ("stale_busy", "Stale busy (no update for a long time)"),
    ("finished", "Finished"),
    ("failed", "Failed"),
    ("denied", "Denied: the run ended on a refused request (a person decides)"),
    ("interrupted", "Interrupted"),
    ("idle", "Idle"),
)


def lead_backlog_items(text: str) -> list[str]:
    """Open items of a human decision list: list lines, without ticked checkboxes (pure)."""
    found = filter(None, map(_LIST_ITEM.match, text.splitlines()))
    items = [m.group(2) for m in found if m.group(2) and m.group(1) not in ("x", "X")]
    return items[:_MAX_LEAD_ITEMS]


def waiting_tasks(
    tasks: Sequence[Task], now: datetime, max_attempts: int, projects: Sequence[str] = ()
) -> dict[str, Rows]:
    """The pool's pending tasks: ready, not ready (with why), blocked (pure); each names its
    project (``store.tasks.project_of`` of ``projects``)."""
    out: dict[str, Rows] = {k: [] for k in ("ready", "not_ready", "blocked", "parked")}
    for task in tasks:
        if task.status != "pending":
            continue
        if task.attempts >= max_attempts:
            key, why = "blocked", f"attempts used up ({task.attempts} of {max_attempts})"
        else:
            why = readiness(task, tasks, now)
            key = "parked" if task.parked else "not_ready" if why else "ready"
        out[key].append({
            "id": task.id,
            "project": project_of(task, projects),
            "title": task.title,
            "priority": task.priority,
            "instance": task.instance,
            "attempts": task.attempts,
            "last_error": task.last_error or "",
            "why": why,
        })
    rank = {p: i for i, p in enumerate(("P0", "P1", "P2", "P3"))}
    for rows in out.values():
        rows.sort(key=lambda r: rank.get(str(r["priority"]), 9))
    return out


def held_by_budget(waiting: dict[str, Rows], held: Mapping[str, str]) -> dict[str, Rows]:
    """``waiting`` with the ready tasks a daily budget kept back listed as not ready, and why."""
    if not held:
        return waiting
    ready = [t for t in waiting["ready"] if t["id"] not in held]
    kept = [{**t, "why": held[t["id"]]} for t in waiting["ready"] if t["id"] in held]
    return {**waiting, "ready": ready, "not_ready": kept + waiting["not_ready"]}


def report_document(
    log: RoundLog,
    *,
    project: str,
    code: int,
    waiting: Mapping[str, Rows],
    lead_path: str,
    lead_items: Sequence[str],
    tasks: Mapping[TaskState, int] | None = None,
    projects: Mapping[str, Mapping[TaskState, int]] | None = None,
) -> dict[str, Any]:
    """The JSON report of one cycle (pure); ``tasks``: how many pool tasks stand in each
    state (``store.pick.count_states``), and ``projects`` the same per project."""
    sessions: dict[str, Rows] = {state: [] for state, _ in SESSION_STATES}
    for line in log.sessions:
        sessions.setdefault(line.state, []).append(asdict(line))
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "project": project,
        "started_at": format_instant(log.started) if log.started else "",
        "finished_at": format_instant(log.finished) if log.finished else "",
        "result": "ok" if code == 0 else "failed",
        "exit_code": code,
        "steps": [asdict(s) for s in log.steps],
        "instances": [asdict(i) for i in log.instances],
        "counts": {state: len(rows) for state, rows in sessions.items()},
        "sessions": sessions,
    }
    for kind, key, _ in SECTIONS:
        doc[key] = [asdict(a) for a in log.actions if a.kind == kind]
    doc["needs_person"] = _one_per_session(doc["needs_person"])
    doc["tasks"] = dict(tasks or {})
    doc["projects"] = {name: dict(states) for name, states in (projects or {}).items()}
    doc["waiting"] = {**waiting, "lead_backlog": {"path": lead_path, "items": list(lead_items)}}
    doc["errors"] = list(log.errors)
    doc["notes"] = list(log.notes)
    return doc


def _one_per_session(rows: Rows) -> Rows:
    """Several jobs may name the same session; keep one line, the one naming its task."""
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["instance"], row["session"])
        if key not in kept or (row["task"] and not kept[key]["task"]):
            kept[key] = row
    return list(kept.values())


def _cell(value: Any) -> str:
    text = " ".join(str(value if value is not None else "").split())
    return text.replace("|", "\\|") or "-"


Column = str | tuple[str, str | Callable[[Mapping[str, Any]], Any]]


def _table(rows: Iterable[Mapping[str, Any]], *columns: Column) -> list[str]:
    """A markdown table of ``rows``; a column is a key, or a header and its key or function."""
    cols = [(c, c) if isinstance(c, str) else c for c in columns]
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = (_cell(get(row) if callable(get) else row[get]) for _, get in cols)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _section(
    mark: str, heading: str, rows: Sequence[Mapping[str, Any]], *columns: Column, hint: str = ""
) -> list[str]:
    """``rows`` under a heading that counts them (and a ``hint`` line), as a table; nothing
    when there are none."""
    if not rows:
        return []
    return ["", f"{mark} {heading} ({len(rows)})", "", *([hint, ""] if hint else [])] + _table(
        rows, *columns)


def _models(a: Mapping[str, Any]) -> str:
    """An action's model, or its move from one model to another."""
    return f"{a['from_model']} → {a['model']}" if a["from_model"] else str(a["model"])


def render_markdown(doc: Mapping[str, Any]) -> str:
    """The report as a markdown page (pure)."""
    out = [f"# Patrol report — {doc['project']}", ""]
    result = "ok" if doc["exit_code"] == 0 else f"failed (exit {doc['exit_code']})"
    out += [
        f"- cycle: {local_iso(doc['started_at'])} → {local_iso(doc['finished_at'])}",
        f"- result: **{result}**",
        "",
    ]
    out += ["## Steps", ""]
    out += _table(doc["steps"], ("step", "name"), "status",
                  ("seconds", lambda s: f"{s['seconds']:.1f}"), "error")
    if doc["instances"]:
        out += ["", "## Instances", ""]
        out += _table(
            doc["instances"], ("instance", "name"),
            ("reachable", lambda i: "yes" if i["reachable"] else "no"),
            ("running", "running_project"), "reserved", "limit",
            ("note", lambda i: i["reason"]
             or ("production (never written to)" if i["production"] else "")),
        )
    counts = doc["counts"]
    out += ["", "## Sessions", ""]
    summary = ", ".join(
        f"{counts[s]} {s.replace('_', '-')}" for s, _ in SESSION_STATES if counts.get(s)
    )
    out.append(summary or "No project session was active in the last 24 hours.")
    for state, heading in SESSION_STATES:
        out += [] if state == "idle" else _section(
            "###", heading, doc["sessions"].get(state) or [], "instance", "session", "title",
            "model", ("updated", lambda r: fmt_time(r["updated_ms"])), "detail",
        )
    for _, key, heading in SECTIONS:
        out += _section(
            "##", heading, doc[key], "result", "task", "instance", "session", "title",
            ("model", _models), "detail",
            hint="Nothing is sent for these until someone acts: `xaf-hub backlog set ID --status "
            "pending` retries the task in a new session, or dispatch to the session again."
            if key == "needs_person" else "",
        )
    def counted(states: Mapping[TaskState, int]) -> str:
        return ", ".join(f"{n} {task_words(s)}" for s, n in states.items() if n)

    out += ["", "## Task pool", "", counted(doc.get("tasks") or {}) or "The pool is empty."]
    for name, states in (doc.get("projects") or {}).items():
        out.append(f"- {name}: {counted(states) or 'no task'}")
    waiting = doc["waiting"]
    out += ["", "## Waiting for dispatch", ""]
    ready, later, blocked = waiting["ready"], waiting["not_ready"], waiting["blocked"]
    parked = waiting.get("parked") or []
    if not (ready or later or blocked or parked):
        out.append("The task pool has no pending task.")
    if ready or later:
        out += _table(ready + later, ("task", "id"), "priority",
                      ("instance", lambda t: t["instance"] or "any"), "title",
                      ("status", lambda t: t["why"] or "ready"))
    out += _section(
        "###", "Blocked: attempts used up", blocked, ("task", "id"), "priority", "title",
        "attempts", ("last error", "last_error"),
        hint="Reset with `xaf-hub backlog set ID --status pending --reset`.",
    )
    out += _section(
        "###", "Parked after infrastructure failures", parked, ("task", "id"), "priority",
        "title", ("status", "why"),
        hint="Retry with `xaf-hub backlog set ID --status pending` once the cause is fixed.",
    )
    lead = waiting["lead_backlog"]
    out += ["", f"### For a human ({lead['path'] or 'lead_backlog.md'})", ""]
    out += [f"- {item}" for item in lead["items"]] or ["Nothing waiting for a decision."]
    if doc["errors"]:
        out += ["", f"## Errors ({len(doc['errors'])})", ""]
        out += [f"- {_cell(e)}" for e in doc["errors"]]
    if doc["notes"]:
        out += ["", "## Notes", ""] + [f"- {_cell(n)}" for n in doc["notes"]]
    return "\n".join(out) + "\n"


def _lead(pctx: OpsContext) -> tuple[str, list[str]]:
    """The decision lists of the projects served (each one's repo_root's, unless
    patrol.lead_backlog_path names one for all), and their open items, each named by its project
    when there are several lists."""
    paths: dict[Path, str] = {}
    for view in project_views(pctx):
        path = view.cfg.patrol.lead_backlog_path or view.repo_root / "lead_backlog.md"
        paths.setdefault(path, view.cfg.project_name)
    items = []
    for path, name in paths.items():
        try:
            text = path.read_bytes().decode("utf-8-sig", errors="replace")
        except FileNotFoundError:
            continue
        except OSError as exc:
            got = [f"(cannot read {path}: {exc.strerror or exc})"]
        else:
            got = lead_backlog_items(text)
        items += [f"{name}: {item}" for item in got] if len(paths) > 1 else got
    return ", ".join(map(str, paths)), items


def write_report(pctx: OpsContext, log: RoundLog, code: int) -> tuple[Path, Path]:
    """Write the JSON and markdown report (latest + timestamped); return the latest paths."""
    try:
        tasks = pctx.backlog().load().tasks
        tasks = pctx.own(tasks) if pctx.cfg.chosen else tasks  # --project: its tasks only
    except HubError as exc:
        tasks = []
        log.errors.append(pctx.redact(f"report: task pool unreadable: {exc}"))
    names = [p.name for p in pctx.cfg.projects]
    most = pctx.cfg.patrol.max_attempts
    waiting = held_by_budget(waiting_tasks(tasks, pctx.now(), most, names), log.budget_held)
    states = count_states(tasks, pctx.now(), most)
    projects = {n: count_states(of_project(tasks, n, names), pctx.now(), most)
                for n in names} if len(names) > 1 else None
    lead_path, lead_items = _lead(pctx)
    doc = _scrub(pctx, report_document(
        log, project=pctx.cfg.project_name, code=code, waiting=waiting, lead_path=lead_path,
        lead_items=lead_items, tasks=states, projects=projects))
    markdown = pctx.redact(render_markdown(doc))
    folder = pctx.patrol_dir
    stamp = log.started.astimezone(UTC).strftime("%Y%m%d-%H%M%S-%f")[:-3]  # to the millisecond
    for name in (f"report-{stamp}", LATEST):
        write_json_atomic(folder / f"{name}.json", doc)
        write_text_atomic(folder / f"{name}.md", markdown)
    prune(folder, KEEP_REPORTS)
    return folder / f"{LATEST}.json", folder / f"{LATEST}.md"


def _scrub(pctx: OpsContext, value: Any) -> Any:
    """Every string in a JSON value with the configured secrets replaced."""
    if isinstance(value, str):
        return pctx.redact(value)
    if isinstance(value, list):
        return [_scrub(pctx, v) for v in value]
    if isinstance(value, dict):
        return {k: _scrub(pctx, v) for k, v in value.items()}
    return value


def prune(folder: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` timestamped reports."""
    stamped = sorted(p for p in folder.glob("report-*.json") if p.stem != LATEST)
    for old in stamped[:-keep] if keep > 0 else stamped:
        for path in (old, old.with_suffix(".md")):
            path.unlink(missing_ok=True)
