"""The Autopilot panel's spend lines: the project against its budget, unknown costs said."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from xaf_hub.config.load import BudgetConfig, Config, InstanceConfig, ModelsConfig
from xaf_hub.core.clock import to_ms
from xaf_hub.core.records import SessionRecord
from xaf_hub.page.autopilot import build, spend_lines
from xaf_hub.page.export import render_html

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def cfg(tmp_path: Path) -> Config:
    insts = (
        InstanceConfig(name="a", url="http://127.0.0.1:1", budget_daily_usd=1.0),
        InstanceConfig(name="b", url="http://127.0.0.1:2"),
        InstanceConfig(name="c", url="http://127.0.0.1:3"),
    )
    return Config(path=None, home=tmp_path, state_dir=tmp_path, instances=insts,
                  budget=BudgetConfig(3.0), models=ModelsConfig(timezone="UTC"))


def sessions() -> dict[tuple[str, str], SessionRecord]:
    at = to_ms(NOW) - 60_000
    rows = [SessionRecord("a", "s1", "t", "/p", updated=at, cost=1.25, project=True),
            SessionRecord("b", "s2", "t", "/p", updated=at, cost=None, project=True),
            SessionRecord("b", "s3", "t", "/p", updated=at, cost=9.0, project=False)]
    return {(s.instance, s.id): s for s in rows}


def test_spend_lines_say_budget_share_unknown_and_silent_servers(tmp_path: Path) -> None:
    lines = spend_lines(cfg(tmp_path), "en", sessions(), ["a", "b"], to_ms(NOW))
    assert lines == (
        "Spent today: $1.25 of the daily budget $3.00 (42 %). Cost unknown for 1 sessions "
        "(their server reports none usable). 1 servers did not answer: their spend is not "
        "counted.",
        "a: Spent today: $1.25 of the daily budget $1.00 (125 %). The budget is reached: no new "
        "work starts until tomorrow.",
    )
    zh = spend_lines(cfg(tmp_path), "zh", sessions(), ["a", "b", "c"], to_ms(NOW))
    assert zh[0] == (
        "今日已花费 $1.25，每日预算 $3.00（42%）。1 个会话费用未知（其服务器没有给出可用的费用）。"
    )


def test_the_page_shows_the_spend(tmp_path: Path) -> None:
    from xaf_hub.core.records import InstanceSummary, Snapshot

    c = cfg(tmp_path)
    up = tuple(InstanceSummary(name, "u", True) for name in "abc")
    snap = Snapshot(to_ms(NOW), up, tuple(sessions().values()))
    view = build(c, to_ms(NOW), "en", snap)
    html = render_html(snap, now_ms=to_ms(NOW), autopilot=view)
    assert "Spent today: $1.25 of the daily budget $3.00 (42 %)." in html
    assert "Cost unknown for 1 sessions" in html
