"""The models of the chains and their rests: which rests, until when and why, and which
instances would use each next. `models clear FAMILY|MODEL` ends a rest; `models rest MODEL
--until TIME` starts one by hand. Rests are shared by every hub sharing the model state.

A rate limit rests a model's family (models.rest_scope "family", the seed) or the model alone
("model"): until the time the provider stated when it stated one, else until the next
models.blackout_reset_hour. See docs/models.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from xaf_hub.cli.context import Context
from xaf_hub.cli.options import JSON, WIDE, opt
from xaf_hub.core.clock import iso_time, local_time, resolve_timezone
from xaf_hub.core.limits import parse_until
from xaf_hub.errors import UsageError
from xaf_hub.notify.derive import rest_ended_event
from xaf_hub.notify.patrol import queue_notice
from xaf_hub.ops.models import end_rest, models_view, rest_json, start_rest
from xaf_hub.store.model_state import WHY_WORDS

EXAMPLES = """\
examples:
  xaf-hub models                                  # every model, resting or not, until when
  xaf-hub models --json                           # the same for scripts (resting_until: ISO)
  xaf-hub models clear opencode                   # end the rest of the family "opencode"
  xaf-hub models clear opencode/big-pickle        # end what keeps this model resting
  xaf-hub models rest opencode/big-pickle --until 18:00
  xaf-hub models rest opencode/big-pickle --until 90m --reason "provider incident"
"""


@dataclass(frozen=True, kw_only=True)
class Options:
    """The options of `models`."""

    action: Literal["list", "clear", "rest"] = opt(
        default="list", help="list (default), clear a rest, or rest a model by hand")
    target: str | None = opt(metavar="FAMILY|MODEL", help="what to clear or rest")
    until: str | None = opt("--until", metavar="TIME", help="rest's end: a duration (90m, 2h), a "
                            "local clock time (18:00) or an ISO time")
    reason: str = opt("--reason", default="", metavar="TEXT", help="why (audit log, the page)")
    json: bool = JSON.field()
    wide: bool = WIDE.field()


def run(ctx: Context) -> int:
    """List the models and their rests, or end or start one."""
    opts = ctx.options(Options)
    if opts.action == "list":
        if opts.target or opts.until:
            raise UsageError("models: list takes no FAMILY|MODEL and no --until")
        return _list(ctx)
    if not opts.target:
        raise UsageError(f"models {opts.action}: name a FAMILY or a MODEL (provider/model)")
    if opts.action == "clear":
        if opts.until:
            raise UsageError("models clear: --until belongs to `models rest`")
        return _clear(ctx, opts.target)
    if not opts.until:
        raise UsageError("models rest: --until TIME is required (90m, 18:00, 2026-12-04T09:00)")
    return _rest(ctx, opts.target, opts.until, opts.reason)


def _local(ms: int, ctx: Context) -> str:

    tz = resolve_timezone(ctx.config.models.timezone)
    return local_time(ms, tz, seconds=False, zone="name")


def _list(ctx: Context) -> int:

    ops = ctx.ops()
    view = models_view(ctx.config, ops.now(), ops.model_state())
    if ctx.json:
        return ctx.answer(view.to_json())
    if view.lines:
        ctx.columns(view.lines, {
            "MODEL": lambda m: m.model,
            "FAMILY": lambda m: m.family or "-",
            "RESTING": lambda m: f"until {_local(m.rest.until_ms, ctx)}" if m.rest else "no",
            "WHY": lambda m: "" if m.rest is None
            else f"{WHY_WORDS.get(m.rest.why, m.rest.why)} ({m.rest.family})",
            "NEXT FOR": lambda m: ", ".join(m.next_for) or "-",
        }, flexible=[("WHY", 12), ("NEXT FOR", 8)])
    else:
        ctx.out("no model configured (models.chain, instances' models, default_dispatch_model)")
    listed = {line.model for line in view.lines} | {line.family for line in view.lines}
    for b in view.rests:
        if b.family not in listed:
            why = WHY_WORDS.get(b.why, b.why)
            ctx.out(f"also resting: {b.family} until {_local(b.until_ms, ctx)} ({why})")
    return 0


def _clear(ctx: Context, target: str) -> int:

    ops = ctx.ops()
    ended = end_rest(ops, target)
    notes = [queue_notice(ops, rest_ended_event(b.family, iso_time(b.until_ms) or "", ops.now()))
             for b in ended]
    for queued, note in notes:
        if not queued:
            ctx.warn(note)
    lines = [f"rest of {b.family} ended (it was to last until {_local(b.until_ms, ctx)})"
             for b in ended] or [f"nothing rests for {target}: nothing to clear"]
    return ctx.answer({"target": target, "ended": [rest_json(b) for b in ended]}, *lines)


def _rest(ctx: Context, target: str, until_text: str, reason: str) -> int:

    ops = ctx.ops()
    try:
        until = parse_until(until_text, ops.now(), resolve_timezone(ctx.config.models.timezone))
    except ValueError as exc:
        raise UsageError(f"models rest --until: {exc}") from None
    rest = start_rest(ops, target, until, reason)
    return ctx.answer(rest_json(rest),
                      f"{rest.family} rests until {_local(rest.until_ms, ctx)} (set by a person)")
