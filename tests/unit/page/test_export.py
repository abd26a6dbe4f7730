"""Exports: the JSON document, the CSV sheet and the static HTML overview."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markupsafe import escape

from xaf_hub import __version__
from xaf_hub.core.catalogue import TEXT
from xaf_hub.core.records import InstanceSummary, SessionRecord, Snapshot
from xaf_hub.errors import ExitCode, UsageError
from xaf_hub.page import export as report
from xaf_hub.page import view as page_view
from xaf_hub.page import words as page_text
from xaf_hub.page.words import ago

NOW = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC
MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR
XSS_TITLE = "<script>alert(1)</script><img src=x onerror=alert(2)>"
NASTY_DIR = "/srv/demo/\"'><"
URL_TITLE = "read https://example.com/a?b=1&c=2 and http://evil.test/x.js"
# Every element the overview may contain; anything else would be injected markup.
ALLOWED_TAGS = """html head meta link title style body header div h1 h2 p main section span ul li
    svg rect details summary dl dt dd label input table thead tbody tr th td strong script i
    time a"""
CSV_TITLES = [
    "plain",
    "comma, separated, title",
    'she said "hi", then left',
    "line one\nline two\r\nline three",
    "修复登录页面的验证码问题，并且补充测试",
    "=1+2 looks like a formula",
    " leading and trailing spaces ",
    "",
]


@pytest.fixture()
def tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Let a test pick the local time zone; the process zone is restored afterwards."""
    if not hasattr(time, "tzset"):
        pytest.skip("time.tzset is POSIX-only")

    def use(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()

    yield use
    monkeypatch.undo()
    time.tzset()


def session(
    sid: str,
    *,
    instance: str = "alpha",
    title: str = "task",
    directory: str = "/srv/demo/app",
    updated: int = NOW,
    project: bool = True,
    **extra: Any,
) -> SessionRecord:
    return SessionRecord(
        instance=instance,
        id=sid,
        title=title,
        directory=directory,
        created=updated - HOUR,
        updated=updated,
        project=project,
        **extra,
    )


def fleet() -> Snapshot:
    """Two answering servers, one not; hostile values; one non-project session."""
    return Snapshot(
        generated_at=NOW,
        instances=(
            InstanceSummary("alpha", "http://127.0.0.1:4096", True, total_sessions=4),
            InstanceSummary("beta", "http://127.0.0.1:4097", True, danger=True),
            InstanceSummary(
                "gamma", "https://gamma.example:443", False, reason="timed out", cause="timeout"
            ),
        ),
        sessions=(
            session("ses_old", updated=NOW - 3 * DAY, cost=1.25),
            session("ses_xss", title=XSS_TITLE, directory=NASTY_DIR, updated=NOW - 5 * MIN),
            session(
                "ses_busy",
                instance="beta",
                title="登录接口",
                run_state="busy",
                running=True,
                updated=NOW - HOUR,
            ),
            session(
                "ses_retry",
                instance="beta",
                title=URL_TITLE,
                run_state="retry",
                running=True,
                retry_message="429 <b>slow down</b>",
                retry_next=NOW + 10 * MIN,
                outcome="rate_limited",
                updated=NOW - 2 * HOUR,
            ),
            session("ses_other", title="not ours", directory="/home/x", project=False),
        ),
        warnings=("alpha: <listed> 200 of 250 sessions",),
    )


class PageParser(HTMLParser):
    """Collect every tag, attribute and inline block of a page as the browser would see it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.blocks: dict[str, list[str]] = {"style": [], "script": []}
        self.titles: list[str] = []
        self.notes: list[str] = []
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        self.tags.append((tag, attributes))
        if tag in self.blocks:
            self._open = tag
            self.blocks[tag].append("")
        elif attributes.get("class") == "badge-note":
            self._open = "note"
            self.notes.append("")
        elif attributes.get("class") == "session-title":
            self._open = "title"
            self.titles.append("")

    def handle_endtag(self, tag: str) -> None:
        self._open = None

    def handle_data(self, data: str) -> None:
        if self._open == "title":
            self.titles[-1] += data
        elif self._open == "note":
            self.notes[-1] += data
        elif self._open in self.blocks:
            self.blocks[self._open][-1] += data


def parse(html: str) -> PageParser:
    parser = PageParser()
    parser.feed(html)
    parser.close()
    return parser


# --------------------------------------------------------------------------- time words


@pytest.mark.parametrize(
    ("then", "words"),
    [
        (0, "unknown"),
        (-5, "unknown"),
        (NOW, "just now"),
        (NOW - 59_000, "just now"),
        (NOW + 30_000, "just now"),
        (NOW - MIN, "1 minute ago"),
        (NOW - 5 * MIN, "5 minutes ago"),
        (NOW - 59 * MIN, "59 minutes ago"),
        (NOW - HOUR, "1 hour ago"),
        (NOW - 3 * HOUR - 59 * MIN, "3 hours ago"),
        (NOW - 23 * HOUR, "23 hours ago"),
        (NOW - DAY, "1 day ago"),
        (NOW - 2 * DAY, "2 days ago"),
        (NOW - 59 * DAY, "59 days ago"),
        (NOW - 60 * DAY, "2 months ago"),
        (NOW - 400 * DAY, "1 year ago"),
        (NOW - 800 * DAY, "2 years ago"),
        (NOW + 5 * MIN, "in 5 minutes"),
        (NOW + 2 * DAY, "in 2 days"),
    ],
)
def test_ago_in_english(then: int, words: str) -> None:
    assert ago("en", then, NOW) == words


@pytest.mark.parametrize(
    ("zone", "plain", "with_zone"),
    [
        ("UTC", "2023-11-14 22:13:20", "2023-11-14 22:13:20 UTC+00:00"),
        ("Asia/Shanghai", "2023-11-15 06:13:20", "2023-11-15 06:13:20 UTC+08:00"),
        ("America/New_York", "2023-11-14 17:13:20", "2023-11-14 17:13:20 UTC-05:00"),
        ("Asia/Kolkata", "2023-11-15 03:43:20", "2023-11-15 03:43:20 UTC+05:30"),
    ],
)
def test_local_times(tz: Any, zone: str, plain: str, with_zone: str) -> None:
    tz(zone)
    assert report.local_time(NOW) == plain
    assert page_text.local_time_with_zone(NOW) == with_zone
    assert report.local_time(0) == ""
    assert page_text.local_time_with_zone(0) == "unknown"


# --------------------------------------------------------------------------- JSON


def test_json_document_shape() -> None:
    doc = report.snapshot_document(fleet())
    assert list(doc) == [
        "generated_at", "xaf_hub_version", "by_instance", "unreachable", "instances", "sessions",
        "source", "live_age_seconds", "live_instances",
    ]
    assert (doc["source"], doc["live_age_seconds"], doc["live_instances"]) == ("scan", None, [])
    assert doc["xaf_hub_version"] == __version__
    assert doc["generated_at"] == "2023-11-14T22:13:20Z"
    assert doc["by_instance"] == {
        "alpha": {"project_sessions": 2, "running": 0},
        "beta": {"project_sessions": 2, "running": 2},
        "gamma": {"project_sessions": 0, "running": 0},
    }
    assert doc["unreachable"] == [{"instance": "gamma", "reason": "timed out"}]
    assert [i["name"] for i in doc["instances"]] == ["alpha", "beta", "gamma"]
    assert doc["instances"][1]["danger"] is True
    # Project sessions only, newest first, in the record's export form.
    assert [s["id"] for s in doc["sessions"]] == ["ses_xss", "ses_busy", "ses_retry", "ses_old"]
    assert doc["sessions"][0] == fleet().sessions[1].to_json()
    assert doc["sessions"][0]["project"] is None  # its project's name (none here), not the flag


def test_write_json_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "out" / "sessions.json"
    report.export(fleet(), path)
    assert json.loads(path.read_text(encoding="utf-8")) == report.snapshot_document(fleet())
    assert [p.name for p in path.parent.iterdir()] == ["sessions.json"]  # no temp file left


# --------------------------------------------------------------------------- CSV


def read_csv(path: Path) -> list[list[str]]:
    with path.open(encoding="utf-8-sig", newline="") as handle:
        return list(csv.reader(handle))


def test_csv_has_bom_and_exact_columns(tmp_path: Path, tz: Any) -> None:
    tz("Asia/Shanghai")
    path = tmp_path / "sessions.csv"
    report.export(fleet(), path)
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    rows = read_csv(path)
    assert rows[0] == [
        "instance",
        "session id",
        "directory",
        "run state",
        "updated",
        "created",
        "outcome",
        "title",
        "cost",
    ]
    assert [r[1] for r in rows[1:]] == ["ses_xss", "ses_busy", "ses_retry", "ses_old"]
    assert rows[4] == [
        "alpha",
        "ses_old",
        "/srv/demo/app",
        "idle",
        "2023-11-12 06:13:20",
        "2023-11-12 05:13:20",
        "",
        "task",
        "1.25",
    ]
    assert rows[3][3:7] == ["retry", "2023-11-15 04:13:20", "2023-11-15 03:13:20", "rate_limited"]


def test_csv_unknown_times_are_blank(tmp_path: Path) -> None:
    snap = Snapshot(
        NOW, (InstanceSummary("a", "u", True),), (SessionRecord("a", "s", "t", "/d", project=True),)
    )
    path = tmp_path / "s.csv"
    report.export(snap, path)
    assert read_csv(path)[1][4:6] == ["", ""]


def test_csv_round_trips_nasty_titles(tmp_path: Path) -> None:
    sessions = tuple(
        session(f"ses_{i}", title=title, directory=f'C:\\Work\\项目, "{i}"', updated=NOW - i)
        for i, title in enumerate(CSV_TITLES)
    )
    snap = Snapshot(NOW, (InstanceSummary("alpha", "u", True),), sessions)
    path = tmp_path / "nasty.csv"
    report.export(snap, path)
    rows = read_csv(path)[1:]
    # Every title comes back as it was, but one a spreadsheet would run as a formula.
    assert [r[7] for r in rows] == [report.csv_cell(t) for t in CSV_TITLES]
    assert rows[5][7] == "'=1+2 looks like a formula"
    assert [r[2] for r in rows] == [s.directory for s in sessions]


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40))
def test_csv_round_trips_any_title(title: str) -> None:
    snap = Snapshot(
        NOW, (InstanceSummary("a", "u", True),), (session("s", instance="a", title=title),)
    )
    text = report.csv_text(snap)
    assert text.startswith("\ufeff")
    rows = list(csv.reader(io.StringIO(text[1:], newline="")))
    cell = rows[1][7]
    # Round trip, except that a formula-looking cell gains one leading quote.
    assert cell == (f"'{title}" if title[:1] in ("=", "+", "-", "@", "\t", "\r") else title)


# --------------------------------------------------------------------------- export


@pytest.mark.parametrize(
    ("name", "starts"),
    [
        ("x.json", "{"),
        ("x.JSON", "{"),
        ("x.csv", "\ufeffinstance,session id"),
        ("x.html", "<!doctype html>"),
        ("x.htm", "<!doctype html>"),
    ],
)
def test_export_picks_format_by_suffix(tmp_path: Path, name: str, starts: str) -> None:
    path = tmp_path / name
    report.export(fleet(), path)
    assert path.read_text(encoding="utf-8").startswith(starts)


@pytest.mark.parametrize("name", ["x.txt", "x.xlsx", "noext", "x.json.bak"])
def test_export_refuses_unknown_format(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "exports"
    folder.mkdir()
    with pytest.raises(UsageError, match="unsupported export format") as caught:
        report.export(fleet(), folder / name)
    assert caught.value.exit_code == ExitCode.USAGE
    assert list(folder.iterdir()) == []


def test_export_html_ages_are_relative_to_the_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "x.html"
    report.export(fleet(), path)
    assert "3 days ago" in path.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- HTML


def test_hostile_values_stay_text() -> None:
    html = report.render_html(fleet(), now_ms=NOW, title="<b>demo</b>")
    for raw in (XSS_TITLE, NASTY_DIR, "<script>alert", "<img", "<b>"):
        assert raw not in html
    assert str(escape(XSS_TITLE)) in html
    assert str(escape(NASTY_DIR)) in html
    page = parse(html)
    # The browser reads the original strings back, as text and in attributes.
    assert XSS_TITLE in page.titles
    keys = [a["data-k"] for t, a in page.tags if t == "tr" and "data-k" in a]
    assert f"{XSS_TITLE}\n{NASTY_DIR}\nses_xss".lower() in keys
    # The provider's message is shown under the badge, as text.
    assert any(n.startswith("The AI provider said: 429 <b>slow down</b> Next try: in 10 minutes")
               for n in page.notes)
    allowed = set(re.findall(r"\w+", ALLOWED_TAGS))
    assert {t for t, _ in page.tags} <= allowed
    assert len(page.blocks["script"]) == 1


def test_nothing_points_outside_the_file() -> None:
    html = report.render_html(fleet(), now_ms=NOW)
    page = parse(html)
    for tag, attrs in page.tags:
        for name in ("src", "href", "action", "formaction", "poster", "srcset", "data"):
            if name in attrs:
                assert attrs[name].startswith("data:"), (tag, name, attrs[name])
    assert "url(" not in html
    assert "@import" not in html
    # The only web addresses are inside user data (a title), escaped.
    rest = html.replace(str(escape(URL_TITLE)), "").replace(
        URL_TITLE.lower().replace("&", "&amp;"), ""
    )
    assert "http://" not in rest
    assert "https://" not in rest
    assert "//" not in re.sub(r"<script>.*?</script>", "", rest, flags=re.DOTALL).replace(
        "/srv/", ""
    )  # no protocol-relative address either


def test_page_is_sealed_by_a_matching_policy() -> None:
    html = report.render_html(fleet(), now_ms=NOW)
    page = parse(html)
    policy = next(
        a["content"]
        for t, a in page.tags
        if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"
    )
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'none'"
    for kind in ("style", "script"):
        (block,) = page.blocks[kind]
        digest = base64.b64encode(hashlib.sha256(block.encode()).digest()).decode()
        assert directives[f"{kind}-src"] == f"'sha256-{digest}'"  # this block and nothing else
    # The policy comes before anything the page could load or run, and before any user text.
    assert html.index("Content-Security-Policy") < min(html.index("<title>"), html.index("<style>"))


def test_seal_needs_the_placeholder() -> None:
    with pytest.raises(ValueError, match="placeholder"):
        report.seal_html("<html><style>b{}</style></html>")


def test_templates_are_strict_and_named_safely() -> None:
    with pytest.raises(jinja2.UndefinedError):
        report.render_page("overview.html.j2", {})
    with pytest.raises(jinja2.TemplateNotFound):
        report.render_page("../pyproject.toml.j2", {})


def test_cards_and_sections_count_from_the_rows() -> None:
    ctx = page_view.overview_context(fleet(), now_ms=NOW, title="demo")
    cards = page_view.CardsView(healthy=2, servers=3, sessions=4, running=2, waiting=1)
    assert ctx["cards"] == cards
    assert [(s.name, s.reachable, len(s.rows)) for s in ctx["sections"]] == [
        ("alpha", True, 2),
        ("beta", True, 2),
        ("gamma", False, 0),
    ]
    gamma = ctx["sections"][2]
    assert gamma.reason_words == "the server did not answer in time"
    assert [(b.name, b.total, b.running, b.width) for b in ctx["bars"]] == [
        ("alpha", 2, 0, 100.0),
        ("beta", 2, 2, 100.0),
    ]
    assert ctx["generated_words"] == "just now"


def test_page_text_uses_plain_words() -> None:
    html = report.render_html(fleet(), now_ms=NOW, title="demo")
    for words in (
        "Servers answering",
        "of 3",
        "Running now",
        "working",
        "waiting to retry (rate limit)",
        "rate-limited",
        "3 days ago",
        "5 minutes ago",
        "not answering",
        "the server did not answer in time",
        "4 of 4 shown",
        "production",
    ):
        assert words in html, words
    assert "opencode" not in html.lower()


@pytest.mark.parametrize(
    ("state", "label", "hover_has"),
    [
        ("busy", "working", None),
        ("idle", "idle", None),
        ("retry", "waiting to retry (rate limit)", "The AI provider said: quota"),
    ],
)
def test_run_state_words(state: str, label: str, hover_has: str | None) -> None:
    s = session("s", run_state=state, retry_message="quota", retry_next=NOW + 5 * MIN)
    (row,) = page_view.overview_context(
        Snapshot(NOW, (InstanceSummary("alpha", "u", True),), (s,)), now_ms=NOW, title="t"
    )["sections"][0].rows
    assert row.state.label == label
    if hover_has is None:
        assert row.state.note == ""
    else:
        assert hover_has in row.state.note
        # The next try is a live time: the page shows it relative to the reader's clock.
        assert row.state.note_ms == NOW + 5 * MIN
        live = row.state.note.replace(page_text.WHEN, page_text.ago("en", row.state.note_ms, NOW))
        assert "Next try: in 5 minutes" in live


@pytest.mark.parametrize(
    ("outcome", "label", "css", "hover_has"),
    [
        ("succeeded", "succeeded", "ok", "finished its answer"),
        ("failed", "failed", "bad", "error"),
        ("denied", "denied", "warn", "refused"),
        ("ceiling", "stopped at its ceiling", "warn", "run ceiling"),
        ("interrupted", "interrupted", "warn", "stopped before it finished"),
        ("rate_limited", "rate-limited", "warn", "too many requests"),
        ("running", "running", "muted", "still going"),
        ("not_started", "not started", "muted", "no answer"),
        (None, "not checked", "muted", "not checked"),
    ],
)
def test_outcome_words(outcome: Any, label: str, css: str, hover_has: str) -> None:
    badge = page_view.outcome_badge(outcome)
    assert (badge.label, badge.css) == (label, css)
    assert hover_has in badge.note


@pytest.mark.parametrize(
    ("cause", "words"),
    [
        ("refused", "nothing is answering at the server's address"),
        ("timeout", "the server did not answer in time"),
        ("auth", "the server refused our login"),
        ("forbidden", "the server refused our login"),
        ("no_password", "the server refused our login"),
        ("dns", "the server's address could not be found"),
        ("server_error", "the server reported an internal error"),
        ("html", "not as a coding-assistant"),
        ("garbled", "garbled answer"),
        ("dropped", "garbled answer"),
        ("tls", "secure connection"),
        ("connect", "the server could not be reached"),
        (None, "the server could not be reached"),
    ],
)
def test_plain_reason_follows_the_cause_not_the_words(cause: Any, words: str) -> None:
    # The reason's words say something else each time: only the cause may decide.
    for reason in ("connection refused", "HTTP 401 timed out", "", "DNS 503 html"):
        down = InstanceSummary("a", "http://127.0.0.1:1", False, reason=reason, cause=cause)
        ctx = page_view.overview_context(Snapshot(NOW, (down,)), now_ms=NOW, title="t")
        assert words in ctx["sections"][0].reason_words


@settings(max_examples=40, deadline=None)
@given(
    title=st.text(alphabet=st.characters(exclude_categories=["Cs", "Cc"]), min_size=1, max_size=30),
    directory=st.text(alphabet=st.characters(exclude_categories=["Cs", "Cc"]), max_size=30),
)
def test_any_title_reads_back_as_text(title: str, directory: str) -> None:
    snap = Snapshot(
        NOW,
        (InstanceSummary("a", "u", True),),
        (session("s", instance="a", title=title, directory=directory),),
    )
    page = parse(report.render_html(snap, now_ms=NOW))
    assert page.titles == [title.strip() or "(untitled)"]
    (key,) = [a["data-k"] for t, a in page.tags if t == "tr" and "data-k" in a]
    assert key == f"{title}\n{directory}\ns".lower()
    assert len(page.blocks["script"]) == 1


def test_three_thousand_sessions_render(tmp_path: Path) -> None:
    sessions = tuple(
        session(
            f"ses_{i:06d}",
            instance=f"server-{i % 6}",
            title=f"任务 {i} deploy",
            directory=f"/srv/demo/m{i % 50}",
            updated=NOW - i * MIN,
        )
        for i in range(3000)
    )
    snap = Snapshot(
        NOW, tuple(InstanceSummary(f"server-{n}", "u", True) for n in range(6)), sessions
    )
    path = tmp_path / "big.html"
    started = time.perf_counter()
    report.write_html(snap, path, now_ms=NOW, title="big")
    elapsed = time.perf_counter() - started
    html = path.read_text(encoding="utf-8")
    assert html.count("<tr data-k=") == 3000
    assert "3000 of 3000 shown" in html
    # Reported, not asserted: timing depends on the machine.
    print(
        f"\n3000 sessions: {os.path.getsize(path) // 1024} KiB written in {elapsed * 1000:.0f} ms"
    )


def test_record_exports_equal_asdict_minus_project_in_field_order() -> None:
    from dataclasses import asdict

    rec = SessionRecord(
        "a", "ses_1", "标题", "/p", 1, 2, 0.5, True, "retry", "429", 3, "ses_0", "m/x", "ok", True,
        owner="shop",
    )
    # the flag is not exported; the owner is, as "project" in its place
    expected = {("project" if k == "owner" else k): v for k, v in asdict(rec).items()
                if k != "project"}
    # then each epoch-ms time again as ISO 8601 (tests/unit/test_time_format.py)
    expected.update(created_at="1970-01-01T00:00:00Z", updated_at="1970-01-01T00:00:00Z",
                    retry_next_at="1970-01-01T00:00:00Z")
    assert list(rec.to_json().items()) == list(expected.items())
    summary = InstanceSummary("a", "http://127.0.0.1:1", False, reason="down", note="n")
    assert list(summary.to_json().items()) == list(asdict(summary).items())


def test_servers_that_did_not_answer_are_summarised_first() -> None:
    html = report.render_html(fleet(), now_ms=NOW, title="demo")
    top = html.index('id="down-summary"')
    assert top < html.index('id="card-healthy"')
    summary = html[top : html.index("</div></div>", top)]
    assert "1 of 3 servers did not answer:" in summary
    assert "gamma: the server did not answer in time" in summary
    assert 'id="fleet-down"' not in html
    down_a = InstanceSummary("a", "u", False, reason="connection refused", cause="refused")
    silent = Snapshot(NOW, (down_a,))
    down = report.render_html(silent, now_ms=NOW, title="demo")
    assert 'id="fleet-down"' in down and "empty, not zero work" in down


def test_chinese_page_has_no_english_of_its_own() -> None:
    html = report.render_html(fleet(), now_ms=NOW, title="demo", lang="zh")
    assert '<html lang="zh-CN">' in html
    for words in ("应答的服务器", "3 台服务器中有 1 台没有应答：", "gamma：服务器没有及时应答",
                  "工作中", "等待重试（限流）", "3 天前", "5 分钟前", "显示 4 / 4", "生产环境"):
        assert words in html, words
    # The page's own English words do not appear (the data's do: titles, folders, the scan's
    # notes, raw reasons).
    body = re.sub(r"<(script|style)>.*?</\1>", "", html, flags=re.DOTALL)
    for key in ("cards.healthy", "filter.label", "help.summary", "col.status", "state.retry"):
        assert TEXT[key][0] not in body, key


def test_saved_page_may_reach_nothing_served_page_only_its_origin() -> None:
    saved = report.render_html(fleet(), now_ms=NOW)
    served = report.render_html(fleet(), now_ms=NOW, live_seconds=10)
    assert "connect-src" not in saved and 'data-live-seconds="0"' in saved
    assert "connect-src 'self';" in served and 'data-live-seconds="10"' in served


def test_only_a_page_too_long_to_capture_lets_rows_skip_rendering() -> None:
    def page(n: int) -> str:
        rows = tuple(session(f"s{i}", title=f"t{i}") for i in range(n))
        snap = Snapshot(NOW, (InstanceSummary("alpha", "u", True),), rows)
        return report.render_html(snap, now_ms=NOW)

    assert '<div data-live="sections">' in page(page_view.MANY_ROWS)
    assert '<div data-live="sections" class="many">' in page(page_view.MANY_ROWS + 1)


@pytest.mark.parametrize(
    ("fields", "phase", "state", "result"),
    [
        ({"run_state": "busy", "running": True, "outcome": "running"}, "working", "working",
         "running"),
        ({"run_state": "retry", "running": True, "outcome": "rate_limited"}, "waiting",
         "waiting to retry (rate limit)", "running"),
        ({"outcome": "succeeded"}, "idle", "idle", "succeeded"),
        ({"outcome": "failed"}, "idle", "idle", "failed"),
        ({"outcome": "denied"}, "idle", "idle", "denied"),
        ({"outcome": "interrupted"}, "idle", "idle", "interrupted"),
        ({"outcome": "ceiling"}, "idle", "idle", "stopped at its ceiling"),
        # Idle, but its last run never completed: the server stopped mid-run.
        ({"outcome": "running"}, "idle", "idle", "interrupted"),
        ({"outcome": "not_started"}, "idle", "idle", "not started"),
        ({"outcome": ""}, "idle", "idle", "not checked"),
    ],
)
def test_one_vocabulary_for_phase_and_badges(
    fields: dict[str, Any], phase: str, state: str, result: str
) -> None:
    s = session("s", **fields)
    assert page_view.session_phase(s) == phase
    badges = page_view.session_badges(s, "en", NOW)
    assert (badges[0].label, badges[1].label) == (state, result)


@pytest.mark.parametrize(("lang", "said"), [
    ("en", "asks for a login: the user name “opencode” and the server&#39;s password"),
    ("zh", "要求登录：用户名“opencode”和这台服务器的密码"),
])
def test_a_section_says_what_its_open_links_need(lang: page_text.Lang, said: str) -> None:
    from xaf_hub.fleet.web_ui import WebUI

    snap = Snapshot(
        generated_at=NOW,
        instances=(InstanceSummary("locked", "http://127.0.0.1:1", True),
                   InstanceSummary("open", "http://127.0.0.1:2", True)),
        sessions=(SessionRecord("locked", "ses_a1", "behind a login", "/srv/a", project=True),
                  SessionRecord("open", "ses_b1", "no login", "/srv/b", project=True)),
    )
    links = {"locked": WebUI("http://127.0.0.1:1", True, login="opencode"),
             "open": WebUI("http://127.0.0.1:2", True)}
    html = report.render_html(snap, now_ms=NOW, lang=lang, links=links)
    locked, rest = html.split('data-server="open"')
    assert said in locked.split('data-server="locked"')[1] and said not in rest
    assert "login-note" not in rest  # a server without a password asks for nothing
