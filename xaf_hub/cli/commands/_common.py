"""Pieces several commands share: instance selection, scanning, scan exit codes, and the
wording of run verdicts, heals and waits (`confirm` and `dispatch --confirm-wait`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import tzinfo
from typing import TYPE_CHECKING, Any

from xaf_hub.cli.context import Context
from xaf_hub.cli.options import MAX_TEXT, Answers, Opt, opt
from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.clock import iso_time, local_time
from xaf_hub.core.records import Snapshot
from xaf_hub.errors import ExitCode, HubError, UsageError

if TYPE_CHECKING:  # the scanner pulls in httpx; --help must stay light
    from xaf_hub.core.runstate import Verdict
    from xaf_hub.fleet.scan import InstanceScan
    from xaf_hub.ops.confirm import WaitResult
    from xaf_hub.ops.heal import Healing


MCP_REQUIREMENT = "mcp>=2.3,<3"  # pyproject's [mcp] extra, word for word
# How to add the extra to an install without it: a second `pipx install` of the hub is refused
# ("already seems to be installed"), an inject adds to the environment there is.
ADD_MCP = f"pipx inject xaf-hub '{MCP_REQUIREMENT}'"

# Options several commands (and their MCP tools) share, declared once (``cli/options.py``);
# a command's record takes one as a field (``INSTANCE.field()``), with its own words if need be.
INSTANCE = Opt(("-i", "--instance"), "only this instance", metavar="NAME")
SESSION = Opt(("-s", "--session"), "the session id (ses_...)", metavar="ID")
# The session named as a positional instead of -s/--session (``the_session`` reads both).
SESSION_POS = Opt((), metavar="SESSION")
ALLOW_PROD = Opt(("--allow-prod",), "allow writes to production", default=False)
FRESH = Opt(("--fresh",), "scan every instance instead of reading the live board", default=False)
FORCE = Opt(("--force",), "allow a non-project session", default=False)
TEXT = Opt(("-t", "--text"), "what the agent should do", required=True, max_length=MAX_TEXT,
           metavar="TEXT")


def the_session(session: str | None, session_pos: str | None) -> str:
    """The one session named, as a positional or with -s/--session (UsageError otherwise)."""

    if session and session_pos and session != session_pos:
        raise UsageError(f"two sessions given ({session_pos} and -s {session}): name one")
    named = session or session_pos
    if not named:
        raise UsageError("name the session: SESSION or -s/--session ID")
    return named


@dataclass(frozen=True, kw_only=True)
class SessionTarget(Answers):
    """What `show`, `confirm` and `interrupt` share: the session, named as a positional or with
    -s/--session (``session_id``), and where it lives."""

    session_pos: str | None = SESSION_POS.field(help="the session id (or -s/--session ID)")
    session: str | None = SESSION.field()
    instance: str | None = INSTANCE.field(help="where it lives (default: search all)")

    @property
    def session_id(self) -> str:
        """The one session named (``the_session``)."""
        return the_session(self.session, self.session_pos)


def chosen_instances(ctx: Context, name: str | None) -> list[InstanceConfig]:
    """All instances, or the one named (by --instance; UsageError when unknown)."""
    return [ctx.config.instance(name)] if name else list(ctx.config.instances)


def scan(
    ctx: Context, instances: list[InstanceConfig], *, progress: bool = False
) -> tuple[Snapshot, list[InstanceScan]]:
    """Scan the given instances. ``progress``: on a terminal, name the instances still awaited
    after a second (stderr)."""

    import asyncio  # deferred: start-up, docs/performance.md

    from xaf_hub.cli.progress import Progress  # deferred: start-up, docs/performance.md
    from xaf_hub.core import aio  # deferred: start-up, docs/performance.md
    from xaf_hub.fleet.scan import scan_fleet  # deferred: start-up, docs/performance.md

    async def go() -> tuple[Snapshot, list[InstanceScan]]:
        waiting = Progress(ctx.stderr, [i.name for i in instances] if progress else [], ctx.env)
        ticker = asyncio.create_task(waiting.run())
        try:
            return await scan_fleet(ctx.config, instances, transport_factory=ctx.transport_factory,
                                    on_done=waiting.done)
        finally:
            await aio.cancel_and_wait(ticker)

    return aio.run(go())


def read_fleet(
    ctx: Context, instances: list[InstanceConfig], *, fresh: bool = False,
    outcomes: bool = False, progress: bool = False, summary: bool = False,
) -> tuple[Snapshot, list[InstanceScan]]:
    """The fleet as `status` and `sessions` read it: each instance from the live board when it
    is fresh there, the rest scanned (``fresh``: all scanned; architecture §5.1). The snapshot
    says which came from the board and how old (``Snapshot.live``, ``source``); the scans are
    in ``instances``' order. ``outcomes``: each project session's last result is fetched too,
    for the board's instances as for the scanned ones (one request per idle session).
    ``summary``: the board's summaries (`status`): an instance taken there holds only its
    running sessions, with the counts and today's spend in its ``tally``."""
    from xaf_hub.ops.live_board import merged, split  # deferred: start-up, docs/performance.md

    board, rest = split(ctx.config, instances, fresh=fresh, stores=ctx.stores, summary=summary)
    fresh_scan, scanned = scan(ctx, rest, progress=progress) if rest else (None, [])
    generated = fresh_scan.generated_at if fresh_scan is not None else None
    snap, scans = merged(instances, board, scanned, generated)
    if outcomes:
        from xaf_hub.core import aio  # deferred: start-up, docs/performance.md
        from xaf_hub.fleet.scan import fill_outcomes  # deferred: start-up, docs/performance.md

        aio.run(fill_outcomes(ctx.config, scans, ctx.transport_factory))
        snap, scans = merged(instances, board, scans, snap.generated_at)
    # What the board's writers say of their config (an older one kept, a restart due).
    return replace(snap, warnings=(*snap.warnings, *board.notes)), scans


def missing_passwords(ctx: Context, snap: Snapshot) -> list[HubError]:
    """The error of each instance that asked for a password the config does not give."""
    return [ctx.config.instance(item.name).unreachable(item.reason, item.cause)
            for item in snap.instances if not item.reachable and item.cause == "no_password"]


def scan_said(ctx: Context, snap: Snapshot, unreachable: bool = True) -> int:
    """Say on stderr what the scan could not read: one error line per instance that asked for
    a password the config does not give; with ``unreachable`` a warning per other instance
    that did not answer and each fail-closed warning. The scan's exit code: 4 when a password
    is missing; else 0 when at least one instance answered (or none is asked), 2 when none did."""
    for missing in missing_passwords(ctx, snap):
        ctx.info(f"xaf-hub: error: {missing}")
    for item in snap.instances if unreachable else ():
        if not item.reachable and item.cause != "no_password":
            ctx.warn(f"{item.name} unreachable: {item.reason}")
    for w in snap.warnings if unreachable else ():
        ctx.warn(w)
    return scan_exit(snap)


def scan_exit(snap: Snapshot) -> int:
    """The exit code of a scan (``scan_said``)."""
    if any(not i.reachable and i.cause == "no_password" for i in snap.instances):
        return int(ExitCode.USAGE)
    if not snap.instances or any(i.reachable for i in snap.instances):
        return int(ExitCode.OK)
    return int(ExitCode.UNREACHABLE)


# ---------------------------------------------------------------------------------------------
# Wording of verdicts, heals and waits (`confirm`, `dispatch --confirm-wait`)


def _in(ms: int, now_ms: int) -> str:
    left = (ms - now_ms) // 1000
    if left <= 0:
        return "due now"
    if left < 120:
        return f"in {left} s"
    if left < 7200:
        return f"in {left // 60} min"
    return f"in {left // 3600} h {left % 3600 // 60} min"


def _next_try(ms: int, tz: tzinfo, now_ms: int) -> str:
    return f"; next try at {local_time(ms, tz, unknown='?')} ({_in(ms, now_ms)})" if ms else ""


def _model(model: str) -> str:
    return model or "the server's default model"


def verdict_text(v: Verdict, tz: tzinfo, now_ms: int) -> str:
    """One phrase for a verdict."""
    model, attempt = _model(v.model), f" (attempt {v.attempt})" if v.attempt else ""
    return {
        "running": f"running on {model} ({v.detail})",
        "retrying": f"retrying on {model}{attempt}: {v.detail or 'no message'}"
        f"{_next_try(v.next_ms, tz, now_ms)}",
        "waiting": f"{v.detail} (on {model})",
        "finished": f"finished (last run on {model})",
        "failed": f"failed on {model}: {v.detail}",
    }.get(v.state, f"{v.state}: {v.detail}")


def healing_text(h: Healing, tz: tzinfo) -> str:
    """What one heal did, e.g. "rate-limited on A, re-sent on B (blackout of ...)"."""
    head = _healed_what(h)
    if h.already:
        return f"{head}: already healed (by the patrol or another command)"
    tail = f" ({_blackout(h, tz)})" if h.family else ""
    if h.to_model is None:
        return f"{head}: no usable model left in the chain{tail}"
    return f"{head}, healed: re-sent on {h.to_model}{tail}"


def _healed_what(h: Healing) -> str:
    return f"{_SIGNAL_WORDS.get(h.signal, h.signal)} on {h.from_model or 'an unknown model'}"


def _blackout(h: Healing, tz: tzinfo) -> str:
    """A heal's blackout and its end as local wall time."""
    until = local_time(h.until_ms or 0, tz, seconds=False, unknown="?")
    return f"blackout of family {h.family} until {until}"


def wait_text(r: WaitResult, window: float, tz: tzinfo, now_ms: int) -> str:
    """One line for how `dispatch --confirm-wait` ended."""
    model = _model(r.model)
    final = {
        "running": f"running on {model}",
        "finished": f"ran on {model} and already finished",
        "failed": f"failed: {r.detail}",
        "no_sign": f"no sign of a run within {window:g} s"
        + (f" (last seen: {r.detail})" if r.detail else ""),
        "retrying": f"retrying on {model}: {r.detail}{_next_try(r.next_ms, tz, now_ms)}",
        "unreachable": f"unreachable while waiting: {r.detail}",
    }[r.state]
    if not r.heals:
        return final
    blackouts = [_blackout(h, tz) for h in r.heals if h.family]
    tail = f" ({'; '.join(blackouts)})" if blackouts else ""
    heads = [_healed_what(h) for h in r.heals]
    if r.state in ("running", "finished"):
        now = "now " if r.state == "running" else ""
        return f"{', then '.join(heads)}, healed: {now}{final}{tail}"
    last = r.heals[-1]
    sent = f", re-sent on {last.to_model}" if last.to_model else ""
    return f"{', then '.join(heads)}{sent}; {final}{tail}"


def wait_json(r: WaitResult, window: float, line: str) -> dict[str, Any]:
    """The `confirm` object of `dispatch --json`."""
    return {
        "state": r.state,
        "model": r.model or None,
        "detail": r.detail,
        "window_seconds": window,
        "seconds": r.seconds,
        "next_try": iso_time(r.next_ms),
        "next_try_ms": r.next_ms or None,
        "healed": [h.to_json() for h in r.heals],
        "message": line,
    }


def wait_exit(r: WaitResult) -> int:
    """0 when the run was seen going (healed or not), 2 unreachable, else 1."""
    codes = {"running": ExitCode.OK, "finished": ExitCode.OK, "unreachable": ExitCode.UNREACHABLE}
    return int(codes.get(r.state, ExitCode.INTERNAL))


_SIGNAL_WORDS = {"rate_limited": "rate-limited", "model_unavailable": "model unavailable"}


# The request id and guards of `approve`, `deny` and `answer` (and their MCP tools).
@dataclass(frozen=True, kw_only=True)
class AnswerTarget(Answers):
    """What `approve`, `deny` and `answer` share: the request and the guards; each command's
    record adds its own words and says its reply (``reply()``)."""

    request: str = opt(help="the request (per_... or que_...; see `waiting`)", required=True,
                       metavar="ID")
    instance: str | None = INSTANCE.field(help="where it waits (default: search all)")
    allow_prod: bool = ALLOW_PROD.field()
    force: bool = FORCE.field()

    def reply(self) -> Any:
        """The ``ops.waiting.Reply`` this command sends."""
        raise NotImplementedError


def answer_waiting(ctx: Context, target: AnswerTarget) -> dict[str, Any]:
    """Answer one waiting request (``ops.waiting.answer_request``); what `--json` prints (and
    the MCP tool answers). A note for the person goes to ``ctx.warn`` too."""
    from xaf_hub.core import aio  # deferred: start-up, docs/performance.md
    from xaf_hub.ops.waiting import answer_request  # deferred: start-up, docs/performance.md

    done = aio.run(answer_request(ctx.ops(), target.request, target.reply(),
                                  instance=target.instance, allow_prod=target.allow_prod,
                                  force=target.force))
    if done.note:
        ctx.warn(done.note)
    return {
        "id": done.waiting.request_id,
        "instance": done.instance,
        "session_id": done.session_id,
        "kind": done.waiting.kind,
        "asked": done.waiting.asked,
        "result": "sent",
        "reply": done.reply.words(),
        "warnings": [done.note] if done.note else [],
    }


def send_answer(ctx: Context, target: AnswerTarget) -> int:
    """Answer one waiting request and say what was sent."""
    from xaf_hub.core.runstate import asked_line  # deferred: start-up, docs/performance.md

    doc = answer_waiting(ctx, target)
    return ctx.answer(doc, f"{doc['reply']}: {doc['id']} of {doc['session_id']} on "
                      f"{doc['instance']} ({asked_line(doc['asked'])})")
