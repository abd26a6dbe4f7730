"""POST one message to a webhook: a short timeout, a few retries with back-off, one verdict.

Retried: no connection, no answer in time, HTTP 408/429/5xx and the services' "too fast"
codes. Not retried: any other refusal (a bad signature, a wrong token, a malformed message),
since the same request would be refused again. Reasons never carry the URL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from xaf_hub.fleet.client import describe_error
from xaf_hub.notify.formats import Outgoing, judge

# Back-off between tries: 0.5 s, 1 s, 2 s... capped.
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 4.0
_ANSWER_CHARS = 500
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}

Sleep = Callable[[float], Awaitable[None]]


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
) -> Answer:
    """Send ``make()`` (rebuilt per try: signatures carry a timestamp) until one verdict."""
    tries = 0
    while True:
        tries += 1
        out = make()
        status, body = 0, ""
        try:
            resp = await client.post(out.url, content=out.body, headers=dict(out.headers))
            status, body = resp.status_code, resp.text[:_ANSWER_CHARS]
            verdict = judge(fmt, status, body)
            ok, retry, reason = verdict.ok, verdict.retry, verdict.reason
        except httpx.HTTPError as exc:
            ok, retry, reason = False, True, describe_error(exc, timeout, timeout)
        if ok or not retry or tries > retries:
            return Answer(ok, retry, status, reason, body, tries)
        pause = min(BACKOFF_FIRST * 2 ** (tries - 1), BACKOFF_MAX)
        if deadline is not None and time.monotonic() + pause + timeout > deadline:
            return Answer(ok, retry, status, reason + " (out of time for retries)", body, tries)
        await sleep(pause)
