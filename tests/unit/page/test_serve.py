"""`serve` without sockets: exposure rules, Basic auth, the shared scan cache, routing."""

from __future__ import annotations

import base64
import json
import threading

import pytest

from xaf_hub.core.records import InstanceSummary, SessionRecord, Snapshot
from xaf_hub.errors import UsageError
from xaf_hub.page.serve import (
    SnapshotCache,
    Viewer,
    basic_auth_ok,
    check_exposure,
    host_header_name,
    is_loopback,
    printable,
)
from xaf_hub.page.words import Lang, Line

PASSWORD = "correct horse battery"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("198.51.100.7", False),
        ("128.0.0.1", False),
        ("localhost.evil.example", False),
        ("myhost", False),
        ("", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:7317", "127.0.0.1"),
        ("localhost", "localhost"),
        ("[::1]:7317", "::1"),
        ("[::1]", "::1"),
        ("evil.example:80", "evil.example"),
    ],
)
def test_host_header_name(header: str, name: str) -> None:
    assert host_header_name(header) == name


def test_check_exposure() -> None:
    check_exposure("127.0.0.1", False, None)
    check_exposure("localhost", False, None)
    check_exposure("0.0.0.0", True, PASSWORD)
    check_exposure("127.0.0.1", True, PASSWORD)
    with pytest.raises(UsageError, match="--public"):
        check_exposure("0.0.0.0", False, PASSWORD)  # a password alone does not open the door
    with pytest.raises(UsageError, match="XAF_HUB_VIEWER_PASSWORD"):
        check_exposure("0.0.0.0", True, None)
    with pytest.raises(UsageError, match="too short"):
        check_exposure("0.0.0.0", True, "short")


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (_basic("viewer", PASSWORD), True),
        (_basic("anyone", PASSWORD), True),
        (_basic("用户", PASSWORD), True),
        ("basic " + _basic("v", PASSWORD).split()[1], True),
        (_basic("viewer", PASSWORD + "x"), False),
        (_basic("viewer", ""), False),
        (_basic(PASSWORD, "viewer"), False),
        ("Basic " + base64.b64encode(PASSWORD.encode()).decode(), False),  # no colon
        ("Basic !!!not-base64!!!", False),
        ("Basic " + base64.b64encode(b"v:\xff\xfe").decode(), False),
        ("Bearer " + PASSWORD, False),
        ("", False),
        (None, False),
    ],
)
def test_basic_auth(header: str | None, ok: bool) -> None:
    assert basic_auth_ok(header, PASSWORD) is ok


def test_printable_escapes_control_characters() -> None:
    assert printable("/a\r\nforged line") == "/a??forged line"
    assert printable("x" * 300).endswith("...") and len(printable("x" * 300)) == 203


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _snap(reachable: bool = True) -> Snapshot:
    return Snapshot(
        generated_at=1_717_000_000_000,
        instances=(InstanceSummary("a", "http://127.0.0.1:1", reachable),),
        sessions=(SessionRecord("a", "ses_1", "标题 <b>", "/p/app", project=True),),
    )


def test_cache_reuses_a_scan_within_max_age() -> None:
    clock = Clock()
    cache = SnapshotCache(_snap, 5.0, clock)
    first, scanned = cache.get(clock())
    assert scanned and cache.scans == 1
    clock.t += 4.9
    again, scanned = cache.get(clock())
    assert again is first and not scanned
    clock.t += 0.2
    _, scanned = cache.get(clock())
    assert scanned and cache.scans == 2


def test_requests_waiting_on_a_scan_share_it() -> None:
    # max_age 0: only the "began after I arrived" rule can make requests share a scan.
    clock = Clock()
    entered, release = threading.Event(), threading.Event()

    def slow_scan() -> Snapshot:
        entered.set()
        assert release.wait(10)
        return _snap()

    cache = SnapshotCache(slow_scan, 0.0, clock)
    results: list[bool] = []
    arrived = clock()
    first = threading.Thread(target=lambda: results.append(cache.get(arrived)[1]))
    first.start()
    assert entered.wait(10)
    # Four requests arrive while the scan runs; they queue on the lock.
    waiters = [threading.Thread(target=lambda: results.append(cache.get(arrived)[1]))
               for _ in range(4)]
    for w in waiters:
        w.start()
    clock.t += 1.0
    release.set()
    for t in (first, *waiters):
        t.join(10)
    assert sorted(results) == [False] * 4 + [True]
    assert cache.scans == 1
    # A request that arrives after that scan began does not take it: max_age is 0.
    _, scanned = cache.get(clock() + 0.5)
    assert scanned and cache.scans == 2


def test_failed_scan_is_not_cached() -> None:
    clock = Clock()
    calls: list[int] = []

    def flaky() -> Snapshot:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return _snap()

    cache = SnapshotCache(flaky, 60.0, clock)
    with pytest.raises(RuntimeError):
        cache.get(clock())
    assert cache.get(clock())[1] and len(calls) == 2


def _viewer(password: str | None = None, reachable: bool = True) -> tuple[Viewer, SnapshotCache]:
    clock = Clock()
    cache = SnapshotCache(lambda: _snap(reachable), 5.0, clock)
    return Viewer(cache, title="T", password=password, clock=clock), cache


def _headers(**values: str) -> dict[str, str]:
    return {k.replace("_", "-").title(): v for k, v in values.items()}


def test_routes_and_headers() -> None:
    viewer, cache = _viewer()
    h = _headers(host="127.0.0.1:7317")
    page = viewer.respond("GET", "/?x=1", h.get)
    assert page.status == 200 and page.content_type.startswith("text/html")
    assert "标题 &lt;b&gt;" in page.body.decode("utf-8")
    headers = dict(page.all_headers())
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Cache-Control"] == "no-store"
    assert headers["Content-Length"] == str(len(page.body))
    snap = viewer.respond("GET", "/api/snapshot", h.get)
    doc = json.loads(snap.body)
    assert doc["sessions"][0]["title"] == "标题 <b>"
    assert "default-src 'none'" in dict(snap.all_headers())["Content-Security-Policy"]
    health = viewer.respond("GET", "/health", h.get)
    assert json.loads(health.body) == {"ok": True, "instances": 1, "reachable": 1}
    assert cache.scans == 1
    assert viewer.respond("GET", "/nope", h.get).status == 404
    assert viewer.respond("POST", "/", h.get).status == 405
    assert viewer.respond("DELETE", "/api/snapshot", h.get).status == 405
    assert cache.scans == 1


def test_page_carries_the_autopilot_panel_built_once_per_scan() -> None:
    from xaf_hub.page.autopilot import AutopilotView

    clock = Clock()
    cache = SnapshotCache(_snap, 5.0, clock)
    asked: list[tuple[int, str]] = []

    def panel(now_ms: int, lang: Lang, snap: Snapshot) -> AutopilotView:
        asked.append((now_ms, lang))
        return AutopilotView(state="paused", headline=Line(f"Paused <by> li ({lang})."))

    viewer = Viewer(cache, title="T", password=None, clock=clock, autopilot=panel)
    h = _headers(host="localhost")
    first = viewer.respond("GET", "/", h.get).body.decode("utf-8")
    assert 'id="autopilot"' in first and "Paused &lt;by&gt; li (en)." in first
    assert viewer.respond("GET", "/", h.get).body.decode("utf-8") == first  # cached scan
    assert asked == [(_snap().generated_at, "en")]
    # Each language is rendered once per scan too.
    zh = _headers(host="localhost", accept_language="zh-CN,zh;q=0.9")
    assert "Paused &lt;by&gt; li (zh)." in viewer.respond("GET", "/", zh.get).body.decode()
    viewer.respond("GET", "/", zh.get)
    assert asked == [(_snap().generated_at, "en"), (_snap().generated_at, "zh")]


@pytest.mark.parametrize(
    ("setting", "accept", "query", "lang"),
    [
        ("auto", "zh-CN,zh;q=0.9,en;q=0.8", "", "zh"),
        ("auto", "en-US,en;q=0.9", "", "en"),
        ("auto", "fr-FR,zh-TW;q=0.5,en;q=0.4", "", "zh"),
        ("auto", "fr-FR", "", "en"),
        ("auto", "", "", "en"),
        ("en", "zh-CN", "", "en"),
        ("zh", "en-US", "", "zh"),
        ("auto", "zh-CN", "lang=en", "en"),
        ("en", "en-US", "lang=zh", "zh"),
        ("auto", "en-US", "lang=xx", "en"),
    ],
)
def test_page_language(setting: str, accept: str, query: str, lang: str) -> None:
    clock = Clock()
    viewer = Viewer(SnapshotCache(_snap, 5.0, clock), title="T", password=None, clock=clock,
                    language=setting)
    h = _headers(host="localhost", accept_language=accept)
    page = viewer.respond("GET", "/?" + query, h.get)
    html = page.body.decode("utf-8")
    want = "zh-CN" if lang == "zh" else "en"
    assert f'<html lang="{want}">' in html
    assert dict(page.all_headers())["Content-Language"] == want
    assert ("查找" in html) == (lang == "zh")
    assert ('data-live-seconds="10"' in html)  # a served page refreshes itself
    # and may fetch from its own origin, nothing else
    assert "connect-src 'self'" in html


def test_links_only_for_instances_with_the_web_app_and_never_loopback_for_others() -> None:
    from xaf_hub.fleet.web_ui import WebUI

    clock = Clock()
    seen: list[list[str]] = []

    def links(names: list[str]) -> dict[str, WebUI]:
        seen.append(names)
        return {"a": WebUI("http://127.0.0.1:4096", loopback=True)}

    local = Viewer(SnapshotCache(_snap, 5.0, clock), title="T", password=None, clock=clock,
                   links=links)
    html = local.respond("GET", "/", _headers(host="127.0.0.1:7317").get).body.decode()
    assert 'href="http://127.0.0.1:4096/' in html and "/session/" in html
    assert seen == [["a"]]
    public = Viewer(SnapshotCache(_snap, 5.0, clock), title="T", password=PASSWORD,
                    clock=clock, links=links)
    auth = _headers(host="hub.lan:7317", authorization=_basic("v", PASSWORD))
    html = public.respond("GET", "/", auth.get).body.decode()
    assert "/session/" not in html  # 127.0.0.1 would be the reader's own computer


def test_the_page_says_how_the_processes_stand_with_their_config_in_its_language() -> None:
    from xaf_hub.config.watch import ConfigState
    from xaf_hub.page.serve import config_notes

    clock = Clock()
    serve = ConfigState(1_800_000_000_000, "config.json: invalid JSON at line 3 column 5")
    daemon = ConfigState(1_800_000_000_000, "", ("lock.backend",))
    states = [("config.serve", serve), ("config.patrol", daemon)]
    viewer = Viewer(SnapshotCache(_snap, 5.0, clock), title="T", password=None, clock=clock,
                    notes=lambda lang: config_notes(states, lang))
    html = viewer.respond("GET", "/?lang=en", _headers(host="localhost").get).body.decode()
    assert "serve (this page&#39;s server) keeps the config it loaded at " in html
    assert "(config.json: invalid JSON at line 3 column 5)" in html
    assert "the patrol daemon needs a restart to use the new lock.backend" in html
    zh = viewer.respond("GET", "/?lang=zh", _headers(host="localhost").get).body.decode()
    assert "本页的服务（serve）仍在使用" in zh
    assert "巡检守护进程需要重启才能使用新的 lock.backend" in zh
    assert config_notes([("config.serve", ConfigState(0))], "zh") == []


def test_health_is_503_when_nothing_answers() -> None:
    viewer, _ = _viewer(reachable=False)
    health = viewer.respond("GET", "/health", _headers(host="localhost").get)
    assert health.status == 503
    assert json.loads(health.body) == {"ok": False, "instances": 1, "reachable": 0}


def test_loopback_viewer_refuses_foreign_host_names() -> None:
    viewer, cache = _viewer()
    for host in ("evil.example", "evil.example:7317", "198.51.100.7:7317"):
        assert viewer.respond("GET", "/", _headers(host=host).get).status == 403
    assert cache.scans == 0
    for host in ("127.0.0.1:7317", "localhost:7317", "[::1]:7317"):
        assert viewer.respond("GET", "/health", _headers(host=host).get).status == 200


def test_public_viewer_requires_the_password_on_every_route() -> None:
    viewer, cache = _viewer(password=PASSWORD)
    for path in ("/", "/api/snapshot", "/health", "/nope"):
        for auth in ({}, _headers(authorization=_basic("v", "wrong password!"))):
            r = viewer.respond("GET", path, {**auth, "Host": "example.lan"}.get)
            assert r.status == 401
            assert dict(r.all_headers())["WWW-Authenticate"].startswith("Basic realm=")
            assert PASSWORD.encode() not in r.body
    assert cache.scans == 0
    ok = viewer.respond("GET", "/health", _headers(authorization=_basic("v", PASSWORD)).get)
    assert ok.status == 200 and cache.scans == 1
