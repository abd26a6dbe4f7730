"""A finished patrol round, compared with what the previous round saw, as events (pure).

``derive`` reads the round's ``RoundLog`` and the stores, and updates the previous-round view in
``state`` in place; an event's id makes "send once" hold when the same fact is derived again. The
events and when each is sent: docs/notifications.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from xaf_hub.core.clock import format_instant, read_instant
from xaf_hub.core.text import mask_credentials
from xaf_hub.notify.events import Event
from xaf_hub.notify.record import RoundLog
from xaf_hub.ops.budget import BudgetLine, levels_reached
from xaf_hub.store.model_state import HEAL_PREFIX, Healed

_FLEET_DOWN = "no instance answered"
_PERSON_STATES = ("failed", "stale_busy", "interrupted")
# A skipped resume or heal that a person must take up (see check_agents.resume_refusal).
_LEFT_FOR_PERSON = ("production", "resumed_once")
HISTORY_HOURS = 48


@dataclass(frozen=True)
class Parked:
    """A pool task that waits for a person: attempts used up, or parked by the pool."""

    id: str
    title: str
    attempts: int
    last_error: str
    dispatched_at: str = ""  # the run it was parked after: a later parking is news again


@dataclass(frozen=True)
class Done:
    """A pool task marked done, with the session that did it."""

    id: str
    title: str
    instance: str
    session: str
    done_at: datetime
    verified: bool = True  # False: finished on the agent's or a person's word

    @property
    def event(self) -> str:
        """Its chat event's type."""
        return "task_done" if self.verified else "task_finished"


@dataclass(frozen=True)
class Inputs:
    """What the stores say at the end of the round (read by the caller)."""

    configured: Sequence[str]
    parked: Sequence[Parked] = ()
    waiting: int = 0
    pool_sessions: frozenset[tuple[str, str]] = frozenset()
    done: Sequence[Done] = ()
    # family -> (until as ISO 8601 UTC, reason)
    blackouts: Mapping[str, tuple[str, str]] | None = None
    # Today's spend against the budgets (ops.budget.BudgetLine: project first, then instances)
    spend: Sequence[BudgetLine] = ()
    heals: Sequence[Healed] = ()  # the healed memory's recent heals


def reachability(log: RoundLog, configured: Sequence[str]) -> dict[str, tuple[bool, str]]:
    """Each instance's (reachable, reason) as this round saw it ({} when it did not look)."""
    if log.instances:
        return {i.name: (i.reachable, i.reason) for i in log.instances}
    if any(s.cause == "fleet_down" for s in log.steps):
        return {name: (False, _FLEET_DOWN) for name in configured}
    return {}


def _instance_events(
    seen: Mapping[str, tuple[bool, str]], state: MutableMapping[str, Any], at: str
) -> list[Event]:
    prev: MutableMapping[str, Any] = state.setdefault("instances", {})
    events = []
    for name, (up, reason) in seen.items():
        before = prev.get(name)
        if isinstance(before, Mapping) and bool(before.get("up")) != up:
            kind, data = "instance_down", {"reason": reason}
            if up:
                kind, data = "instance_up", {"down_since": str(before.get("since") or "")}
            events.append(Event(f"{kind}:{name}:{at}", kind, at, instance=name, data=data))
        if not isinstance(before, Mapping) or bool(before.get("up")) != up:
            prev[name] = {"up": up, "since": at, "reason": reason}
    return events


def _session_events(log: RoundLog, inputs: Inputs, at: str, people: bool = True) -> list[Event]:
    events = []
    for a in log.actions:  # a run stopped past its ceiling, a task done: one event each
        if a.kind == "ceiling":
            kind, key, data = "run_ceiling", a.instance, {"reason": a.detail}
        elif a.kind in ("done", "finished") and a.result == "ok":
            kind = "task_done" if a.kind == "done" else "task_finished"
            key, data = a.task, {"judged": a.detail} if a.detail else {}
        else:
            continue
        where = (a.instance, a.session, a.title, a.task)
        events.append(Event(f"{kind}:{key}:{a.session}", kind, at, *where, data))
    if not people:
        return events
    return [*events, *_person_events(log, inputs, at), *_waiting_events(log, at)]


def _waiting_events(log: RoundLog, at: str) -> list[Event]:
    """One ``waiting_person`` per request a run waits on (the same request: the same id)."""

    return [
        Event(f"waiting_person:{line.instance}:{line.request}", "waiting_person", at,
              line.instance, line.session, line.title,
              data={"detail": mask_credentials(line.detail), "request": line.request,
                    "answer": line.answer})
        for line in log.sessions
        if line.state == "waiting" and line.request
    ]


def _person_events(log: RoundLog, inputs: Inputs, at: str) -> list[Event]:
    lines = {(line.instance, line.session): line for line in log.sessions}
    found: dict[tuple[str, str], Event] = {}

    def add(key: tuple[str, str], title: str, task: str, state: str, detail: str) -> None:
        line = lines.get(key)
        updated = line.updated_ms if line is not None else 0
        title = title or (line.title if line is not None else "")
        found.setdefault(key, Event(f"needs_person:{key[0]}:{key[1]}:{updated}", "needs_person",
                                    at, *key, title, task, data={"state": state, "detail": detail}))

    # A person's decision: what the report lists under "Needs a person".
    for a in log.actions:
        if a.kind == "person":
            add((a.instance, a.session), a.title, a.task, "person", a.detail)
    # Sessions in trouble that no step took care of this round.
    handled = {(a.instance, a.session) for a in log.actions if a.result in ("ok", "waiting")}
    handled |= log.touched | log.deferred
    left = {
        (a.instance, a.session): a.detail
        for a in log.actions
        if a.kind in ("resume", "heal", "keep")
        and a.result in ("skipped", "failed")
        and (a.result == "failed" or a.why in _LEFT_FOR_PERSON)
    }
    for line in log.sessions:
        key = (line.instance, line.session)
        if line.state not in _PERSON_STATES or key in handled or key in inputs.pool_sessions:
            continue
        if line.state == "interrupted" and key not in left:
            continue  # resumed later, or still starting
        detail = "; ".join(p for p in (line.detail, left.get(key, "")) if p)
        add(key, line.title, "", line.state, detail)
    return list(found.values())


def _catch_up(inputs: Inputs, since: datetime | None, at: str) -> list[Event]:
    """task_done for pool tasks done since the previous finished round began.

    The record already has this round's; these are the ones of a round that was
    killed before it could queue them (same ids, so nothing is announced twice).
    """
    if since is None:
        return []
    return [
        Event(f"{t.event}:{t.id}:{t.session}", t.event, at, t.instance, t.session, t.title, t.id)
        for t in inputs.done
        if t.done_at >= since
    ]


def _healed(log: RoundLog, inputs: Inputs, since: datetime) -> list[Event]:
    """One ``healed`` per heal the store remembers since ``since`` (id: the failure's key)."""
    healed = [a for a in log.actions if a.kind == "heal" and a.result == "ok"]
    details = {(a.instance, a.session): a for a in healed}
    since_ms = int(since.timestamp() * 1000)
    events = []
    for h in inputs.heals:
        if h.at_ms < since_ms:
            continue
        a = details.get((h.who.instance, h.who.session))
        when = format_instant(datetime.fromtimestamp(h.at_ms / 1000, UTC))
        data = {"from_model": h.from_model or (a.from_model if a is not None else ""),
                "model": h.to_model, "detail": a.detail if a is not None else ""}
        title = h.who.title or (a.title if a is not None else "")
        events.append(Event("healed:" + h.key.removeprefix(HEAL_PREFIX), "healed", when,
                            h.who.instance, h.who.session, title, data=data))
    return events


def _store_events(inputs: Inputs, state: MutableMapping[str, Any], at: str) -> list[Event]:
    events = [
        Event(f"task_parked:{t.id}:{t.dispatched_at}:{t.attempts}", "task_parked", at,
              title=t.title, task=t.id, data={"attempts": t.attempts, "error": t.last_error})
        for t in inputs.parked
    ]
    if inputs.blackouts is not None:
        before = state.get("blackouts")
        before = before if isinstance(before, Mapping) else {}
        for family, (until, reason) in sorted(inputs.blackouts.items()):
            if before.get(family) != until:
                data = {"family": family, "until": until, "reason": reason}
                events.append(Event(f"blackout:{family}:{until}", "blackout", at, data=data))
        state["blackouts"] = {f: u for f, (u, _) in inputs.blackouts.items()}
    return events


def _budget_events(inputs: Inputs, day: str, at: str) -> list[Event]:
    """80 % and 100 % of a daily budget reached, once per level and local ``day``."""
    return [
        Event(f"budget:{scope}{line.instance or '*'}:{level}:{day}", "budget", at,
              instance=line.instance, project=line.project,
              data={"every_project": line.every, "level": level, "day": day,
                    "spent_usd": round(line.spent.usd, 6), "budget_usd": line.budget,
                    "cost_unknown_sessions": line.spent.unknown})
        for line in inputs.spend
        for scope in [f"{line.project}/" if line.project else ""]
        for level in levels_reached(line)
    ]


def failover_event(from_host: str, to_host: str, token: str, now: datetime) -> Event:
    """The patrol moved from ``from_host`` to ``to_host``; ``token`` (the new lease) makes it
    one fact however often it is queued."""
    data = {"from_host": from_host, "to_host": to_host}
    return Event(f"failover:{token}", "failover", format_instant(now), data=data)


def rest_ended_event(target: str, until: str, now: datetime) -> Event:
    """A person ended the rest of ``target`` (a family or a model) that was to last ``until``
    (ISO); one fact per rest, however often it is queued."""
    data = {"family": target, "until": until}
    return Event(f"rest_ended:{target}:{until}", "rest_ended", format_instant(now), data=data)


def counts_since(history: Sequence[Mapping[str, Any]], since: datetime) -> dict[str, int]:
    """How many events of each type were derived since ``since``."""
    when = [(str(i.get("type")), read_instant(i.get("at"))) for i in history]
    return dict(Counter(kind for kind, at in when if at is not None and at >= since))


def derive(
    log: RoundLog,
    inputs: Inputs,
    state: MutableMapping[str, Any],
    *,
    now: datetime,
    tz: tzinfo,
    summary_hour: int,
    live: bool = False,
) -> list[Event]:
    """The round's events, in the order a reader wants them; ``state`` moves to this round.

    ``live`` is a patrol daemon's reaction between rounds (``patrol.live``): it looked at a few
    sessions, not the fleet, so it says what it did (task_done, healed) and what the stores
    now hold (task_parked, blackout); reachability, "needs a person" and the daily summary
    need a whole round's view and wait for the next round.
    """
    at = format_instant(log.started)
    seen = {} if live else reachability(log, inputs.configured)
    events = _instance_events(seen, state, at)
    events += _session_events(log, inputs, at, people=not live)
    # When the previous finished round began (None before the first); then this one's.
    since = read_instant(state.get("last_round"))
    state["last_round"] = at
    events += _healed(log, inputs, since if since is not None else log.started)
    ids = {e.id for e in events}
    events += [e for e in _catch_up(inputs, since, at) if e.id not in ids]
    events += _store_events(inputs, state, at)
    local = now.astimezone(tz)
    day = local.date().isoformat()
    events += _budget_events(inputs, day, at)
    if not live and local.hour >= summary_hour and state.get("summary_day") != day:
        # The day's summary: the last 24 hours' events (this round's new ones too), and now.
        state["summary_day"] = day
        history = list(state.get("history") or [])
        seen_ids = state.get("seen")
        seen_ids = seen_ids if isinstance(seen_ids, Mapping) else {}
        history += [{"type": e.type, "at": e.at} for e in events if e.id not in seen_ids]
        states = Counter(s.state for s in log.sessions)
        data = {
            "day": day,
            "counts": counts_since(history, now - timedelta(hours=24)),
            "running": states["running"] + states["stale_busy"],
            "waiting": inputs.waiting,
            "asking": states["waiting"],
            "up": sum(1 for up, _ in seen.values() if up),
            "servers": len(inputs.configured),
        }
        events.append(Event(f"daily_summary:{day}", "daily_summary", format_instant(now),
                            data=data))
    # Each event of a session names the session's project.
    owners = {(s.instance, s.session): s.project for s in log.sessions if s.project}
    return [
        replace(e, project=owners.get((e.instance, e.session), e.project)) if e.session else e
        for e in events
    ]
