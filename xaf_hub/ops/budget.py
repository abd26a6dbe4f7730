"""Daily budgets: what the project's sessions cost today, and whether new work may start.

``spend_today`` (pure) sums the reported cost of today's project sessions, each once and in
full, so it errs high, never low; an unknown cost (``fleet.wire.cost_value``) is shown apart,
never counted as 0, and never blocks work. ``refusal``, run by ``ops.send`` under the instance's
lock before any new work, refuses with BudgetReached (exit 3) at a daily budget, the runs in
flight counted at their run ceiling. The rules: docs/architecture.md §6, "Daily budgets"; for
users, docs/budget.md.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core.clock import day_start, resolve_timezone, to_ms
from xaf_hub.core.records import SessionRecord, SpendSlots, Tally
from xaf_hub.errors import BudgetReached

if TYPE_CHECKING:
    from xaf_hub.fleet.scan import InstanceScan

# Shares of a budget at which the chat is told, once per day each.
NOTICE_LEVELS = (80, 100)


@dataclass(frozen=True)
class Spend:
    """Known spend today in USD, and how many of today's sessions have an unknown cost.

    ``in_flight`` runs are under way (or sent); ``in_flight_usd`` is what they may still
    spend: each at its run ceiling when one is set (0 without one: nothing bounds it).
    """

    usd: float = 0.0
    unknown: int = 0
    sessions: int = 0  # project sessions active today (known and unknown cost)
    in_flight: int = 0
    in_flight_usd: float = 0.0

    def __add__(self, other: Spend) -> Spend:
        return Spend(*map(operator.add, astuple(self), astuple(other)))

    def __sub__(self, other: Spend) -> Spend:
        return Spend(*map(operator.sub, astuple(self), astuple(other)))

    @property
    def committed(self) -> float:
        """Spent today plus what the runs in flight may still spend."""
        return self.usd + self.in_flight_usd

    def with_sent(self, runs: int, ceiling: float | None) -> Spend:
        """This spend with ``runs`` more in flight (prompts sent the server shows no run for)."""
        return self + Spend(in_flight=runs, in_flight_usd=runs * (ceiling or 0.0))


def spend_today(
    sessions: Iterable[SessionRecord], now: datetime, tz: tzinfo,
    run_ceiling: float | None = None, fleet: bool = False,
) -> Spend:
    """Today's spend of the project sessions among ``sessions`` (module docstring), with
    ``fleet`` every configured project's; each run in flight (``run_roots``) may still spend
    ``run_ceiling`` (when set)."""
    start = to_ms(day_start(now, tz))
    project = [s for s in sessions if s.project or (fleet and s.owner)]
    running = len(run_roots(project))
    today = _slots(s for s in project if s.updated >= start)
    return _summed(today).with_sent(running, run_ceiling)


def run_roots(sessions: Iterable[SessionRecord]) -> dict[str, SessionRecord]:
    """The runs in flight among ``sessions``, by their root session's id: a running session
    and its sub-agents' (``parent_id``, followed as far as ``sessions`` go) are one run, whose
    cost and ceiling are the root's (``ops.ceiling``), whichever of them still works."""
    by_id = {s.id: s for s in sessions}
    roots: dict[str, SessionRecord] = {}
    for s in by_id.values():
        if not s.running:
            continue
        root, seen = s, {s.id}
        while root.parent_id in by_id and root.parent_id not in seen:
            root = by_id[root.parent_id]
            seen.add(root.id)
        roots[root.id] = root
    return roots


def _spend(sessions: Iterable[SessionRecord]) -> Spend:
    """The cost of ``sessions``, each counted in full (None: unknown, never 0); the sum
    exact to the last bit whatever their order (``math.fsum``)."""
    costs = [s.cost for s in sessions]
    known = [c for c in costs if c is not None]
    return Spend(math.fsum(known), len(costs) - len(known), len(costs))


Slot = tuple[int, float, int, int]  # (start, known USD, sessions of unknown cost, sessions)


def _slots(sessions: Iterable[SessionRecord]) -> list[Slot]:
    """The cost of ``sessions`` by the quarter hour of their last activity, earliest first.
    Today's spend is summed slot by slot (``_summed``) from the sessions as from the live
    board's summary, so both give the same float (in another order $0.03 + $0.03 + $0.01 is
    0.06999999999999999, not 0.07: a budget of $0.07 reached by one and not by the other)."""
    groups: dict[int, list[SessionRecord]] = {}
    for s in sessions:
        groups.setdefault(s.updated // SLOT_MS * SLOT_MS, []).append(s)
    out = []
    for start in sorted(groups):
        spent = _spend(groups[start])
        out.append((start, spent.usd, spent.unknown, spent.sessions))
    return out


def _summed(slots: Iterable[Slot]) -> Spend:
    """The spend of ``slots`` together (``math.fsum``: the same float in any order)."""
    rows = list(slots)
    return Spend(math.fsum(r[1] for r in rows), sum(r[2] for r in rows), sum(r[3] for r in rows))


# Today's spend without the sessions (the live board's summary, ``records.SpendSlots``): each
# time zone's midnight falls on a quarter hour, and the slots reach back further than the
# longest day (25 h, when the clocks go back) plus the oldest board a reader takes.
SLOT_MS = 15 * 60 * 1000
SLOTS_BACK_MS = 27 * 3600 * 1000


def spend_slots(sessions: Iterable[SessionRecord], now_ms: int) -> SpendSlots:
    """The project sessions among ``sessions`` active in the last ``SLOTS_BACK_MS``, their
    cost by the quarter hour of their last activity."""
    since = (now_ms - SLOTS_BACK_MS) // SLOT_MS * SLOT_MS
    return SpendSlots(since, tuple(_slots(s for s in sessions if s.project and s.updated >= since)))


def slots_today(tally: Tally, now: datetime, tz: tzinfo) -> Spend | None:
    """Today's spend from a tally's slots, as ``spend_today`` counts it from the sessions
    (None: the slots do not reach back to today's start, or today starts off the quarter
    hours, where a slot holds sessions of both days: no IANA zone's day does today, a POSIX
    ``TZ`` such as ``XXX-5:17`` does, and the reader then scans)."""
    slots = tally.spend
    start = to_ms(day_start(now, tz))
    if slots is None or start < slots.since_ms or start % SLOT_MS:
        return None
    today = (slot for slot in slots.slots if slot[0] >= start)  # start: a slot's own start
    return _summed(today).with_sent(tally.running_project, None)


def run_ceiling(cfg: Config, inst: InstanceConfig) -> float | None:
    """The most one run on ``inst`` may cost: its ``budget_run_usd``, else the project's, else
    ``budget.run_usd``."""
    caps = (inst.budget_run_usd, cfg.project_run_usd, cfg.budget.run_usd)
    return next((c for c in caps if c is not None), None)


def money(usd: float) -> str:
    """A dollar amount as people read it: "$3.00"."""
    return f"${usd:,.2f}"


def unknown_text(unknown: int) -> str:
    """ "cost unknown for N sessions", or "" when every cost is known."""
    return f"cost unknown for {unknown} session{'s' if unknown != 1 else ''}" if unknown else ""


def reached_text(
    budget: float, spent: float, instance: str = "", flight: Spend | None = None
) -> str:
    """The refusal: "daily budget $3.00 reached ($3.00 spent today)", led by the instance;
    with runs in flight at their ceilings: "($2.50 spent today + up to $0.50 for 1 run in
    flight)"."""
    lead = f"{instance}: " if instance else ""
    more = ""
    if flight is not None and flight.in_flight_usd > 0:
        n, usd = flight.in_flight, money(flight.in_flight_usd)
        more = f" + up to {usd} for {n} run{'s' if n != 1 else ''} in flight"
    return f"{lead}daily budget {money(budget)} reached ({money(spent)} spent today{more})"


def zone(cfg: Config) -> tzinfo:
    """The zone whose date is "today" for budgets: ``models.timezone``."""
    return resolve_timezone(cfg.models.timezone)


def guarded(cfg: Config, inst: InstanceConfig) -> bool:
    """True when sending to ``inst`` is under any budget."""
    caps = (cfg.budget.daily_usd, cfg.project_budget_usd, inst.budget_daily_usd)
    return any(cap is not None for cap in caps)


def refusal(
    cfg: Config, inst: InstanceConfig, own: Spend, others: Spend | None, fleet: Spend | None = None
) -> BudgetReached | None:
    """The error that refuses new work on ``inst``, or None when every budget has room.

    ``own`` is the project's spend today on ``inst``, ``others`` on the rest of the fleet (None
    when no budget needs them, so nobody scanned them), ``fleet`` every configured project's on
    every instance (None: ``own`` + ``others``, as with one project): the instance's budget
    holds ``own``, the project's own (``Config.project_budget_usd``) both, and
    ``budget.daily_usd`` the fleet's. Runs in flight count at their ceilings
    (``Spend.committed``), so dispatches racing for the last of a budget are refused once the
    runs already started could spend it: the day's spend passes a daily budget by at most one
    run's ceiling per instance (the last run admitted), not by every run started at once.
    """
    cap = inst.budget_daily_usd
    if cap is not None and own.committed >= cap:
        return BudgetReached(reached_text(cap, own.usd, inst.name, own), inst.name)
    total = own + (others or Spend())
    every = "all projects" if len(cfg.projects) > 1 else ""
    for cap, spent, lead in (
        (cfg.project_budget_usd, total, f"project {cfg.project_name}"),
        (cfg.budget.daily_usd, fleet or total, every),
    ):
        if cap is not None and spent.committed >= cap:
            return BudgetReached(reached_text(cap, spent.usd, lead, spent))
    return None


def spends(
    cfg: Config, scans: Sequence[InstanceScan], now: datetime
) -> dict[str, tuple[Spend, Spend]]:
    """Each reachable instance's spend today: its project sessions', and every configured
    project's (``spend_today`` with ``fleet``), its runs in flight at its run ceiling."""
    tz = zone(cfg)
    return {
        sc.inst.name: (spend_today(sc.sessions, now, tz, run_ceiling(cfg, sc.inst)),
                       spend_today(sc.sessions, now, tz, run_ceiling(cfg, sc.inst), fleet=True))
        for sc in scans if sc.reachable
    }


def totals(spent: Iterable[tuple[Spend, Spend]]) -> tuple[Spend, Spend]:
    """The sums of ``spends``' pairs: (the project's, every project's)."""
    pairs = list(spent)
    return sum((p for p, _ in pairs), Spend()), sum((f for _, f in pairs), Spend())


def over_budget(
    cfg: Config, scans: Sequence[InstanceScan], now: datetime
) -> dict[str, BudgetReached]:
    """Instance name -> the refusal, for the reachable instances a budget already stops.

    For planning only (``send_work`` checks again under the lock): the project's spend is
    what ``scans`` saw, so a partial scan never refuses for want of the others' spend.
    """
    spent = spends(cfg, scans, now)
    total, fleet = totals(spent.values())
    refused = {sc.inst.name: refusal(cfg, sc.inst, spent[sc.inst.name][0],
                                     total - spent[sc.inst.name][0], fleet)
               for sc in scans if sc.inst.name in spent}
    return {name: why for name, why in refused.items() if why is not None}


@dataclass(frozen=True)
class BudgetLine:
    """Spend against budget for one instance, or for the project (``instance`` "")."""

    instance: str
    spent: Spend
    budget: float | None
    known: bool = True  # False: the instance did not answer, its spend is not in the figure
    project: str = ""  # the project of several whose spend it is ("": the config's only one)
    every: bool = False  # every project's spend against budget.daily_usd (several projects)

    @property
    def share(self) -> float | None:
        """Spend as a percentage of the budget (None without a budget; 0 budget: 100 %)."""
        if self.budget is None:
            return None
        if self.budget <= 0:
            return 100.0
        return 100.0 * self.spent.usd / self.budget

    def text(self) -> str:
        """ "$1.20 of $3.00 today (40 %)" or "$1.20 today", with unknown costs said."""
        if not self.known:
            return "spend unknown (instance did not answer)"
        out = money(self.spent.usd)
        out += f" of {money(self.budget)} today" if self.budget is not None else " today"
        share = self.share
        if share is not None:
            out += f" ({share:.0f} %)"
        extra = unknown_text(self.spent.unknown)
        return f"{out}; {extra}" if extra else out

    def to_json(self) -> dict[str, object]:
        """The JSON fields a script reads."""
        return {
            "spent_today_usd": round(self.spent.usd, 6) if self.known else None,
            "budget_daily_usd": self.budget,
            "cost_unknown_sessions": self.spent.unknown,
        }


def budget_lines(
    cfg: Config,
    by_instance: Sequence[tuple[InstanceConfig, Sequence[SessionRecord] | Tally | None]],
    now: datetime,
) -> tuple[BudgetLine, list[BudgetLine]]:
    """(the project's line, one line per instance); ``None`` sessions: it did not answer; a
    ``Tally`` (the live board's summary): its slots stand for the sessions."""
    tz = zone(cfg)
    lines = []
    total = Spend()
    for inst, sessions in by_instance:
        spent = (slots_today(sessions, now, tz) if isinstance(sessions, Tally)
                 else None if sessions is None else spend_today(sessions, now, tz))
        total += spent or Spend()
        lines.append(BudgetLine(inst.name, spent or Spend(), inst.budget_daily_usd,
                                spent is not None))
    return BudgetLine("", total, line_budget(cfg)), lines


def line_budget(cfg: Config) -> float | None:
    """The budget the spend of the sessions ``cfg`` sees holds: a chosen project's own among
    several, else the lower of the overall and the one project's (None: neither is set)."""
    several = cfg.chosen and len(cfg.projects) > 1
    caps = [c for c in (cfg.project_budget_usd, None if several else cfg.budget.daily_usd)
            if c is not None]
    return min(caps) if caps else None


def levels_reached(line: BudgetLine) -> list[int]:
    """The notice levels (80, 100) the line's spend has reached, lowest first."""
    share = line.share
    if share is None or not line.known:
        return []
    return [level for level in NOTICE_LEVELS if share >= level]
