"""The overview against the real fleet: `sessions --html` from file://, then `serve` over HTTP.

Sessions are created on real opencode servers (hostile title, hostile folder on disk, Chinese
and ASCII titles, one session kept busy by a slow model) next to an instance that does not
answer; the page is checked in headless Chromium, and `serve` runs as a real process.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.browser.served import Served, off_loop
from tests.browser.support import (
    ARTIFACTS,
    NEEDS_CHROMIUM,
    NOW,
    Watched,
    big_snapshot,
    expected_ids,
)
from tests.e2e.proxy import StallProxy
from tests.fleet import NAMES, Hub
from xaf_hub.page import export as report
from xaf_hub.page.serve import VIEWER_PASSWORD_ENV, SnapshotCache, Viewer

pytestmark = [pytest.mark.e2e, *NEEDS_CHROMIUM]

XSS_TITLE = "<script>alert(1)</script><img src=x onerror=alert(2)>"
NASTY_FOLDER = "q\"'><"
DOWN = {"name": "lan-down", "url": "http://127.0.0.1:9"}  # port 9: nothing listens
VIEWER_PASSWORD = "shared viewer secret 共享"



def populate(hub: Hub, outside: Path) -> dict[str, str]:
    """Create idle sessions on the three real servers; return {label: session id}."""
    ids = {
        "xss": hub.session("local-a", XSS_TITLE, directory=hub.project_dir("web", NASTY_FOLDER)),
        "zh-login": hub.session("local-a", "修复登录页面的验证码", "web"),
        "deploy": hub.session("local-a", "Deploy staging pipeline", "ops"),
        "zh-limit": hub.session("lan-b", "登录接口增加限流", "api"),
        "notes": hub.session("lan-b", "Write release notes", "docs"),
        "hotfix": hub.session("lan-c", "deploy hotfix 部署", "ops"),
    }
    # Outside the project root: must never show, though it matches both searches below.
    outside.mkdir(exist_ok=True)
    hub.session("local-a", "登录 deploy outside", directory=outside)
    hub.doc["instances"].append({**DOWN, "roots": [str(hub.root)]})
    hub.write_config()
    return ids


def wait_idle(hub: Hub, name: str, sid: str) -> None:
    sandbox.abort(hub.server(name).url, hub.password(name), sid)
    hub.wait_for(lambda: sid not in off_loop(hub.busy_ids, name), timeout=60)


def visible_titles(page: Any) -> list[str]:
    return list(page.eval_on_selector_all(
        "tr[data-k]",
        "rows => rows.filter(r => r.offsetParent !== null)"
        ".map(r => r.querySelector('.session-title').textContent)",
    ))


def full_screenshot(page: Any, name: str) -> None:
    """Save the whole page under test-artifacts/ (every row is drawn: nothing skips rendering)."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


# --------------------------------------------------------------------------- sessions --html


def test_exported_page_shows_the_real_fleet(hub: Hub, browser: Any, tmp_path: Path) -> None:
    ids = populate(hub, tmp_path / "elsewhere")
    hub.llm.set_mode("slow-model", "slow", delay=180)
    busy = hub.session("lan-c", "Long refactor 长任务", "app")
    hub.prompt("lan-c", busy, "work slowly", "fake/slow-model")
    try:
        hub.wait_for(lambda: busy in off_loop(hub.busy_ids, "lan-c"), timeout=60)
        page_path = tmp_path / "overview.html"
        code, _, err = off_loop(hub.cli, "sessions", "--html", str(page_path))
        assert code == 0, err
        assert "lan-down unreachable" in err
        ids["busy"] = busy
        code, doc = off_loop(hub.cli_json, "sessions")
        assert code == 0
        assert {s["id"] for s in doc["sessions"]} == set(ids.values())
    finally:
        wait_idle(hub, "lan-c", busy)

    watched = Watched(browser, page_path)
    try:
        page = watched.page
        assert watched.text("#card-healthy .figure") == "3 of 4"
        assert watched.text("#card-sessions .value") == "7"
        assert watched.text("#card-running .value") == "1"
        assert "1 working" in watched.text("#card-running .sub")
        assert watched.text("#shown-total") == "7 of 7 shown"
        down = page.locator('section[data-server="lan-down"]').inner_text()
        assert "not answering" in down and "nothing is answering" in down
        busy_row = page.locator("tr[data-k]", has_text="Long refactor 长任务")
        # innerText: every row is rendered, on screen or not.
        assert busy_row.locator(".badge.working").inner_text() == "working"

        # Hostile values are shown as the very text the servers returned.
        titles = page.eval_on_selector_all(".session-title", "es => es.map(e => e.textContent)")
        assert XSS_TITLE in titles
        folders = page.eval_on_selector_all("td.dir", "es => es.map(e => e.textContent)")
        assert str(hub.root / "web" / NASTY_FOLDER) in folders
        assert page.evaluate("document.images.length") == 0
        assert page.evaluate("document.scripts.length") == 1

        all_ids = set(ids.values())
        assert watched.visible_ids() == all_ids
        for query, labels in (
            ("登录", {"zh-login", "zh-limit"}),
            ("deploy", {"deploy", "hotfix"}),
            ("部署", {"hotfix"}),
            (NASTY_FOLDER, {"xss"}),
        ):
            if query.isascii():
                page.locator("#filter").press_sequentially(query)  # keystroke by keystroke
            else:
                page.locator("#filter").fill(query)  # as an input method commits CJK text
            want = {ids[label] for label in labels}
            assert watched.visible_ids() == want, query
            assert watched.text("#shown-total") == f"{len(want)} of 7 shown"
            page.locator("#filter").fill("")
            assert watched.visible_ids() == all_ids
            assert watched.text("#shown-total") == "7 of 7 shown"

        page.locator("#filter").fill("登录")
        watched.screenshot("overview-e2e-filtered.png")
        page.locator("#filter").fill("")
        watched.screenshot("overview-e2e.png")
        assert watched.dialogs == []
        assert watched.errors == []
        assert watched.requests == [watched.url]
    finally:
        watched.close()


# --------------------------------------------------------------------------- serve


@pytest.fixture
def served(hub: Hub) -> Iterator[list[Served]]:
    """Every server a test starts; each is stopped (or killed) at the end."""
    started: list[Served] = []
    yield started
    for s in started:
        s.kill()


def settled_count(seen: list[str], quiet: float = 3.0, limit: float = 60.0) -> int:
    """len(seen) once it has not grown for ``quiet`` seconds."""
    end = time.monotonic() + limit
    last, since = len(seen), time.monotonic()
    while time.monotonic() < end:
        time.sleep(0.2)
        if len(seen) != last:
            last, since = len(seen), time.monotonic()
        elif time.monotonic() - since >= quiet:
            return last
    raise AssertionError(f"still asking lan-b after {limit:g}s: {seen[-5:]}")


def followed(log: str, name: str) -> bool:
    """Whether serve's log says its follower has had its first view of ``name``."""
    pattern = rf" {re.escape(name)}: (following its |.*; polling it$)"
    return re.search(pattern, log, re.M) is not None


def test_serve_shows_the_fleet_and_scans_once_per_window(
    hub: Hub, browser: Any, tmp_path: Path, served: list[Served],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(VIEWER_PASSWORD_ENV, raising=False)
    ids = populate(hub, tmp_path / "elsewhere")
    forwarded: list[str] = []

    def count(method: str, path: str) -> bool:
        forwarded.append(f"{method} {path}")
        return False  # never stall: the proxy only counts what lan-b is asked

    with StallProxy(hub.server("lan-b").url, stall=count) as proxy:
        hub.set_instance("lan-b", url=proxy.url)
        # A window far longer than the test: any second scan would be the cache's fault.
        server = Served(hub, "--cache-seconds", "600")
        served.append(server)
        context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="en-US")
        try:
            page = context.new_page()
            requests: list[str] = []
            dialogs: list[str] = []
            page.on("request", lambda r: requests.append(r.url))

            def on_dialog(dialog: Any) -> None:
                dialogs.append(dialog.message)
                dialog.dismiss()

            page.on("dialog", on_dialog)
            response = page.goto(server.url)
            assert response is not None and response.status == 200
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["cache-control"] == "no-store"
            page.locator("#filter").wait_for()
            assert page.locator("#card-healthy .figure").inner_text().strip() == "3 of 4"
            assert page.locator("#card-sessions .value").inner_text().strip() == "6"
            assert XSS_TITLE in visible_titles(page)
            wanted = sorted(["修复登录页面的验证码", "登录接口增加限流"])
            # The page may refresh itself from a change notice while the filter is typed:
            # type it again into the page as it is now until the rows settle.
            deadline = time.monotonic() + 20
            while True:
                if page.locator("#filter").input_value() != "登录":
                    page.locator("#filter").fill("登录")
                shown = sorted(visible_titles(page))
                if shown == wanted or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert shown == wanted
            assert page.locator("#shown-total").inner_text().strip() == "2 of 6 shown"
            page.locator("#filter").fill("")
            full_screenshot(page, "overview-served.png")
            # The page itself, then only its change notices and its own refreshes (same
            # origin, same language).
            # A locator, not wait_for_function("..."): the page's CSP forbids eval.
            page.locator("#live-status", has_text="Following live.").wait_for(timeout=30_000)
            assert requests[0] == server.url
            assert set(requests[1:]) <= {server.url + "?lang=en", server.url + "api/events"}
            assert dialogs == []
        finally:
            context.close()
        assert forwarded, "the page was served without scanning lan-b"
        # The notices' one follower (shared by every viewer) rescans each instance once
        # when it connects; after that it only listens, so the count settles. Its first view
        # of an instance marks the cached scan stale (a change may have come in between), so
        # the first request after the last of them may scan once more; later ones share it.
        hub.wait_for(lambda: all(followed(server.log(), name) for name in NAMES), timeout=60)
        assert any(f.startswith("GET /global/event") for f in forwarded), forwarded
        snap = server.get("/api/snapshot")
        after_page = settled_count(forwarded)

        assert snap.status_code == 200
        assert snap.headers["content-type"].startswith("application/json")
        # Once followed, the snapshot comes from the follower's memory, not from a scan: every
        # instance that answers (lan-b by polling) is taken live; the one down is scanned.
        assert (snap.json()["source"], snap.json()["live_instances"]) == (
            "mixed", sorted(NAMES))
        health = server.get("/health")
        assert health.json() == {"ok": True, "instances": 4, "reachable": 3}
        again = server.get("/")
        assert again.status_code == 200 and XSS_TITLE.encode() not in again.content
        assert len(forwarded) == after_page, "a request inside the cache window re-scanned"

        # The JSON is `sessions --outcomes --json` for the same fleet, moment aside.
        code, expected = off_loop(hub.cli_json, "sessions", "--outcomes")
        assert code == 0
        served_doc = snap.json()
        assert {s["id"] for s in served_doc["sessions"]} == set(ids.values())
        for doc in (served_doc, expected):
            doc.pop("generated_at")
            doc.pop("live_age_seconds")  # both from serve's follower (the CLI from its board)
        # Moment and live following aside: lan-b sits behind the counting proxy, which cannot
        # stream, so serve follows it by polling and its server line says so; the export,
        # which follows nothing, has no such note.
        served_notes = {i["name"]: i.pop("note") for i in served_doc["instances"]}
        expected_notes = {i["name"]: i.pop("note") for i in expected["instances"]}
        assert "polling it" in served_notes.pop("lan-b") and expected_notes.pop("lan-b") == ""
        assert served_notes == expected_notes
        assert served_doc == expected

        # The counter does see scans: with no cache, each request scans lan-b again.
        uncached = Served(hub, "--cache-seconds", "0")
        served.append(uncached)
        before = len(forwarded)
        assert uncached.get("/health").status_code == 200
        first = len(forwarded)
        assert first > before
        assert uncached.get("/health").status_code == 200
        assert len(forwarded) > first
        assert uncached.stop() == 0

    assert server.stop() == 0
    log = server.log()
    assert "GET / 200" in log and "(scanned, 3 of 4 answering)" in log
    assert "GET /api/snapshot 200" in log and "(cached" in log
    assert log.rstrip().endswith("stopped")
    everything = log + uncached.log()
    assert not any(pw in everything for pw in hub.secrets())


def test_serve_refuses_to_expose_the_fleet_without_a_password(
    hub: Hub, served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VIEWER_PASSWORD_ENV, raising=False)
    for args, needle in (
        (("--host", "0.0.0.0"), "--public"),
        (("--host", "::"), "--public"),
        (("--public",), VIEWER_PASSWORD_ENV),
        (("--public", "--host", "0.0.0.0"), VIEWER_PASSWORD_ENV),
    ):
        proc = hub.popen("serve", "--port", "0", *args)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 4, (args, err)
        assert needle in err and out == ""

    hub.session("local-a", "公开页面 public page", "web")
    server = Served(hub, "--public", extra_env={VIEWER_PASSWORD_ENV: VIEWER_PASSWORD})
    served.append(server)
    for path in ("/", "/api/snapshot", "/health", "/nope"):
        denied = server.get(path)
        assert denied.status_code == 401, path
        assert denied.headers["www-authenticate"].startswith("Basic realm=")
        assert "公开页面" not in denied.text
    assert server.get("/health", auth=("viewer", "not the password")).status_code == 401
    token = base64.b64encode(f"x:{VIEWER_PASSWORD}".encode()).decode()
    ok = server.get("/health", headers={"Authorization": f"Basic {token}"})
    assert ok.status_code == 200 and ok.json() == {"ok": True, "instances": 3, "reachable": 3}
    page = server.get("/", headers={"Authorization": f"Basic {token}"})
    assert page.status_code == 200 and "公开页面 public page" in page.text
    assert server.stop() == 0
    log = server.log()
    assert "401" in log and "GET / 200" in log
    assert VIEWER_PASSWORD not in log and token not in log


# --------------------------------------------------------------------------- figures


def test_three_thousand_sessions_figures(browser: Any, tmp_path: Path) -> None:
    """Measure (never assert) the export and the filter with 3,000 sessions."""
    snap = big_snapshot(3000)
    path = tmp_path / "big.html"
    started = time.perf_counter()
    report.write_html(snap, path, now_ms=NOW, title="big")  # what `sessions --html` does after
    written = time.perf_counter() - started                 # its scan
    viewer = Viewer(SnapshotCache(lambda: snap, 600), title="big", password=None)
    started = time.perf_counter()
    first = viewer.respond("GET", "/", {"Host": "127.0.0.1"}.get)
    served_first = time.perf_counter() - started
    started = time.perf_counter()
    viewer.respond("GET", "/", {"Host": "127.0.0.1"}.get)
    served_again = time.perf_counter() - started
    assert first.status == 200

    watched = Watched(browser, path)
    try:
        timings = {}
        for query in ("登录", "deploy", "module3", "zzz", ""):
            timings[query or "(cleared)"] = watched.page.evaluate(
                """q => {
                    const input = document.getElementById('filter');
                    const t0 = performance.now();
                    input.value = q;
                    input.dispatchEvent(new Event('input'));
                    document.body.getBoundingClientRect();
                    return performance.now() - t0;
                }""",
                query,
            )
            want = len(expected_ids(snap, query))
            assert watched.text("#shown-total") == f"{want} of 3000 shown"
        assert watched.requests == [watched.url]
    finally:
        watched.close()
    lines = [
        f"3000 sessions: sessions --html wrote {path.stat().st_size // 1024} KiB "
        f"in {written * 1000:.0f} ms (after the scan)",
        f"serve: first page {served_first * 1000:.0f} ms (render), "
        f"next within the window {served_again * 1000:.1f} ms",
    ]
    lines += [f"in-browser filter {q!r}: {ms:.1f} ms" for q, ms in timings.items()]
    print("\n".join(lines))
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "overview-e2e-timing.txt").write_text("\n".join(lines) + "\n", "utf-8")
