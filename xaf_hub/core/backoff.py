"""How long to wait before the next try: one type for every retry in the hub.

A ``Backoff`` is either a doubling wait (``first``, then twice as long each time, at most
``cap``) or a table of waits (``steps``, the last one repeating). ``delay(n)`` is the wait after
the n-th failure in a row; 0 for none. Used by the client's retries (``fleet.client``), the
follower's reconnects (``fleet.follow``), a webhook's retries and the outbox's
(``notify.send``, ``notify.outbox``), and a pool task's back-off (``store.pool``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Waits in seconds between tries (module docstring)."""

    first: float = 1.0
    cap: float = 30.0
    steps: tuple[float, ...] = ()

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row (the table's last step repeats;
        a doubling wait stops at ``cap``; a runaway count never overflows)."""
        if failures <= 0:
            return 0.0
        if self.steps:
            return self.steps[min(failures, len(self.steps)) - 1]
        return float(min(self.first * 2.0 ** min(failures - 1, 1000), self.cap))


__all__ = ["Backoff"]
