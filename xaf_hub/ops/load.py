"""Instance load: the running sessions of every configured project plus live reservations
against the limit, and the chosen project's own against its share.

``instance_load`` is the one place that counts an instance's load, for ``status``, the
planner's views, the gate's re-count under the lock and the patrol's free slots (``free``
the one sum of free slots). A reservation whose session the server already reports running
is counted once, as that running session (``Gate.pending``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xaf_hub.core.outcomes import waiting_count

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from xaf_hub.core.records import SessionRecord
    from xaf_hub.fleet.scan import InstanceScan
    from xaf_hub.store.gate import Gate


def free(limit: int, running: int, reserved: int, share: int | None = None, own: int = 0) -> int:
    """Free slots: ``limit`` less every configured project's ``running`` sessions and the
    ``reserved`` slots; with a ``share``, at most it less the project's ``own`` (running and
    reserved). Never negative."""
    slots = limit - running - reserved
    return max(0, slots if share is None else min(slots, share - own))


@dataclass(frozen=True)
class ProjectLoad:
    """One project's runs on one instance (``project`` "": runs of no configured project)."""

    project: str
    running: int
    reserved: int = 0
    share: int | None = None  # its runs here, at most (None: up to the limit)

    @property
    def full(self) -> bool:
        """Whether its share is used (runs and reservations)."""
        return self.share is not None and self.running + self.reserved >= self.share

    def to_json(self) -> dict[str, Any]:
        """Export form ("project" null for the runs of no configured project)."""
        return {**self.__dict__, "project": self.project or None}


def per_project(
    projects: Sequence[tuple[str, int | None]], sessions: Iterable[SessionRecord],
    reserved: Iterable[str] = (),
) -> tuple[ProjectLoad, ...]:
    """Each of ``projects`` (name, share) with its running ``sessions`` and live reservations
    (``reserved``: the project of each), in their order; then, when there are any, the running
    sessions that belong to none."""
    running = Counter(s.owner for s in sessions if s.running)
    held = Counter(reserved)
    rows = tuple(ProjectLoad(name, running[name], held[name], share) for name, share in projects)
    return rows + ((ProjectLoad("", running[""]),) if running[""] else ())


@dataclass(frozen=True)
class Load:
    """One instance's load as the gate counts it, and whether it can take new work."""

    instance: str
    reachable: bool
    running_total: int
    running_project: int
    reserved: int | None  # None: the shared gate (Redis) could not be read
    project_sessions: int
    limit: int
    dispatchable: bool
    reason: str
    running_ids: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    run_state_unknown: str = ""  # why the run state could not be read: counted full
    # Running project sessions whose run waits for a person: counted in running_project (the
    # run goes on the moment it is answered), named in the reason so nobody takes it for work.
    waiting: int = 0
    project: str = ""  # the chosen project: running_project and reserved_own are its
    running_others: int = 0  # running sessions of the other configured projects (they count)
    share: int | None = None  # the project's runs here, at most (None: up to the limit)
    reserved_own: int = 0  # the project's own live reservations
    # Seen as every project: each one's runs here, then those of none ("other").
    projects: tuple[ProjectLoad, ...] = ()

    @property
    def free(self) -> int:
        """Free slots (never negative; 0 while reservations or the run state are unknown)."""
        if not self.reachable or self.reserved is None or self.run_state_unknown:
            return 0
        own = self.running_project + self.reserved_own
        return free(self.limit, self.running_project + self.running_others, self.reserved,
                    self.share, own)

    def to_json(self) -> dict[str, Any]:
        """Export form."""
        doc = {k: v for k, v in self.__dict__.items() if k != "running_ids"}
        projects = [p.to_json() for p in self.projects]
        return {**doc, "project": self.project or None, "projects": projects}


def instance_load(
    sc: InstanceScan, gate: Gate | None, allow_prod: bool, observed_at: float | None = None,
    shares: Sequence[tuple[str, int | None]] = (),
) -> Load:
    """Count one scanned instance's load (``gate`` None: reservations unknown); ``shares``
    (each project's name and share) asks for each project's runs too (``Load.projects``).

    ``observed_at`` is when the scan's run state was read (gate clock; default now): a
    reservation made after it is never judged by it.
    """
    summary, inst = sc.summary(), sc.inst
    running_ids = frozenset(s.id for s in sc.sessions if s.running)
    reserved: int | None = 0
    own = 0
    held: list[str] = []
    if sc.reachable and gate is None:
        reserved = None
    elif sc.reachable and gate is not None:
        held = [r.project for r in gate.pending(inst.name, set(running_ids), observed_at)]
        reserved, own = len(held), held.count(inst.project)
    others = sum(1 for s in sc.sessions if s.running and not s.project and s.owner)
    running = summary.running_project + others
    used = running + (reserved or 0)
    mine = summary.running_project + own
    if not sc.reachable:
        ok, reason = False, f"unreachable: {sc.reason}"
    elif sc.run_state_unknown:
        ok, reason = False, f"counted full: run state unknown ({sc.run_state_unknown})"
    elif sc.inst.production and not allow_prod:
        ok, reason = False, "production instance (needs --allow-prod)"
    elif used >= summary.limit:
        shown = "?" if reserved is None else reserved
        ok, reason = False, f"full ({running} running + {shown} reserved)"
    elif reserved is None:
        ok, reason = False, "reservations unknown (the shared gate is unreachable)"
    elif inst.share is not None and mine >= inst.share:
        ok, reason = False, f"{inst.project}'s share is used ({mine} of {inst.share})"
    else:
        slots = free(summary.limit, running, reserved, inst.share, mine)
        ok, reason = True, f"{slots} free slot(s)"
    if sc.reachable and summary.waiting:
        reason = f"{reason}; {waiting_count(summary.waiting)}"
    return Load(
        inst.name, sc.reachable, summary.running_total, summary.running_project, reserved,
        summary.project_sessions, summary.limit, ok, reason, running_ids, sc.run_state_unknown,
        summary.waiting, inst.project, others, inst.share, own,
        per_project(shares, sc.sessions, held) if shares and sc.reachable else (),
    )
