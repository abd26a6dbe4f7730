"""Budget notices: 80 % and 100 % of a daily budget, each sent once per local day."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from tests.unit.notify.support import URL
from xaf_hub.config.notify import DEFAULT_EVENTS, Webhook
from xaf_hub.notify import outbox
from xaf_hub.notify.derive import Inputs, derive
from xaf_hub.notify.messages import render
from xaf_hub.notify.record import RoundLog
from xaf_hub.ops.budget import BudgetLine, Spend

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def round_(
    tmp: Path, spend: list[BudgetLine], now: datetime = NOW, tz: Any = UTC
) -> list[tuple[str, Any]]:
    """One patrol round's derive + queue; the (id, data) of what it newly queued."""
    hook = Webhook("team", "H", "json", url=URL)
    c = RoundLog(started=now, finished=now)
    q = outbox.enqueue(
        tmp,
        lambda state: derive(
            c, Inputs(configured=["a"], spend=spend), state, now=now, tz=tz, summary_hour=23
        ),
        [hook],
        now=now,
        queue_limit=100,
        keep_hours=24,
    )
    return [(e.id, dict(e.data)) for e in q.new]


def project(usd: float, budget: float | None = 10.0) -> BudgetLine:
    return BudgetLine("", Spend(usd), budget)


def test_each_level_once_per_day(tmp_path: Path) -> None:
    assert round_(tmp_path, [project(7.9)]) == []
    first = round_(tmp_path, [project(8.0), BudgetLine("a", Spend(0.2), 1.0)])
    assert [i for i, _ in first] == ["budget:*:80:2026-12-02"]
    assert first[0][1] == {"level": 80, "day": "2026-12-02", "spent_usd": 8.0, "budget_usd": 10.0,
                           "cost_unknown_sessions": 0, "every_project": False}
    # Still above 80 %: nothing new (the outbox's state remembers, across restarts too).
    assert round_(tmp_path, [project(9.0)]) == []
    reached = round_(tmp_path, [project(10.0), BudgetLine("a", Spend(1.0), 1.0)])
    assert [i for i, _ in reached] == [
        "budget:*:100:2026-12-02", "budget:a:80:2026-12-02", "budget:a:100:2026-12-02"
    ]
    assert round_(tmp_path, [project(12.0), BudgetLine("a", Spend(3.0), 1.0)]) == []
    # The next day (local) starts over.
    tomorrow = round_(tmp_path, [project(8.5)], NOW + timedelta(days=1))
    assert "budget:*:80:2026-12-03" in {i for i, _ in tomorrow}


def test_the_day_is_the_configured_zones(tmp_path: Path) -> None:
    late = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)  # 01:00 on the 3rd in Shanghai
    got = round_(tmp_path, [project(9.0)], late, ZoneInfo("Asia/Shanghai"))
    assert [i for i, _ in got] == ["budget:*:80:2026-12-03"]


def test_no_budget_or_unknown_spend_sends_nothing(tmp_path: Path) -> None:
    lines = [project(50.0, None), BudgetLine("a", Spend(), 1.0, known=False)]
    assert round_(tmp_path, lines) == []


def test_budget_notices_are_on_by_default_and_read_well() -> None:
    assert "budget" in DEFAULT_EVENTS
    from xaf_hub.notify.events import Event

    ev = Event("budget:*:100:2026-12-02", "budget", NOW.isoformat(),
               data={"level": 100, "day": "2026-12-02", "spent_usd": 3.01, "budget_usd": 3.0})
    head, text = render(ev, language="en", project="shop", page_url="", tz=UTC)
    assert head == "[xaf-hub · shop] Daily budget 100 % spent: The project"
    assert text == ("The project spent $3.01 of its daily budget $3.00 today (2026-12-02). "
                    "No new work starts until tomorrow; runs already started go on.")
    ev80 = Event("budget:a:80:2026-12-02", "budget", NOW.isoformat(), instance="lan-b",
                 data={"level": 80, "day": "2026-12-02", "spent_usd": 0.8, "budget_usd": 1})
    head, text = render(ev80, language="zh", project="shop", page_url="", tz=UTC)
    assert head.endswith("每日预算已用 80%:lan-b")
    assert "$0.80" in text and "$1.00" in text
    # A hub of several projects telling of the whole fleet names no one project.
    head, _ = render(ev80, language="en", project="", page_url="", tz=UTC)
    assert head.startswith("[xaf-hub · All projects] ")
