"""Check everything a new operator tends to get wrong, and say in one sentence how to fix each.

Checks, in order: the config file (which one, valid or not, which config.local.json lent
credentials), each instance (reachable, auth accepted, API dialect and opencode version, where
its password came from, roots and default_directory, which event stream live views follow),
the state and lock folders (writable), with project.check_command a probe check in the check's
sandbox (what it could read and reach), the blackout clock (zone, next reset, active
blackouts), the patrol's pause flag and the last heartbeat of its daemon, and each chat
webhook (its environment variables, its last delivery; with --online, whether its host
resolves: nothing is sent).

Exit status: 0 when nothing is wrong (warnings alone still exit 0), else the code of the worst
problem: 4 for a config problem (or an unwritable state folder), 2 for an instance that is
unreachable or rejects the password, 1 for a corrupt state file.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xaf_hub import __version__
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import Answers, flag
from xaf_hub.cli.termfit import Screen, wrap
from xaf_hub.config.credentials import REDIS_PASSWORD_ENV
from xaf_hub.config.load import Config, InstanceConfig, find_config
from xaf_hub.config.reader import load_json_file
from xaf_hub.core import aio
from xaf_hub.core.clock import resolve_timezone
from xaf_hub.errors import ConfigError, ExitCode, HubError, UnreachableError
from xaf_hub.fleet.scan import make_client, read_run_state
from xaf_hub.notify.check import webhook_checks
from xaf_hub.ops.context import utc_now as now_utc
from xaf_hub.ops.health import (
    Finding,
    Probe,
    clock_findings,
    config_error_finding,
    config_findings,
    daemon_finding,
    error,
    file_backend_findings,
    file_mode_finding,
    folder_finding,
    instance_findings,
    layout_findings,
    ok,
    opencode_finding,
    patrol_finding,
    repository_findings,
    room_findings,
    root_usage_findings,
    sandbox_finding,
    stream_findings,
    worst,
)
from xaf_hub.ops.models import families_chosen, models_view
from xaf_hub.ops.rooms import room_support
from xaf_hub.store.backends import Stores
from xaf_hub.store.contain import Reach, prove
from xaf_hub.store.patrol_state import PAUSE_FILE, heartbeat, patrol_dir, pause_info

if TYPE_CHECKING:  # the scanner pulls in httpx; --help must stay light
    from xaf_hub.fleet.scan import TransportFactory

EXAMPLES = """\
examples:
  xaf-hub doctor
  xaf-hub doctor --online                       # also resolve each webhook's host
  xaf-hub doctor --json | jq '.findings[] | select(.level != "ok")'
  xaf-hub --config /etc/xaf-hub/config.json doctor   # what the service will see

exit status: 0 all well (warnings allowed), 4 config problem or unwritable state folder,
2 an instance unreachable or its password rejected, 1 a corrupt state file.
"""


# ---------------------------------------------------------------------------------------------
# I/O edges


async def probe_instance(
    cfg: Config, inst: InstanceConfig, transport_factory: TransportFactory | None = None
) -> Probe:
    """Detect dialect and version, then list every session's folder."""

    async with make_client(cfg, inst, transport_factory) as client:
        try:
            await client.detect()
            sessions = await client.list_sessions()
            # One directory is enough to see whether this release's run state can be read.
            folders = sorted({s.directory for s in sessions if s.directory})[:1]
            _, unknown = await read_run_state(client, folders)
            rooms = None
            if cfg.repository.isolation == "worktree":
                rooms = await room_support(client, inst)
        except UnreachableError as exc:
            return Probe(inst.name, False, exc.reason, client.dialect or "", client.version,
                         cause=exc.cause)
        except HubError as exc:
            return Probe(inst.name, False, str(exc).removeprefix(f"{inst.name}: "),
                         client.dialect or "", client.version, cause="other")
        return Probe(inst.name, True, "", client.dialect or "", client.version,
                     tuple(s.directory for s in sessions), unknown, rooms)


async def probe_all(cfg: Config, transport_factory: TransportFactory | None = None) -> list[Probe]:
    """Probe every instance, at most ``scan_workers`` at once."""
    return await aio.bounded(
        cfg.scan_workers, lambda inst: probe_instance(cfg, inst, transport_factory), cfg.instances
    )


def check_writable(path: Path) -> tuple[str | None, bool]:
    """Create and remove a temp file in ``path`` (or its nearest existing parent when missing).

    Returns (problem or None, True when the folder does not exist yet).
    """
    target, missing = path, False
    while not target.exists():
        missing = True
        if target.parent == target:
            return "no part of the path exists", True
        target = target.parent
    if not target.is_dir():
        return f"{target} is a file, not a folder", missing
    try:
        fd, tmp = tempfile.mkstemp(prefix=".xaf-hub-doctor-", dir=target)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        return exc.strerror or str(exc), missing
    return None, missing


def _mode(path: Path) -> int | None:
    if os.name != "posix":  # Windows has ACLs, not mode bits worth reading
        return None
    try:
        return path.stat().st_mode
    except OSError:
        return None


def _credential_file_findings(cfg: Config) -> list[Finding]:
    files: dict[Path, str] = {}
    if cfg.local_config is not None:
        files[cfg.local_config] = "config.local.json"
    for inst in cfg.instances:
        kind, _, where = inst.password_source.partition(":")
        if kind == "file" and where:
            files.setdefault(Path(where), inst.name)
    found = (file_mode_finding(path, _mode(path), subject) for path, subject in files.items())
    return [f for f in found if f is not None]


def _patrol(cfg: Config) -> list[Finding]:
    """The pause flag, the daemon's heartbeat, and daemons on two hosts with a backend that
    lives on one (what can be seen of them)."""
    folder = patrol_dir(cfg)
    beat = heartbeat(folder)
    hosts: list[str] = []
    with contextlib.suppress(HubError), Stores(cfg) as stores:  # Redis unreachable: see redis
        lease = stores.lease_status(int(time.time() * 1000))
        if lease is not None:
            hosts = [str(d["host"]) for d in lease["daemons"] if d["role"] != "stopped"]
    beat_host = str(beat.get("host") or "") if isinstance(beat, dict) else ""
    return [patrol_finding(folder / PAUSE_FILE, pause_info(folder)), daemon_finding(beat),
            *file_backend_findings(cfg.lock.backend, cfg.pool.backend, socket.gethostname(),
                                   beat_host or None, hosts)]


# How to fix a Redis that does not answer.
_REDIS_FIX = (f"Start redis-server there or correct lock.redis_url; its password comes from "
              f"${REDIS_PASSWORD_ENV}.")


def _redis(cfg: Config) -> list[Finding]:
    """One line for the shared Redis, when the gate, the model state or the pool lives there."""
    users = [what for what, on in (("dispatch gate", cfg.lock.backend == "redis"),
                                   ("model state", cfg.models.state_backend == "redis"),
                                   ("task pool", cfg.pool.backend == "redis")) if on]
    if not users:
        return []
    try:
        # deferred: an optional dependency (the redis extra), see docs/performance.md
        from xaf_hub.store.redis import client as redis_client

        found = redis_client.probe(cfg.lock)
    except ConfigError as exc:  # the redis package is missing
        return [error("lock", "redis", str(exc), "pip install 'xaf-hub[redis]'", exc.exit_code)]
    except HubError as exc:
        return [error("lock", "redis", str(exc), _REDIS_FIX, exc.exit_code)]
    return [ok("lock", "redis", f"{found} answers (holds the {' and the '.join(users)})")]


def _sandbox(cfg: Config) -> list[Finding]:
    """With a check to run: a probe check in its sandbox, and what it reached."""

    repo = cfg.repository
    if not repo.check_command:
        return []
    try:
        proof = prove(cfg.state_dir, Reach(repo.check_paths, repo.check_network))
    except OSError as exc:
        return [error("check", "sandbox", f"the probe check could not start: {exc}",
                      "Make the state folder writable (see state folder above).", ExitCode.USAGE)]
    return [sandbox_finding(proof, repo.check_network, bool(repo.check_uncontained))]


def _clock(cfg: Config, now: datetime) -> list[Finding]:

    try:
        tz = resolve_timezone(cfg.models.timezone)
    except ConfigError as exc:
        return [config_error_finding(exc)]
    try:
        with Stores(cfg) as stores:
            blackouts = {b.family: b for b in models_view(cfg, now, stores.model_state()).rests}
    except HubError as exc:
        fix = (_REDIS_FIX if cfg.models.state_backend == "redis" else
               "Repair or move aside the named file (it is never reset silently); "
               "the hub recreates it on the next blackout.")
        return [*clock_findings(cfg.models, tz, now, {}, families_chosen(cfg)),
                error("clock", "model state", str(exc), fix, exc.exit_code)]
    return clock_findings(cfg.models, tz, now, blackouts, families_chosen(cfg))


def collect(ctx: Context, opts: Options, now: datetime) -> tuple[Path | None, list[Finding]]:
    """Run every check; return (config path, findings)."""
    try:
        path: Path | None = find_config(ctx.common.config, ctx.env, ctx.cwd)
    except ConfigError:
        path = None
    try:
        cfg = ctx.config
    except ConfigError as exc:
        return path, [config_error_finding(exc)]
    local_doc: Any = None
    if cfg.local_config is not None:
        with contextlib.suppress(ConfigError):
            local_doc = load_json_file(cfg.local_config, "config.local.json")
    findings = [opencode_finding(ctx.env), *config_findings(cfg, local_doc),
                *_credential_file_findings(cfg)]
    probes = aio.run(probe_all(cfg, ctx.transport_factory))
    for inst, probe in zip(cfg.instances, probes, strict=True):
        findings += [*instance_findings(inst, probe), *layout_findings(inst),
                     *root_usage_findings(inst, probe), *room_findings(cfg, inst, probe)]
    findings += repository_findings(cfg)
    live = [i for i, p in zip(cfg.instances, probes, strict=True) if p.reachable]
    findings += aio.run(stream_findings(cfg, live, ctx.transport_factory))
    for label, folder in (("state folder", cfg.state_dir), ("lock folder", cfg.lock_dir)):
        if label == "state folder" or folder != cfg.state_dir:  # the lock folder when apart
            findings.append(folder_finding(label, folder, *check_writable(folder)))
    findings += [*_redis(cfg), *_sandbox(cfg), *_clock(cfg, now), *_patrol(cfg)]
    findings += webhook_checks(cfg.notify, cfg.state_dir, online=opts.online)
    return cfg.path, findings


# ---------------------------------------------------------------------------------------------
# Output


_MARK = {"ok": "ok", "info": "info", "warn": "WARN", "error": "FAIL"}


def render(
    path: Path | None, findings: Sequence[Finding], code: ExitCode, *,
    columns: int | None = None, clean: Callable[[str], str] = str,
) -> str:
    """The one-screen text report; with ``columns`` (a terminal's width) the messages and
    fix lines wrap under their own column. ``clean`` runs on every message first (secrets
    leave a text before it is wrapped, never a wrapped half of one)."""
    width = min(max((len(f.subject) for f in findings), default=8), 24)

    where = path if path is not None else "(none found)"
    lines = [f"xaf-hub {__version__} doctor: config {where}"]

    def add(lead: str, text: str, hang: str) -> None:
        if columns is None:
            lines.append(lead + text)
            return
        # Under its own column while that leaves a useful width, else under the marks.
        indent = len(hang) if columns - len(hang) >= 40 else 8
        lines.extend(wrap(text, columns, lead, " " * indent))

    for f in findings:
        subject = f.subject if len(f.subject) <= width else "..." + f.subject[-(width - 3):]
        lead = f"  {_MARK[f.level]:<4}  {subject:<{width}}  "
        add(lead, clean(f.message), lead)
        if f.fix:
            label = "hint" if f.level in ("ok", "info") else "fix"
            pad = f"  {'':<4}  {'':<{width}}  "
            add(f"{pad}{label}: ", clean(f.fix), f"{pad}{label}: ")
    errors = sum(1 for f in findings if f.level == "error")
    warnings = sum(1 for f in findings if f.level == "warn")
    if errors:
        lines.append(f"{errors} problem(s), {warnings} warning(s): exit {int(code)}")
    elif warnings:
        lines.append(f"no problems, {warnings} warning(s) worth a look")
    else:
        lines.append("all well")
    return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class Options(Answers):
    """The options of `doctor`."""

    online: bool = flag("--online", help="also check that each webhook's host resolves (sends "
                        "nothing)")


def run(ctx: Context) -> int:
    """Check everything and print one line per check, with a fix for each problem."""

    opts = ctx.options(Options)
    path, findings = collect(ctx, opts, now_utc())
    code = worst(findings)
    if ctx.json:
        return ctx.answer({
            "version": __version__,
            "config": str(path) if path is not None else None,
            "exit_code": int(code),
            "errors": sum(1 for f in findings if f.level == "error"),
            "warnings": sum(1 for f in findings if f.level == "warn"),
            "findings": [f.to_json() for f in findings],
        }, code=int(code))
    columns = Screen.of(ctx.stdout, ctx.env).width
    ctx.out(render(path, findings, code, columns=columns, clean=ctx.redact))
    return int(code)
