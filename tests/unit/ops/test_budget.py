"""Daily budgets: today's spend arithmetic, unknown costs, the refusal and the notice levels."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from xaf_hub.config.load import BudgetConfig, Config, InstanceConfig, ModelsConfig
from xaf_hub.core.clock import day_start, to_ms
from xaf_hub.core.records import SessionRecord
from xaf_hub.fleet.wire import MAX_SESSION_COST_USD, cost_value
from xaf_hub.ops import budget
from xaf_hub.ops.budget import BudgetLine, Spend, budget_lines, levels_reached, refusal, spend_today

SHANGHAI = ZoneInfo("Asia/Shanghai")
NEW_YORK = ZoneInfo("America/New_York")


def ms(text: str) -> int:
    """Epoch ms of an ISO 8601 instant with its offset."""
    return to_ms(datetime.fromisoformat(text))


def rec(
    updated: str, cost: float | None, *, project: bool = True, inst: str = "a"
) -> SessionRecord:
    return SessionRecord(inst, f"ses_{updated}_{cost}", "t", "/srv/demo", updated=ms(updated),
                         cost=cost, project=project)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0.0),
        (0.02, 0.02),
        (3, 3.0),
        (MAX_SESSION_COST_USD, MAX_SESSION_COST_USD),
        (MAX_SESSION_COST_USD * 1.01, None),  # huge: a broken report, not spend
        (1e300, None),
        (-0.01, None),
        (math.nan, None),
        (math.inf, None),
        (None, None),  # missing: releases before 1.18 report cost per message only
        ("0.5", None),
        (True, None),
        ([1], None),
    ],
)
def test_a_cost_missing_or_absurd_is_unknown_never_zero(value: Any, expected: float | None) -> None:
    assert cost_value(value) == expected


# now, zone, sessions (updated, cost, project) -> (usd, unknown, sessions)
DAY_CASES = [
    pytest.param(
        "2026-12-02T10:00:00+00:00", UTC,
        [("2026-12-02T00:00:00+00:00", 1.0, True), ("2026-12-01T23:59:59.999+00:00", 5.0, True)],
        (1.0, 0, 1),
        id="utc midnight: the first millisecond is today, the last of yesterday is not",
    ),
    pytest.param(
        # 01:00 in Shanghai on the 3rd is 17:00 UTC on the 2nd: the Shanghai day began at
        # 16:00 UTC on the 2nd, so 15:59 UTC (23:59 Shanghai on the 2nd) is yesterday.
        "2026-12-02T17:00:00+00:00", SHANGHAI,
        [("2026-12-02T16:00:00+00:00", 2.0, True), ("2026-12-02T15:59:00+00:00", 4.0, True)],
        (2.0, 0, 1),
        id="models.timezone decides the day, not UTC",
    ),
    pytest.param(
        # 8 March 2026: New York springs forward at 02:00; midnight still exists (05:00 UTC).
        "2026-03-08T12:00:00+00:00", NEW_YORK,
        [("2026-03-08T05:00:00+00:00", 1.5, True), ("2026-03-08T04:59:59+00:00", 9.0, True)],
        (1.5, 0, 1),
        id="a DST day begins at its own midnight",
    ),
    pytest.param(
        "2026-12-02T10:00:00+00:00", UTC,
        [("2026-12-02T09:00:00+00:00", None, True), ("2026-12-02T09:30:00+00:00", 0.25, True),
         ("2026-12-02T09:40:00+00:00", None, True)],
        (0.25, 2, 3),
        id="unknown costs are counted apart, never as 0",
    ),
    pytest.param(
        "2026-12-02T10:00:00+00:00", UTC,
        [("2026-12-02T09:00:00+00:00", 7.0, False), ("2026-12-02T09:00:01+00:00", None, False)],
        (0.0, 0, 0),
        id="sessions outside the project cost the project nothing",
    ),
]


@pytest.mark.parametrize(("now", "tz", "rows", "expected"), DAY_CASES)
def test_spend_today(
    now: str, tz: Any, rows: list[tuple[str, float | None, bool]], expected: tuple[float, int, int]
) -> None:
    sessions = [rec(u, c, project=p) for u, c, p in rows]
    got = spend_today(sessions, datetime.fromisoformat(now), tz)
    assert (round(got.usd, 9), got.unknown, got.sessions) == expected


def test_a_session_without_a_time_is_not_today() -> None:
    s = SessionRecord("a", "ses_x", "t", "/srv/demo", updated=0, cost=2.0, project=True)
    assert spend_today([s], datetime(2026, 12, 2, tzinfo=UTC), UTC) == Spend()


def test_day_start_needs_an_aware_now() -> None:
    with pytest.raises(ValueError, match="aware"):
        day_start(datetime(2026, 12, 2), UTC)  # noqa: DTZ001 - the naive value is the point


def config(daily: float | None, *caps: float | None, tz: str = "UTC") -> Config:
    insts = tuple(
        InstanceConfig(name=n, url=f"http://127.0.0.1:{4000 + i}", budget_daily_usd=c)
        for i, (n, c) in enumerate(zip(("a", "b"), caps or (None, None), strict=True))
    )
    return Config(path=None, home=Path("/h"), state_dir=Path("/h"), instances=insts,
                  budget=BudgetConfig(daily), models=ModelsConfig(timezone=tz))


# project budget, instance a's cap, a's spend, the others' spend -> refusal text or None
REFUSALS = [
    (None, None, 100.0, 100.0, None),
    (3.0, None, 1.0, 1.99, None),
    (3.0, None, 1.0, 2.0, "daily budget $3.00 reached ($3.00 spent today)"),
    (3.0, None, 0.0, 3.5, "daily budget $3.00 reached ($3.50 spent today)"),
    (None, 1.0, 0.99, 50.0, None),  # only a's own spend counts against a's cap
    (None, 1.0, 1.0, 0.0, "a: daily budget $1.00 reached ($1.00 spent today)"),
    (10.0, 1.0, 1.2, 9.0, "a: daily budget $1.00 reached ($1.20 spent today)"),  # first: own
    (0.0, None, 0.0, 0.0, "daily budget $0.00 reached ($0.00 spent today)"),  # 0: no new work
]


@pytest.mark.parametrize(("daily", "cap", "own", "others", "expected"), REFUSALS)
def test_refusal(
    daily: float | None, cap: float | None, own: float, others: float, expected: str | None
) -> None:
    cfg = config(daily, cap, None)
    err = refusal(cfg, cfg.instances[0], Spend(own), Spend(others))
    assert (str(err) if err else None) == expected
    if err is not None:
        assert err.exit_code == 3 and err.instance == ("a" if "a:" in expected else "")


def test_unknown_cost_does_not_block() -> None:
    cfg = config(1.0, None, None)
    assert refusal(cfg, cfg.instances[0], Spend(0.5, unknown=40), Spend(0.0, unknown=9)) is None


def test_budget_lines_per_instance_and_project() -> None:
    cfg = config(3.0, 1.0, None)
    now = datetime.fromisoformat("2026-12-02T12:00:00+00:00")
    a = [rec("2026-12-02T01:00:00+00:00", 0.6), rec("2026-12-02T02:00:00+00:00", None)]
    b = [rec("2026-12-02T03:00:00+00:00", 1.8, inst="b")]
    project, lines = budget_lines(cfg, [(cfg.instances[0], a), (cfg.instances[1], b)], now)
    assert [(x.instance, round(x.spent.usd, 6), x.spent.unknown, x.budget) for x in lines] == [
        ("a", 0.6, 1, 1.0),
        ("b", 1.8, 0, None),
    ]
    assert (round(project.spent.usd, 6), project.spent.unknown, project.budget) == (2.4, 1, 3.0)
    assert project.text() == "$2.40 of $3.00 today (80 %); cost unknown for 1 session"
    assert lines[1].text() == "$1.80 today"
    assert lines[0].to_json() == {
        "spent_today_usd": 0.6, "budget_daily_usd": 1.0, "cost_unknown_sessions": 1
    }
    assert levels_reached(project) == [80]


def test_an_instance_that_did_not_answer_is_said_unknown() -> None:
    cfg = config(3.0, None, None)
    project, lines = budget_lines(cfg, [(cfg.instances[0], None), (cfg.instances[1], [])],
                                  datetime(2026, 12, 2, tzinfo=UTC))
    assert lines[0].text() == "spend unknown (instance did not answer)"
    assert lines[0].to_json()["spent_today_usd"] is None
    assert levels_reached(lines[0]) == []


@pytest.mark.parametrize(
    ("spent", "cap", "levels"),
    [(0.0, 3.0, []), (2.39, 3.0, []), (2.4, 3.0, [80]), (2.99, 3.0, [80]), (3.0, 3.0, [80, 100]),
     (9.0, 3.0, [80, 100]), (0.0, 0.0, [80, 100]), (5.0, None, [])],
)
def test_notice_levels(spent: float, cap: float | None, levels: list[int]) -> None:
    assert levels_reached(BudgetLine("", Spend(spent), cap)) == levels


def test_unknown_text() -> None:
    assert [budget.unknown_text(n) for n in (0, 1, 2)] == [
        "", "cost unknown for 1 session", "cost unknown for 2 sessions"
    ]


def test_over_budget_for_planning() -> None:
    from xaf_hub.fleet.scan import InstanceScan

    cfg = config(1.0, 0.5, None)
    now = datetime.fromisoformat("2026-12-02T12:00:00+00:00")
    a = InstanceScan(cfg.instances[0], True, sessions=[rec("2026-12-02T01:00:00+00:00", 0.5)])
    b = InstanceScan(cfg.instances[1], True, sessions=[rec("2026-12-02T01:00:00+00:00", 0.4)])
    over = budget.over_budget(cfg, [a, b], now)
    assert {k: (str(v), v.instance) for k, v in over.items()} == {
        "a": ("a: daily budget $0.50 reached ($0.50 spent today)", "a")
    }
    b2 = InstanceScan(cfg.instances[1], True, sessions=[rec("2026-12-02T01:00:00+00:00", 0.5)])
    over = budget.over_budget(cfg, [a, b2], now)
    assert str(over["b"]) == "daily budget $1.00 reached ($1.00 spent today)"
    # An instance that did not answer is neither refused nor counted.
    down = InstanceScan(cfg.instances[1], False, "connection refused")
    assert set(budget.over_budget(cfg, [a, down], now)) == {"a"}


# -- runs in flight count at their ceiling ------------------------------------------------------


def running(updated: str, cost: float | None, inst: str = "a") -> SessionRecord:
    return SessionRecord(inst, f"ses_run_{updated}_{cost}", "t", "/srv/demo", updated=ms(updated),
                         cost=cost, project=True, running=True, run_state="busy")


def test_running_sessions_are_in_flight_at_the_run_ceiling() -> None:
    now = datetime.fromisoformat("2026-12-03T12:00:00+00:00")
    sessions = [
        rec("2026-12-03T10:00:00+00:00", 0.5),
        running("2026-12-03T11:59:00+00:00", 0.25),
        running("2026-12-02T23:00:00+00:00", 1.0),  # yesterday's cost, but in flight now
        SessionRecord("a", "x", "t", "/o", updated=ms("2026-12-03T11:00:00+00:00"), cost=9.0,
                      project=False, running=True),  # not the project's
    ]
    spent = spend_today(sessions, now, UTC, 0.2)
    assert (spent.usd, spent.in_flight) == (0.75, 2)
    assert spent.in_flight_usd == pytest.approx(0.4) and spent.committed == pytest.approx(1.15)
    assert spend_today(sessions, now, UTC).in_flight_usd == 0.0  # no ceiling: nothing bounded
    assert spent.with_sent(3, 0.2).in_flight == 5


def test_a_run_with_sub_agents_is_one_run_in_flight_and_each_session_costs_once() -> None:
    """opencode keeps a sub-agent's cost on its own session (the parent's excludes it): today's
    spend adds every session once. A run whose root or sub-agents still work is one run in
    flight, at one ceiling, however many of its sessions run; a free root gone idle while a
    priced sub-agent works in the background is still a run in flight."""
    now = datetime.fromisoformat("2026-12-03T12:00:00+00:00")
    at = ms("2026-12-03T11:00:00+00:00")

    def s(sid: str, cost: float, parent: str = "", busy: bool = True) -> SessionRecord:
        return SessionRecord("a", sid, "t", "/srv/demo", updated=at, cost=cost, project=True,
                             parent_id=parent, running=busy, run_state="busy" if busy else "idle")

    sessions = [
        s("ses_root", 0.0),
        s("ses_kid", 0.30, "ses_root"),
        s("ses_grandkid", 0.10, "ses_kid"),
        s("ses_idle_root", 0.0, busy=False),  # gone idle; its sub-agent works on
        s("ses_background", 0.25, "ses_idle_root"),
        s("ses_done", 0.05, busy=False),
    ]
    spent = spend_today(sessions, now, UTC, 0.5)
    assert spent.usd == pytest.approx(0.70) and spent.sessions == 6
    assert (spent.in_flight, spent.in_flight_usd) == (2, 1.0)
    assert set(budget.run_roots(sessions)) == {"ses_root", "ses_idle_root"}


def ceiling_config(daily: float, run: float | None, inst_run: float | None = None) -> Config:
    inst = InstanceConfig(name="a", url="http://127.0.0.1:4000", budget_daily_usd=daily,
                          budget_run_usd=inst_run)
    return Config(path=None, home=Path("/h"), state_dir=Path("/h"), instances=(inst,),
                  budget=BudgetConfig(None, run), models=ModelsConfig(timezone="UTC"))


@pytest.mark.parametrize(
    ("run", "inst_run", "spent", "flight", "refused"),
    [
        (0.05, None, 0.0, 0, False),
        (0.05, None, 0.0, 1, False),  # 0.05 committed of 0.10
        (0.05, None, 0.0, 2, True),  # 0.10 committed: a third run could pass the day
        (0.05, None, 0.06, 0, False),
        (0.05, None, 0.06, 1, True),
        (None, None, 0.06, 9, False),  # without a run ceiling a run in flight is unbounded
        (1.0, 0.01, 0.0, 9, False),  # the instance's own ceiling wins: 0.09 of 0.10
        (1.0, 0.01, 0.0, 10, True),
    ],
)
def test_the_daily_ceiling_counts_runs_in_flight(
    run: float | None, inst_run: float | None, spent: float, flight: int, refused: bool
) -> None:
    cfg = ceiling_config(0.10, run, inst_run)
    inst = cfg.instances[0]
    own = Spend(spent).with_sent(flight, budget.run_ceiling(cfg, inst))
    err = refusal(cfg, inst, own, None)
    assert (err is not None) == refused
    if err is not None and flight:
        assert f"for {flight} run" in str(err) and "in flight" in str(err)


def test_racing_dispatches_overspend_by_at_most_one_run_ceiling() -> None:
    """Ten dispatches admitted one at a time under the instance lock (as send_work does),
    each run then spending up to its ceiling: the day ends at most one ceiling over."""
    for daily, ceiling in [(0.01, 0.02), (0.10, 0.03), (0.05, 0.05), (1.0, 0.3)]:
        cfg = ceiling_config(daily, ceiling)
        inst = cfg.instances[0]
        admitted = 0
        for _ in range(10):
            own = Spend(0.0).with_sent(admitted, ceiling)
            if refusal(cfg, inst, own, None) is None:
                admitted += 1
        assert admitted * ceiling <= daily + ceiling + 1e-9, (daily, ceiling, admitted)
        assert admitted >= 1


# ---------------------------------------------------------------------------------------------
# Today's spend from quarter-hour slots (the live board's summary) against the sessions

# Zones whose midnight is off the hour (Kathmandu +5:45, St John's -3:30, Chatham +12:45),
# one with a 25-hour day (New York, the clocks going back) and one with a 23-hour day.
SLOT_CASES = [
    ("Asia/Kathmandu", "2026-12-03T18:20:00+00:00"),
    ("America/St_Johns", "2026-12-03T03:40:00+00:00"),
    ("Pacific/Chatham", "2026-12-03T11:05:00+00:00"),
    ("America/New_York", "2026-11-02T04:50:00+00:00"),  # 23:50 of the 25-hour day
    ("Europe/Berlin", "2026-03-29T21:59:00+00:00"),  # 23:59 of the 23-hour day
    ("UTC", "2026-12-03T00:00:00+00:00"),  # midnight exactly
]


@pytest.mark.parametrize(("zone_name", "now"), SLOT_CASES, ids=[c[0] for c in SLOT_CASES])
def test_the_slots_give_todays_spend_as_the_sessions_do(zone_name: str, now: str) -> None:
    import random

    from xaf_hub.core.records import Tally

    tz = ZoneInfo(zone_name)
    at = datetime.fromisoformat(now)
    now_ms = to_ms(at)
    rng = random.Random(zone_name)
    sessions = []
    for i in range(600):  # up to two days back, some on the quarter hours and midnight itself
        midnight = now_ms - to_ms(day_start(at, tz))
        back = rng.choice([rng.randrange(0, 48 * 3_600_000), rng.randrange(0, 96) * 900_000,
                           midnight, midnight + 1])
        cost = None if i % 17 == 0 else round(rng.uniform(0, 0.5), 4)
        sessions.append(SessionRecord("a", f"s{i}", "t", "/srv/demo", updated=now_ms - back,
                                      cost=cost, project=i % 5 != 0, running=i % 23 == 0))
    want = spend_today(sessions, at, tz)
    tally = Tally.of(sessions)
    tally = Tally(tally.total_sessions, tally.project_sessions, tally.running_total,
                  tally.running_project, tally.waiting, budget.spend_slots(sessions, now_ms))
    got = budget.slots_today(tally, at, tz)
    assert got is not None
    assert (round(got.usd, 6), got.unknown, got.sessions, got.in_flight) == (
        round(want.usd, 6), want.unknown, want.sessions, want.in_flight)
    assert 0 < want.sessions < 480  # the day's start cut the sessions in two
    # Read later by up to the board's age, the slots still say the same.
    later = datetime.fromtimestamp((now_ms + 15_000) / 1000, UTC)
    if day_start(later, tz) == day_start(at, tz):
        again = budget.slots_today(tally, later, tz)
        assert again is not None and again.sessions == want.sessions


def test_slots_that_do_not_reach_back_to_midnight_give_nothing() -> None:
    from xaf_hub.core.records import SpendSlots, Tally

    at = datetime(2026, 12, 3, 20, 0, tzinfo=UTC)
    short = Tally(1, 1, 0, 0, 0, SpendSlots(to_ms(at) - 3_600_000, ((to_ms(at), 1.0, 0, 1),)))
    assert budget.slots_today(short, at, UTC) is None
    whole = Tally(1, 1, 0, 0, 0, SpendSlots(to_ms(at) - 27 * 3_600_000,
                                            ((to_ms(at) - 900_000, 1.0, 0, 1),)))
    got = budget.slots_today(whole, at, UTC)
    assert got is not None and (got.usd, got.sessions) == (1.0, 1)


def test_the_slots_and_the_sessions_add_up_to_the_same_float_in_any_order() -> None:
    """$0.03 + $0.03 + $0.01 is 0.06999999999999999 in one order and 0.07 in another: a budget
    of $0.07 was reached by a scan (newest session first) and not by the summary's slots
    (oldest quarter first), so `status` said "takes work" where `status --fresh` said no."""
    import itertools

    from xaf_hub.core.records import Tally

    at = datetime(2026, 12, 3, 20, 0, tzinfo=UTC)
    runs = [rec("2026-12-03T10:00:00+00:00", 0.03), rec("2026-12-03T11:00:00+00:00", 0.03),
            rec("2026-12-03T12:00:00+00:00", 0.01), rec("2026-12-03T12:05:00+00:00", 0.1),
            rec("2026-12-03T12:06:00+00:00", 0.2)]
    got = set()
    for order in itertools.permutations(runs):
        slots = budget.spend_slots(order, to_ms(at))
        from_slots = budget.slots_today(Tally(5, 5, 0, 0, 0, slots), at, UTC)
        assert from_slots is not None
        got |= {spend_today(order, at, UTC).usd, from_slots.usd}
    assert len(got) == 1, got
    cfg = config(0.37)
    (spent,) = got
    assert refusal(cfg, cfg.instances[0], Spend(spent), None) is not None


def test_a_midnight_off_the_quarter_hours_is_never_counted_from_the_slots() -> None:
    """models.timezone "local" with TZ a POSIX rule (``XXX-5:17``: UTC+5:17) puts midnight
    off the quarter hours: the slots cannot say what came after it, so they say nothing and
    `status` scans, not $1.00 more than `status --fresh` (a session of 23:50 yesterday)."""
    from xaf_hub.core.clock import resolve_timezone
    from xaf_hub.core.records import Tally

    tz = resolve_timezone("local", environ={"TZ": "XXX-5:17"})
    at = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    midnight = to_ms(day_start(at, tz))
    assert midnight % budget.SLOT_MS != 0
    sessions = [SessionRecord("a", "late", "t", "/srv/demo", updated=midnight - 10 * 60_000,
                              cost=1.0, project=True),
                SessionRecord("a", "today", "t", "/srv/demo", updated=midnight + 60_000,
                              cost=0.5, project=True)]
    tally = Tally(2, 2, 0, 0, 0, budget.spend_slots(sessions, to_ms(at)))
    got = budget.slots_today(tally, at, tz)
    assert got is None or got.usd == spend_today(sessions, at, tz).usd == 0.5


def test_over_budget_with_several_projects_holds_the_overall_and_each_projects_budget() -> None:
    from xaf_hub.config.load import ProjectConfig, RepositoryConfig
    from xaf_hub.fleet.scan import InstanceScan

    def seen_as_blog(daily: float, blog: float | None) -> Config:
        shop, mine = (ProjectConfig(n, (), (), (), RepositoryConfig(), {}, {}) for n in "ab")
        cfg = replace(config(daily, None, None), project_name="blog", projects=(shop, mine))
        return cfg if blog is None else replace(cfg, project_budget_usd=blog)

    now = datetime.fromisoformat("2026-12-02T12:00:00+00:00")
    at = "2026-12-02T01:00:00+00:00"
    shop = replace(rec(at, 0.5, project=False), id="shop", owner="shop")
    blog = replace(rec(at, 0.25, inst="b"), owner="blog")

    def over(cfg: Config) -> dict[str, str]:
        a = InstanceScan(cfg.instances[0], True, sessions=[shop])
        b = InstanceScan(cfg.instances[1], True, sessions=[blog])
        return {k: str(v) for k, v in budget.over_budget(cfg, [a, b], now).items()}

    # Shop and blog together reach the overall $0.75 while blog alone ($0.25) is under it.
    whole = "all projects: daily budget $0.75 reached ($0.75 spent today)"
    assert over(seen_as_blog(0.75, None)) == {"a": whole, "b": whole}
    assert over(seen_as_blog(1.0, None)) == {}
    mine = "project blog: daily budget $0.25 reached ($0.25 spent today)"
    assert over(seen_as_blog(5.0, 0.25)) == {"a": mine, "b": mine}


def test_the_spend_line_holds_the_overall_budget_seen_as_every_project(tmp_path: Path) -> None:
    from tests.unit.config.projects_support import load, projects

    doc = projects(budget={"daily_usd": 4.0})
    doc["projects"]["blog"]["budget_daily_usd"] = 1.5
    cfg = load(tmp_path, doc)
    now = datetime.fromisoformat("2026-12-02T12:00:00+00:00")
    seen = {
        name: budget_lines(view, [], now)[0].budget
        for name, view in (("all", cfg), ("blog", cfg.choose("blog")), ("shop", cfg.choose("shop")))
    }
    assert seen == {"all": 4.0, "blog": 1.5, "shop": None}
    one = load(tmp_path, {"project": {"name": "demo", "budget_daily_usd": 2.0},
                          "budget": {"daily_usd": 3.0}, "instances": [{"name": "a", "url": "http://127.0.0.1:1"}]})
    assert budget_lines(one, [], now)[0].budget == 2.0  # one project: the lower of the two
