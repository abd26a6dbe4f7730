"""The HTML overview in a real headless Chromium, opened from file:// with the network off."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.browser import support
from tests.browser.support import (  # noqa: F401 - the old import path
    ARTIFACTS,
    CHROMIUM,
    MIN,
    NASTY_DIR,
    NEEDS_CHROMIUM,
    NOW,
    ROWS,
    XSS_TITLE,
    Watched,
    _session,
    big_snapshot,
    expected_ids,
    small_snapshot,
)
from xaf_hub.page import export as report

pytestmark = NEEDS_CHROMIUM

# The fixture lives in tests/browser/support.py (tests/browser/conftest.py offers it to every
# module); this name keeps the old import path working.
browser = support.browser


@pytest.fixture()
def small_page(browser: Any, tmp_path: Path) -> Iterator[Watched]:
    path = tmp_path / "overview.html"
    report.write_html(small_snapshot(), path, now_ms=NOW, title="Shop 商店")
    watched = Watched(browser, path)
    try:
        yield watched
    finally:
        watched.close()


def test_cards_show_the_fleet_figures(small_page: Watched) -> None:
    page = small_page.page
    assert small_page.text("#card-healthy .figure") == "2 of 3"
    assert small_page.text("#card-sessions .value") == "20"
    assert small_page.text("#card-running .value") == "4"
    assert "3 working, 1 waiting to retry" in small_page.text("#card-running .sub")
    bars = page.locator("#card-spread .bars li")
    assert bars.count() == 2  # the server that did not answer has no bar
    assert "10 · 3 running" in bars.nth(0).inner_text()
    assert "10 · 1 running" in bars.nth(1).inner_text()
    assert small_page.text("#shown-total") == "20 of 20 shown"
    # The sealed page's own style applied: the header is dark, the body light.
    header_bg = page.eval_on_selector("header.top", "e => getComputedStyle(e).backgroundColor")
    body_bg = page.eval_on_selector("body", "e => getComputedStyle(e).backgroundColor")
    assert header_bg == "rgb(22, 32, 44)"
    assert body_bg == "rgb(243, 245, 248)"


def test_unreachable_server_explained_in_plain_words(small_page: Watched) -> None:
    page = small_page.page
    # Summarised at the top, with the reason, before any figure...
    top = page.locator("#down-summary").inner_text()
    assert "1 of 3 servers did not answer:" in top
    assert "gamma: nothing is answering at the server's address" in top
    summary, cards = page.locator("#down-summary"), page.locator(".cards")
    assert summary.bounding_box()["y"] < cards.bounding_box()["y"]
    # ...and in its own section, the technical detail one tap away.
    gamma = page.locator('section[data-server="gamma"]')
    text = gamma.inner_text()
    assert "not answering" in text
    assert "nothing is answering at the server's address" in text
    assert "connection refused" not in text
    gamma.locator("details.reason summary").click()
    assert "connection refused" in gamma.inner_text()


def test_hostile_values_render_as_text(small_page: Watched) -> None:
    page = small_page.page
    titles = page.eval_on_selector_all(".session-title", "els => els.map(e => e.textContent)")
    assert XSS_TITLE in titles
    dirs = page.eval_on_selector_all("td.dir", "els => els.map(e => e.textContent)")
    assert NASTY_DIR in dirs
    assert page.evaluate("document.images.length") == 0
    assert page.evaluate("document.scripts.length") == 1
    assert small_page.dialogs == []
    assert small_page.errors == []
    assert small_page.requests == [small_page.url]


@pytest.mark.parametrize(
    ("query", "count"),
    [
        ("登录", 3),  # Chinese fragment, two servers
        ("deploy", 2),  # ASCII, case-insensitive against "Deploy"
        ("DEPLOY staging", 1),  # every word must match
        ("live/ops", 4),  # folder
        ("a1c0de07", 1),  # session id
        ("<script>", 1),  # the hostile title is searchable text
        ("中文", 1),
        ("no such thing", 0),
    ],
)
def test_filter_leaves_exactly_the_matching_rows(
    small_page: Watched, query: str, count: int
) -> None:
    page = small_page.page
    snap = small_snapshot()
    want = expected_ids(snap, query)
    assert len(want) == count  # guards the table itself
    if query.isascii():
        page.locator("#filter").press_sequentially(query)  # keystroke by keystroke
    else:
        page.locator("#filter").fill(query)  # as an input method commits CJK text
    assert small_page.visible_ids() == want
    assert small_page.text("#shown-total") == f"{count} of 20 shown"
    for name in ("alpha", "beta"):
        section = page.locator(f'section[data-server="{name}"]')
        in_server = {s for s in want if s.startswith("ses_a" if name == "alpha" else "ses_b")}
        assert section.is_visible() == bool(in_server)
        if in_server:
            assert section.locator(".shown").inner_text() == f"{len(in_server)} of 10 shown"
    assert not page.locator('section[data-server="gamma"]').is_visible()
    assert page.locator("#no-match").is_visible() == (count == 0)

    page.locator("#filter").fill("")
    assert len(small_page.visible_ids()) == 20
    assert small_page.text("#shown-total") == "20 of 20 shown"
    assert page.locator('section[data-server="gamma"]').is_visible()
    assert small_page.dialogs == []
    assert small_page.errors == []
    assert small_page.requests == [small_page.url]


def test_escape_clears_the_filter(small_page: Watched) -> None:
    page = small_page.page
    page.locator("#filter").fill("deploy")
    assert small_page.text("#shown-total") == "2 of 20 shown"
    page.locator("#filter").press("Escape")
    assert small_page.text("#shown-total") == "20 of 20 shown"


def test_the_project_filter_leaves_one_projects_rows(browser: Any, tmp_path: Path) -> None:
    snap = small_snapshot()
    owner = {"ses_a1c0de01": "shop", "ses_a1c0de02": "shop", "ses_b2f00d11": "blog"}
    snap = replace(snap, sessions=tuple(
        replace(s, owner=owner.get(s.id, "")) for s in snap.sessions))
    path = tmp_path / "overview.html"
    report.write_html(snap, path, now_ms=NOW, title="shop, blog", projects=("shop", "blog"))
    watched = Watched(browser, path)
    try:
        page = watched.page
        assert "shop" in watched.text("#projects") and "blog" in watched.text("#projects")
        page.locator("#project-filter").select_option("shop")
        assert watched.visible_ids() == {"ses_a1c0de01", "ses_a1c0de02"}
        assert watched.text("#shown-total") == "2 of 20 shown"
        assert not page.locator('section[data-server="beta"]').is_visible()
        page.locator("#filter").fill("限流")  # the words filter narrows the project's rows
        assert watched.visible_ids() == {"ses_a1c0de02"}
        page.locator("#filter").fill("")
        page.locator('#projects [data-pick=""]').click()  # the sessions of no project
        others = {s.id for s in snap.project_sessions()} - set(owner)
        assert watched.visible_ids() == others
        page.locator("#project-filter").select_option("*")
        assert len(watched.visible_ids()) == 20
        assert watched.errors == [] and watched.dialogs == []
    finally:
        watched.close()


def test_screenshots_for_people(small_page: Watched, browser: Any, tmp_path: Path) -> None:
    small_page.screenshot("overview.png")
    small_page.page.locator("#filter").fill("登录")
    small_page.screenshot("overview-filtered.png")
    chinese = tmp_path / "overview-zh.html"
    report.write_html(small_snapshot(), chinese, now_ms=NOW, title="Shop 商店", lang="zh")
    for path, name in ((small_page.path, "overview"), (chinese, "overview-zh")):
        for width, suffix in ((1366, "wide"), (390, "phone")):
            seen = Watched(browser, path, width=width, height=844)
            try:
                # On a phone the table becomes one card per session; nothing may overflow
                # sideways, in either language.
                scroll_width = seen.page.evaluate("document.documentElement.scrollWidth")
                assert scroll_width <= width
                seen.screenshot(f"{name}-{suffix}.png")
                assert seen.requests == [seen.url]
            finally:
                seen.close()


def test_three_thousand_rows_filter_quickly(browser: Any, tmp_path: Path) -> None:
    snap = big_snapshot()
    path = tmp_path / "big.html"
    started = time.perf_counter()
    report.write_html(snap, path, now_ms=NOW, title="big")
    written = time.perf_counter() - started
    watched = Watched(browser, path)
    try:
        page = watched.page
        assert watched.text("#shown-total") == "3000 of 3000 shown"
        timings = {}
        for query in ("登录", "deploy task number 1", "module3", "zzz", ""):
            # Time the input handler plus the layout it causes, as a keystroke would.
            timings[query or "(cleared)"] = page.evaluate(
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
        assert watched.errors == []
        assert watched.requests == [watched.url]
    finally:
        watched.close()
    lines = [f"3000 sessions: wrote {path.stat().st_size // 1024} KiB in {written * 1000:.0f} ms"]
    lines += [f"filter {q!r}: {ms:.1f} ms" for q, ms in timings.items()]
    print("\n".join(lines))
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "overview-timing.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
