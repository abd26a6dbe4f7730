"""What people decided, and the one rule every patrol job applies to it.

A decision is an operator interrupt, a stop at the run ceiling, or a pool row a person steered by
hand; no patrol job resumes, heals, requeues or re-sends it (docs/architecture.md §8).
``hub_stops`` tells every view who ended a run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from xaf_hub.core import clock
from xaf_hub.core.outcomes import Stop, StopKind, run_outcome
from xaf_hub.core.records import SessionRecord, Snapshot
from xaf_hub.errors import HubError, SessionNotFound, StateFileError
from xaf_hub.ops.ceiling import STEP as CEILING
from xaf_hub.ops.context import OpsContext
from xaf_hub.store.tasks import Task, instant_seconds

# Read at most this much of the audit log's end when looking for operator interrupts.
_AUDIT_TAIL_BYTES = 2_000_000
# An interrupt logged this long before the message it stopped was created still counts for it
# (the audit log has whole seconds; the server's clock may differ a little).
CLOCK_SLACK_S = 2.0
# ``xaf-hub interrupt`` writes "stopping" before its abort (a failed abort keeps it: a timed-out
# one may have stopped the run), then "aborted". A ceiling's stop counts whatever its abort did.
_STOPS = ("stopping", "aborted")

Key = tuple[str, str]  # (instance, session)


@dataclass(frozen=True)
class Decision:
    """Why the patrol leaves a session or a task alone."""

    kind: Literal["interrupted", "ceiling", "steered"]
    who: str
    at: float  # epoch seconds

    @property
    def text(self) -> str:
        """One line for the report and the page."""
        when = local_time(self.at)
        if self.kind == "interrupted":
            return f"interrupted by {self.who} at {when}"
        if self.kind == "ceiling":
            return f"stopped over its run ceiling at {when}; the patrol leaves it to a person"
        return f"steered by hand at {when}; the patrol leaves it to a person"


def local_time(at: float) -> str:
    """Epoch seconds as local time with its zone, minutes only."""
    return clock.local_time(round(at * 1000), seconds=False, zone="name")


def _who(raw: object) -> str:
    if not isinstance(raw, Mapping):
        return "someone"
    name = str(raw.get("caller") or raw.get("user") or "")
    return "@".join(p for p in (name, str(raw.get("host") or "")) if p) or "someone"


def _stop(entry: Mapping[str, Any]) -> StopKind | None:
    """The stop an audit line records, if any."""
    command = str(entry.get("command") or "")
    if command == "interrupt":
        return "person" if entry.get("result") in _STOPS else None
    return "ceiling" if command.endswith("." + CEILING) else None


def operator_interrupts(state_dir: Path) -> dict[Key, Stop]:
    """Latest stop per (instance, session) (``xaf-hub interrupt``, the run ceiling), from
    the audit log's tail."""
    path = state_dir / "audit.log"
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - _AUDIT_TAIL_BYTES))  # from the end
            raw = handle.read()
    except OSError:
        return {}
    found: dict[Key, Stop] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        if '"interrupt"' not in line and f'{CEILING}"' not in line:
            continue
        try:
            entry = json.loads(line)
            kind, when = _stop(entry), clock.read_instant(entry["time"])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a torn first line of the tail, or a hand-edited one
        if kind is None or when is None:
            continue
        key = (str(entry.get("instance") or ""), str(entry.get("session") or ""))
        _keep_later(found, key, kind, when.timestamp(), entry.get("who"))
    return found


def _keep_later(found: dict[Key, Stop], key: Key, kind: StopKind, at: float, who: object) -> None:
    """Keep the stop of ``key`` at ``at`` unless ``found`` holds a later one (a person's stop
    named by ``who``, a ceiling's by the run ceiling)."""
    if key not in found or at >= found[key].at:
        found[key] = Stop(kind, at, _who(who) if kind == "person" else "the run ceiling")


def people_interrupts(ops: OpsContext) -> dict[Key, Stop]:
    """Latest stop per session: this host's audit log, and with the Redis stores every
    host's interrupts (``store.backends.Stores.interrupts``). UnreachableError when Redis
    cannot be asked: a patrol must not undo an interrupt it could not read."""
    found = operator_interrupts(ops.cfg.state_dir)
    for key, (at, who, kind) in ops.stores.interrupts().items():
        _keep_later(found, key, "ceiling" if kind == "ceiling" else "person", at, who)
    return found


def hub_stops(ops: OpsContext) -> dict[Key, Stop]:
    """What a view needs to tell who ended a run: ``people_interrupts``, or only this host's
    audit log when Redis does not answer (a view still renders)."""
    try:
        return people_interrupts(ops)
    except HubError:
        return operator_interrupts(ops.cfg.state_dir)


def stopped_after(stop: Stop | None, since_s: float | None) -> bool:
    """True when ``stop`` came at or after ``since_s`` (None: any interrupt counts)."""
    return stop is not None and (since_s is None or stop.at >= since_s - CLOCK_SLACK_S)


def is_steered(task: Task) -> bool:
    """A row whose session a person steered by hand."""
    return task.status == "dispatched" and task.steered_at is not None


@dataclass(frozen=True)
class Decisions:
    """Every person's decision the patrol knows of this cycle (read once per job)."""

    interrupts: Mapping[Key, Stop] = field(default_factory=dict)
    steered: Mapping[Key, Task] = field(default_factory=dict)
    problem: str = ""  # the pool could not be read: steered rows unknown

    def for_session(self, instance: str, session: str, since_ms: int | None) -> Decision | None:
        """The decision about one session whose run (or prompt) started at ``since_ms``."""
        since = None if not since_ms else since_ms / 1000
        return self._decided((instance, session), since, self.steered.get((instance, session)))

    def for_task(self, task: Task) -> Decision | None:
        """The decision about a dispatched row: interrupted after its last prompt, or steered."""
        if task.status != "dispatched" or not task.session_id or not task.dispatched_to:
            return None
        since = instant_seconds(task.steered_at or task.dispatched_at)
        steered = task if is_steered(task) else None
        return self._decided((task.dispatched_to, task.session_id), since, steered)

    def _decided(self, key: Key, since: float | None, steered: Task | None) -> Decision | None:
        """A stop of ``key`` since ``since``, else the row ``steered`` by hand (None: none)."""
        stop = self.interrupts.get(key)
        if stop is not None and stopped_after(stop, since):
            return Decision("ceiling" if stop.kind == "ceiling" else "interrupted", stop.who,
                            stop.at)
        if steered is None:
            return None
        return Decision("steered", "", instant_seconds(steered.steered_at) or 0.0)


def decisions_from(interrupts: Mapping[Key, Stop], tasks: Iterable[Task]) -> Decisions:
    """Build the cycle's view from the audit log's interrupts and the pool's rows (pure)."""
    steered = {(t.dispatched_to or "", t.session_id or ""): t for t in tasks if is_steered(t)}
    return Decisions(dict(interrupts), steered)


def load_decisions(ops: OpsContext) -> Decisions:
    """Read the interrupts and the task pool; an unreadable pool is reported, never fatal."""
    interrupts = people_interrupts(ops)
    try:
        tasks = ops.backlog().load().tasks
    except StateFileError as exc:
        return Decisions(interrupts, {}, f"task pool unreadable, steered rows unknown: {exc}")
    return decisions_from(interrupts, tasks)


def person_stop(ops: OpsContext, instance: str, session: str, since_ms: int | None) -> str:
    """Why the patrol may no longer act on a session it judged ("" = it may): a person
    interrupted or steered it since ``since_ms``, read afresh. ``ops.send`` asks this under the
    instance lock, which ``xaf-hub interrupt`` holds while it records and aborts, so a heal or
    resume and a person's stop never interleave."""
    decision = load_decisions(ops).for_session(instance, session, since_ms)
    return "" if decision is None else f"{decision.text} since it was judged; nothing was sent"


async def session_still_runs(ops: OpsContext, instance: str, session_id: str) -> bool:
    """Ask the one instance whether the session runs now (busy or retrying).

    A session the instance no longer knows, or an instance no longer configured, does not
    run. An instance that does not answer raises UnreachableError: nobody can tell.
    """
    inst = next((i for i in ops.cfg.instances if i.name == instance), None)
    if inst is None:
        return False
    async with ops.client(inst) as client:
        try:
            session = await client.get_session(session_id)
        except SessionNotFound:
            return False
        running = await client.running([session.directory] if session.directory else [])
    return session_id in running


def shown_outcomes(snap: Snapshot, stops: Mapping[Key, Stop]) -> Snapshot:
    """``snap`` with each project session's ``outcome`` as every view shows it
    (``core.outcomes.run_outcome``: a run going on, one its server stopped, the hub's stops)."""

    def shown(s: SessionRecord) -> SessionRecord:
        if not s.project:
            return s
        stop = stops.get((s.instance, s.id))
        outcome = run_outcome(s.outcome, running=s.running, stop=stop, updated_ms=s.updated)
        return s if outcome == (s.outcome or None) else replace(s, outcome=outcome or "")

    return replace(snap, sessions=tuple(shown(s) for s in snap.sessions))
