"""A person stops a session's run: find it, apply the production and project guards, abort.

The decision is recorded (audit, and Redis with the Redis stores) before the abort and under the
instance's dispatch lock, and kept even when the abort fails, so the patrol never undoes it
(docs/architecture.md §8).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xaf_hub.core import aio
from xaf_hub.core.records import find_session
from xaf_hub.errors import HubError, MissingPassword, UnreachableError, UsageError
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.planner import check_write
from xaf_hub.ops.send import held_or_noted
from xaf_hub.store.audit import who

if TYPE_CHECKING:
    from xaf_hub.core.records import SessionRecord
    from xaf_hub.fleet.instance_scan import InstanceScan


@dataclass(frozen=True)
class Interrupted:
    """The session that was stopped and what it was doing."""

    instance: str
    session_id: str
    was: str  # its run state before: busy | retry | idle
    note: str = ""  # why other hosts' patrols may not know of it ("" = they do)

    @property
    def running(self) -> bool:
        """Whether it was running when stopped."""
        return self.was != "idle"


async def interrupt_session(
    ops: OpsContext, session_id: str, *, instance: str | None = None, allow_prod: bool = False,
    force: bool = False,
) -> Interrupted:
    """Find ``session_id`` (on ``instance``, or anywhere) and abort its run."""
    sc, session = await locate(ops, session_id, instance)
    check_write(sc.inst, session, allow_prod=allow_prod, force=force)
    was = "was " + session.run_state
    notes: list[str] = []
    # a patrol's heal or resume re-reads people's decisions under this lock
    risk = ": a heal or resume under way at this moment may start the session again"
    async with held_or_noted(ops.gate(), sc.inst.name, notes, "stopped", risk):
        await aio.blocking(ops.audit, "interrupt", instance=sc.inst.name, session=session.id,
                           result="stopping", reason=was)
        shared = await aio.blocking(_share, ops, sc.inst.name, session.id, notes)
        async with (
            ops.audited("interrupt", instance=sc.inst.name, session=session.id),
            ops.client(sc.inst) as client,
        ):
            await client.abort(session.id, session.directory)
        await aio.blocking(ops.audit, "interrupt", instance=sc.inst.name, session=session.id,
                           result="aborted", reason=was)
        if shared:  # again, with the time the run stopped (the later time, as the audit has)
            await aio.blocking(_share, ops, sc.inst.name, session.id, notes)
    note = "; ".join(ops.redact(n) for n in notes)
    return Interrupted(sc.inst.name, session.id, session.run_state, note)


def _share(ops: OpsContext, instance: str, session: str, notes: list[str]) -> bool:
    """Keep the interrupt where a patrol on any host reads it (Redis stores); False and a note
    when that failed."""
    try:
        ops.stores.record_interrupt(instance, session, time.time(), who(ops.env))
    except HubError as exc:
        notes.append(
            f"the interrupt is recorded on this host only ({exc}): a patrol daemon on another "
            "host may resume the session"
        )
        return False
    return True


async def locate(
    ops: OpsContext, session_id: str, instance: str | None = None
) -> tuple[InstanceScan, SessionRecord]:
    """The session ``session_id`` names (its id, or the start of one) with the scan of its
    instance: on ``instance``, or on any; ``session_not_found``'s error when none has it."""
    _, scans = await ops.scan_named(instance)
    hit = find_session(((sc, sc.sessions) for sc in scans), session_id)
    if hit is None:
        down = [sc.failure() for sc in scans if not sc.reachable]
        raise session_not_found(session_id, down, instance)
    return hit


def session_not_found(
    session_id: str, down: Sequence[UnreachableError], instance: str | None = None
) -> HubError:
    """The error for a session no instance answered for; ``down``: why each that did not.

    While any instance did not answer, "not found" is not known: that is exit 2 (unreachable)
    naming where the session may be, not exit 4; a missing password comes first (a config
    fix, whatever else failed). ``instance``: the one asked (--instance).
    """

    if not down:
        return UsageError(f"session {session_id} not found on {instance or 'any instance'}")
    missing = [e for e in down if isinstance(e, MissingPassword)]
    if missing:
        return missing[0]
    names = ", ".join(e.instance for e in down)
    each = "; ".join(f"{e.instance}: {e.reason}" for e in down)
    reason = down[0].reason if len(down) == 1 else each
    return UnreachableError(
        names, f"{reason} (session {session_id} was not found where asked; it may be there)"
    )
