"""Instance load: running project sessions plus live reservations against the limit.

``instance_load`` is the one place that counts an instance's load, for ``status``, the
planner's views, the gate's re-count under the lock and the patrol's free slots. A
reservation whose session the server already reports running is counted once, as that
running session (``Gate.pending``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xaf_hub.fleet.scan import InstanceScan
    from xaf_hub.store.gate import Gate


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

    @property
    def free(self) -> int:
        """Free slots (never negative; 0 while reservations or the run state are unknown)."""
        if not self.reachable or self.reserved is None or self.run_state_unknown:
            return 0
        return max(0, self.limit - self.running_project - self.reserved)

    def to_json(self) -> dict[str, Any]:
        """Export form."""
        doc = dict(self.__dict__)
        doc.pop("running_ids")
        return doc


def instance_load(
    sc: InstanceScan,
    gate: Gate | None,
    allow_prod: bool,
    observed_at: float | None = None,
) -> Load:
    """Count one scanned instance's load (``gate`` None: reservations unknown).

    ``observed_at`` is when the scan's run state was read (gate clock; default now): a
    reservation made after it is never judged by it.
    """
    summary = sc.summary()
    running_ids = frozenset(s.id for s in sc.sessions if s.running)
    reserved: int | None = 0
    if sc.reachable:
        reserved = (
            None
            if gate is None
            else len(gate.pending(sc.inst.name, set(running_ids), observed_at))
        )
    used = summary.running_project + (reserved or 0)
    if not sc.reachable:
        ok, reason = False, f"unreachable: {sc.reason}"
    elif sc.run_state_unknown:
        ok, reason = False, f"counted full: run state unknown ({sc.run_state_unknown})"
    elif sc.inst.production and not allow_prod:
        ok, reason = False, "production instance (needs --allow-prod)"
    elif used >= summary.limit:
        shown = "?" if reserved is None else reserved
        ok, reason = False, f"full ({summary.running_project} running + {shown} reserved)"
    elif reserved is None:
        ok, reason = False, "reservations unknown (the shared gate is unreachable)"
    else:
        ok, reason = True, f"{summary.limit - used} free slot(s)"
    if sc.reachable and summary.waiting:
        from xaf_hub.core.runstate import waiting_count

        reason = f"{reason}; {waiting_count(summary.waiting)}"
    return Load(
        sc.inst.name,
        sc.reachable,
        summary.running_total,
        summary.running_project,
        reserved,
        summary.project_sessions,
        summary.limit,
        ok,
        reason,
        running_ids,
        sc.run_state_unknown,
        summary.waiting,
    )
