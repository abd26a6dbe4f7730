"""The patrol's one call at the end of a cycle: derive, queue, send, and say how it went.

``notify_round(pctx, cycle)`` never raises and never holds the round up for long:

1. read what the stores say (task pool, blackouts), derive the round's events and queue the new
   ones for every webhook that wants them, in one locked write (so a crash after this point
   loses nothing: the next round sends what is queued);
2. send the outbox, each webhook in order of queueing, the webhooks side by side; each message
   gets ``notify.timeout_seconds`` per try and ``notify.retries`` retries with back-off; a
   webhook that stays unreachable is left for the next round after its first failed message;
   nothing new starts after ``notify.round_seconds``;
3. record each delivery, and write into the cycle's record what was sent (notes) and what
   could not be (errors), so the patrol report says it.

When a stop was requested (SIGTERM), events are queued but not sent: the next start sends them.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from xaf_hub.config.notify import NotifyConfig, Webhook
from xaf_hub.core import aio
from xaf_hub.core.text import redact
from xaf_hub.errors import HubError
from xaf_hub.notify import outbox
from xaf_hub.notify.derive import Done, Inputs, Parked, derive
from xaf_hub.notify.events import Event
from xaf_hub.notify.formats import Outgoing, build
from xaf_hub.notify.messages import render
from xaf_hub.notify.send import Answer, deliver, make_client
from xaf_hub.store.backlog import parse_instant

if TYPE_CHECKING:
    import httpx

    from xaf_hub.config.load import Config
    from xaf_hub.ops.context import OpsContext
    from xaf_hub.patrol.context import Cycle

STEP = "notify"


def _inputs(pctx: OpsContext, cycle: Cycle, now: datetime) -> Inputs:
    cfg = pctx.cfg
    parked: list[Parked] = []
    waiting = 0
    pool_sessions: set[tuple[str, str]] = set()
    try:
        tasks = pctx.backlog().load().tasks
    except HubError as exc:
        cycle.error(pctx, STEP, f"task pool unreadable, no task events this round: {exc}")
        tasks = []
    done: list[Done] = []
    for t in tasks:
        if t.session_id:
            pool_sessions.add((t.dispatched_to or "", t.session_id))
        if t.status == "done" and t.session_id:
            when = _instant(t.done_at)
            if when is not None:
                done.append(Done(t.id, t.title, t.dispatched_to or "", t.session_id, when))
        if t.status != "pending":
            continue
        if t.attempts >= cfg.patrol.max_attempts or t.parked:
            # Attempts used up, or parked after infrastructure failures: both wait for a person.
            why = t.parked or t.last_error or ""
            parked.append(Parked(t.id, t.title, t.attempts, why, t.dispatched_at or ""))
        else:
            waiting += 1
    blackouts: dict[str, tuple[str, str]] | None
    try:
        found = pctx.model_state().active_blackouts(now)
        blackouts = {
            fam: (datetime.fromtimestamp(b.until_ms / 1000, UTC).isoformat(), b.reason)
            for fam, b in found.items()
        }
    except HubError as exc:
        cycle.error(pctx, STEP, f"model state unreadable, no blackout events this round: {exc}")
        blackouts = None
    return Inputs(
        configured=[i.name for i in cfg.instances],
        parked=parked,
        waiting=waiting,
        pool_sessions=frozenset(pool_sessions),
        done=done,
        blackouts=blackouts,
        spend=cycle.spend,
    )


def _instant(value: str | None) -> datetime | None:
    try:
        when = parse_instant(value)
    except ValueError:
        return None
    return when if when is None or when.tzinfo else when.replace(tzinfo=UTC)


def _what(ev: Event) -> str:
    return " ".join(
        p for p in (ev.type, ev.task, "/".join(x for x in (ev.instance, ev.session) if x)) if p
    )


def outgoing(cfg: Config, hook: Webhook, ev: Event, now: datetime) -> Outgoing:
    """The request that tells ``hook`` about ``ev`` in the configured language, at ``now``."""
    notify = cfg.notify
    headline, text = render(
        ev,
        language=notify.language,
        project=cfg.project_name,
        page_url=notify.page_url,
        tz=_zone(cfg.models.timezone),
    )
    # Error texts in events come from servers: no configured secret goes to the chat.
    secrets = cfg.secrets()
    return build(
        hook,
        ev,
        redact(headline, secrets),
        redact(text, secrets),
        project=cfg.project_name,
        language=notify.language,
        page_url=notify.page_url,
        now=now,
    )


async def send_test(
    cfg: Config, hook: Webhook, transport: httpx.AsyncBaseTransport | None = None
) -> Answer:
    """Send one test message to ``hook`` (its URL must be set); return the receiver's answer."""
    assert hook.url
    stamp = datetime.now(UTC)
    ev = Event(
        f"test:{stamp.isoformat()}",
        "test",
        stamp.isoformat(timespec="seconds"),
        data={"webhook": hook.name},
    )
    notify = cfg.notify
    async with make_client(hook.url, notify.timeout_seconds, transport) as client:
        return await deliver(
            client,
            hook.format,
            lambda: outgoing(cfg, hook, ev, datetime.now(UTC)),
            retries=notify.retries,
            timeout=notify.timeout_seconds,
        )


class _Sender:
    """Sends one webhook's queue in order; stops when the receiver is unreachable."""

    def __init__(
        self,
        pctx: OpsContext,
        hook: Webhook,
        entries: Sequence[outbox.Entry],
        deadline: float,
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        self.pctx, self.hook, self.entries = pctx, hook, entries
        self.deadline, self.transport = deadline, transport
        self.sent: list[Event] = []
        self.refused: list[tuple[Event, str]] = []
        self.waiting: list[Event] = []
        self.down = ""

    def _outgoing(self, ev: Event) -> Outgoing:
        return outgoing(self.pctx.cfg, self.hook, ev, self.pctx.now())

    async def run(self) -> None:
        notify = self.pctx.cfg.notify
        if not self.hook.url:
            self.down = f"${self.hook.url_env} is not set"
            self.waiting = [e.event for e in self.entries]
            return
        async with make_client(self.hook.url, notify.timeout_seconds, self.transport) as client:
            for i, entry in enumerate(self.entries):
                if time.monotonic() >= self.deadline:
                    self.down = self.down or f"out of time ({notify.round_seconds:g} s per round)"
                    self.waiting = [e.event for e in self.entries[i:]]
                    return
                ev = entry.event
                answer: Answer = await deliver(
                    client,
                    self.hook.format,
                    functools.partial(self._outgoing, ev),
                    retries=notify.retries,
                    timeout=notify.timeout_seconds,
                    deadline=self.deadline,
                )
                reason = self.pctx.redact(answer.reason)
                await asyncio.to_thread(
                    outbox.record,
                    self.pctx.cfg.state_dir,
                    entry,
                    ok=answer.ok,
                    reason=reason,
                    now=self.pctx.now(),
                )
                if answer.ok:
                    self.sent.append(ev)
                elif answer.retry:
                    self.down = reason
                    self.waiting = [e.event for e in self.entries[i:]]
                    return
                else:
                    self.refused.append((ev, reason))


def _zone(name: str) -> Any:
    from xaf_hub.core.clock import resolve_timezone

    try:
        return resolve_timezone(name)
    except HubError:
        return datetime.now().astimezone().tzinfo


def notify_round(
    pctx: OpsContext,
    cycle: Cycle,
    transport: httpx.AsyncBaseTransport | None = None,
    *,
    live: bool = False,
) -> None:
    """Derive, queue and send this round's notifications; record the outcome in ``cycle``.

    ``live``: ``cycle`` is a reaction between rounds (see ``derive``).
    """
    cfg: NotifyConfig = pctx.cfg.notify
    if not cfg.webhooks:
        return
    try:
        _round(pctx, cycle, cfg, transport, live)
    except Exception as exc:  # noqa: BLE001 - notifications must never break a patrol round
        cycle.error(pctx, STEP, f"notifications failed: {type(exc).__name__}: {exc}")


def _round(
    pctx: OpsContext,
    cycle: Cycle,
    cfg: NotifyConfig,
    transport: httpx.AsyncBaseTransport | None,
    live: bool,
) -> None:
    now = pctx.now()
    inputs = _inputs(pctx, cycle, now)
    tz = _zone(pctx.cfg.models.timezone)
    try:
        queued = outbox.enqueue(
            pctx.cfg.state_dir,
            lambda state: derive(
                cycle, inputs, state, now=now, tz=tz, summary_hour=cfg.summary_hour, live=live
            ),
            cfg.webhooks,
            now=now,
            queue_limit=cfg.queue_limit,
            keep_hours=cfg.keep_hours,
            lock_timeout=pctx.cfg.lock.lock_timeout_seconds,
        )
    except HubError as exc:
        cycle.error(pctx, STEP, f"nothing queued or sent: {exc}")
        return
    for line in queued.dropped:
        cycle.error(pctx, STEP, line)
    if not queued.pending:
        return
    if pctx.stop_requested():
        cycle.notes.append(f"{STEP}: {len(queued.pending)} message(s) queued, sent after restart")
        return
    deadline = time.monotonic() + cfg.round_seconds
    senders = [
        _Sender(
            pctx, hook, [e for e in queued.pending if e.webhook == hook.name], deadline, transport
        )
        for hook in cfg.webhooks
    ]
    senders = [s for s in senders if s.entries]

    async def all_senders() -> None:
        await aio.gather(*(s.run() for s in senders))

    aio.run(all_senders())
    for s in senders:
        if s.sent:
            kinds = ", ".join(f"{k} {n}" for k, n in Counter(e.type for e in s.sent).items())
            cycle.notes.append(
                f"{STEP}: sent {len(s.sent)} message(s) to '{s.hook.name}' ({kinds})"
            )
        for ev, reason in s.refused:
            cycle.error(
                pctx,
                STEP,
                f"webhook '{s.hook.name}' refused {_what(ev)}: {reason}; kept for the next round",
            )
        if s.waiting:
            kinds = ", ".join(sorted({e.type for e in s.waiting}))
            cycle.error(
                pctx,
                STEP,
                f"could not send {len(s.waiting)} message(s) ({kinds}) to webhook "
                f"'{s.hook.name}': {s.down}; they stay queued for the next round",
            )
