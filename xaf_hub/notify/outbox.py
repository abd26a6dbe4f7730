"""The notifications' durable state: ``<state>/notify/state.json`` (schema 1, mode 0600).

Every change is one locked read-modify-write with an atomic replace, and no lock is held while a
message is posted. Delivery is at most once per webhook and event: ``claim`` before posting,
``mark_posted`` as the request leaves, ``record`` to settle (docs/architecture.md §8).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

from xaf_hub.config.notify import Webhook
from xaf_hub.core.backoff import Backoff
from xaf_hub.core.clock import format_instant, read_instant
from xaf_hub.errors import StateFileError
from xaf_hub.notify.derive import HISTORY_HOURS
from xaf_hub.notify.events import Event
from xaf_hub.store.gate import pid_alive
from xaf_hub.store.statefile import read_json, update_json

SCHEMA_VERSION = 1
FILE = Path("notify") / "state.json"
SEEN_DAYS = 14
PARKED_HOURS = 24.0  # a refused message is shown this long, never re-sent
# A message not sent (no connection) waits 10 s, 20 s, 40 s... at most 5 min for the next try.
RETRY = Backoff(first=10.0, cap=300.0)
# A claim older than this is its owner's no longer (a sender's tries end long before).
STALE_SENDING = timedelta(minutes=10)
_WHAT = "notification state"
# Every key of the state, and its type.
_KEYS: dict[str, type] = {
    **dict.fromkeys(("instances", "blackouts", "seen", "sent", "last"), dict),
    **dict.fromkeys(("history", "outbox", "parked"), list),
}
T = TypeVar("T")

Outcome = Literal["delivered", "maybe", "refused", "retry"]


def state_path(state_dir: Path) -> Path:
    """Where the notification state lives."""
    return state_dir / FILE


@dataclass(frozen=True)
class Entry:
    """One queued message: an event for one webhook."""

    webhook: str
    event: Event
    queued_at: str
    attempts: int
    last_error: str


def _checked(data: Any, path: Path) -> dict[str, Any]:
    """The state with every key present; a wrong shape is an error naming the file."""
    if not isinstance(data, dict):
        raise StateFileError(f"{_WHAT} {path}: top level must be an object")
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise StateFileError(
            f"{_WHAT} {path}: schema_version {version} is not {SCHEMA_VERSION} "
            "(written by another xaf-hub version)"
        )
    data["schema_version"] = SCHEMA_VERSION
    for key, kind in _KEYS.items():
        if key not in data:
            data[key] = kind()
        elif not isinstance(data[key], kind):
            raise StateFileError(f"{_WHAT} {path}: key '{key}' must be a {kind.__name__}")
    for i, item in enumerate(data["outbox"]):
        if not (isinstance(item, dict) and isinstance(item.get("event"), dict)):
            raise StateFileError(f"{_WHAT} {path}: key 'outbox[{i}]' is not a queued message")
        try:
            Event.from_json(item["event"])
        except ValueError as exc:
            raise StateFileError(f"{_WHAT} {path}: key 'outbox[{i}].event': {exc}") from None
    return data


def _update(state_dir: Path, change: Callable[[dict[str, Any]], T], lock_timeout: float) -> T:
    """``change`` the checked state in one locked read-modify-write; return what it returns."""
    path = state_path(state_dir)
    return update_json(path, lambda raw: change(_checked(raw, path)), what=_WHAT,
                       default=lambda: {"schema_version": SCHEMA_VERSION}, timeout=lock_timeout)


def _entry(item: Mapping[str, Any]) -> Entry:
    return Entry(
        str(item.get("webhook") or ""),
        Event.from_json(item["event"]),
        str(item.get("queued_at") or ""),
        int(item.get("attempts") or 0),
        str(item.get("last_error") or ""),
    )


@dataclass(frozen=True)
class Queued:
    """What one round put in and found in the outbox."""

    pending: list[Entry]
    new: list[Event]
    dropped: list[str]  # one line per message given up on (too old, queue full)


def enqueue(
    state_dir: Path,
    derive: Callable[[dict[str, Any]], list[Event]],
    hooks: Sequence[Webhook],
    *,
    now: datetime,
    queue_limit: int,
    keep_hours: float,
    lock_timeout: float = 20.0,
    claim: Callable[[str], bool] | None = None,
) -> Queued:
    """Run ``derive(state)`` under the lock, queue its new events, trim; return the outbox.

    ``claim(event_id)`` (HA patrol: ``store.backends.Stores.event_claimer``) is asked for each event
    new here; False means another hub queued it already: it is only marked seen. When it
    raises, nothing of this call is written (the next round derives the events again).
    """
    stamp = format_instant(now)
    names = {h.name for h in hooks}

    def mutate(data: dict[str, Any]) -> Queued:
        events = derive(data)
        new = []
        for ev in events:
            if ev.id in data["seen"]:
                continue
            data["seen"][ev.id] = stamp
            if claim is not None and not claim(ev.id):
                continue  # another hub of the HA patrol queued it
            new.append(ev)
            data["history"].append({"type": ev.type, "at": ev.at})
            for hook in hooks:
                if hook.wants(ev.type):
                    item = {"webhook": hook.name, "event": ev.to_json(), "queued_at": stamp}
                    data["outbox"].append({**item, "attempts": 0, "last_error": ""})
        dropped: list[str] = []
        oldest = now - timedelta(hours=keep_hours)
        kept: list[dict[str, Any]] = []
        for item in data["outbox"]:
            when = read_instant(item.get("queued_at"))
            if item.get("webhook") not in names:
                continue  # the webhook left the config: nobody to send it to
            if when is not None and when < oldest:
                dropped.append(_drop_line(item, f"unsent for more than {keep_hours:g} h"))
                continue
            kept.append(item)
        for name in names:
            mine = [i for i in kept if i.get("webhook") == name]
            for item in mine[: max(0, len(mine) - queue_limit)]:
                dropped.append(_drop_line(item, f"queue full ({queue_limit} messages)"))
                kept.remove(item)
        data["outbox"] = kept
        _prune(data, now)
        return Queued([_entry(i) for i in kept], new, dropped)

    return _update(state_dir, mutate, lock_timeout)


def _drop_line(item: Mapping[str, Any], why: str) -> str:
    ev = item.get("event") or {}
    return f"gave up on {ev.get('type')} {ev.get('id')} for webhook '{item.get('webhook')}': {why}"


def _prune(data: dict[str, Any], now: datetime) -> None:
    seen = now - timedelta(days=SEEN_DAYS)
    for key in ("seen", "sent"):
        data[key] = {k: v for k, v in data[key].items()
                     if (w := read_instant(v)) is None or w >= seen}

    def since(items: list[Any], key: str, horizon: datetime) -> list[Any]:
        """The entries stamped (``key``) at or after ``horizon``."""
        return [i for i in items if isinstance(i, dict)
                and (w := read_instant(i.get(key))) is not None and w >= horizon]

    data["parked"] = since(data["parked"], "parked_at", now - timedelta(hours=PARKED_HOURS))
    data["history"] = since(data["history"], "at", now - timedelta(hours=HISTORY_HOURS))[-5000:]


def _same(item: Mapping[str, Any], entry: Entry) -> bool:
    return bool(item.get("webhook") == entry.webhook and item["event"].get("id") == entry.event.id)


def retry_delay(attempts: int) -> float:
    """Seconds before the next try of a message not sent ``attempts`` times (back-off)."""
    return RETRY.delay(max(1, attempts))


def _reap(data: dict[str, Any], now: datetime, stamp: str) -> list[str]:
    """Settle claims whose sender is gone; one line per message counted as maybe delivered."""
    lines, kept = [], []
    for item in data["outbox"]:
        claim = item.get("sending")
        if isinstance(claim, dict):
            at = read_instant(claim.get("at"))
            owner = claim.get("owner")
            gone = not (isinstance(owner, int) and pid_alive(owner))
            if gone or at is None or now - at > STALE_SENDING:
                if claim.get("posted"):
                    why = ("the hub stopped during its POST: maybe delivered, not sent again "
                           "(at most once)")
                    data["sent"][f"{item.get('webhook')}:{item['event'].get('id')}"] = stamp
                    last = data["last"].setdefault(str(item.get("webhook")), {})
                    last.update(error_at=stamp, error=why)
                    lines.append(_drop_line(item, why))
                    continue
                del item["sending"]  # nothing left the machine: send it as usual
        kept.append(item)
    data["outbox"] = kept
    return lines


@dataclass(frozen=True)
class Claim:
    """The message a sender now owns (None: nothing due), and claims it found abandoned."""

    entry: Entry | None
    reaped: list[str]


def claim(
    state_dir: Path,
    webhook: str,
    *,
    now: datetime,
    owner: int,
    due_only: bool = True,
    lock_timeout: float = 20.0,
) -> Claim:
    """Mark the oldest queued message of ``webhook`` as being sent by ``owner`` (a pid).

    ``due_only``: skip messages still in their back-off (a round tries them all).
    """
    stamp = format_instant(now)

    def mutate(data: dict[str, Any]) -> Claim:
        reaped = _reap(data, now, stamp)
        for item in data["outbox"]:
            if item.get("webhook") != webhook or isinstance(item.get("sending"), dict):
                continue
            due = read_instant(item.get("next_at"))
            if due_only and due is not None and due > now:
                continue
            item["sending"] = {"owner": owner, "at": stamp, "posted": False}
            return Claim(_entry(item), reaped)
        return Claim(None, reaped)

    return _update(state_dir, mutate, lock_timeout)


def mark_posted(state_dir: Path, entry: Entry, *, lock_timeout: float = 20.0) -> None:
    """Record that the request is about to leave: from here on it is never re-sent blindly."""
    def mutate(data: dict[str, Any]) -> None:
        for item in data["outbox"]:
            if _same(item, entry) and isinstance(item.get("sending"), dict):
                item["sending"]["posted"] = True

    _update(state_dir, mutate, lock_timeout)


def record(
    state_dir: Path,
    entry: Entry,
    *,
    outcome: Outcome,
    reason: str,
    now: datetime,
    lock_timeout: float = 20.0,
) -> None:
    """Settle one claimed message (see the module's docstring for each outcome)."""
    stamp = format_instant(now)

    def mutate(data: dict[str, Any]) -> None:
        if outcome == "retry":
            for item in data["outbox"]:
                if _same(item, entry):
                    item.pop("sending", None)
                    item["attempts"] = attempts = int(item.get("attempts") or 0) + 1
                    item["last_error"] = reason
                    item["next_at"] = format_instant(now + timedelta(seconds=retry_delay(attempts)))
        else:
            data["outbox"] = [i for i in data["outbox"] if not _same(i, entry)]
        if outcome == "refused":
            parked = {"webhook": entry.webhook, "event": entry.event.to_json(), "reason": reason}
            data["parked"].append({**parked, "parked_at": stamp})
        elif outcome != "retry":  # delivered, or maybe
            data["sent"][f"{entry.webhook}:{entry.event.id}"] = stamp
        last = {"ok_at": stamp} if outcome == "delivered" else {"error_at": stamp, "error": reason}
        data["last"].setdefault(entry.webhook, {}).update(last)

    _update(state_dir, mutate, lock_timeout)


def read_state(state_dir: Path) -> dict[str, Any] | None:
    """The state for ``doctor`` (None before the first round; StateFileError when corrupt)."""
    path = state_path(state_dir)
    try:
        return _checked(read_json(path, what=_WHAT), path)
    except FileNotFoundError:
        return None
