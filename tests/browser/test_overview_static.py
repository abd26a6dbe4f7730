"""The HTML overview in a real headless Chromium, opened from file:// with the network off."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.core.records import InstanceSummary, SessionRecord, Snapshot
from xaf_hub.page import export as report

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
NOW = 1_717_000_000_000  # a fixed "now" in ms; every age on the page is relative to it
MIN = 60_000
XSS_TITLE = "<script>alert(1)</script><img src=x onerror=alert(2)>"
NASTY_DIR = "/srv/shop/\"'><"

# Every browser test: real Chromium through playwright (scripts/setup.sh installs both).
NEEDS_CHROMIUM = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt install chromium)"),
    pytest.mark.skipif(
        importlib.util.find_spec("playwright") is None,
        reason="the playwright Python package is not installed",
    ),
]
pytestmark = NEEDS_CHROMIUM

# (instance, id, title, directory, run_state, outcome)
# fmt: off - one session per line reads as the table it is
ROWS: list[tuple[str, str, str, str, str, str]] = [
    ("alpha", "ses_a1c0de01", "修复登录页面的验证码问题", "/srv/shop/web", "busy", "running"),
    ("alpha", "ses_a1c0de02", "登录接口增加限流", "/srv/shop/api", "retry", "rate_limited"),
    ("alpha", "ses_a1c0de03", "Deploy pipeline for staging", "/srv/shop/ops", "idle", "succeeded"),
    ("alpha", "ses_a1c0de04", XSS_TITLE, NASTY_DIR, "idle", "succeeded"),
    ("alpha", "ses_a1c0de05", "Refactor payment", "/srv/shop/pay", "idle", "failed:APIError"),
    ("alpha", "ses_a1c0de06", "Write release notes", "/srv/shop/docs", "idle", "rate_limited"),
    ("alpha", "ses_a1c0de07", "更新用户手册", "/srv/shop/docs", "idle", "aborted"),
    ("alpha", "ses_a1c0de08", "Fix flaky checkout test", "/srv/shop/web", "idle", "succeeded"),
    ("alpha", "ses_a1c0de09", "Add dark mode toggle", "/srv/shop/web", "idle", ""),
    ("alpha", "ses_a1c0de10", "数据库迁移脚本", "/srv/shop/db", "busy", "running"),
    ("beta", "ses_b2f00d11", "Deploy hotfix to production", "/srv/live/ops", "busy", "running"),
    ("beta", "ses_b2f00d12", "调查登录超时", "/srv/live/web", "idle", "succeeded"),
    ("beta", "ses_b2f00d13", "Rotate API keys", "/srv/live/ops", "idle", "unknown"),
    ("beta", "ses_b2f00d14", "Investigate memory leak", "/srv/live/worker", "idle", "failed:X"),
    ("beta", "ses_b2f00d15", "清理日志文件", "/srv/live/ops", "idle", "succeeded"),
    ("beta", "ses_b2f00d16", "Upgrade Python to 3.12", "/srv/live/api", "idle", "succeeded"),
    ("beta", "ses_b2f00d17", "Translate help pages to 中文", "/srv/live/docs", "idle", "aborted"),
    ("beta", "ses_b2f00d18", "Backfill missing invoices", "/srv/live/billing", "idle", ""),
    ("beta", "ses_b2f00d19", "Audit access logs", "/srv/live/ops", "idle", "succeeded"),
    ("beta", "ses_b2f00d20", "Speed up search index", "/srv/live/search", "idle", "succeeded"),
]
# fmt: on


def _session(index: int, row: tuple[str, str, str, str, str, str]) -> SessionRecord:
    instance, sid, title, directory, state, outcome = row
    retrying = state == "retry"
    return SessionRecord(
        instance=instance,
        id=sid,
        title=title,
        directory=directory,
        created=NOW - (index + 1) * 26 * 60 * MIN,
        updated=NOW - index * 47 * MIN,
        cost=0.37 * index,
        running=state != "idle",
        run_state=state,  # type: ignore[arg-type]  # the table holds valid RunState strings
        retry_message="429 Too Many Requests: please slow down" if retrying else "",
        retry_next=NOW + 12 * MIN if retrying else 0,
        outcome=outcome,
        project=True,
    )


def small_snapshot() -> Snapshot:
    """Three servers (one not answering), twenty project sessions, two outsiders."""
    sessions = [_session(i, row) for i, row in enumerate(ROWS)]
    # Not project sessions: must never appear, even though their title matches "登录".
    sessions += [
        SessionRecord("alpha", "ses_zz000001", "登录 outside", "/home/x/other", updated=NOW),
        SessionRecord("beta", "ses_zz000002", "Deploy elsewhere", "/tmp/else", updated=NOW),
    ]
    return Snapshot(
        generated_at=NOW,
        instances=(
            InstanceSummary("alpha", "http://127.0.0.1:4096", True, limit=3),
            InstanceSummary("beta", "http://127.0.0.1:4097", True, danger=True, note="live shop"),
            InstanceSummary("gamma", "http://127.0.0.1:4098", False, reason="connection refused"),
        ),
        sessions=tuple(sessions),
    )


def big_snapshot(count: int = 3000) -> Snapshot:
    """Six servers sharing ``count`` project sessions."""
    names = [f"server-{n}" for n in range(6)]
    words = ["登录", "deploy", "支付", "report", "测试", "cleanup", "billing", "数据"]
    sessions = tuple(
        SessionRecord(
            instance=names[i % 6],
            id=f"ses_{i:08x}",
            title=f"{words[i % len(words)]} task number {i} 任务",
            directory=f"/srv/proj/module{i % 40}",
            created=NOW - i * MIN * 3,
            updated=NOW - i * MIN,
            run_state="busy" if i % 50 == 0 else "idle",
            running=i % 50 == 0,
            outcome="succeeded",
            project=True,
        )
        for i in range(count)
    )
    return Snapshot(
        generated_at=NOW,
        instances=tuple(
            InstanceSummary(n, f"http://127.0.0.1:{5000 + k}", True) for k, n in enumerate(names)
        ),
        sessions=sessions,
    )


def expected_ids(snap: Snapshot, query: str) -> set[str]:
    """Session ids a filter for ``query`` must leave visible (every term, case-insensitive)."""
    terms = query.lower().split()
    return {
        s.id
        for s in snap.project_sessions()
        if all(t in f"{s.title}\n{s.directory}\n{s.id}".lower() for t in terms)
    }


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield chromium
        finally:
            chromium.close()


class Watched:
    """A page opened offline with every request, dialog and console error recorded."""

    def __init__(self, browser: Any, path: Path, *, width: int = 1280, height: int = 900) -> None:
        self.context = browser.new_context(
            offline=True, viewport={"width": width, "height": height}, locale="zh-CN"
        )
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", self._dialog)
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.path = path
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)

    def _console(self, message: Any) -> None:
        # A CSP violation (a hash that no longer matches its block) is reported here.
        if message.type == "error":
            self.errors.append(message.text)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def visible_ids(self) -> set[str]:
        ids = self.page.eval_on_selector_all(
            "tr[data-k]",
            "rows => rows.filter(r => r.offsetParent !== null)"
            ".map(r => r.querySelector('.session-id').textContent)",
        )
        return set(ids)

    def screenshot(self, name: str) -> None:
        """Save the whole page, every row drawn, under test-artifacts/."""
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / name), full_page=True)

    def text(self, selector: str) -> str:
        return str(self.page.locator(selector).inner_text()).strip()

    def close(self) -> None:
        self.context.close()


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


def test_screenshots_for_people(small_page: Watched, browser: Any) -> None:
    small_page.screenshot("overview.png")
    small_page.page.locator("#filter").fill("登录")
    small_page.screenshot("overview-filtered.png")
    phone = Watched(browser, small_page.path, width=390, height=844)
    try:
        # On a phone the table becomes one card per session; nothing may overflow sideways.
        scroll_width = phone.page.evaluate("document.documentElement.scrollWidth")
        assert scroll_width <= 390
        phone.screenshot("overview-phone.png")
        assert phone.requests == [phone.url]
    finally:
        phone.close()


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
