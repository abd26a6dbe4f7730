"""What the browser tests share: headless Chromium (the `browser` fixture, one per module), a
page opened offline with every request, dialog and error recorded, the snapshots they draw, and
the marks that skip them where Chromium or playwright is missing."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.core.records import InstanceSummary, SessionRecord, Snapshot

CHROMIUM = Path("/usr/bin/chromium")


ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


NOW = 1_717_000_000_000  # a fixed "now" in ms; every age on the page is relative to it


MIN = 60_000


XSS_TITLE = "<script>alert(1)</script><img src=x onerror=alert(2)>"


NASTY_DIR = "/srv/shop/\"'><"


# Every browser test: real Chromium through playwright (scripts/setup.sh --test installs both).
NEEDS_CHROMIUM = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt install chromium)"),
    pytest.mark.skipif(
        importlib.util.find_spec("playwright") is None,
        reason="the playwright Python package is not installed",
    ),
]


# (instance, id, title, directory, run_state, outcome)
# fmt: off - one session per line reads as the table it is
ROWS: list[tuple[str, str, str, str, str, str]] = [
    ("alpha", "ses_a1c0de01", "修复登录页面的验证码问题", "/srv/shop/web", "busy", "running"),
    ("alpha", "ses_a1c0de02", "登录接口增加限流", "/srv/shop/api", "retry", "rate_limited"),
    ("alpha", "ses_a1c0de03", "Deploy pipeline for staging", "/srv/shop/ops", "idle", "succeeded"),
    ("alpha", "ses_a1c0de04", XSS_TITLE, NASTY_DIR, "idle", "succeeded"),
    ("alpha", "ses_a1c0de05", "Refactor payment", "/srv/shop/pay", "idle", "failed"),
    ("alpha", "ses_a1c0de06", "Write release notes", "/srv/shop/docs", "idle", "rate_limited"),
    ("alpha", "ses_a1c0de07", "更新用户手册", "/srv/shop/docs", "idle", "interrupted"),
    ("alpha", "ses_a1c0de08", "Fix flaky checkout test", "/srv/shop/web", "idle", "succeeded"),
    ("alpha", "ses_a1c0de09", "Add dark mode toggle", "/srv/shop/web", "idle", ""),
    ("alpha", "ses_a1c0de10", "数据库迁移脚本", "/srv/shop/db", "busy", "running"),
    ("beta", "ses_b2f00d11", "Deploy hotfix to production", "/srv/live/ops", "busy", "running"),
    ("beta", "ses_b2f00d12", "调查登录超时", "/srv/live/web", "idle", "succeeded"),
    ("beta", "ses_b2f00d13", "Rotate API keys", "/srv/live/ops", "idle", "not_started"),
    ("beta", "ses_b2f00d14", "Investigate memory leak", "/srv/live/worker", "idle", "failed"),
    ("beta", "ses_b2f00d15", "清理日志文件", "/srv/live/ops", "idle", "succeeded"),
    ("beta", "ses_b2f00d16", "Upgrade Python to 3.12", "/srv/live/api", "idle", "succeeded"),
    ("beta", "ses_b2f00d17", "Translate help pages to 中文", "/srv/live/docs", "idle", "denied"),
    ("beta", "ses_b2f00d18", "Backfill missing invoices", "/srv/live/billing", "idle", ""),
    ("beta", "ses_b2f00d19", "Audit access logs", "/srv/live/ops", "idle", "ceiling"),
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
            InstanceSummary("gamma", "http://127.0.0.1:4098", False, reason="connection refused",
                           cause="refused"),
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
