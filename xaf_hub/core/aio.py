"""Run a coroutine to completion from synchronous code."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
X = TypeVar("X")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, but the result never sits in the main task.

    On Python 3.11, ``asyncio.run`` formats its main task with ``%r`` twice on the way out
    (``signal.getsignal`` builds an error message from the SIGINT handler, which holds the
    task), and a finished task's repr includes its result: a whole fleet snapshot formatted
    for nothing (docs/performance.md). The wrapper keeps the result out of the task.
    """
    box: list[T] = []

    async def main() -> None:
        box.append(await coro)

    job = main()
    try:
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            runner.run(job)
    except BaseException:
        job.close()  # never started (a Ctrl+C before the loop ran it): no "never awaited"
        coro.close()
        raise
    return box[0]


def _new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop, made with SIGINT held back (POSIX main thread).

    A Ctrl+C that lands while the loop is being built leaves half an object whose ``__del__``
    prints "Exception ignored ... AttributeError: _signal_handlers" and a traceback on the
    way out (seen under load in the e2e test that interrupts `watch` at random moments).
    Held back, it arrives once the loop is whole: the usual KeyboardInterrupt.
    """

    if sys.platform == "win32" or threading.current_thread() is not threading.main_thread():
        return asyncio.new_event_loop()
    loop = None
    try:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            loop = asyncio.new_event_loop()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a held Ctrl+C raises here
        return loop
    except BaseException:
        if loop is not None:
            loop.close()
        raise


async def gather(*aws: Awaitable[T]) -> list[T]:
    """``asyncio.gather``, except that a failure ends the others before it is raised.

    ``asyncio.gather`` raises the first error at once and leaves the other awaitables
    running: their requests go on after the caller has moved on, closed its client and ended
    its loop, and their sockets are never closed. Here the others are cancelled (once) and
    waited for first, so nothing outlives the call; the first error is raised as is (not as
    an ExceptionGroup), so callers keep their ``except`` clauses. When the caller itself is
    cancelled, ``asyncio.gather`` has already cancelled them all and waited for them.
    """
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except asyncio.CancelledError:
        raise
    except BaseException:
        await cancel_and_wait(*tasks)
        raise


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` that are still running and wait until they have ended.

    Their own errors and cancellations are swallowed; a cancellation of the caller is not
    (``contextlib.suppress(CancelledError)`` around ``await task`` would swallow both, and a
    task cancelled twice, e.g. on Ctrl+C during its clean-up, would then carry on).
    """
    for task in tasks:
        if not task.done():
            task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


async def bounded(limit: int, fn: Callable[[X], Awaitable[T]], items: Iterable[X]) -> list[T]:
    """``fn`` of each item, in their order, at most ``limit`` at once (as ``gather``: a failure
    ends the others before it is raised)."""
    sem = asyncio.Semaphore(limit)

    async def one(item: X) -> T:
        async with sem:
            return await fn(item)

    return await gather(*(one(item) for item in items))
