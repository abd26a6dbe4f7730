"""One back-off for every retry (core/backoff.py), and the waits each user of it keeps."""

from __future__ import annotations

from datetime import timedelta

import pytest

from xaf_hub.core.backoff import Backoff
from xaf_hub.fleet.client import RETRY as CLIENT
from xaf_hub.notify import send
from xaf_hub.notify.outbox import retry_delay
from xaf_hub.store.pool import InfraPolicy, backoff_delay


@pytest.mark.parametrize(("backoff", "waits"), [
    (Backoff(first=1.0, cap=30.0), [0, 1, 2, 4, 8, 16, 30, 30]),
    (Backoff(steps=(1.0, 2.0, 4.0, 8.0, 15.0, 30.0)), [0, 1, 2, 4, 8, 15, 30, 30]),
    (Backoff(first=0.5, cap=4.0), [0, 0.5, 1, 2, 4, 4, 4, 4]),
])
def test_each_failure_waits_longer_up_to_the_cap(backoff: Backoff, waits: list[float]) -> None:
    assert [backoff.delay(n) for n in range(8)] == waits


def test_a_runaway_count_never_overflows() -> None:
    assert Backoff(first=600, cap=86400).delay(10**9) == 86400
    assert backoff_delay(10**9) == timedelta(hours=24)


def test_the_users_keep_their_waits() -> None:
    assert [CLIENT.delay(n) for n in (1, 2, 3, 4)] == [0.2, 0.4, 0.8, 1.0]
    assert [send.RETRY.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1, 2, 4, 4]
    assert [retry_delay(n) for n in (0, 1, 2, 6, 9)] == [10, 10, 20, 300, 300]
    assert [backoff_delay(n) for n in (0, 1, 3)] == [timedelta(0), timedelta(minutes=10),
                                                     timedelta(minutes=40)]
    assert [InfraPolicy().delay(n) for n in (0, 1, 2, 3, 9)] == [
        timedelta(0), timedelta(minutes=5), timedelta(minutes=15), timedelta(hours=1),
        timedelta(hours=1)]
