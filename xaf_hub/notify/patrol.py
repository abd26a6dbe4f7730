"""The patrol's hooks: queue a round's notices (fast, under its lock), send them (never under it).

``queue_round`` touches no network and never raises; the daemon's ``Sender`` thread and
``send_round`` (``patrol --once``) post outside every patrol lock (docs/architecture.md §8).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from xaf_hub.config.notify import NotifyConfig, Webhook
from xaf_hub.core import aio
from xaf_hub.core.clock import read_instant, resolve_timezone
from xaf_hub.core.text import redact
from xaf_hub.errors import HubError
from xaf_hub.notify import outbox
from xaf_hub.notify.derive import Done, Inputs, Parked, derive, failover_event
from xaf_hub.notify.events import Event
from xaf_hub.notify.formats import Outgoing, build
from xaf_hub.notify.messages import render
from xaf_hub.notify.record import RoundLog
from xaf_hub.notify.send import Answer, deliver, make_client

if TYPE_CHECKING:
    import httpx

    from xaf_hub.config.load import Config
    from xaf_hub.ops.context import OpsContext

STEP = "notify"
HEALS_LOOKBACK = timedelta(hours=24)  # heals read per round; derive keeps the new ones
T = TypeVar("T")


def _inputs(pctx: OpsContext, log: RoundLog, now: datetime) -> Inputs:
    cfg = pctx.cfg

    def read(get: Callable[[], T], store: str, events: str) -> T | None:
        """What ``get`` reads, or None and an error in ``log`` when it cannot be read."""
        try:
            return get()
        except HubError as exc:
            log.error(pctx, STEP, f"{store} unreadable, no {events} events this round: {exc}")
            return None

    tasks = read(lambda: pctx.backlog().load().tasks, "task pool", "task") or []
    pending = [t for t in tasks if t.status == "pending"]
    # Attempts used up, or parked after infrastructure failures: both wait for a person.
    stuck = [t for t in pending if t.attempts >= cfg.patrol.max_attempts or t.parked]
    parked = [Parked(t.id, t.title, t.attempts, t.parked or t.last_error or "",
                     t.dispatched_at or "") for t in stuck]
    done = [
        Done(t.id, t.title, t.dispatched_to or "", t.session_id, when, t.verified is True)
        for t in tasks
        if t.status == "done" and t.session_id and (when := read_instant(t.done_at)) is not None
    ]
    state = pctx.model_state
    heals = read(lambda: state().healed_since(now - HEALS_LOOKBACK), "model state", "heal")
    found = read(lambda: state().active_blackouts(now), "model state", "blackout")
    blackouts = None if found is None else {
        fam: (datetime.fromtimestamp(b.until_ms / 1000, UTC).isoformat(), b.reason)
        for fam, b in found.items()
    }
    return Inputs(
        configured=[i.name for i in cfg.instances],
        parked=parked,
        waiting=len(pending) - len(stuck),
        pool_sessions=frozenset((t.dispatched_to or "", t.session_id) for t in tasks
                                if t.session_id),
        done=done,
        blackouts=blackouts,
        spend=log.spend,
        heals=heals or (),
    )


def _what(ev: Event) -> str:
    return " ".join(
        p for p in (ev.type, ev.task, "/".join(x for x in (ev.instance, ev.session) if x)) if p
    )


def outgoing(cfg: Config, hook: Webhook, ev: Event, now: datetime) -> Outgoing:
    """The request that tells ``hook`` about ``ev`` in the configured language, at ``now``."""
    notify = cfg.notify
    project = ev.project or cfg.project_name
    words = {"project": project, "language": notify.language, "page_url": notify.page_url}
    headline, text = render(ev, tz=_zone(cfg.models.timezone), **words)
    # Error texts in events come from servers: no configured secret goes to the chat.
    secrets = cfg.secrets()
    return build(hook, ev, redact(headline, secrets), redact(text, secrets), now=now, **words)


async def send_test(
    cfg: Config, hook: Webhook, transport: httpx.AsyncBaseTransport | None = None
) -> Answer:
    """Send one test message to ``hook`` (its URL must be set); return the receiver's answer."""
    assert hook.url
    stamp = datetime.now(UTC)
    at, data = stamp.isoformat(timespec="seconds"), {"webhook": hook.name}
    ev = Event(f"test:{stamp.isoformat()}", "test", at, data=data)
    notify = cfg.notify
    async with make_client(hook.url, notify.timeout_seconds, transport) as client:
        return await deliver(
            client, hook.format, lambda: outgoing(cfg, hook, ev, datetime.now(UTC)),
            retries=notify.retries, timeout=notify.timeout_seconds,
        )


@dataclass
class _Sender:
    """Sends one webhook's queue in order, claiming each message; stops when the receiver is
    unreachable or slow."""

    pctx: OpsContext
    hook: Webhook
    deadline: float
    transport: httpx.AsyncBaseTransport | None
    due_only: bool
    sent: list[Event] = field(default_factory=list)
    refused: list[tuple[Event, str]] = field(default_factory=list)
    maybe: list[tuple[Event, str]] = field(default_factory=list)
    reaped: list[str] = field(default_factory=list)
    down: str = ""

    def _outgoing(self, ev: Event) -> Outgoing:
        return outgoing(self.pctx.cfg, self.hook, ev, self.pctx.now())

    async def run(self) -> None:
        pctx = self.pctx
        notify = pctx.cfg.notify
        if not self.hook.url:
            self.down = f"${self.hook.url_env} is not set"
            return
        state_dir = pctx.cfg.state_dir
        async with make_client(self.hook.url, notify.timeout_seconds, self.transport) as client:
            while True:
                if pctx.stop_requested():
                    return
                if time.monotonic() >= self.deadline:
                    self.down = self.down or f"out of time ({notify.round_seconds:g} s per round)"
                    return
                got = await aio.blocking(
                    outbox.claim, state_dir, self.hook.name, now=pctx.now(), owner=os.getpid(),
                    due_only=self.due_only, lock_timeout=pctx.cfg.lock.lock_timeout_seconds,
                )
                self.reaped += got.reaped
                if (entry := got.entry) is None:
                    return
                ev = entry.event
                posted = functools.partial(aio.blocking, outbox.mark_posted, state_dir, entry)
                answer: Answer = await deliver(
                    client, self.hook.format, functools.partial(self._outgoing, ev),
                    retries=notify.retries, timeout=notify.timeout_seconds, deadline=self.deadline,
                    on_sent=posted,
                )
                reason = pctx.redact(answer.reason)
                await aio.blocking(outbox.record, state_dir, entry, outcome=answer.outcome,
                                   reason=reason, now=pctx.now())
                if answer.ok:
                    self.sent.append(ev)
                elif answer.maybe or answer.retry:
                    if answer.maybe:
                        self.maybe.append((ev, reason))
                    self.down = reason  # a slow or down receiver: the rest waits for the next pass
                    return
                else:
                    self.refused.append((ev, reason))


def send_outbox(
    pctx: OpsContext, *, seconds: float, due_only: bool,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[tuple[str, bool]]:
    """Send what is queued, each webhook side by side, for at most ``seconds``.

    Returns the lines to tell (text, is it an error). ``due_only``: leave messages that are
    still in their back-off.
    """
    cfg = pctx.cfg.notify
    deadline = time.monotonic() + seconds
    senders = [_Sender(pctx, hook, deadline, transport, due_only) for hook in cfg.webhooks]

    aio.run(aio.gather(*(s.run() for s in senders)))
    try:
        state = outbox.read_state(pctx.cfg.state_dir) or {}
    except HubError:
        state = {}
    lines: list[tuple[str, bool]] = []
    for s in senders:
        lines += [(f"{STEP}: {line}", True) for line in s.reaped]
        hook = f"webhook '{s.hook.name}'"
        if s.sent:
            kinds = ", ".join(f"{k} {n}" for k, n in Counter(e.type for e in s.sent).items())
            lines.append((f"{STEP}: sent {len(s.sent)} message(s) to '{s.hook.name}' ({kinds})",
                          False))
        bad = [f"{hook} refused {_what(ev)}: {reason}; parked, not sent again (see doctor)"
               for ev, reason in s.refused]
        bad += [f"{hook} {_what(ev)}: {reason}" for ev, reason in s.maybe]
        queued = state.get("outbox", [])
        waiting = [Event.from_json(i["event"]) for i in queued if i.get("webhook") == s.hook.name]
        if waiting and s.down:
            kinds = ", ".join(sorted({e.type for e in waiting}))
            bad.append(f"could not send {len(waiting)} message(s) ({kinds}) to {hook}: {s.down}; "
                       "they stay queued")
        lines += [(f"{STEP}: {line}", True) for line in bad]
    return lines


def send_round(
    pctx: OpsContext, log: RoundLog, transport: httpx.AsyncBaseTransport | None = None
) -> None:
    """``patrol --once``: send the outbox now (no patrol lock held); tell ``log`` how it went."""
    cfg = pctx.cfg.notify
    if not cfg.webhooks:
        return
    if pctx.stop_requested():
        log.notes.append(f"{STEP}: messages stay queued, sent after restart")
        return
    try:
        lines = send_outbox(pctx, seconds=cfg.round_seconds, due_only=False, transport=transport)
    except Exception as exc:  # noqa: BLE001 - notifications must never break a patrol round
        log.error(pctx, STEP, f"sending failed: {type(exc).__name__}: {exc}")
        return
    for line, bad in lines:
        if bad:
            log.errors.append(pctx.redact(line))
        else:
            log.notes.append(line)


class Sender:
    """The daemon's sending thread: delivers the outbox whenever woken, never under a lock."""

    POLL_SECONDS = 5.0  # how often it looks for messages whose back-off ended

    def __init__(self, pctx: OpsContext, out: Callable[[str], None],
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.pctx, self.out, self.transport = pctx, out, transport
        self.passes = 0
        self._wake = threading.Event()
        self._force = False
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="xaf-hub-notify", daemon=True)

    def start(self) -> None:
        """Start sending (a pass at once: what a previous run left queued); again after a
        config change: started once the config names a webhook."""
        if self.pctx.cfg.notify.webhooks and self._thread.ident is None:
            self._force = True
            self._wake.set()
            self._thread.start()

    def wake(self, *, every: bool = False) -> None:
        """Send now; ``every``: also the messages still in their back-off (a round)."""
        self._force = self._force or every
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the message being posted (at most one try's timeout)."""
        self._stopped = True
        self._wake.set()
        if self._thread.is_alive():
            notify = self.pctx.cfg.notify
            self._thread.join(timeout if timeout is not None else notify.timeout_seconds + 2.0)

    def _loop(self) -> None:
        while not self._stopped:
            self._wake.wait(self.POLL_SECONDS)
            self._wake.clear()
            if self._stopped or self.pctx.stop_requested():
                return
            every, self._force = self._force, False
            try:
                lines = send_outbox(self.pctx, seconds=self.pctx.cfg.notify.round_seconds,
                                    due_only=not every, transport=self.transport)
            except Exception as exc:  # noqa: BLE001 - the thread must outlive one bad pass
                lines = [(f"{STEP}: sending failed: {type(exc).__name__}: {exc}", True)]
            self.passes += 1
            for line, bad in lines:
                text = self.pctx.redact(line)
                if bad:
                    self.pctx.log(text)
                self.out(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}")


def _zone(name: str) -> Any:
    try:
        return resolve_timezone(name)
    except HubError:
        return datetime.now().astimezone().tzinfo


def queue_round(pctx: OpsContext, log: RoundLog, *, live: bool = False) -> int:
    """Derive and queue this round's notices; record problems in ``log``; never raises.

    ``live``: ``log`` is a live reaction's, between rounds (see ``derive``). Returns how many
    messages wait in the outbox.
    """
    cfg: NotifyConfig = pctx.cfg.notify
    if not cfg.webhooks:
        return 0
    try:
        now = pctx.now()
        inputs = _inputs(pctx, log, now)
        tz = _zone(pctx.cfg.models.timezone)
        queued = _enqueue(pctx, lambda state: derive(
            log, inputs, state, now=now, tz=tz, summary_hour=cfg.summary_hour, live=live
        ), now)
        for line in queued.dropped:
            log.error(pctx, STEP, line)
        if queued.new:
            log.notes.append(f"{STEP}: queued {len(queued.new)} new event(s) for the sender")
        return len(queued.pending)
    except HubError as exc:
        log.error(pctx, STEP, f"nothing queued: {exc}")
    except Exception as exc:  # noqa: BLE001 - notifications must never break a patrol round
        log.error(pctx, STEP, f"notifications failed: {type(exc).__name__}: {exc}")
    return 0


def _enqueue(
    pctx: OpsContext, make: Callable[[dict[str, Any]], list[Event]], now: datetime
) -> outbox.Queued:
    """Queue what ``make`` derives from the outbox's state, for every webhook, under its lock."""
    cfg = pctx.cfg.notify
    return outbox.enqueue(
        pctx.cfg.state_dir, make, cfg.webhooks, now=now, queue_limit=cfg.queue_limit,
        keep_hours=cfg.keep_hours, lock_timeout=pctx.cfg.lock.lock_timeout_seconds,
        claim=pctx.stores.event_claimer(),
    )


def queue_failover(pctx: OpsContext, from_host: str, to_host: str, token: str) -> str:
    """Queue the ``failover`` notice of a lease just taken from ``from_host``; never raises.

    Returns a line for the daemon's output: what was queued, or why nothing was.
    """
    return queue_notice(pctx, failover_event(from_host, to_host, token, pctx.now()))[1]


def queue_notice(pctx: OpsContext, event: Event) -> tuple[bool, str]:
    """Queue one notice made outside a round (a failover, a rest a person ended); never raises.

    Returns whether nothing failed, and a line saying what was queued, or why nothing was ("":
    no webhooks).
    """
    cfg: NotifyConfig = pctx.cfg.notify
    if not cfg.webhooks:
        return True, ""
    try:
        queued = _enqueue(pctx, lambda state: [event], pctx.now())
    except Exception as exc:  # noqa: BLE001 - a notice must never stop what announced it
        return False, pctx.redact(
            f"{STEP}: {event.type} notice not queued: {type(exc).__name__}: {exc}"
        )
    return True, f"{STEP}: queued the {event.type} notice" if queued.new else ""
