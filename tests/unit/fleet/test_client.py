"""Client edge cases over httpx.MockTransport: failures become short, secret-free reasons."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from xaf_hub.config.load import InstanceConfig
from xaf_hub.errors import SessionNotFound, UnreachableError
from xaf_hub.fleet.client import OpencodeClient

SECRET = "s3cret-pw"
INST = InstanceConfig(name="lan-x", url="http://127.0.0.1:1", password=SECRET)


def run(
    handler: Callable[[httpx.Request], httpx.Response],
    coro: Callable[[OpencodeClient], Any],
    **kw: Any,
) -> Any:
    async def go() -> Any:
        async with OpencodeClient(INST, transport=httpx.MockTransport(handler), **kw) as c:
            return await coro(c)

    return asyncio.run(go())


def health(req: httpx.Request) -> httpx.Response | None:
    if req.url.path == "/global/health":
        return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
    return None


def sess(i: int, updated: int, directory: str = "/srv/demo") -> dict[str, Any]:
    return {
        "id": f"ses_{i:04d}",
        "title": f"t{i}",
        "directory": directory,
        "time": {"created": 1, "updated": updated},
        "cost": 0.5,
    }


def reason_of(handler: Callable[[httpx.Request], httpx.Response], **kw: Any) -> str:
    with pytest.raises(UnreachableError) as err:
        run(handler, lambda c: c.list_sessions(), **kw)
    assert SECRET not in str(err.value)
    return err.value.reason


def test_basic_auth_is_sent() -> None:
    seen: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req.headers.get("authorization", ""))
        return health(req) or httpx.Response(200, json=[])

    assert run(handler, lambda c: c.list_sessions()) == []
    assert seen and all(h.startswith("Basic ") for h in seen)


def test_401() -> None:
    assert "auth rejected (HTTP 401)" in reason_of(lambda r: httpx.Response(401))


def test_500_is_retried_then_reported() -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.path)
        return httpx.Response(502, text="bad gateway")

    assert reason_of(handler, retries=2) == "server error (HTTP 502)"
    assert len(calls) == 3


def test_4xx_not_retried() -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        return health(req) or httpx.Response(
            404, json={"name": "NotFoundError", "data": {"message": "Session not found"}}
        )

    with pytest.raises(SessionNotFound):
        run(handler, lambda c: c.get_session("ses_1"), retries=3)
    assert len(calls) == 2  # health + one lookup


def test_html_instead_of_json() -> None:
    reason = reason_of(lambda r: httpx.Response(200, html="<!doctype html><html></html>"))
    assert "HTML page instead of JSON" in reason


def test_truncated_json_retried_then_reported() -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        return health(req) or httpx.Response(
            200, content=b'[{"id": "ses_1", "ti', headers={"content-type": "application/json"}
        )

    assert "truncated or invalid JSON" in reason_of(handler, retries=1)
    assert len(calls) == 3


def test_wrong_shape() -> None:
    reason = reason_of(lambda r: health(r) or httpx.Response(200, json={"unexpected": 1}))
    assert "unexpected response shape" in reason


@pytest.mark.parametrize(
    ("exc", "expected", "cause"),
    [
        (httpx.ConnectError("[Errno -2] Name or service not known"), "DNS lookup failed", "dns"),
        (httpx.ConnectError("[Errno 111] Connection refused"), "connection refused", "refused"),
        (httpx.ConnectTimeout("timed out"), "connection timed out after 8s", "timeout"),
        (httpx.ReadTimeout("timed out"), "no answer within 30s", "timeout"),
        (httpx.RemoteProtocolError("peer closed connection"), "truncated response", "dropped"),
        (httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"),
         "could not connect (TLS", "tls"),
    ],
)
def test_network_errors(exc: Exception, expected: str, cause: str) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise exc

    assert expected in reason_of(handler)
    with pytest.raises(UnreachableError) as err:
        run(handler, lambda c: c.list_sessions())
    assert err.value.cause == cause  # what callers act on, whatever the words


@pytest.mark.parametrize(
    ("status", "cause"), [(403, "forbidden"), (502, "server_error"), (200, "html")]
)
def test_an_answer_that_is_not_the_api_says_why_as_a_code(status: int, cause: str) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        page = httpx.Response(status, text="<html></html>", headers={"content-type": "text/html"})
        return health(req) or page

    with pytest.raises(UnreachableError) as err:
        run(handler, lambda c: c.list_sessions())
    assert err.value.cause == cause


def test_paging_uses_explicit_limit_and_keeps_boundary_ties() -> None:
    # 7 sessions, 3 share the boundary millisecond; page size 3.
    data = [
        sess(1, 900),
        sess(2, 800),
        sess(3, 700),
        sess(4, 700),
        sess(5, 700),
        sess(6, 600),
        sess(7, 500),
    ]
    limits = []

    def handler(req: httpx.Request) -> httpx.Response:
        if (r := health(req)) is not None:
            return r
        limits.append(req.url.params["limit"])
        cursor = int(req.url.params.get("cursor", 10**9))
        page = [s for s in data if s["time"]["updated"] < cursor][:3]
        return httpx.Response(200, json=page)

    got = run(handler, lambda c: c.list_sessions(), page_size=3)
    assert sorted(s.id for s in got) == [f"ses_{i:04d}" for i in range(1, 8)]
    assert set(limits) == {"3"}


def test_v2_detection_and_listing() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        p = req.url.path
        if p == "/global/health" or p == "/api/info":
            return httpx.Response(200, html="<html>spa</html>")
        if p == "/api/health":
            return httpx.Response(200, json={"healthy": True})
        if p == "/api/session":
            cur = req.url.params.get("cursor")
            if cur is None:
                return httpx.Response(
                    200,
                    json={
                        "data": [
                            {
                                "id": "ses_a",
                                "title": "A",
                                "location": {"directory": "/srv/demo"},
                                "time": {"created": 1, "updated": 2},
                                "cost": 0,
                            }
                        ],
                        "cursor": {"next": "n1"},
                    },
                )
            return httpx.Response(200, json={"data": [], "cursor": {}})
        if p == "/api/session/active":
            return httpx.Response(200, json={"data": {"ses_a": {"type": "running"}}})
        return httpx.Response(200, html="<html></html>")

    async def go(c: OpencodeClient) -> Any:
        dialect = await c.detect()
        return dialect, await c.list_sessions(), await c.running([])

    dialect, sessions, running = run(handler, go, page_size=1)
    assert dialect == "v2"
    assert [(s.id, s.directory) for s in sessions] == [("ses_a", "/srv/demo")]
    assert running == {"ses_a": {"type": "busy"}}


def test_prompt_body_and_create_query() -> None:
    seen: list[tuple[str, str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        if (r := health(req)) is not None:
            return r
        body = json.loads(req.content) if req.content else None
        seen.append((req.method, str(req.url), body))
        if req.url.path == "/session":
            return httpx.Response(200, json=sess(1, 5, req.url.params["directory"]))
        return httpx.Response(204)

    async def go(c: OpencodeClient) -> Any:
        s = await c.create_session("/srv/demo/a b", "my title")
        await c.prompt_async(s.id, "do it", "fake/fake-model")
        return s

    s = run(handler, go)
    assert s.directory == "/srv/demo/a b"
    create, prompt = seen
    assert create[0] == "POST" and "directory=%2Fsrv%2Fdemo%2Fa+b" in create[1]
    assert create[2] == {"title": "my title"}
    assert prompt[2] == {
        "parts": [{"type": "text", "text": "do it"}],
        "model": {"providerID": "fake", "modelID": "fake-model"},
    }


def test_post_not_retried_after_server_error() -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        if (r := health(req)) is not None:
            return r
        calls.append(req.method)
        return httpx.Response(500)

    with pytest.raises(UnreachableError):
        run(handler, lambda c: c.create_session("/srv/demo", "x"), retries=3)
    assert calls == ["POST"]


def test_malformed_session_id_is_a_usage_error() -> None:
    with pytest.raises(SessionNotFound, match="not a session id"):
        run(lambda r: health(r) or httpx.Response(500), lambda c: c.get_session("bogus"))


def _prompt_failure(fault: Callable[[httpx.Request], httpx.Response]) -> UnreachableError:
    def handler(req: httpx.Request) -> httpx.Response:
        return health(req) or fault(req)

    with pytest.raises(UnreachableError) as err:
        run(handler, lambda c: c.prompt_async("ses_1", "do it", None, "/srv/demo"), retries=2)
    return err.value


def _raise(exc: type[httpx.HTTPError]) -> Callable[[httpx.Request], httpx.Response]:
    def fault(req: httpx.Request) -> httpx.Response:
        raise exc("boom", request=req)

    return fault


@pytest.mark.parametrize(
    ("fault", "maybe"),
    [
        (_raise(httpx.ConnectError), False),  # never reached the server
        (_raise(httpx.ConnectTimeout), False),
        (_raise(httpx.PoolTimeout), False),
        (_raise(httpx.ReadTimeout), True),  # sent; the answer is what got lost
        (_raise(httpx.RemoteProtocolError), True),
        (lambda req: httpx.Response(502), True),  # answered with an error: unknown
    ],
)
def test_a_failed_write_says_whether_it_may_have_arrived(
    fault: Callable[[httpx.Request], httpx.Response], maybe: bool
) -> None:
    assert _prompt_failure(fault).maybe_delivered is maybe


def test_a_failed_read_is_never_maybe_delivered() -> None:
    with pytest.raises(UnreachableError) as err:
        run(lambda req: health(req) or httpx.Response(502), lambda c: c.list_sessions())
    assert err.value.maybe_delivered is False


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (httpx.ReadTimeout("timed out"), "no answer within 30s (timed out); 3 tries, 90s in all"),
        (httpx.ConnectTimeout("slow"), "connection timed out after 8s; 3 tries, 24s in all"),
    ],
)
def test_a_retried_timeout_says_how_long_the_user_waited(exc: Exception, said: str) -> None:
    calls: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.path)
        if req.url.path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        raise exc

    assert reason_of(handler, retries=2) == said
    assert len(calls) == 4, calls  # health once, the listing three times
    calls.clear()
    assert "tries" not in reason_of(handler, retries=0)


def test_a_refused_connection_is_still_retried() -> None:
    calls: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.path)
        raise httpx.ConnectError("[Errno 111] Connection refused")

    assert "connection refused" in reason_of(handler, retries=2)
    assert len(calls) == 3
