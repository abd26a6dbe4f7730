"""Keep the fleet busy and healthy: heal rate limits, resume interrupted runs, fill free slots.

Each cycle runs four steps in order, each surviving the others' failure:
fix_free_limit (switch rate-limited / model-unavailable sessions to the next model, black out
a rate-limited free family until the reset hour), check_agents (classify sessions, resume
interrupted ones once, through the gate), sync_design_tasks (add pending rows of design
documents to the task pool), fill_slots (settle dispatched tasks, dispatch pending ones into
free slots through the gate). The report goes to <state dir>/patrol/report-latest.md/.json.

`patrol --once` runs one cycle (for cron); `patrol` runs cycles on a timer
(patrol.interval_minutes, first run at patrol.minute_offset) until SIGTERM or Ctrl+C, which
finish the running step and exit; between rounds it follows the servers' events and heals,
resumes or fills at once (--no-live: rounds only). `patrol pause|resume|status` are durable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from xaf_hub.cli.context import Context
from xaf_hub.cli.options import HIDDEN, Answers, flag, opt
from xaf_hub.config.watch import ConfigWatch
from xaf_hub.core.clock import local_iso
from xaf_hub.errors import ExitCode, UsageError
from xaf_hub.patrol.report import LATEST, latest_report
from xaf_hub.patrol.runner import open_lease, run_daemon, run_once
from xaf_hub.store.audit import who
from xaf_hub.store.patrol_state import (
    clear_paused,
    daemon_alive,
    heartbeat,
    patrol_dir,
    pause_info,
    set_paused,
)

EXAMPLES = """\
examples:
  xaf-hub patrol --once                     # one cycle, then exit (cron: 7 * * * *)
  xaf-hub patrol --once --no-fill --no-design
  xaf-hub patrol                            # run every patrol.interval_minutes until stopped
  xaf-hub patrol pause                      # durable: survives restarts
  xaf-hub patrol status --json
  xaf-hub patrol resume
exit codes: with --once, 0 when every step ran, else the worst failed step's code; 3 when
another patrol cycle holds the lock on this machine; 0 with a message when paused. The
daemon: 3 when another daemon runs for the same state folder (its pid is named); one --once
cycle may still run beside it.
"""

@dataclass(frozen=True, kw_only=True)
class Options(Answers):
    """The options of `patrol`."""

    action: Literal["pause", "resume", "status"] | None = opt(
        help="pause or resume the patrol (durable), or show its status")
    once: bool = flag("--once", help="run one cycle and exit")
    no_freelimit: bool = flag("--no-freelimit", help="skip fix_free_limit")
    no_check: bool = flag("--no-check", help="skip check_agents")
    no_design: bool = flag("--no-design", help="skip sync_design_tasks")
    no_fill: bool = flag("--no-fill", help="skip fill_slots")
    no_live: bool = flag("--no-live",
                         help="daemon: run rounds only, do not react to the servers' events")
    # Tests and demos run the loop in seconds; operators use patrol.interval_minutes.
    interval_seconds: float | None = opt("--interval-seconds", help=HIDDEN)


def run(ctx: Context) -> int:
    """Run a cycle, the loop, or a pause/resume/status action."""
    opts = ctx.options(Options)
    if opts.action:
        if opts.once or opts.interval_seconds is not None:
            raise UsageError(f"patrol {opts.action} takes no --once / --interval-seconds")
        return _status(ctx) if opts.action == "status" else _pause(ctx, opts.action == "pause")

    def log(line: str) -> None:
        ctx.info(line)
        ctx.stderr.flush()

    # Several projects and no --project: the patrol serves them all (patrol.context).
    ctx.see_every_project()
    pctx = ctx.ops(log=log)
    # The steps the --no-* flags leave out, in cycle order.
    steps = ((opts.no_freelimit, "fix_free_limit"), (opts.no_check, "check_agents"),
             (opts.no_design, "sync_design_tasks"), (opts.no_fill, "fill_slots"))
    skip = [step for skipped, step in steps if skipped]
    if opts.once:
        if opts.interval_seconds is not None:
            raise UsageError("--interval-seconds makes no sense with --once")
        result = run_once(pctx, skip, lease=open_lease(pctx))
        doc = latest_report(pctx.patrol_dir) if ctx.json and result.status == "ran" else None
        report = [] if result.report is None else [f"report: {result.report}"]
        ctx.answer({"status": result.status, "exit_code": result.code, "message": result.message,
                    "report": doc}, result.message, *report)
        return result.code
    if ctx.json:
        raise UsageError("--json needs --once (the loop prints one line per cycle)")
    if opts.interval_seconds is not None:
        if opts.interval_seconds <= 0:
            raise UsageError("--interval-seconds must be more than 0")
        interval, aligned = timedelta(seconds=opts.interval_seconds), False
    else:
        interval, aligned = timedelta(minutes=ctx.whole.patrol.interval_minutes), True

    return run_daemon(pctx, skip, interval, aligned=aligned, live=not opts.no_live,
                      out=lambda line: ctx.out(line, flush=True),
                      watch=ConfigWatch(ctx.whole, ctx.env), use=ctx.use)


# What `patrol pause` and `patrol resume` say: (pausing, changed) -> words.
_PAUSE_WORDS = {(True, True): "patrol paused (durable; `xaf-hub patrol resume` to undo)",
                (True, False): "patrol was already paused",
                (False, True): "patrol resumed", (False, False): "patrol was not paused"}


def _pause(ctx: Context, pause: bool) -> int:
    """Pause or resume the patrol (durable); a change is audited."""
    folder, by = patrol_dir(ctx.whole), who(ctx.env)
    changed = (set_paused(folder, by["caller"] or by["user"], datetime.now(UTC).astimezone())
               if pause else clear_paused(folder))
    if changed:
        ctx.audit("patrol.pause" if pause else "patrol.resume",
                  result="paused" if pause else "active")
    return ctx.answer({"paused": pause, "changed": changed}, _PAUSE_WORDS[pause, changed])


def _status(ctx: Context) -> int:

    folder = patrol_dir(ctx.whole)
    paused = pause_info(folder)
    report = latest_report(folder)
    beat = heartbeat(folder)
    daemon = None if beat is None else {
        "pid": beat.get("pid"), "alive": daemon_alive(beat), "last_tick": beat.get("tick_at"),
        "ticks": beat.get("ticks"), "last": beat.get("last")}
    steps = report.get("steps", []) if report is not None else []
    failed: list[object] = [s.get("name") for s in steps if s.get("status") == "failed"]
    last = None if report is None else {
        **{k: report.get(k) for k in ("started_at", "finished_at", "result", "exit_code")},
        "failed_steps": failed, "report": str(folder / f"{LATEST}.md")}
    doc: dict[str, object] = {"state": "paused" if paused is not None else "active",
                              "paused": paused, "last_cycle": last, "daemon": daemon}
    # The HA lease when the gate or pool lives in Redis: active host, each known daemon.
    lease = ctx.stores.lease_status(int(time.time() * 1000))
    if lease is not None and "lease_error" in lease:
        lease["lease_error"] = ctx.redact(lease["lease_error"])
    doc.update(lease or {})
    code = int(ExitCode.UNREACHABLE if lease and lease.get("lease_error") else ExitCode.OK)
    lines = ["patrol: active"]
    if paused is not None:
        since = f" since {paused.get('paused_at')}" if paused.get("paused_at") else ""
        by = f" by {paused.get('by')}" if paused.get("by") else ""
        lines = [f"patrol: paused{since}{by}"]
    if last is None:
        lines.append("last cycle: none yet")
    else:
        what = str(last["result"])
        if failed:
            what += f" (exit {last['exit_code']}; failed: {', '.join(map(str, failed))})"
        lines += [f"last cycle: {local_iso(str(last['finished_at'] or last['started_at']))} - "
                  f"{what}", f"report: {last['report']}"]
    if daemon is not None:
        state = "running" if daemon["alive"] else "not running"
        lines.append(f"daemon: {state} (pid {daemon['pid']}, {daemon['ticks']} tick(s), "
                     f"last {local_iso(str(daemon['last_tick'] or ''))})")
    if lease is not None:
        host = lease.get("active_host") or "none (no daemon holds the lease)"
        lines.append(f"active host: unknown ({lease['lease_error']})" if lease.get("lease_error")
                     else f"active host: {host}")
        rows = lease.get("daemons")
        for d in rows if isinstance(rows, list) else []:
            seen = local_iso(str(d["heartbeat"]))
            lines.append(f"  {d['host']} pid {d['pid']}: {d['role']}, heartbeat {seen}")
    return ctx.answer(doc, *lines, code=code)
