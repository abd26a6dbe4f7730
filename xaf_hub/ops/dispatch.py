"""A person's dispatch: find the right session or instance, then send through the gate.

``prepare`` builds everything ``dispatch --dry-run`` shows; ``send_prepared`` records the work in
the task pool (one row per piece of work) and sends it, taking the record back only if the prompt
certainly never arrived (docs/architecture.md §6).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from xaf_hub.config.load import Config
from xaf_hub.core import aio
from xaf_hub.core.cues import named_files, refers_back
from xaf_hub.core.discipline import base_commit, expected_branches
from xaf_hub.core.matcher import Evidence, Index, holds
from xaf_hub.core.records import Room, SessionRecord
from xaf_hub.core.rules import apply_aliases
from xaf_hub.errors import ApiError, BusyError, UnreachableError, UsageError
from xaf_hub.fleet.scan import InstanceScan
from xaf_hub.fleet.wire import SessionTrace, session_trace
from xaf_hub.ops import budget
from xaf_hub.ops.cleanup import cleanup_fleet
from xaf_hub.ops.context import OpsContext, utc_now
from xaf_hub.ops.live_board import board_or_scan, source_of
from xaf_hub.ops.load import instance_load
from xaf_hub.ops.models import choose_model
from xaf_hub.ops.planner import DispatchRequest, InstanceView, MatchEvidence, Plan, plan_dispatch
from xaf_hub.ops.rooms import in_room, room_name
from xaf_hub.ops.send import SendResult, build_prompt, send_work
from xaf_hub.store.pool import ManualRecord
from xaf_hub.store.repository import GitFailed, Mirror
from xaf_hub.store.tasks import Task, new_task_id


@dataclass(frozen=True)
class DispatchOrder:
    """What a person asked ``dispatch`` to do (the typed form of its options)."""

    request: DispatchRequest
    record: bool = True  # record the work in the task pool
    auto_cleanup: bool = False  # run `cleanup --execute` first
    dry_run: bool = False
    confirm_wait: float | None = None  # seconds to wait for the run after sending
    fresh: bool = False  # plan from a scan of every instance, never from the live board

    @property
    def baseline(self) -> bool:
        """Read the session's newest message before sending (to tell this run's messages)."""
        return self.confirm_wait is not None

    @property
    def smart(self) -> bool:
        """True when the target is chosen by similarity."""
        req = self.request
        return not (req.session or req.title or req.new or req.no_match)


@dataclass(frozen=True)
class Prepared:
    """The plan and everything shown before a send."""

    plan: Plan
    view: InstanceView
    model: str | None
    prompt: str
    warnings: tuple[str, ...] = ()
    base: str | None = None  # the expected branch's tip for a new session's row
    source: str = "scan"  # the fleet as planned from: "live" (the live board), "mixed", "scan"
    task_id: str = ""  # a new row's id, chosen before its worktree is named after it


@dataclass(frozen=True)
class Dispatched:
    """A sent dispatch: the send's result, its pool row and the message before it."""

    result: SendResult
    task_id: str = ""
    baseline: str | None = None
    warnings: tuple[str, ...] = field(default=())


def project_for(
    cfg: Config, named: str | None, directory: str | None, instance: str | None, cwd: str
) -> str | None:
    """The project a dispatch is for: ``named``; else the config's chosen one; else the one
    whose roots hold the folder it is sent to (``directory``), or when none is given the folder
    it is run from (``cwd``, through each instance's ``dir_aliases``). None: the chosen one.
    UsageError naming the projects when no single one does."""
    if named or cfg.chosen:
        return named
    folder, what = (directory, "--dir") if directory else (cwd, "the folder it is run from")
    insts = [cfg.instance(instance)] if instance else cfg.instances
    found = [
        p.name for p in cfg.projects
        if any(p.rules(i.name).under_roots(apply_aliases(folder, dict(i.dir_aliases)))
               for i in insts)
    ]
    if len(found) == 1:
        return found[0]
    held = f"lies under the roots of {', '.join(found)}" if found else "is under no project's roots"
    raise UsageError(
        f"which project is this for? {what} ({folder}) {held}: say --project NAME "
        f"(configured: {cfg.project_names()})"
    )


def session_tasks(tasks: Sequence[Task]) -> dict[tuple[str, str], tuple[str, ...]]:
    """(instance, session id) -> the task texts the hub sent into that session (pool rows)."""
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for task in tasks:
        if task.session_id:
            key = (task.dispatched_to or task.instance, task.session_id)
            out[key] = out.get(key, ()) + tuple(t for t in task.texts() if t.strip())
    return out


# The candidates whose own messages are read before the decision: the prompts typed
# into them and the files their tools touched. A request each, so only the best few, their
# newest messages, and never longer than a dispatch should wait for a hint.
READ_CANDIDATES = 3
TRACE_MESSAGES = 40
TRACE_SECONDS = 5.0


def match_candidates(
    scans: Sequence[InstanceScan], text: str, sent: dict[tuple[str, str], tuple[str, ...]],
    traces: Mapping[tuple[str, str], SessionTrace] | None = None,
) -> tuple[list[tuple[SessionRecord, float]], list[MatchEvidence]]:
    """The matcher's top candidates for ``text`` among the project sessions, with what each
    shares with it. A session's evidence is its title, folder (relative to its root), the
    task texts the hub sent into it (``sent``) and, where read (``traces``), the prompts, files,
    todo items and newest reply its own messages show."""

    traces = traces or {}
    pool: dict[str, tuple[SessionRecord, Evidence, SessionTrace | None]] = {}
    docs = []
    for sc in scans:
        if not sc.reachable:
            continue
        relative: dict[str, str] = {}  # many sessions share a directory
        for s in sc.sessions:
            if s.project:
                key = f"{s.instance}\x00{s.id}"
                if s.directory not in relative:
                    relative[s.directory] = sc.inst.rules.relative(s.directory)
                known = Evidence(s.title, relative[s.directory], sent.get((s.instance, s.id), ()))
                trace = traces.get((s.instance, s.id))
                if trace is not None:
                    known = known.adding(trace.prompts, trace.files, _said(trace))
                docs.append((key, known))
                pool[key] = (s, known, trace)
    index = Index(docs)
    found = index.rank(text, top=5)
    back = refers_back(text)
    evidence = []
    for c in found:
        s, known, trace = pool[c.key]
        shared = tuple(index.shared(text, c.key))
        told = sent.get((s.instance, s.id), ())
        texts = len(set(told) | set(trace.prompts)) if trace is not None else len(told)
        evidence.append(
            MatchEvidence(
                shared,
                _naming(trace.files if trace else (), shared),
                tasks=texts,
                # Files it only read, listed or was shown are not its work: not named.
                named=named_files(text, known.tasks, trace.changed if trace else ()),
                refers_back=back,
                todos=tuple([t for t in trace.todos if holds(t, shared)][:2]) if trace else (),
            )
        )
    return [(pool[c.key][0], c.score) for c in found], evidence


def _said(trace: SessionTrace) -> tuple[str, ...]:
    """The agent's own words of a read session: its todo items and its newest reply."""
    return (*trace.todos, trace.reply) if trace.reply else trace.todos


def _naming(files: Sequence[str], words: Sequence[str], limit: int = 3) -> tuple[str, ...]:
    """The files whose path holds one of ``words`` (what a person checks a match by)."""
    low = [w.lower() for w in words if len(w) > 1]
    return tuple([f for f in files if any(w in f.lower() for w in low)][:limit])


async def read_traces(
    ops: OpsContext, sessions: Sequence[SessionRecord]
) -> dict[tuple[str, str], SessionTrace]:
    """The prompts and files of each session's newest messages, read at once; a session that
    cannot be read in time is left out (it keeps the evidence the hub has)."""
    async def one(s: SessionRecord) -> tuple[tuple[str, str], SessionTrace] | None:
        try:
            inst = ops.cfg.instance(s.instance)
            async with asyncio.timeout(TRACE_SECONDS), ops.client(inst) as client:
                found = await client.messages(s.id, limit=TRACE_MESSAGES, directory=s.directory)
            return (s.instance, s.id), session_trace(found, s.directory)
        except Exception:  # noqa: BLE001 - gone, unreachable, refused, malformed, late: a hint
            return None

    return dict(got for got in await aio.gather(*(one(s) for s in sessions)) if got is not None)


async def rank_candidates(
    ops: OpsContext, scans: Sequence[InstanceScan], text: str, tasks: Sequence[Task]
) -> tuple[list[tuple[SessionRecord, float]], list[MatchEvidence]]:
    """Rank on what the hub knows, read the best few candidates' own messages, rank again."""
    sent = session_tasks(tasks)
    scores, evidence = match_candidates(scans, text, sent)
    if not scores:
        return scores, evidence
    traces = await read_traces(ops, [s for s, _ in scores[:READ_CANDIDATES]])
    if not traces:
        return scores, evidence
    return match_candidates(scans, text, sent, traces)


async def prepare(ops: OpsContext, order: DispatchOrder) -> Prepared:
    """Scan, plan, choose the model and build the prompt; sends nothing."""
    cfg, req = ops.cfg, order.request
    if order.auto_cleanup and not order.dry_run:
        await cleanup_fleet(ops, execute=True, ttl_days=cfg.session_ttl_days,
                            instance=req.instance, allow_prod=req.allow_prod)
    smart = order.smart and cfg.auto_match
    instances = [cfg.instance(req.instance)] if req.instance else list(cfg.instances)
    gate = ops.gate()
    observed = await aio.blocking(gate.clock)  # the scan judges only reservations made before it
    # Where the live board is fresh it stands for the scan (ops.live_board): the send still
    # re-reads the server under the instance's lock. Its view is as old as its confirmation,
    # so it judges only reservations made before that.
    snap, scans, board = await board_or_scan(
        cfg, instances, fresh=order.fresh, transport_factory=ops.transport_factory,
        project_only=True, stores=ops.stores,
    )
    observed -= board.age
    views = []
    over = budget.over_budget(cfg, scans, ops.now())
    for sc in scans:
        load = await aio.blocking(instance_load, sc, gate, allow_prod=True, observed_at=observed)
        reserved = (load.reserved or 0) if sc.reachable else 0
        views.append(InstanceView(
            sc.inst, sc.reachable, sc.reason, tuple(sc.sessions), reserved, sc.run_state_unknown,
            over_budget=str(over.get(sc.inst.name) or ""), sandboxes=sc.project_sandboxes(),
            cause=sc.cause, free=load.free,
        ))
    pool = await aio.blocking(ops.backlog().load)
    scores, evidence = (
        await rank_candidates(ops, scans, req.text, pool.tasks) if smart else ([], [])
    )
    plan = plan_dispatch(cfg, views, req, scores, evidence)
    warnings = [*plan.warnings, *snap.warnings]
    override = cfg.discipline_or(pool.discipline)
    task_id = ""
    if plan.action == "create" and cfg.repository.isolation == "worktree" and order.record:
        task_id = new_task_id(ops.now(), (t.id for t in pool.tasks))
        plan = replace(plan, room=room_name(task_id, plan.title))
    room = bool(plan.room) or in_room(plan.instance, plan.session)
    model = choose_model(ops, plan.instance, req.model)
    if req.model and model != req.model:
        warnings.append(
            f"model {req.model} is blacked out (rate limit); using {model or 'server default'}"
        )
    prompt = build_prompt(ops, plan.instance, req.text, plan.title, override,
                          "new" if plan.action == "create" else "unknown", room=room)
    view = next(v for v in views if v.inst.name == plan.instance.name)
    return Prepared(plan, view, model, prompt, tuple(warnings), _base(ops, plan, req, override),
                    source_of(len(board.scans), len(scans)), task_id)



async def send_prepared(
    ops: OpsContext, prep: Prepared, order: DispatchOrder, warn: Callable[[str], None]
) -> Dispatched:
    """Record the work in the pool, then send it; on failure take the row back if safe.

    ``warn`` hears what a person must know when the send fails (the failure is raised).
    """
    plan, req = prep.plan, order.request
    backlog = ops.backlog()
    recorded: list[ManualRecord] = []

    def record(session_id: str, room: Room | None) -> None:
        # Recorded before the prompt goes out (as the patrol does): a crash in between leaves
        # a pool row for work not yet sent, which the patrol settles, never work running
        # without a row.
        if order.record:
            recorded.append(backlog.record_manual_dispatch(
                req.text, session_id, plan.instance.name, prep.model, utc_now(),
                base=room.base if room is not None else prep.base, task_id=prep.task_id,
                room=room, project=ops.cfg.project_name,
            ))

    try:
        async with ops.client(plan.instance) as client:
            baseline = None
            if order.baseline and plan.session is not None:
                # The newest message before the send: what comes after it is this run.
                newest = await client.messages(plan.session.id, limit=1)
                baseline = newest[-1].id if newest else ""
            result = await send_work(
                ops, plan, prep.prompt, prep.model, client, before_prompt=record
            )
    except BaseException as exc:
        for rec in recorded:
            take_back(ops, rec, exc, warn)
        raise
    return Dispatched(result, recorded[0].task.id if recorded else "", baseline, result.warnings)


def _base(ops: OpsContext, plan: Plan, req: DispatchRequest, override: str | None) -> str | None:
    """A new row's base from the hub's mirror as it stands (no fetch: a dispatch does not wait
    for the remote); None without a repository, a mirror or a readable one: "base unknown"."""
    cfg = ops.cfg
    if not cfg.repository.url or plan.action != "create":
        return None
    mirror = Mirror.of(cfg)
    try:
        tips = mirror.known_tips()
    except (GitFailed, OSError):
        return None
    base = cfg.patrol.base_branch
    branches = expected_branches(plan.instance.branch_policy == "mainline", base_branch=base,
                                 titles=[plan.title or req.text], override=override)
    return base_commit(tips, branches, base)


def take_back(
    ops: OpsContext, rec: ManualRecord, exc: BaseException, warn: Callable[[str], None]
) -> None:
    """After a failed send, undo the pool record unless the prompt may have arrived.

    A new row is dropped; a row the prompt was added to loses that prompt again.

    The command fails and says so; a row for work that never arrived would make the patrol
    send it later behind the user's back. A row for work that may have arrived stays: the
    patrol settles it from what the session shows. ``send_work`` raises BusyError (the
    limit, a lock timeout, a lock lost before the prompt left) only before sending.
    """
    task_id = rec.task.id
    refused = isinstance(exc, (ApiError, BusyError)) or (
        isinstance(exc, UnreachableError) and not exc.maybe_delivered
    )
    if not refused:
        warn(
            f"task {task_id} stays in the task pool: the prompt may have reached the server, "
            "and the patrol will settle it from what the session shows "
            f"(xaf-hub backlog set {task_id} --status done keeps it from being sent again)"
        )
        return
    try:
        ops.backlog().take_back(rec)
    except Exception as problem:  # noqa: BLE001 - the original failure is what gets raised
        warn(
            f"task {task_id} could not be taken back from the task pool ({problem}); "
            f"xaf-hub backlog set {task_id} --status done keeps the patrol from sending it"
        )
