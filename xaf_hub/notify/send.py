"""POST one message to a webhook: a short timeout, a few retries with back-off, one verdict.

Retried: no connection (refused, DNS, connect timeout: nothing was sent), HTTP 408/429/5xx
and the services' "too fast" codes. Not retried: any other refusal or a redirect (a bad
signature, a wrong token, a moved hook), since the same request would be refused again; and
a request that went out on an open connection but got no answer in time (the receiver may
have accepted it: at most once, never twice). Reasons never carry the URL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from xaf_hub.core.backoff import Backoff
from xaf_hub.fleet.client import explain
from xaf_hub.fleet.retry import maybe_delivered
from xaf_hub.notify.formats import Outgoing, judge

# Back-off between tries: 0.5 s, 1 s, 2 s... capped.
RETRY = Backoff(first=0.5, cap=4.0)  # between the tries of one POST
_ANSWER_CHARS = 500
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}

Sleep = Callable[[float], Awaitable[None]]
OnSent = Callable[[], Awaitable[None]]
_SENDING = ("send_request_headers.started",)  # httpcore's trace, HTTP/1.1 and HTTP/2


@dataclass(frozen=True)
class Answer:
    """How a delivery ended.

    ``retry`` on a failure: the receiver was down or busy (a later round may succeed), as
    opposed to a refusal. ``status`` is 0 when no HTTP answer came. ``body`` is the start of
    the receiver's answer.
    """

    ok: bool
    retry: bool
    status: int
    reason: str
    body: str
    tries: int
    maybe: bool = False  # sent on an open connection, no answer in time: maybe delivered

    @property
    def outcome(self) -> Literal["delivered", "maybe", "refused", "retry"]:
        """What the outbox makes of it (``outbox.record``)."""
        if self.ok:
            return "delivered"
        if self.maybe:
            return "maybe"
        return "retry" if self.retry else "refused"


def make_client(
    url: str, timeout: float, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """An HTTP client for one webhook; a proxy from the environment never sees loopback."""
    host = urlsplit(url).hostname or ""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout),
        transport=transport,
        trust_env=host not in _LOOPBACK,
        follow_redirects=False,
    )


async def deliver(
    client: httpx.AsyncClient,
    fmt: str,
    make: Callable[[], Outgoing],
    *,
    retries: int,
    timeout: float,
    deadline: float | None = None,
    sleep: Sleep = asyncio.sleep,
    on_sent: OnSent | None = None,
) -> Answer:
    """Send ``make()`` (rebuilt per try: signatures carry a timestamp) until one verdict.

    ``on_sent`` is awaited once, just before the request's first byte leaves (real transports
    only): the caller's chance to record durably that the message may now arrive.
    """
    tries = 0
    said = False  # on_sent was awaited
    leaving = False  # this try's request started to leave

    async def trace(name: str, info: dict[str, Any]) -> None:
        nonlocal said, leaving
        if name.endswith(_SENDING):
            leaving = True
            if on_sent is not None and not said:
                said = True
                await on_sent()

    while True:
        tries += 1
        leaving = False
        out = make()
        status, body, maybe = 0, "", False
        try:
            resp = await client.post(
                out.url, content=out.body, headers=dict(out.headers), extensions={"trace": trace}
            )
            status, body = resp.status_code, resp.text[:_ANSWER_CHARS]
            verdict = judge(fmt, status, body)
            ok, retry, reason = verdict.ok, verdict.retry, verdict.reason
        except httpx.HTTPError as exc:
            ok, reason = False, explain(exc, timeout, timeout)[1]
            maybe = maybe_delivered(exc, leaving)
            retry = not maybe
            if maybe:
                reason += "; the request was sent, so it counts as delivered (at most once)"
        if ok or not retry or tries > retries:
            return Answer(ok, retry, status, reason, body, tries, maybe)
        pause = RETRY.delay(tries)
        if deadline is not None and time.monotonic() + pause + timeout > deadline:
            return Answer(ok, retry, status, reason + " (out of time for retries)", body, tries)
        await sleep(pause)
