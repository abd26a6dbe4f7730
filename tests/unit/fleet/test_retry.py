"""One judgement of whether a failed write may have reached its receiver (fleet.retry)."""

from __future__ import annotations

import httpx
import pytest

from xaf_hub.fleet.retry import maybe_delivered


@pytest.mark.parametrize("exc", [httpx.ConnectError("refused"), httpx.ConnectTimeout("t"),
                                 httpx.PoolTimeout("t")])
def test_nothing_left_the_machine_so_nothing_arrived(exc: httpx.HTTPError) -> None:
    assert not maybe_delivered(exc) and not maybe_delivered(exc, leaving=True)


@pytest.mark.parametrize("exc", [httpx.ReadTimeout("t"), httpx.WriteError("w"),
                                 httpx.RemoteProtocolError("closed")])
def test_a_failure_after_the_send_may_have_arrived(exc: httpx.HTTPError) -> None:
    assert maybe_delivered(exc) and maybe_delivered(exc, leaving=False)


def test_any_other_failure_is_judged_by_whether_the_request_started_to_leave() -> None:
    other = httpx.ProxyError("proxy said no")
    assert maybe_delivered(other, leaving=True) and not maybe_delivered(other, leaving=False)
    assert maybe_delivered(other)  # unknown: at most once
