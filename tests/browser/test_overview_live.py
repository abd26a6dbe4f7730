"""The overview a colleague trusts at a glance, against real opencode servers in real Chromium.

Their language (zh-CN / en-US browsers under `serve`), a served page that updates itself
without losing the filter, full-page screenshots with every row drawn (desktop and phone), the
work queue agreeing with the session badges after a patrol round, and links that open a
session in opencode's own web app.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.browser import support
from tests.browser.served import Served, off_loop
from tests.browser.support import ARTIFACTS, NEEDS_CHROMIUM
from tests.fleet import NAMES, Hub
from xaf_hub.core.catalogue import TEXT
from xaf_hub.page.serve import VIEWER_PASSWORD_ENV

pytestmark = [pytest.mark.e2e, *NEEDS_CHROMIUM]

_CJK = re.compile(r"[\u4e00-\u9fff]")
# Labels that are the page's own words (not data), in both languages.
FIXED = ("cards.healthy", "cards.sessions", "cards.running", "filter.label", "help.summary",
         "col.title", "col.status", "col.result", "ap.title")


@pytest.fixture
def served(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Served]]:
    monkeypatch.delenv(VIEWER_PASSWORD_ENV, raising=False)
    started: list[Served] = []
    yield started
    for s in started:
        s.kill()


def following(page: Any, timeout_ms: float = 30_000) -> None:
    """Wait until the page says it follows the hub's change notices. A locator, not
    ``wait_for_function("...")``: the page's CSP forbids eval, and Playwright evaluates a string
    predicate with eval once it has to poll (the test failed whenever the first look was early).
    """
    page.locator("#live-status", has_text="Following live.").wait_for(timeout=timeout_ms)


def fixed_text(page: Any) -> str:
    """The page's own words: everything but the session rows and server names (data)."""
    return str(page.evaluate(
        """() => {
            const doc = document.body.cloneNode(true);
            doc.querySelectorAll('tbody, h2, .bars .name, #page-data, script, style')
               .forEach(e => e.remove());
            return doc.innerText;
        }"""
    ))


# --------------------------------------------------------------------------- language


@pytest.mark.parametrize("locale", ["zh-CN", "en-US"])
def test_served_page_speaks_the_browsers_language(
    hub: Hub, browser: Any, served: list[Served], locale: str
) -> None:
    hub.session("local-a", "修复登录页面的验证码", "web")
    hub.session("lan-b", "Write release notes", "docs")
    server = Served(hub)
    served.append(server)
    context = browser.new_context(viewport={"width": 1366, "height": 900}, locale=locale)
    try:
        page = context.new_page()
        page.goto(server.url)
        page.locator("#filter").wait_for()
        lang = page.evaluate("document.documentElement.lang")
        zh = locale.startswith("zh")
        assert lang.startswith("zh") if zh else lang == "en"
        fixed = fixed_text(page)
        for key in FIXED:
            en_words, zh_words = TEXT[key]
            assert (zh_words if zh else en_words) in fixed, key
            assert (en_words if zh else zh_words) not in fixed, key
        if zh:
            # No English word of the page's own leaks through (names, numbers, times aside).
            # ("opencode": the user name a server's links ask for, a name from the config)
            leaks = set(re.findall(r"[A-Za-z]{3,}", fixed)) - {"UTC", "xaf", "hub", "patrol",
                                                                 "resume", "local", "lan",
                                                                 "opencode"}
            assert leaks == set(), leaks
            assert "刚刚" in page.locator("time.ago").first.inner_text() or _CJK.search(
                page.locator("time.ago").first.inner_text()
            )
        else:
            assert not _CJK.search(fixed)
        page.screenshot(path=str(ARTIFACTS / f"overview-served-{locale}.png"), full_page=True)
    finally:
        context.close()


def test_static_page_language_from_config_and_flag(hub: Hub, browser: Any, tmp_path: Path) -> None:
    hub.session("local-a", "Deploy staging pipeline", "ops")
    english = tmp_path / "en.html"
    code, _, err = off_loop(hub.cli, "sessions", "--html", str(english))
    assert code == 0, err
    assert '<html lang="en">' in english.read_text("utf-8")  # auto: nobody's browser to ask
    hub.write_config(page={"language": "zh"})
    chinese = tmp_path / "zh.html"
    code, _, err = off_loop(hub.cli, "sessions", "--html", str(chinese))
    assert code == 0, err
    flag = tmp_path / "flag.html"
    code, _, err = off_loop(hub.cli, "sessions", "--html", str(flag), "--lang", "en")
    assert code == 0, err
    assert '<html lang="en">' in flag.read_text("utf-8")
    watched = support.Watched(browser, chinese)
    try:
        assert watched.page.evaluate("document.documentElement.lang") == "zh-CN"
        assert "应答的服务器" in fixed_text(watched.page)
        assert watched.errors == [] and watched.requests == [watched.url]
    finally:
        watched.close()
    hub.write_config(page={"language": "klingon"})
    code, _, err = off_loop(hub.cli, "sessions", "--html", str(tmp_path / "x.html"))
    assert code == 4 and "page.language" in err


# --------------------------------------------------------------------------- live


def test_served_page_updates_itself_and_keeps_the_filter(
    hub: Hub, browser: Any, served: list[Served]
) -> None:
    hub.session("local-a", "登录页样式 older", "web")
    hub.session("lan-b", "Unrelated work", "docs")
    server = Served(hub, "--cache-seconds", "2")
    served.append(server)
    context = browser.new_context(viewport={"width": 1366, "height": 700}, locale="en-US")
    try:
        page = context.new_page()
        page.goto(server.url)
        page.locator("#filter").fill("登录")
        assert page.locator("#shown-total").inner_text() == "1 of 2 shown"
        page.locator("details.help summary").click()  # the reader opened the glossary
        page.evaluate("window.scrollTo(0, 200)")
        scrolled = page.evaluate("window.scrollY")
        following(page)  # the page listens to the hub's change notices

        created = time.monotonic()
        hub.session("lan-c", "登录 new after the page opened", "web")
        row = page.locator("tr[data-k]", has_text="登录 new after the page opened")
        row.wait_for(state="visible", timeout=20_000)  # no reload: the page fetched itself
        seen_after = time.monotonic() - created
        assert page.locator("#filter").input_value() == "登录"
        assert page.locator("#shown-total").inner_text() == "2 of 3 shown"
        assert not page.locator("tr[data-k]", has_text="Unrelated work").is_visible()
        assert page.locator("details.help").evaluate("d => d.open") is True
        assert page.evaluate("window.scrollY") == scrolled
        assert re.fullmatch(r"Following live\. Updated (just now|\d+ s ago)\.",
                            page.locator("#live-status").inner_text())
        print(f"new session shown {seen_after:.1f} s after it was created")

        # The hub itself goes away: the page says so and keeps what it has.
        assert server.stop() == 0
        page.locator("#live-status.bad").wait_for(timeout=30_000)
        assert "cannot reach the hub" in page.locator("#live-status").inner_text()
        assert row.is_visible()
    finally:
        context.close()


def test_served_page_follows_change_notices_not_its_timer(
    hub: Hub, browser: Any, served: list[Served]
) -> None:
    # Its timer is 10 minutes and a scan is reused for a minute: only a change notice (which
    # also marks the cached scan stale) can bring a start or a new session onto the page.
    hub.llm.set_mode("slow-model", "slow", delay=45)  # running for longer than any wait below
    sid = hub.session("lan-b", "Migrate the billing tables", "svc")
    server = Served(hub, "--refresh-seconds", "600", "--cache-seconds", "60")
    served.append(server)
    context = browser.new_context(viewport={"width": 1366, "height": 700}, locale="en-US")
    try:
        page = context.new_page()
        page.goto(server.url)
        following(page)
        row = page.locator("tr[data-k]", has_text="Migrate the billing tables")
        assert row.locator(".badge.working").count() == 0
        assert "at least every 600 seconds" in page.locator(".snapline").inner_text()

        sent = time.monotonic()
        hub.prompt("lan-b", sid, "go", "fake/slow-model")
        row.locator(".badge.working").wait_for(timeout=40_000)
        started_after = time.monotonic() - sent

        created = time.monotonic()
        hub.session("local-a", "Rotate the signing keys", "ops")
        page.locator("tr[data-k]", has_text="Rotate the signing keys").wait_for(timeout=30_000)
        new_after = time.monotonic() - created
        print(f"start shown {started_after:.1f} s after the prompt, "
              f"a new session {new_after:.1f} s after it was created")
    finally:
        context.close()
        sandbox.abort(hub.server("lan-b").url, hub.password("lan-b"), sid)  # not left running


def test_a_change_before_the_hubs_follower_starts_still_reaches_the_page(
    hub: Hub, browser: Any, served: list[Served]
) -> None:
    # `serve` starts following the fleet when the first page asks for notices, after that
    # page's scan. A run that starts in between shows only in the follower's first view of
    # its instance, which must count as a change (it once did not: the page then waited for
    # its timer, here 10 minutes). The page's notices are held back until the run is busy.
    hub.llm.set_mode("slow-model", "slow", delay=45)
    sid = hub.session("lan-b", "Index the audit trail", "svc")
    server = Served(hub, "--refresh-seconds", "600", "--cache-seconds", "300")
    served.append(server)
    context = browser.new_context(viewport={"width": 1366, "height": 700}, locale="en-US")
    try:
        page = context.new_page()
        page.route("**/api/events", lambda route: route.abort())  # a network error: it retries
        page.goto(server.url)
        row = page.locator("tr[data-k]", has_text="Index the audit trail")
        row.wait_for()
        assert row.locator(".badge.working").count() == 0

        hub.prompt("lan-b", sid, "go", "fake/slow-model")
        hub.wait_for(lambda: sid in off_loop(hub.busy_ids, "lan-b"))
        page.unroute("**/api/events")
        page.locator("#live-status", has_text="Following live.").wait_for(timeout=30_000)
        row.locator(".badge.working").wait_for(timeout=30_000)
    finally:
        context.close()
        sandbox.abort(hub.server("lan-b").url, hub.password("lan-b"), sid)


def test_static_page_times_move_with_the_clock(browser: Any, tmp_path: Path) -> None:
    from xaf_hub.page import export as report

    path = tmp_path / "overview.html"
    report.write_html(support.small_snapshot(), path, now_ms=support.NOW, title="Shop")
    context = browser.new_context(offline=True, locale="en-US")
    try:
        page = context.new_page()
        page.clock.install(time=support.NOW / 1000 + 30)
        page.goto(path.as_uri())
        first = page.locator("time.ago").all_inner_texts()
        assert first[0] == "just now"  # the snapshot line
        assert "47 minutes ago" in first and "1 hour ago" in first
        page.clock.fast_forward("15:00")
        later = page.locator("time.ago").all_inner_texts()
        assert later[0] == "15 minutes ago"
        assert later != first
        changed = sum(a != b for a, b in zip(first, later, strict=True))
        assert changed >= 5, (first, later)  # minutes move; "3 hours ago" may stay
    finally:
        context.close()


# --------------------------------------------------------------------------- screenshots


def ink_per_row(browser: Any, png: bytes, rects: list[dict[str, float]]) -> list[int]:
    """Dark pixels inside each rectangle of a screenshot, counted in a blank page's canvas."""
    context = browser.new_context(offline=True)
    try:
        page = context.new_page()
        src = "data:image/png;base64," + base64.b64encode(png).decode()
        return list(page.evaluate(
            """async ([src, rects]) => {
                const img = new Image();
                img.src = src;
                await img.decode();
                const c = document.createElement('canvas');
                c.width = img.width; c.height = img.height;
                const g = c.getContext('2d');
                g.drawImage(img, 0, 0);
                return rects.map(r => {
                    const d = g.getImageData(Math.floor(r.x), Math.floor(r.y),
                                             Math.max(1, Math.ceil(r.w)),
                                             Math.max(1, Math.ceil(r.h))).data;
                    let ink = 0;
                    for (let i = 0; i < d.length; i += 4) {
                        if (d[i] < 120 && d[i + 1] < 120 && d[i + 2] < 120) { ink++; }
                    }
                    return ink;
                });
            }""",
            [src, rects],
        ))
    finally:
        context.close()


def test_full_page_screenshots_draw_every_row(
    hub: Hub, browser: Any, tmp_path: Path
) -> None:
    ids = {
        hub.session(NAMES[i % 3], f"任务 {i:02d} task number {i}", f"mod{i % 7}")
        for i in range(60)
    }
    path = tmp_path / "overview.html"
    code, _, err = off_loop(hub.cli, "sessions", "--html", str(path))
    assert code == 0, err
    for width in (1366, 390):
        watched = support.Watched(browser, path, width=width, height=800)
        try:
            page = watched.page
            assert watched.visible_ids() == ids
            # No row skips rendering (content-visibility) anywhere on the page.
            hidden = page.eval_on_selector_all(
                "tr[data-k]",
                "rows => rows.filter(r => !r.checkVisibility({contentVisibilityAuto: true}))"
                ".length",
            )
            assert hidden == 0
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            rects = page.eval_on_selector_all(
                "tr[data-k] .session-title",
                """els => els.map(e => {
                    const r = e.getBoundingClientRect();
                    return {x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height};
                })""",
            )
            assert len(rects) == 60
            # The viewport stays at 800 px: what a reader's full-page capture would get.
            png = page.screenshot(full_page=True)
            (ARTIFACTS / f"overview-60-{width}.png").write_bytes(png)
            ink = ink_per_row(browser, png, rects)
            blank = [i for i, n in enumerate(ink) if n < 20]
            assert blank == [], f"rows drawn blank at {width} px: {blank} (ink {ink})"
        finally:
            watched.close()


# --------------------------------------------------------------------------- vocabulary


def test_after_a_patrol_round_the_queue_agrees_with_the_badges(
    hub: Hub, browser: Any, tmp_path: Path
) -> None:
    hub.doc["instances"] = [i for i in hub.doc["instances"] if i["name"] != "lan-c"]
    # A pool row is judged once it is older than this (and its session finished).
    hub.write_config(patrol={"just_dispatched_seconds": 0})
    for tid, title in (
        ("T-20261201-a1b2", "给登录页加验证码"),
        ("T-20261201-c3d4", "Add health check"),
    ):
        code, _, err = off_loop(hub.cli, "backlog", "add", "--title", title, "--id", tid)
        assert code == 0, err
    code, _, err = off_loop(hub.cli, "patrol", "--once", "--no-design")
    assert code == 0, err
    home = Path(hub.env["XAF_HUB_HOME"])
    pool = json.loads((home / "tasks_backlog.json").read_text("utf-8"))["tasks"]
    assert {t["status"] for t in pool} == {"dispatched"}
    # The fake model answers at once: both sessions finish before the next round, which
    # settles them: without project.repository "finished, not verified", never green.
    def answered() -> bool:
        code, doc = off_loop(hub.cli_json, "sessions", "--outcomes")
        return code == 0 and [s["outcome"] for s in doc["sessions"]] == ["succeeded"] * 2

    def settled() -> Any:  # a round settles each finished run (a busy machine: the next)
        code, _, err = off_loop(hub.cli, "patrol", "--once", "--no-design")
        assert code == 0, err
        code, listed = off_loop(hub.cli_json, "backlog", "list")
        return code == 0 and all(t["status"] == "done" for t in listed["tasks"]) and listed

    hub.wait_for(answered, timeout=90, step=0.5)
    listed = hub.wait_for(settled, timeout=90, step=1.0)
    path = tmp_path / "overview.html"
    code, _, err = off_loop(hub.cli, "sessions", "--html", str(path))
    assert code == 0, err
    watched = support.Watched(browser, path)
    try:
        page = watched.page
        queue = {
            li.get_attribute("data-kind"): int(li.locator("b").inner_text())
            for li in page.locator("#queue li").all()
        }
        assert queue == {"unverified": 2} == dict(Counter(t["state"] for t in listed["tasks"]))
        task_rows = page.locator("tr[data-k]", has=page.locator(".chip.task"))
        assert task_rows.count() == 2
        # The runs succeeded (green); the tasks are not verified (not green).
        assert task_rows.filter(has=page.locator(".badge.ok")).count() == 2
        done = page.locator("#done li")
        assert done.count() == 2 and done.locator(".badge.ok").count() == 0
        assert done.locator(".badge.warn").all_inner_texts() == ["finished, not verified"] * 2
        # Task ids are chips, not part of the title.
        chips = sorted(task_rows.locator(".chip.task").all_inner_texts())
        assert chips == ["T-20261201-a1b2", "T-20261201-c3d4"]
        titles = sorted(task_rows.locator(".session-title").all_inner_texts())
        assert titles == ["Add health check", "给登录页加验证码"]
        # No daemon runs: the autopilot is "off", with when it last ran.
        assert page.locator("#autopilot .panel-head .badge").inner_text() == "off"
        headline = page.locator("#autopilot .headline").inner_text()
        assert "not running in the background" in headline
        assert re.search(r"(just now|\d+ minutes? ago)", headline)
        # Not "as planned" above lines for a person: it says what is left for one.
        assert "as planned" not in headline and "left for a person" in headline
        watched.screenshot("overview-after-patrol.png")
    finally:
        watched.close()


# --------------------------------------------------------------------------- links


def test_each_session_links_to_opencodes_own_page(
    hub: Hub, browser: Any, served: list[Served]
) -> None:
    sid = hub.session("lan-b", "打开我 open me", "web")
    server = Served(hub)
    served.append(server)
    context = browser.new_context(viewport={"width": 1366, "height": 900}, locale="en-US")
    try:
        page = context.new_page()
        page.goto(server.url)
        link = page.locator("tr[data-k]", has_text="打开我 open me").locator("a.open")
        href = link.get_attribute("href")
        assert href is not None
        base = hub.server("lan-b").url.rstrip("/")
        folder = base64.urlsafe_b64encode(str(hub.root / "web").encode()).decode().rstrip("=")
        assert href == f"{base}/{folder}/session/{sid}"
        assert link.get_attribute("target") == "_blank"
        assert "noreferrer" in (link.get_attribute("rel") or "")
        html = page.content()
        assert not any(pw in html for pw in hub.secrets())
        assert "@" not in href
        # The page says what the link needs: the server's login, its user name named.
        note = page.locator("section[data-server='lan-b'] .login-note")
        assert note.is_visible()
        assert "the user name “opencode” and the server's password" in note.inner_text()
    finally:
        context.close()
    # The link works for someone who has the server's login: opencode shows the session.
    login = {"username": "opencode", "password": hub.password("lan-b")}
    app = browser.new_context(viewport={"width": 1280, "height": 800}, http_credentials=login)
    try:
        page = app.new_page()
        page.goto(href)
        page.get_by_text("打开我 open me").first.wait_for(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "opencode-session-from-link.png"))
    finally:
        app.close()
