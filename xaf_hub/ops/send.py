"""Send work: the one path every prompt takes, for commands and patrol jobs alike.

``send_work`` carries out a ``planner.Plan`` under the instance lock: re-read, re-count, steer a
session still running, else refuse at the limit or a daily budget (exit 3) before anything is
reserved. A prompt certainly not delivered gives its slot back, one of unknown fate keeps it; a
lost lock sends nothing; every outcome is audited (docs/architecture.md §6, step 4).
``abort_and_prompt`` and ``build_prompt`` (the task plus ``xaf_hub.core.discipline``) live here
too: this is the only module that calls ``OpencodeClient.prompt_async``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.discipline import BranchState, compose_prompt, slugify
from xaf_hub.core.records import Room, SessionRecord
from xaf_hub.errors import (
    ApiError,
    BusyError,
    HubError,
    LockLostError,
    NotProjectSession,
    RoomFailed,
    RunsAgain,
    RunStateUnknown,
    StateFileError,
    UnreachableError,
)
from xaf_hub.fleet.client import OpencodeClient
from xaf_hub.fleet.scan import InstanceScan, scan_fleet, scan_instance
from xaf_hub.ops import budget
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.load import instance_load
from xaf_hub.ops.planner import Plan
from xaf_hub.ops.rooms import close_room, open_room, start_room
from xaf_hub.store.gate import PROMPT_SENT, Gate, Reservation

# How long to wait for an aborted retry to go idle before sending the new prompt.
ABORT_SETTLE_SECONDS = 10.0


def build_prompt(
    ops: OpsContext, inst: InstanceConfig, text: str, title: str, override: str | None = None,
    branch: BranchState = "new", *, room: bool = False,
) -> str:
    """Task text plus the discipline block for ``inst``, or for a task in a worktree of its
    own (``room``): the one place prompts are built; ``branch``: where the feature branch
    stands ("new" for a new session's first prompt)."""
    return compose_prompt(
        text,
        "worktree" if room else "mainline" if inst.branch_policy == "mainline" else "branch",
        base_branch=ops.cfg.patrol.base_branch,
        slug=slugify(title or text),
        override=override,
        branch=branch,
    )


def pool_discipline(ops: OpsContext) -> tuple[str | None, str]:
    """The discipline override of the project's prompts (``Config.discipline_or``), and why the
    pool's could not be read ("" when it could).

    A corrupt pool never stops a send: the prompt then carries the default discipline.
    """
    if ops.cfg.discipline is not None:
        return ops.cfg.discipline, ""
    try:
        return ops.backlog().load().discipline, ""
    except StateFileError as exc:
        return None, f"task pool unreadable, prompts use the default discipline: {exc}"


@dataclass(frozen=True)
class SendResult:
    """What was done, and what the caller should tell a person."""

    action: str  # steer | reuse | create
    instance: str
    session_id: str
    directory: str
    title: str
    model: str | None
    steered_instead: bool = False  # planned as an idle restart, found running: steered
    had_stopped: bool = False  # planned as a steer, found stopped: started again via the gate
    room: Room | None = None  # the new session's own worktree (project.isolation "worktree")
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, object]:
        """The JSON form (warnings go to stderr, not into the document)."""
        doc = {k: v for k, v in self.__dict__.items() if k not in ("warnings", "room")}
        return {**doc, "branch": self.room.branch if self.room is not None else None}


async def send_work(
    ops: OpsContext, plan: Plan, prompt: str, model: str | None, client: OpencodeClient,
    gate: Gate | None = None, *, command: str = "dispatch",
    before_prompt: Callable[[str, Room | None], None] | None = None, steer: bool = True,
    still_wanted: Callable[[], str] | None = None,
) -> SendResult:
    """Send the prompt under the instance lock: re-read, re-count, reserve, create, prompt.

    ``before_prompt(session_id, room)`` runs once the target session is known and before the
    prompt is sent, so work is recorded before it is sent; when it raises nothing is sent (and a
    worktree made for it is removed). A reused session found running is steered, or with
    ``steer=False`` raises RunsAgain; so does a reason from ``still_wanted``, asked under the lock.
    """
    gate = gate if gate is not None else ops.gate()
    inst = plan.instance
    warnings: list[str] = []
    try:
        async with ops.audited(command, instance=inst.name,
                               session=plan.session.id if plan.session else ""):
            result = await _gated(ops, plan, prompt, model, client, gate, warnings,
                                  before_prompt, steer, still_wanted)
    finally:
        warnings.extend(gate.warnings)
        gate.warnings.clear()
    try:
        await aio.blocking(
            ops.audit, command, instance=inst.name, session=result.session_id, result=result.action,
            reason=plan.via + (" (it had stopped)" if result.had_stopped else ""),
            extra={"model": model or "", "directory": result.directory},
        )
    except HubError as exc:
        # The work is sent: failing now would make the caller think it was not.
        warnings.append(f"the audit log could not record this dispatch: {exc}")
    return SendResult(**{**result.__dict__, "warnings": tuple(warnings)})


def _lock_lost(
    gate: Gate, instance: str, step: str, session_id: str, why: str = ""
) -> LockLostError:
    """The exit-3 error of a process whose dispatch lock, or whose patrol lease (an HA patrol
    daemon's fence), stopped being its own before sending.

    Nothing was sent, so this dispatch cannot have pushed the instance over its limit.
    """
    target = f"session {session_id}" if session_id else "a new session"
    done = "its reservation was given back" if step == "before sending" else "nothing was reserved"
    if gate.fenced_out(instance):
        return LockLostError(
            f"{instance}: this patrol daemon lost the patrol lease {step} (another daemon is "
            f"active and does the patrol's work now); nothing was sent to {target} and {done}"
        )
    cause = why or (
        "another process may hold it now: its lease ran out while this process was paused "
        "or cut off from the lock's server, or that server lost its keys"
    )
    return LockLostError(
        f"{instance}: the dispatch lock was lost {step} ({cause}); nothing was sent to "
        f"{target} and {done}, so this dispatch took no slot - retry"
    )


def _confirm(gate: Gate, instance: str, step: str, session_id: str) -> None:
    """Raise LockLostError unless the lock is still this process's (asked at this moment)."""
    try:
        owned = gate.owns_lock(instance)
    except UnreachableError as exc:
        why = f"could not ask whether it is still ours: {exc.reason}"
        raise _lock_lost(gate, instance, step, session_id, why) from None
    if not owned:
        raise _lock_lost(gate, instance, step, session_id)


def _reserve(gate: Gate, inst: InstanceConfig, session_id: str, new: bool = False) -> Reservation:
    """A slot on ``inst``: for a new session (``new``), else tied to ``session_id`` with its
    prompt counted as sent; LockLostError (nothing reserved) when the lock is no longer ours."""
    try:
        if new:
            return gate.reserve(inst.name, project=inst.project)
        return gate.reserve(inst.name, session_id, PROMPT_SENT, inst.project)
    except LockLostError:
        raise _lock_lost(gate, inst.name, "before reserving", session_id) from None


Others = tuple[budget.Spend, budget.Spend]  # the other instances' (project, fleet) spend today


async def _others_spend(ops: OpsContext, inst: InstanceConfig) -> tuple[Others | None, list[str]]:
    """The rest of the fleet's spend today, the project's and every project's, when a budget
    across instances is set (else None).

    An instance that does not answer adds nothing and is named in a warning.
    """
    if ops.cfg.budget.daily_usd is None and ops.cfg.project_budget_usd is None:
        return None, []
    others = [i for i in ops.cfg.instances if i.name != inst.name]
    _, scans = (
        await scan_fleet(ops.cfg, others, transport_factory=ops.transport_factory,
                         project_only=True)
        if others else (None, [])
    )
    spent = budget.spends(ops.cfg, scans, ops.now()).values()
    warnings = [
        f"{sc.inst.name} did not answer ({sc.reason}): its spend today is not counted "
        "against the daily budgets"
        for sc in scans if not sc.reachable
    ]
    return budget.totals(spent), warnings


def _check_budget(
    ops: OpsContext, inst: InstanceConfig, own: Sequence[SessionRecord], others: Others | None,
    sent: int = 0,
) -> None:
    """Raise BudgetReached when today's spend leaves no room for new work (ops.budget).

    ``sent``: prompts reserved on ``inst`` whose run the server does not show yet (in flight).
    """
    if not budget.guarded(ops.cfg, inst):
        return
    ceiling = budget.run_ceiling(ops.cfg, inst)
    now, tz = ops.now(), budget.zone(ops.cfg)
    spent = budget.spend_today(own, now, tz, ceiling).with_sent(sent, ceiling)
    fleet = budget.spend_today(own, now, tz, ceiling, fleet=True).with_sent(sent, ceiling)
    rest, rest_fleet = others or (None, budget.Spend())
    refused = budget.refusal(ops.cfg, inst, spent, rest, fleet + rest_fleet)
    if refused is not None:
        raise refused


async def _fresh_scans(
    ops: OpsContext, client: OpencodeClient, inst: InstanceConfig
) -> tuple[InstanceScan, Others | None, list[str]]:
    """This instance's fresh scan (its failure raised), and the others' spend when a budget
    needs it."""
    fresh, (others, notes) = await asyncio.gather(
        scan_instance(client, inst, project_only=True), _others_spend(ops, inst)
    )
    if not fresh.reachable:
        raise fresh.failure()
    return fresh, others, notes


@contextlib.asynccontextmanager
async def held(gate: Gate, instance: str) -> AsyncIterator[None]:
    """``gate``'s lock for async code: waits for it and gives it back in a worker thread, so the
    event loop runs on meanwhile; a caller cancelled while waiting holds nothing."""
    cm = gate.lock(instance)
    guard, state = threading.Lock(), {"taken": False, "gone": False}

    def take() -> None:
        cm.__enter__()
        with guard:
            state["taken"] = True
            if not state["gone"]:
                return
        cm.__exit__(None, None, None)  # its waiter was cancelled meanwhile

    try:
        await asyncio.to_thread(take)
    except BaseException:
        with guard:
            state["gone"] = True
            taken = state["taken"]
        if taken:
            await asyncio.to_thread(cm.__exit__, None, None, None)
        raise
    try:
        yield
    except BaseException as exc:
        if not await asyncio.to_thread(cm.__exit__, type(exc), exc, exc.__traceback__):
            raise
    else:
        await asyncio.to_thread(cm.__exit__, None, None, None)


@contextlib.asynccontextmanager
async def held_or_noted(
    gate: Gate, instance: str, notes: list[str], done: str, risk: str = ""
) -> AsyncIterator[None]:
    """``held``, or, when the lock cannot be had, on without it and a note in ``notes`` that
    the act was ``done`` without it (with the ``risk`` that brings)."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(held(gate, instance))
        except HubError as exc:
            notes.append(f"{done} without {instance}'s dispatch lock ({exc}){risk}")
        yield


async def _gated(
    ops: OpsContext, plan: Plan, prompt: str, model: str | None, client: OpencodeClient,
    gate: Gate, warnings: list[str],
    before_prompt: Callable[[str, Room | None], None] | None = None, steer: bool = True,
    still_wanted: Callable[[], str] | None = None,
) -> SendResult:
    inst = plan.instance
    planned = plan.session.id if plan.session is not None else ""
    async with held(gate, inst.name):
        # Re-read the running state under the lock: the plan was made without it. The read
        # judges only reservations made before it (observed_at), however slow it was.
        observed = await aio.blocking(gate.clock)
        fresh, others, notes = await _fresh_scans(ops, client, inst)
        if fresh.run_state_unknown:  # fail closed: no slot is known to be free, none is taken
            raise RunStateUnknown(inst.name, fresh.run_state_unknown)
        warnings.extend(fresh.warnings)
        await aio.blocking(_confirm, gate, inst.name, "before its load was counted", planned)
        load = await aio.blocking(instance_load, fresh, gate, allow_prod=True,
                                  observed_at=observed)
        session = plan.session if plan.action in ("reuse", "steer") else None
        if still_wanted is not None and (why := await aio.blocking(still_wanted)):
            raise RunsAgain(f"session {planned} on {inst.name}: {why}")
        if session is not None and session.id in load.running_ids:
            if not steer:
                raise RunsAgain(
                    f"session {session.id} on {inst.name} runs again: it was acted on since it "
                    "was judged (another daemon, a late prompt or a person), so nothing was sent"
                )
            # Running: the prompt steers it and takes no slot. The reservation tied to it
            # counts only if the run ends while the prompt travels and the prompt starts it
            # again (it is not running then), until the server shows that run.
            res = await aio.blocking(_reserve, gate, inst, session.id)
            await _deliver(client, gate, res, prompt, model, before_prompt, warnings)
            return SendResult(
                "steer", inst.name, session.id, plan.directory, plan.title, model,
                steered_instead=plan.action != "steer",
            )
        stopped = plan.action == "steer"
        # New work: today's spend is checked here, under the lock, once for every caller.
        warnings.extend(notes)
        assert load.reserved is not None
        _check_budget(ops, inst, fresh.sessions, others, load.reserved)
        if not load.free:
            why = (f"session {planned} had stopped, so a prompt would start a new run; "
                   if stopped else "")
            running = load.running_project + load.running_others
            full = running + load.reserved >= inst.concurrency_limit
            raise BusyError(
                f"{inst.name} is at its limit: {running} running + {load.reserved} reserved of "
                f"{inst.concurrency_limit}; {why}try later or steer a running session with "
                "--session" if full else f"{inst.name} is at its limit for {inst.project}: "
                f"{load.reason}; {why}try later"
            )
        res = await aio.blocking(_reserve, gate, inst, planned, new=True)
        session_id, directory = planned, plan.directory
        room: Room | None = None
        try:
            try:
                if plan.action == "create":
                    base_branch = ops.cfg.patrol.base_branch
                    if plan.room:
                        try:
                            room = await open_room(client, plan.directory, plan.room)
                        except RoomFailed as exc:
                            if not exc.unsupported:
                                raise
                            warnings.append(f"{exc}; this task shares the checkout")
                    where = room.directory if room is not None else plan.directory
                    created = await client.create_session(where, plan.title)
                    session_id, directory = created.id, created.directory
                    # Where the server placed it, links followed: never outside the project.
                    if room is not None and not plan.forced:
                        if not inst.rules.owns(directory, room.checkout):
                            raise await _outside(client, plan, (
                                f"made the worktree for {plan.directory} of "
                                f"{room.checkout or 'no checkout'} (its session in {directory})"
                            ))
                    elif not plan.forced and not fresh.rules().under_roots(directory):
                        raise await _outside(client, plan, (
                            f"placed the new session for {plan.directory} in "
                            f"{directory or 'no folder'}"
                        ), session_id, directory)
                    if room is not None:
                        room = await start_room(client, room, session_id, base_branch)
                # From here on the prompt may go out at any moment: "sent" keeps the slot
                # counting until the server shows the run (or the TTL), whatever this process
                # does.
                res = await aio.blocking(gate.attach, res, session_id, PROMPT_SENT)
            except LockLostError:
                await aio.blocking(gate.release, res)
                raise _lock_lost(gate, inst.name, "before sending", session_id) from None
            except BaseException:
                await aio.blocking(gate.release, res)
                raise
            await _deliver(client, gate, res, prompt, model, before_prompt, warnings, room)
        except BaseException as exc:
            # Whether the prompt may have reached the server despite ``exc``.
            maybe = (exc.maybe_delivered if isinstance(exc, UnreachableError)
                     else not isinstance(exc, HubError))
            if room is not None and not maybe:
                warnings.extend(await _empty_room(client, room, session_id))
            raise
    action = "reuse" if stopped else plan.action
    return SendResult(action, inst.name, session_id, directory, plan.title, model,
                      had_stopped=stopped, room=room)


async def _empty_room(client: OpencodeClient, room: Room, session_id: str) -> list[str]:
    """Take back a worktree (and the session made in it) whose prompt never went out."""
    notes = []
    if session_id:
        try:
            await client.delete(session_id, room.directory)
        except HubError as exc:
            notes.append(f"the empty session {session_id} in {room.directory} stays ({exc})")
    why = await close_room(client, room)
    return notes + ([why] if why else [])


async def _outside(
    client: OpencodeClient, plan: Plan, placed: str, session_id: str = "", directory: str = ""
) -> NotProjectSession:
    """The refusal of a new session the server ``placed`` outside the roots (it followed a
    link), deleted first as it never got a prompt; without ``session_id``, of a worktree whose
    checkout it resolved there (the caller removes it)."""
    done = " and the worktree is removed again"
    if session_id:
        try:
            await client.delete(session_id, directory)
            done = f" to {session_id} and it was deleted"
        except HubError as exc:
            done = f" to {session_id} and it stays, empty (delete failed: {exc})"
    roots = ", ".join(plan.instance.roots) or "none configured"
    return NotProjectSession(
        f"{plan.instance.name} {placed}, outside its project roots ({roots}): nothing was "
        f"sent{done}; --force overrides"
    )


async def _deliver(
    client: OpencodeClient, gate: Gate, res: Reservation, prompt: str, model: str | None,
    before_prompt: Callable[[str, Room | None], None] | None, warnings: list[str],
    room: Room | None = None,
) -> None:
    """Record the work, confirm the lock, send the prompt; settle the reservation.

    A prompt certainly not delivered (refused, never connected, lock lost before it left)
    gives the slot back. One whose fate is unknown (timeout, dropped connection, 5xx) keeps
    its reservation counting until the server shows the run or slot_ttl_seconds pass.
    """
    instance, session_id = res.instance, res.session_id

    def ready() -> None:
        if before_prompt is not None:
            before_prompt(session_id, room)
        _confirm(gate, instance, "before sending", session_id)

    try:
        await aio.blocking(ready)
    except BaseException:
        await aio.blocking(gate.release, res)
        raise
    try:
        await client.prompt_async(session_id, prompt, model)
    except (ApiError, UnreachableError) as exc:
        # A refusal (the server answered: nothing runs) or certainly never delivered.
        if isinstance(exc, ApiError) or not exc.maybe_delivered:
            await aio.blocking(gate.release, res)
            raise
        raise UnreachableError(
            exc.instance,
            f"{exc.reason}; the prompt to {session_id} may still arrive, so its slot stays "
            "reserved until the server shows the run or slot_ttl_seconds pass",
            maybe_delivered=True,
        ) from exc
    # Anything else (a cancel, a crash) leaves the reservation as it is: "sent".
    await aio.blocking(_settle, gate, res, warnings)


def _settle(gate: Gate, res: Reservation, warnings: list[str]) -> None:
    """After the prompt was answered: warn when the lock was lost while it travelled, and mark
    the reservation answered."""
    instance, session_id = res.instance, res.session_id
    try:
        lost = not gate.owns_lock(instance)
        kept = gate.holds(res) if lost else True
    except UnreachableError as exc:
        lost, kept = False, True  # unknown: say only that
        warnings.append(
            f"{instance}: could not confirm the dispatch lock after sending to {session_id} "
            f"({exc.reason}); its reservation counts the run until the server shows it or "
            "slot_ttl_seconds pass"
        )
    if lost and not kept:
        warnings.append(
            f"{instance}: the dispatch lock was lost and its reservation erased while the "
            f"prompt to {session_id} was on its way: another dispatch may have taken the same "
            "slot, so the limit may have been exceeded for one run"
        )
    elif lost:
        warnings.append(
            f"{instance}: the dispatch lock was lost while the prompt to {session_id} was on its "
            "way; its reservation kept counting, so the limit held"
        )
    try:
        gate.accepted(res)
    except HubError as exc:
        warnings.append(
            f"{instance}: could not mark the reservation for {session_id} as answered ({exc}); "
            "it keeps counting until the server shows the run or slot_ttl_seconds pass"
        )


async def wait_until_idle(
    client: OpencodeClient, directory: str, session: str, timeout: float
) -> bool:
    """Poll the directory's status until ``session`` is no longer running (or timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        if session not in await client.status(directory):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.2)


async def abort_and_prompt(
    ops: OpsContext, inst: InstanceConfig, session: str, directory: str, prompt: str, model: str,
    *, command: str, reason: str, still_wanted: Callable[[], str] | None = None,
) -> None:
    """Abort a running session and send a new prompt while holding the instance's gate lock.

    The re-send is new work: it is refused like a dispatch when a daily budget is reached.
    The session holds a slot while it runs; holding the lock across abort -> prompt, and a
    reservation tied to the session from before the abort until the new run shows, keep any
    other dispatch from taking that slot in between. The prompt goes out as in ``send_work``
    (lock confirmed right before it; an unknown delivery keeps the reservation).
    ``still_wanted`` is asked first under the lock, as in ``send_work`` (RunsAgain).
    """
    gate = ops.gate()
    warnings: list[str] = []
    async with (
        ops.audited(command, instance=inst.name, session=session),
        ops.client(inst) as client,
        held(gate, inst.name),
    ):
        if still_wanted is not None and (why := await aio.blocking(still_wanted)):
            raise RunsAgain(f"session {session} on {inst.name}: {why}")
        if budget.guarded(ops.cfg, inst):
            fresh, others, notes = await _fresh_scans(ops, client, inst)
            warnings.extend(notes)
            _check_budget(ops, inst, fresh.sessions, others)
        res = await aio.blocking(_reserve, gate, inst, session)
        try:
            await client.abort(session, directory)
            await wait_until_idle(client, directory, session, ABORT_SETTLE_SECONDS)
        except BaseException:
            await aio.blocking(gate.release, res)
            raise
        await _deliver(client, gate, res, prompt, model, None, warnings)
    await aio.blocking(
        ops.audit, command, instance=inst.name, session=session, result="abort+prompt",
        reason=reason,
        # No caller prints this heal's warnings (a lock lost while its prompt travelled).
        extra={"model": model, **({"warnings": "; ".join(warnings)} if warnings else {})},
    )

