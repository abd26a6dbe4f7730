"""A hostile or broken server's answers, over httpx.MockTransport: caps, deadlines, parsing.

Each case is one instance's scan: it must end (within the deadline), be reported with a
one-line reason (or skip one entry with a warning), never raise, and leave no non-finite
number or absurd time behind for the exports.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.clock import fmt_time
from xaf_hub.core.records import InstanceSummary, Snapshot, sane_ms
from xaf_hub.core.rules import ProjectRules
from xaf_hub.core.text import dumps
from xaf_hub.fleet.client import OpencodeClient
from xaf_hub.fleet.scan import InstanceScan, scan_instance
from xaf_hub.page.export import csv_text, local_time
from xaf_hub.page.export import snapshot_document as document
from xaf_hub.page.words import ago, local_time_with_zone

SECRET = "s3cret-pw"
INST = InstanceConfig(
    name="evil",
    url="http://127.0.0.1:1",
    password=SECRET,
    rules=ProjectRules(roots=("/srv/demo",)),
)
NOW = 1_780_000_000_000


def health(req: httpx.Request) -> httpx.Response | None:
    if req.url.path == "/global/health":
        return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
    return None


def scan(handler: Callable[[httpx.Request], httpx.Response], **kw: Any) -> InstanceScan:
    async def go() -> InstanceScan:
        transport = httpx.MockTransport(handler)
        async with OpencodeClient(INST, transport=transport, retries=0, **kw) as client:
            return await scan_instance(client, INST)

    return asyncio.run(go())


def listing(
    sessions: list[Any], status: dict[str, Any] | None = None
) -> Callable[[httpx.Request], httpx.Response]:
    def handler(req: httpx.Request) -> httpx.Response:
        if (h := health(req)) is not None:
            return h
        # json.dumps writes NaN / Infinity as a hostile server may (httpx would refuse).
        if req.url.path == "/experimental/session":
            return httpx.Response(200, content=json.dumps(sessions).encode())
        if req.url.path == "/session/status":
            return httpx.Response(200, content=json.dumps(status or {}).encode())
        return httpx.Response(404)

    return handler


def sess(ident: Any = "ses_1", **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": ident,
        "title": "work",
        "directory": "/srv/demo/app",
        "time": {"created": NOW - 5000, "updated": NOW},
        "cost": 0.25,
    }
    doc.update(fields)
    return doc


def raw(text: str) -> Callable[[httpx.Request], httpx.Response]:
    """Answer the listing with ``text`` verbatim (JSON Python would not write itself)."""

    def handler(req: httpx.Request) -> httpx.Response:
        if (h := health(req)) is not None:
            return h
        if req.url.path == "/experimental/session":
            return httpx.Response(200, content=text.encode(), headers={"content-type": "json"})
        return httpx.Response(200, json={})

    return handler


# --------------------------------------------------------------------------- fields


@pytest.mark.parametrize(
    ("updated", "expected"),
    [(1e400, 0), (10**22, 0), (-5, 0), ("soon", 0), (None, 0), (True, 0), ([1], 0), (NOW, NOW)],
)
def test_absurd_times_read_as_unknown(updated: Any, expected: int) -> None:
    result = scan(listing([sess(time={"created": updated, "updated": updated})]))
    assert result.reachable, result.reason
    (rec,) = result.sessions
    assert rec.updated == expected and rec.created == expected


def test_infinite_time_and_nan_cost_written_raw_by_the_server() -> None:
    body = (
        '[{"id": "ses_1", "title": "t", "directory": "/srv/demo/x", '
        '"time": {"created": 1e400, "updated": -Infinity}, "cost": NaN},'
        ' {"id": "ses_2", "title": "t", "directory": "/srv/demo/x", "cost": Infinity,'
        ' "time": {"updated": 100000000000000000000000000000}}]'
    )
    result = scan(raw(body))
    assert result.reachable, result.reason
    # An absurd cost is unknown (None, "null" in JSON), never a silent 0 (issue 26).
    assert [(s.created, s.updated, s.cost) for s in result.sessions] == [(0, 0, None)] * 2
    snap = Snapshot(NOW, (result.summary(),), tuple(result.sessions))
    text = dumps(document(snap))
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert "unknown" in local_time_with_zone(result.sessions[0].updated)


@pytest.mark.parametrize(
    "entry",
    [
        sess(title={"a": 1}, directory=["x"], time="yesterday", cost="free", model=7),
        sess(parentID=12, time={"created": "12", "updated": {"x": 1}}),
        sess(directory=None, title=None),
    ],
)
def test_wrong_field_types_never_raise(entry: dict[str, Any]) -> None:
    result = scan(listing([entry]))
    assert result.reachable, result.reason
    assert len(result.sessions) == 1


def test_entries_without_a_usable_id_are_skipped_with_a_warning() -> None:
    entries = [sess("ses_ok"), sess(None), sess(12), "not an object", [1, 2], sess("")]
    result = scan(listing(entries))
    assert result.reachable, result.reason
    assert [s.id for s in result.sessions] == ["ses_ok"]
    assert result.warnings == [
        "evil: skipped 5 entries of /experimental/session without a usable session id"
    ]


@pytest.mark.parametrize(
    "status",
    [
        {"type": "retry", "attempt": 1, "message": "rate limited", "next": "soon"},
        {"type": "retry", "message": {"x": 1}, "next": 1e400},
        {"type": "retry", "next": 10**22},
        {"type": ["busy"], "next": None},
    ],
)
def test_malformed_run_state_never_raises(status: dict[str, Any]) -> None:
    result = scan(listing([sess()], {"ses_1": status}))
    assert result.reachable, result.reason
    (rec,) = result.sessions
    assert rec.retry_next == 0
    assert isinstance(rec.retry_message, str)


def test_deeply_nested_or_huge_number_json_is_one_reason() -> None:
    for body in ("[" * 100_000 + "]" * 100_000, "[" + "9" * 10_000 + "]"):
        result = scan(raw(body))
        assert not result.reachable
        assert "\n" not in result.reason and result.reason


def test_v2_cursor_of_the_wrong_type() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/api/session":
            doc = {"data": [sess()], "cursor": "next-please"}
            return httpx.Response(200, json=doc)
        return httpx.Response(200, json={"data": {}})

    async def go() -> list[Any]:
        transport = httpx.MockTransport(handler)
        async with OpencodeClient(replace(INST, api="v2"), transport=transport) as client:
            return await client.list_sessions()

    assert [s.id for s in asyncio.run(go())] == ["ses_1"]


def test_sane_ms_and_time_words() -> None:
    assert sane_ms("1700000000000") == 1_700_000_000_000
    assert sane_ms(float("nan")) == 0 and sane_ms(10**400) == 0
    for render in (fmt_time, local_time):
        assert render(10**22) in ("-", "")
    assert ago("en", 10**22, NOW) == "unknown"
    assert local_time_with_zone(-1) == "unknown"


# --------------------------------------------------------------------------- caps


def endless(req: httpx.Request) -> httpx.Response:
    """Every page is full of ids never seen before."""
    if (h := health(req)) is not None:
        return h
    if req.url.path == "/experimental/session":
        limit = int(req.url.params["limit"])
        start = _ISSUED[0]
        _ISSUED[0] += limit
        return httpx.Response(200, json=[sess(f"ses_{start + i}") for i in range(limit)])
    return httpx.Response(200, json={})


_ISSUED = [0]  # ids handed out so far, across pages


def test_endless_pagination_stops_at_the_page_cap() -> None:
    result = scan(endless, page_size=5, max_pages=20)
    assert not result.reachable and result.sessions == []
    assert result.reason == (
        "more than 20 pages of sessions (stopped reading; endless pagination?)"
    )


def test_endless_pagination_stops_at_the_session_cap() -> None:
    result = scan(endless, page_size=100, max_sessions=450)
    assert not result.reachable
    assert "more than 450 sessions listed" in result.reason


def test_body_over_the_cap_is_not_read_whole() -> None:
    served: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        yield b'[{"id": "ses_1", "title": "'
        for _ in range(10_000):
            served.append(1)
            yield b"x" * 1024
        yield b'"}]'

    def handler(req: httpx.Request) -> httpx.Response:
        if (h := health(req)) is not None:
            return h
        return httpx.Response(200, content=chunks())  # no content-length: read to the cap

    result = scan(handler, max_body_bytes=64 * 1024)
    assert not result.reachable
    assert result.reason == "answer larger than 0 MB (stopped reading; not an opencode server?)"
    assert len(served) < 100  # stopped at the cap, not at the end of the 10 MB

    def declared(req: httpx.Request) -> httpx.Response:
        if (h := health(req)) is not None:
            return h
        return httpx.Response(200, content=b"[]", headers={"content-length": str(10**9)})

    assert "answer larger than" in scan(declared, max_body_bytes=2**20).reason


def test_slow_body_hits_the_deadline() -> None:
    async def dribble() -> AsyncIterator[bytes]:
        yield b"["
        while True:  # one byte every 50 ms, never done: no read timeout ever fires
            await asyncio.sleep(0.05)
            yield b" "

    def handler(req: httpx.Request) -> httpx.Response:
        if (h := health(req)) is not None:
            return h
        return httpx.Response(200, content=dribble())

    result = scan(handler, deadline=0.5)
    assert not result.reachable
    assert "timed out" in result.reason and "\n" not in result.reason


# --------------------------------------------------------------------------- secrets


def test_echoed_authorization_never_reaches_the_reason() -> None:
    token = base64.b64encode(f"opencode:{SECRET}".encode()).decode()

    def echo(req: httpx.Request) -> httpx.Response:
        if (h := health(req)) is not None:
            return h
        header = req.headers["authorization"]
        assert header == f"Basic {token}"
        return httpx.Response(400, text=f"bad request; you sent Authorization: {header} {SECRET}")

    result = scan(echo)
    assert not result.reachable
    assert token not in result.reason and SECRET not in result.reason
    assert "Authorization: Basic ***" in result.reason


def test_csv_formula_cells_are_neutralised() -> None:
    titles = ["=HYPERLINK(\"http://x\",\"y\")", "@SUM(1)", "+1+1", "-2+3", "\tx", "\rx", "ok"]
    sessions = [sess(f"ses_{i}", title=t) for i, t in enumerate(titles)]
    result = scan(listing(sessions))
    snap = Snapshot(NOW, (InstanceSummary("evil", "u", True),), tuple(result.sessions))
    import csv
    import io

    rows = list(csv.reader(io.StringIO(csv_text(snap)[1:], newline="")))[1:]
    shown = {r[1]: r[7] for r in rows}
    for i, title in enumerate(titles):
        expected = title if title == "ok" else "'" + title
        assert shown[f"ses_{i}"] == expected



def test_a_secret_at_the_cut_of_a_long_error_is_not_half_shown() -> None:
    def echo(req: httpx.Request) -> httpx.Response:
        if (h := health(req)) is not None:
            return h
        # The message is cut to 300 characters; the password straddles the cut.
        return httpx.Response(400, json={"message": "x" * 296 + " " + SECRET + " tail"})

    reason = scan(echo).reason
    # Cut first, then redacted, the reason would end in "s3c" (half the password).
    assert reason.endswith(" ***") and SECRET[:3] not in reason, reason


def test_half_a_surrogate_pair_becomes_one_replacement_character() -> None:
    from xaf_hub.fleet.events import parse_frame
    from xaf_hub.fleet.wire import server_json

    # Escaped (JSON.stringify writes a lone one so), in a text or a key, at any depth.
    raw = json.dumps({"t": "a\ud800b", "\udfff": [1, {"k": "\ud83d"}], "ok": "\U0001f600"})
    got = server_json(raw.encode())
    assert got == {"t": "a\ufffdb", "\ufffd": [1, {"k": "\ufffd"}], "ok": "\U0001f600"}
    assert server_json(raw) == got  # a frame's text as an answer's bytes
    # Written as bytes (json.loads takes ED A0 80 whatever UTF-8 says).
    assert server_json(b'["x\xed\xa0\x80y"]') == ["x\ufffdy"]
    # A whole pair written as escapes is one character, and nothing else changes.
    assert server_json(b'"\\ud83d\\ude00"') == "\U0001f600"
    plain = {"a": [1, 2.5, None, True, "\u00e9"]}
    assert server_json(json.dumps(plain).encode()) == plain
    # Deep, walked without recursion of ours (the parser's own limit is about 900 here).
    deep = b"[" * 800 + b'"\\ud800"' + b"]" * 800
    inner = server_json(deep)
    for _ in range(800):
        inner = inner[0]
    assert inner == "\ufffd"
    # A status frame of the live board reads the same way.
    frame = parse_frame("data: " + json.dumps(
        {"type": "session.updated", "properties": {"info": {"id": "ses_1", "title": "x\ud800"}}}
    ))  # fmt: skip
    assert frame is not None and "\ud800" not in repr(frame)
