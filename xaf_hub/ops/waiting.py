"""Runs that wait for a person: list their requests, and answer one (docs/waiting.md).

An answer goes only to a request the server still lists, looked up again under the instance's
dispatch lock just before the reply; every answer is audited with who gave it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from xaf_hub.config.load import PermissionRule, PermissionsConfig
from xaf_hub.core import aio
from xaf_hub.core.clock import MAX_TIME_MS
from xaf_hub.core.records import SessionRecord, Waiting
from xaf_hub.core.shell import simple_commands
from xaf_hub.errors import (
    HubError,
    NotProjectSession,
    ProductionRefused,
    RequestGone,
    UnreachableError,
    UsageError,
)
from xaf_hub.fleet.scan import InstanceScan
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.planner import check_write
from xaf_hub.ops.send import held_or_noted

Action = Literal["approve", "deny", "answer"]
# How an approval is sent, by ``Reply.always``.
_GRANT: dict[bool, Literal["once", "always"]] = {False: "once", True: "always"}


@dataclass(frozen=True)
class PendingRequest:
    """One request a run waits on, with the session it holds."""

    instance: str
    session: SessionRecord
    waiting: Waiting

    def to_json(self, now_ms: int) -> dict[str, Any]:
        """The ``waiting --json`` form: the request, where, and how long it waits."""
        w = self.waiting
        age = (now_ms - w.since) // 1000 if w.since and now_ms >= w.since else None
        return {
            "id": w.request_id,
            "instance": self.instance,
            "session_id": self.session.id,
            "title": self.session.title,
            "directory": self.session.directory,
            "project": self.session.owner or None,
            **{k: v for k, v in w.to_json().items() if k != "request_id"},
            "age_seconds": age,
        }


@dataclass(frozen=True)
class Waiters:
    """Every pending request of the instances asked, and the instances that did not say."""

    requests: tuple[PendingRequest, ...]
    down: tuple[tuple[str, str], ...]  # (instance, reason): unreachable, or requests unreadable


def pending_of(scans: Sequence[InstanceScan]) -> Waiters:
    """The pending requests a scan found, oldest first (pure)."""
    found = [
        PendingRequest(sc.inst.name, s, s.waiting)
        for sc in scans
        for s in sc.sessions
        if s.running and s.waiting is not None
    ]
    # Longest waiting first; a request whose start is unknown after those that have one.
    found.sort(key=lambda p: (p.waiting.since or MAX_TIME_MS, p.instance, p.waiting.request_id))
    down = [(sc.inst.name, sc.reason) for sc in scans if not sc.reachable]
    down += [(sc.inst.name, sc.waiting_unknown) for sc in scans if sc.waiting_unknown]
    return Waiters(tuple(found), tuple(down))


async def list_waiting(ops: OpsContext, instance: str | None = None) -> Waiters:
    """Scan ``instance`` (or every instance) for runs that wait for a person."""
    return pending_of((await ops.scan_named(instance))[1])


@dataclass(frozen=True)
class Reply:
    """A person's (or a rule's) answer to one request.

    ``approve``: a permission, once or (``always``) for the patterns it offers. ``deny``: a
    permission refused (``message`` tells the agent why, or how to go on), or a question
    rejected. ``answer``: a question, with ``choices`` (option labels: all for the one
    question, or one per question in order) or ``text`` (the person's own words).
    """

    action: Action
    always: bool = False
    message: str = ""
    choices: tuple[str, ...] = ()
    text: str = ""

    def words(self) -> str:
        """What was answered, for the audit line and the command's output."""
        if self.action == "approve":
            return "approved always" if self.always else "approved once"
        if self.action == "deny":
            return "denied" + (f" ({self.message})" if self.message else "")
        return "answered " + (repr(self.text) if self.text else ", ".join(self.choices))


@dataclass(frozen=True)
class Answered:
    """The request answered, where, and what was sent."""

    instance: str
    session_id: str
    waiting: Waiting
    reply: Reply
    note: str = ""


def question_answers(w: Waiting, reply: Reply) -> list[list[str]]:
    """The ``answers`` body of a question reply, checked against its options (pure)."""
    n = len(w.choices)
    if reply.text:
        if reply.choices or n > 1:
            raise UsageError(
                f"{w.request_id} asks {n} questions: give one CHOICE per question, no --text"
                if n > 1
                else "give CHOICE... or --text, not both"
            )
        return [[reply.text]]
    if not reply.choices:
        raise UsageError(f"answer {w.request_id} with CHOICE... or --text")
    if n <= 1:
        picked = [list(reply.choices)]
    elif len(reply.choices) != n:
        raise UsageError(
            f"{w.request_id} asks {n} questions: give {n} CHOICEs, one per question in order"
        )
    else:
        picked = [[c] for c in reply.choices]
    return [[_option(c, w.choices[i] if i < n else (), w.request_id) for c in labels]
            for i, labels in enumerate(picked)]


def _option(label: str, known: tuple[str, ...], request_id: str) -> str:
    """The option ``label`` names: itself when offered, else the one option equal to it
    ignoring case (UsageError for none, or for several)."""
    if label in known:
        return label
    alike = [k for k in known if k.casefold() == label.casefold()]
    if len(alike) == 1:
        return alike[0]
    offered = ", ".join(repr(k) for k in known) or "none (use --text)"
    if alike:
        raise UsageError(f"{label!r} matches several options of {request_id} when case is "
                         f"ignored: give one as written ({offered})")
    raise UsageError(f"{label!r} is not an option of {request_id}; options: {offered}")


async def answer_request(
    ops: OpsContext, request_id: str, reply: Reply, *, instance: str | None = None,
    allow_prod: bool = False, force: bool = False, rule: str = "",
) -> Answered:
    """Find the run waiting on ``request_id`` and answer it; nothing is sent when it no
    longer waits (``RequestGone``, exit 4) or the answer does not fit it (exit 4).

    ``rule``: the policy rule that answered (audited), "" for a person.
    """
    request_id = request_id.strip()
    if not request_id.startswith(("per", "que")):
        raise UsageError(f"{request_id!r} is not a request id (per_... or que_...)")
    waiters = await list_waiting(ops, instance)
    hit = next((p for p in waiters.requests if p.waiting.request_id == request_id), None)
    if hit is None:
        raise _not_waiting(request_id, waiters.down)
    return await send_reply(ops, hit, reply, allow_prod=allow_prod, force=force, rule=rule)


async def send_reply(
    ops: OpsContext, hit: PendingRequest, reply: Reply, *, allow_prod: bool = False,
    force: bool = False, rule: str = "",
) -> Answered:
    """Answer one request a scan found: guards, a fresh look under the lock, reply, audit."""
    inst = ops.cfg.instance(hit.instance)
    w, s = hit.waiting, hit.session
    if w.kind == "question" and reply.action == "approve":
        raise UsageError(f"{w.request_id} is a question: answer it with `xaf-hub answer`")
    if w.kind == "permission" and reply.action == "answer":
        raise UsageError(
            f"{w.request_id} is a permission request: `xaf-hub approve` or `xaf-hub deny` it"
        )
    answers = question_answers(w, reply) if reply.action == "answer" else None
    if answers and reply.choices:  # the labels as offered, for the audit and the output
        reply = replace(reply, choices=tuple(label for labels in answers for label in labels))
    check_write(inst, s, allow_prod=allow_prod, force=force)
    command = reply.action
    extra: dict[str, Any] = {
        "request": w.request_id,
        "kind": w.kind,
        "permission": w.permission,
        "asked": w.asked,
        "reply": reply.words(),
        "by": f"rule {rule}" if rule else "person",
    }
    notes: list[str] = []
    # another hub answering the same request waits here, then finds it gone
    async with held_or_noted(ops.gate(), inst.name, notes, "answered"):
        async with ops.client(inst) as client:
            still = await client.pending_requests(s.directory)
            if not any(p.waiting.request_id == w.request_id for p in still):
                raise RequestGone(
                    f"{inst.name}: request {w.request_id} no longer waits (answered, or its run "
                    "ended); nothing sent"
                )
            async with ops.audited(command, instance=inst.name, session=s.id, extra=extra):
                if w.kind == "permission":
                    kind = _GRANT[reply.always] if reply.action == "approve" else "reject"
                    await client.reply_permission(w.request_id, kind, reply.message, s.directory)
                else:
                    await client.reply_question(w.request_id, answers, s.directory)
        await aio.blocking(
            ops.audit, command, instance=inst.name, session=s.id, result="sent", extra=extra
        )
    note = "; ".join(ops.redact(n) for n in notes)
    return Answered(inst.name, s.id, w, reply, note)


def _not_waiting(request_id: str, down: Sequence[tuple[str, str]]) -> HubError:
    """No instance lists ``request_id``: gone, unless an instance could not say (exit 2)."""
    if not down:
        return RequestGone(
            f"request {request_id} is not waiting on any instance (answered, or its run "
            "ended); nothing sent"
        )
    names = ", ".join(name for name, _ in down)
    reasons = "; ".join(f"{n}: {r}" for n, r in down)
    return UnreachableError(
        names, f"{reasons} (request {request_id} was not found where asked; it may be there)"
    )


# What an agent hears when nobody answered in time (permissions.deny_after_minutes).
TIMEOUT_MESSAGE = (
    "Nobody answered this request in time, so it is denied. Go on without it: finish what "
    "you can, and say in your final answer what you needed and why."
)


@dataclass(frozen=True)
class PolicyAnswer:
    """What the policy answers one request with, and the rule that decided it."""

    reply: Reply
    rule: str


def _rule_for(
    rules: Sequence[PermissionRule], permission: str, text: str
) -> tuple[int, PermissionRule] | None:
    """The first rule of ``permission`` (or ``*``) whose pattern matches ``text``."""
    hits = ((i, r) for i, r in enumerate(rules)
            if r.kind in ("*", permission) and fnmatch.fnmatchcase(text, r.pattern))
    return next(hits, None)


def approvable(w: Waiting) -> tuple[str, ...] | None:
    """What a rule must allow, each, for ``w`` to be approved, or None: only a person may.

    A bash request: the simple commands of its whole command (``core.shell``); anything
    more than plain commands joined by ``;``, ``&&``, ``||``, ``|`` is None. Another
    permission: its patterns, when the hub holds them all (pure).
    """
    if w.kind != "permission" or not w.whole:
        return None
    if w.permission == "bash":
        return simple_commands(w.asked)
    return w.patterns or None


def _decided(
    rules: Sequence[PermissionRule], w: Waiting
) -> tuple[Action, list[tuple[int, PermissionRule]]] | None:
    """What the rules answer ``w`` with, and the rules that decided it."""
    if w.kind != "permission":
        return None
    # A deny rule denies on any part it matches: the request's patterns (however few the
    # hub kept), its command's simple commands, each line of what it asks.
    units = approvable(w) or ()
    seen = [*w.patterns, *units, *(line.strip() for line in w.asked.splitlines())]
    for text in seen:
        hit = _rule_for(rules, w.permission, text)
        if hit is not None and hit[1].action == "deny":
            return "deny", [hit]
    if not units:
        return None
    allowed = [_rule_for(rules, w.permission, u) for u in units]
    used = [hit for hit in allowed if hit is not None and hit[1].action == "allow"]
    if len(used) < len(units):
        return None
    return "approve", sorted(set(used), key=lambda hit: hit[0])


def policy_answer(policy: PermissionsConfig, w: Waiting, now_ms: int) -> PolicyAnswer | None:
    """The policy's answer to ``w`` at ``now_ms``, or None: leave it to a person (pure).

    Approved when every part a rule must see (``approvable``) has an allow rule as its first
    matching rule (of its kind or ``*``); denied when any part of the request has a deny rule
    as its first; only a permission request can match a rule, and nothing is allowed unless
    a rule says so. With ``deny_after_minutes``, a request that waited that long (from its
    tool call's start; an unknown start never times out) is denied, a question rejected.
    """
    decided = _decided(policy.rules, w)
    if decided is not None:
        action, hits = decided
        rule = ", ".join(f"permissions.rules[{i}] {r.describe()}" for i, r in hits)
        return PolicyAnswer(Reply(action), rule)
    after = policy.deny_after_minutes
    if after is not None and w.since and now_ms - w.since >= after * 60_000:
        message = TIMEOUT_MESSAGE if w.kind == "permission" else ""
        return PolicyAnswer(
            Reply("deny", message=message), f"permissions.deny_after_minutes {after:g}"
        )
    return None


@dataclass(frozen=True)
class PolicyOutcome:
    """One request the policy acted on: answered, or why not (gone, refused, failed)."""

    request: PendingRequest
    answer: PolicyAnswer
    result: Literal["sent", "gone", "refused", "failed"]
    detail: str = ""


async def apply_policy(
    ops: OpsContext, requests: Sequence[PendingRequest], now_ms: int
) -> list[PolicyOutcome]:
    """Answer what ``permissions`` decides among ``requests`` (the patrol's rounds and live
    reactions); never on production instances, never outside the project."""
    policy = ops.cfg.permissions
    if not policy.rules and policy.deny_after_minutes is None:
        return []
    out = []
    for p in requests:
        decided = policy_answer(policy, p.waiting, now_ms)
        if decided is None:
            continue
        try:
            await send_reply(ops, p, decided.reply, rule=decided.rule)
        except RequestGone as exc:
            out.append(PolicyOutcome(p, decided, "gone", str(exc)))
        except (ProductionRefused, NotProjectSession, UsageError) as exc:
            out.append(PolicyOutcome(p, decided, "refused", str(exc)))
        except HubError as exc:
            out.append(PolicyOutcome(p, decided, "failed", str(exc)))
        else:
            out.append(PolicyOutcome(p, decided, "sent"))
    return out
