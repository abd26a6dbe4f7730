"""Dispatch planning: snapshot + request -> plan (architecture §6 `dispatch` steps 1-3). Pure.

The planner decides *where* work goes; the dispatcher carries the plan out under the gate.
Similarity scores come in from the matcher, so this module never imports scikit-learn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from xaf_hub.config.load import Config, InstanceConfig, MatchRule
from xaf_hub.core.records import SessionRecord, find_session, running_project
from xaf_hub.core.rules import apply_aliases, clean_dir, normalize_dir
from xaf_hub.errors import (
    BudgetReached,
    BusyError,
    Cause,
    NotProjectSession,
    ProductionRefused,
    UnreachableError,
    UsageError,
)

Action = Literal["steer", "reuse", "create"]


@dataclass(frozen=True)
class DispatchRequest:
    """What the operator (or the patrol) asked for."""

    text: str
    instance: str | None = None
    session: str | None = None
    directory: str | None = None
    title: str | None = None
    new: bool = False
    no_match: bool = False
    allow_prod: bool = False
    force: bool = False
    model: str | None = None


@dataclass(frozen=True)
class InstanceView:
    """One instance as the planner sees it."""

    inst: InstanceConfig
    reachable: bool
    reason: str
    sessions: tuple[SessionRecord, ...]
    reserved: int = 0
    run_state_unknown: str = ""  # set: the run state could not be read; counted full
    over_budget: str = ""  # set: its daily budget is reached (the refusal); takes no new work
    sandboxes: tuple[str, ...] = ()  # the project's worktrees the server lists: inside
    cause: Cause | None = None  # why it is unreachable, as a code
    free: int = 0  # free slots, as the gate counts them (``ops.load.Load.free``)

    @property
    def running_project(self) -> int:
        """Running project sessions."""
        return running_project(self.sessions)

    @property
    def project_count(self) -> int:
        """Project sessions."""
        return sum(1 for s in self.sessions if s.project)


@dataclass(frozen=True)
class MatchEvidence:
    """Why a session was a candidate, in words a person can check: the task's words it shares
    (with its title, the task texts sent into it, its files) and the files naming them."""

    shared: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    tasks: int = 0  # task texts of the hub's known for the session
    named: tuple[str, ...] = ()  # the session's files the task names (core.cues)
    refers_back: str = ""  # the task's word that refers back to earlier work (core.cues)
    todos: tuple[str, ...] = ()  # the items of its agent's todo list holding a shared word

    def to_json(self) -> dict[str, object]:
        """Plain data for `dispatch --dry-run --json` and the MCP answer."""
        return {
            "shared_terms": list(self.shared),
            "files": list(self.files),
            "tasks": self.tasks,
            "named_files": list(self.named),
            "refers_back": self.refers_back,
            "todos": list(self.todos),
        }


@dataclass(frozen=True)
class CandidateVerdict:
    """One smart-match candidate and what the planner made of it."""

    session: SessionRecord
    score: float
    verdict: str
    margin: float = 0.0  # its lead over the next candidate
    evidence: MatchEvidence = field(default_factory=MatchEvidence)

    def to_json(self) -> dict[str, object]:
        """Plain data: the session, the score, the margin, the verdict and the evidence."""
        return {
            "instance": self.session.instance,
            "session_id": self.session.id,
            "title": self.session.title,
            "directory": self.session.directory,
            "running": self.session.running,
            "similarity": round(self.score, 4),
            "margin": round(self.margin, 4),
            "verdict": self.verdict,
            "evidence": self.evidence.to_json(),
        }


@dataclass(frozen=True)
class MatchVerdict:
    """Whether a candidate's evidence is strong enough, and why in words."""

    take: bool
    reason: str


# The least score of a candidate taken on a file the task names. A file's name alone shares a
# few n-grams (a new task that only mentions queue.ts: about 0.04); the labelled follow-ups
# that name a file score 0.10 and more (docs/matching.md).
NAMED_FLOOR = 0.05


def match_decision(
    rule: MatchRule, score: float, runner_up: float, *, running: bool,
    named: Sequence[str] = (), refers_back: str = "",
) -> MatchVerdict:
    """Is a candidate scoring ``score`` (the next one ``runner_up``) strong enough?

    A running session needs the ``steer`` threshold and margin, an idle one ``reuse`` and
    ``margin``; a task naming files only this session changed (``named``, at least ``NAMED_FLOOR``)
    continues it, one that refers back needs only ``cue`` and ``cue_margin``. When in doubt the
    work gets a new session (docs/matching.md).
    """
    if named and score >= NAMED_FLOOR:
        files = ", ".join(f.replace("\\", "/").rsplit("/", 1)[-1] for f in named)
        return MatchVerdict(True, f"the task names its file{'s' if len(named) > 1 else ''} {files}")
    need, lead = (rule.steer, rule.steer_margin) if running else (rule.reuse, rule.margin)
    what = "running: a steer" if running else "idle: a reuse"
    margin = score - runner_up
    if score >= need and margin >= lead:
        return MatchVerdict(True, f"{score:.3f} >= {need:.2f}, lead {margin:.3f} >= {lead:.2f}")
    if refers_back and score >= rule.cue and margin >= rule.cue_margin:
        return MatchVerdict(
            True,
            f"refers back ({refers_back!r}): {score:.3f} >= {rule.cue:.2f}, "
            f"lead {margin:.3f} >= {rule.cue_margin:.2f}",
        )
    if score < need:
        return MatchVerdict(False, f"below threshold ({what} needs {need:.2f})")
    return MatchVerdict(
        False, f"too close to the next candidate (lead {margin:.3f}; {what} needs {lead:.2f})"
    )


def named_first(evidences: Sequence[MatchEvidence], scores: Sequence[float]) -> int | None:
    """The one candidate whose files the task names, by index, when it scores at least
    ``NAMED_FLOOR``; None when none or several do (a file two candidates changed does not tell
    them apart), or when it scores less: a name and nothing else shared is a coincidence, and
    judged first it would stand in the way of a stronger candidate."""
    holders = [i for i, e in enumerate(evidences) if e.named]
    if len(holders) != 1 or scores[holders[0]] < NAMED_FLOOR:
        return None
    return holders[0]


def judging_order(
    scores: Sequence[float], evidences: Sequence[MatchEvidence]
) -> tuple[list[tuple[int, float]], int | None]:
    """The order candidates (in the matcher's order) are judged in, by index, each with the
    score its lead is taken over: the next candidate's in the matcher's order, whatever order
    they are judged in (the named one judged first does not leave the best a lead over the
    third when the named one was between them). Also the index of the one candidate judged
    first on a file the task names (``named_first``; None when none is)."""
    order = [(j, scores[j + 1] if j + 1 < len(scores) else 0.0) for j in range(len(scores))]
    first = named_first(evidences, scores)
    if first is not None:
        order.insert(0, order.pop(first))
    return order, first


@dataclass(frozen=True)
class Plan:
    """Where the work goes and how."""

    action: Action
    instance: InstanceConfig
    session: SessionRecord | None
    directory: str
    title: str
    via: str
    candidates: tuple[CandidateVerdict, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)
    forced: bool = False  # --force: a new session may lie outside the project's roots
    # A new session's own worktree to make first, by this name (``ops.rooms``); "": none.
    room: str = ""

    @property
    def gated(self) -> bool:
        """True when the plan takes a slot (new session or idle reuse)."""
        return self.action != "steer"


def plan_reuse(inst: InstanceConfig, session: SessionRecord, *, via: str) -> Plan:
    """Start ``session`` again (the patrol's resume and heal): gated like any idle reuse."""
    return Plan("reuse", inst, session, session.directory, session.title, via=via)


def plan_create(inst: InstanceConfig, directory: str, title: str, *, via: str) -> Plan:
    """A new session in ``directory`` (the patrol's fill_slots picks instance and directory)."""
    return Plan("create", inst, None, directory, title, via=via)


def default_title(text: str, width: int = 60) -> str:
    """A session title from the task's first non-empty line."""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "task")
    return first if len(first) <= width else first[: width - 1] + "…"


def check_write(
    inst: InstanceConfig, session: SessionRecord | None, *, allow_prod: bool, force: bool
) -> None:
    """The one guard of every write a person asks for: a production instance needs
    ``allow_prod`` (ProductionRefused), a session outside the project ``force``
    (NotProjectSession)."""
    if inst.production and not allow_prod:
        raise ProductionRefused(f"{inst.name} is a production instance: writes need --allow-prod")
    if session is not None and not session.project and not force:
        raise NotProjectSession(
            f"session {session.id} on {inst.name} is not a project session "
            f"({session.directory or 'no directory'}); --force overrides"
        )


def _check_reachable(view: InstanceView) -> None:
    if not view.reachable:
        raise view.inst.unreachable(view.reason, view.cause)


def pick_instance(views: Sequence[InstanceView]) -> InstanceView:
    """The least-loaded dispatchable instance: running project, project count, then name."""
    reachable = [v for v in views if v.reachable]
    candidates = [v for v in reachable if not v.inst.production and v.inst.roots]
    eligible = [v for v in candidates if v.free > 0 and not v.over_budget]
    if eligible:
        return min(eligible, key=lambda v: (v.running_project, v.project_count, v.inst.name))
    if not reachable:
        reasons = "; ".join(f"{v.inst.name}: {v.reason}" for v in views) or "no instances"
        raise UnreachableError.fleet_down(reasons)
    if not candidates:
        raise UsageError(
            "no instance can take new sessions: each is production or has no project roots "
            "(use --instance NAME --allow-prod, or add roots)"
        )
    if all(v.over_budget for v in candidates):
        # Every budget names its own instance (or none, the project's): one line, each said once.
        raise BudgetReached("; ".join(dict.fromkeys(v.over_budget for v in candidates)))
    detail = ", ".join(
        f"{v.inst.name} "
        + (v.over_budget or f"{v.running_project}+{v.reserved}/{v.inst.concurrency_limit}")
        for v in candidates
    )
    raise BusyError(f"every eligible instance is at its limit ({detail}); try again later")


def _written_dir(inst: InstanceConfig, written: str) -> str:
    """--dir made plain as text (`.` and `..` removed), then mapped by dir_aliases."""
    try:
        plain = clean_dir(written)
    except ValueError as exc:
        raise UsageError(f"--dir {written!r}: {exc}") from None
    return apply_aliases(plain, dict(inst.dir_aliases))


def new_session_directory(view: InstanceView, req: DispatchRequest) -> str:
    """--dir (made plain, after dir_aliases), else default_directory, else a root; one outside
    the roots is NotProjectSession unless --force."""
    inst = view.inst
    if req.directory:
        directory = _written_dir(inst, req.directory)
        named = f"--dir {req.directory!r}" + (
            f" ({directory})" if directory != req.directory else ""
        )
    elif inst.default_directory:
        directory, named = inst.default_directory, f"default_directory {inst.default_directory!r}"
    elif inst.roots:
        return inst.roots[0]
    else:
        raise UsageError(f"{inst.name} has no default_directory or roots: pass --dir")
    if not req.force and not inst.rules.with_sandboxes(view.sandboxes).under_roots(directory):
        raise NotProjectSession(
            f"{named} is not under {inst.name}'s project roots "
            f"({', '.join(inst.roots) or 'none configured'}); --force overrides"
        )
    return directory


def _target_plan(
    view: InstanceView, session: SessionRecord, req: DispatchRequest, via: str,
    candidates: tuple[CandidateVerdict, ...] = (), warnings: tuple[str, ...] = (),
) -> Plan:
    check_write(view.inst, session, allow_prod=req.allow_prod, force=req.force)
    # Run state unknown: "running" is only the fail-closed guess, so it passes the gate.
    action: Action = "steer" if session.running and not view.run_state_unknown else "reuse"
    return Plan(
        action, view.inst, session, session.directory, session.title, via, candidates, warnings
    )


def plan_dispatch(
    cfg: Config, views: Sequence[InstanceView], req: DispatchRequest,
    scores: Sequence[tuple[SessionRecord, float]] = (), evidences: Sequence[MatchEvidence] = (),
) -> Plan:
    """Decide the target for ``req``; ``scores`` are the matcher's top candidates, best first,
    and ``evidences`` (when given) what each shares with the task."""
    if not req.text.strip():
        raise UsageError("--text is empty: say what the agent should do")
    by_name = {v.inst.name: v for v in views}
    if req.instance is not None and req.instance not in by_name:
        cfg.instance(req.instance)  # raises the "unknown instance" UsageError
    scoped = [by_name[req.instance]] if req.instance else list(views)

    # --session: find it (on --instance, or anywhere).
    if req.session:
        named = find_session(((v, v.sessions) for v in scoped), req.session)
        if named is not None:
            _check_reachable(named[0])
            return _target_plan(named[0], named[1], req, "--session")
        if scoped and not any(v.reachable for v in scoped):
            _check_reachable(scoped[0])
        for v in scoped:  # it may be where the config lacks a password: say how to fix that
            if not v.reachable and v.cause == "no_password":
                raise v.inst.unreachable(v.reason, v.cause)
        where = req.instance or "any reachable instance"
        raise UsageError(f"session {req.session} not found on {where}")

    smart = not (req.title or req.new or req.no_match) and cfg.auto_match
    verdicts: list[CandidateVerdict] = []
    if smart:
        allowed = {v.inst.name for v in scoped}
        padded = list(evidences) + [MatchEvidence()] * (len(scores) - len(evidences))
        kept = [
            (session, score, found)
            for (session, score), found in zip(scores, padded, strict=False)
            if session.instance in allowed and session.instance in by_name
        ]
        # The one candidate whose files the task names is judged first, whatever its rank.
        order, first = judging_order([sc for _, sc, _ in kept], [f for _, _, f in kept])
        ranked = [(*kept[j], runner_up) for j, runner_up in order]

        def verdict(i: int, words: str) -> CandidateVerdict:
            session, score, found, runner_up = ranked[i]
            return CandidateVerdict(session, score, words, score - runner_up, found)

        def rest(i: int, words: str = "not needed") -> list[CandidateVerdict]:
            return [verdict(j, words) for j in range(i + 1, len(ranked))]

        for i, (session, score, found, runner_up) in enumerate(ranked):
            view = by_name[session.instance]
            steer = session.running and not view.run_state_unknown
            judged = match_decision(
                cfg.match, score, runner_up, running=steer,
                named=found.named if first is not None else (), refers_back=found.refers_back,
            )
            if not judged.take:
                # A weaker candidate is never taken where a stronger one was in doubt.
                verdicts.append(verdict(i, judged.reason))
                verdicts += rest(i, "weaker than a candidate in doubt")
                break
            if view.inst.production and not req.allow_prod:
                verdicts.append(verdict(i, "production instance"))
            elif steer or (view.free > 0 and not view.over_budget):
                how = "running, steer it" if steer else "idle, free slot"
                verdicts.append(verdict(i, f"chosen: {how} ({judged.reason})"))
                return _target_plan(view, session, req, "smart match", tuple(verdicts + rest(i)))
            else:
                verdicts.append(verdict(i, "daily budget reached" if view.over_budget
                                        else "instance full"))

    # Choose the instance.
    if req.instance:
        view = by_name[req.instance]
        _check_reachable(view)
        check_write(view.inst, None, allow_prod=req.allow_prod, force=req.force)
    else:
        view = pick_instance(scoped)

    warnings: list[str] = []
    if req.title and not req.new:
        hits = [s for s in view.sessions if s.project and req.title in s.title]
        if hits:
            hit = max(hits, key=lambda s: s.updated)
            if req.directory:
                mapped = _written_dir(view.inst, req.directory)
                if normalize_dir(mapped) != normalize_dir(hit.directory):
                    warnings.append(
                        f"reusing session {hit.id} ({hit.directory}) found by --title; --dir "
                        f"{req.directory} was ignored - add --new to create a session there"
                    )
            return _target_plan(view, hit, req, "--title", tuple(verdicts), tuple(warnings))

    directory = new_session_directory(view, req)
    title = req.title if req.title else default_title(req.text)
    via = "--new" if req.new else ("no related session" if smart else "new session")
    return Plan(
        "create", view.inst, None, directory, title, via, tuple(verdicts), tuple(warnings),
        forced=req.force,
    )
