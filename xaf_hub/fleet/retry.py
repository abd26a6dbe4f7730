"""Whether a request that failed may still have reached its receiver: the one judgement of
every write the hub sends over HTTP (the opencode client's, a webhook's POST). A write that may
have arrived is never sent again (at most once); one that cannot have may be retried."""

from __future__ import annotations

import httpx

# Nothing left the machine: no connection was made, or none was free.
_BEFORE_SEND = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Failures that can only happen once the request started to leave.
_AFTER_SEND = (httpx.ReadTimeout, httpx.WriteTimeout, httpx.ReadError, httpx.WriteError,
               httpx.RemoteProtocolError)


def maybe_delivered(exc: httpx.HTTPError, leaving: bool | None = None) -> bool:
    """Whether the receiver may have the request that failed with ``exc``. ``leaving``: whether
    it started to leave, when a trace saw that (None: unknown, so any failure not known to come
    before the send counts as maybe)."""
    if isinstance(exc, _BEFORE_SEND):
        return False
    return isinstance(exc, _AFTER_SEND) or leaving is not False
