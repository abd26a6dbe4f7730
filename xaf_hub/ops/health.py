"""What `doctor` finds, as pure functions: each check turns facts into findings with a fix.

A ``Finding`` is one line of the doctor's report: its level (ok, info, warn, error), the
area and subject, what was seen, the one-sentence fix and, for errors, the exit code.
``commands/doctor.py`` gathers the facts (files, probes of each instance, the state folder)
and prints; everything that decides what a fact means lives here.
"""

from __future__ import annotations

import difflib
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal

from xaf_hub.config.credentials import CREDENTIAL_KEYS, password_var
from xaf_hub.config.load import Config, InstanceConfig, ModelsConfig
from xaf_hub.core import aio
from xaf_hub.core.clock import next_reset
from xaf_hub.core.rules import is_under, normalize_dir
from xaf_hub.errors import Cause, ConfigError, ConfigProblem, ExitCode
from xaf_hub.fleet.follow import BUDGET_COOLDOWN, POLL_SECONDS, probe_mode
from xaf_hub.fleet.releases import OPENCODE_VERSION, classify
from xaf_hub.fleet.scan import TransportFactory
from xaf_hub.store.contain import Proof
from xaf_hub.store.model_state import WHY_WORDS, Blackout

Level = Literal["ok", "info", "warn", "error"]

@dataclass(frozen=True)
class Finding:
    """One line of the report: what was checked, how it went, and how to fix a problem."""

    area: str
    subject: str
    level: Level
    message: str
    fix: str = ""
    exit_code: ExitCode = ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        """Export form."""
        return {**self.__dict__, "exit_code": int(self.exit_code)}


def ok(area: str, subject: str, message: str) -> Finding:
    """A passed check."""
    return Finding(area, subject, "ok", message)


def info(area: str, subject: str, message: str, fix: str = "") -> Finding:
    """A fact worth knowing that is not a problem."""
    return Finding(area, subject, "info", message, fix)


def warn(area: str, subject: str, message: str, fix: str) -> Finding:
    """A likely mistake that does not stop the hub."""
    return Finding(area, subject, "warn", message, fix)


def error(area: str, subject: str, message: str, fix: str, code: ExitCode) -> Finding:
    """A problem that stops some or all of the hub's work."""
    return Finding(area, subject, "error", message, fix, code)


def worst(findings: Sequence[Finding]) -> ExitCode:
    """The exit code of the worst error (OK when there is none)."""
    return ExitCode.worst(f.exit_code for f in findings if f.level == "error")


def opencode_finding(env: Mapping[str, str]) -> Finding:
    """Where this machine's opencode is, or in one line how to get it (needed only where the
    servers run: the hub itself talks HTTP)."""
    found = env.get("XAF_HUB_OPENCODE_BIN") or shutil.which("opencode", path=env.get("PATH", ""))
    if found:
        return ok("machine", "opencode", f"found at {found}")
    return info("machine", "opencode",
                "not on this machine (the hub needs it only where its servers run)",
                f"npm install -g opencode-ai@{OPENCODE_VERSION} (Node.js 18+), then opencode serve")


# ---------------------------------------------------------------------------------------------
# Config file


_CONFIG_FIXES: dict[ConfigProblem, str] = {
    "no_config": "Run `xaf-hub init` (writes ./config.json; --help shows the options), "
                 "or pass --config PATH.",
    "config_missing": "Point --config or $XAF_HUB_CONFIG at a file that exists.",
    "password_file_missing": "Create the password_file named for that instance, or correct "
                             "its path.",
    "bad_json": "Fix the JSON syntax at that line and column (a trailing comma or a missing "
                "quote is the usual cause).",
    "not_utf8": "Save the file as UTF-8 text.",
    "literal_password": "Delete the password from the config file and put it in "
                        "config.local.json or in the environment variable the message names.",
    "unknown_key": "Remove the key or correct its spelling; config.example.json shows every "
                   "valid key.",
    "duplicate_instance": "Give every instance its own name.",
    "bad_url": "Write the server's base address, e.g. http://127.0.0.1:4096, with no "
               "credentials in it.",
    "url_credentials": "Remove user:password@ from the url; put the password in "
                       "config.local.json or XAF_HUB_PW_<NAME>.",
    "relative_path": "Write the full path, e.g. /srv/project or C:\\work\\project.",
    "bad_timezone": 'Use an IANA zone name such as Europe/Berlin or Asia/Shanghai, or "local".',
    "password_value": "Make the password file a JSON object holding the password under "
                      "password_key (default \"password\").",
    "unreadable": "Give the user running the hub read access to that file.",
    "value": "Correct the key the message names; config.example.json shows a valid value.",
}


def config_error_finding(exc: ConfigError) -> Finding:
    """The doctor line for a config that does not load (the message names file and key)."""
    return error("config", "config", str(exc), _CONFIG_FIXES[exc.problem], ExitCode.USAGE)


def config_findings(cfg: Config, local_doc: Any = None) -> list[Finding]:
    """Which config file is in use and what its config.local.json contributed."""
    out = [ok("config", "config",
              f"{cfg.path}: valid; {len(cfg.instances)} instance(s); "
              f"state folder {cfg.state_dir}")]
    if not cfg.instances:
        out.append(warn("config", "config", f"{cfg.path}: no instances configured",
                        "Add the opencode servers under \"instances\" (see "
                        "config.example.json)."))
    local = cfg.local_config
    if local is None:
        beside = cfg.path.parent / "config.local.json" if cfg.path else "beside the config"
        out.append(info("credentials", "config.local.json",
                        f"none found (looked at {beside} and {cfg.home / 'config.local.json'})"))
        return out
    said = (f"{local} from the hub home (scope 'home'): lends only credential fields to "
            "instances the config already names" if cfg.local_scope == "home" else
            f"{local} beside the config (scope 'beside'): its instance fields override the "
            "config's")
    out.append(ok("credentials", "config.local.json", said))
    out.extend(_local_doc_findings(cfg, local, local_doc))
    return out


def _local_entries(doc: Any) -> list[tuple[str, dict[str, Any]]]:
    """(name, fields) pairs of config.local.json's instances, list or map form."""
    raw = doc.get("instances") if isinstance(doc, dict) else None
    if isinstance(raw, dict):
        return [(str(k), v) for k, v in raw.items() if isinstance(v, dict)]
    if isinstance(raw, list):
        return [(str(v.get("name")), v) for v in raw if isinstance(v, dict)]
    return []


def _local_doc_findings(cfg: Config, local: Path, doc: Any) -> list[Finding]:
    known = [i.name for i in cfg.instances]
    out = []
    for name, fields in _local_entries(doc):
        if name not in known:
            hint = difflib.get_close_matches(name, known, n=1)
            fix = (f"Rename it to '{hint[0]}'." if hint
                   else f"Rename it to one of: {', '.join(known) or '(none configured)'}.")
            out.append(warn("credentials", "config.local.json",
                            f"{local}: instances.{name} matches no configured instance, so its "
                            "credentials are never used", fix))
        ignored = sorted(k for k in fields if k not in (*CREDENTIAL_KEYS, "name"))
        if cfg.local_scope == "home" and ignored:
            out.append(warn("credentials", "config.local.json",
                            f"{local}: instances.{name}: {', '.join(ignored)} ignored, because a "
                            "config.local.json in the hub home lends only password, "
                            "password_env, password_file and password_key",
                            "Move those keys into the config file, or put config.local.json "
                            "beside the config file."))
    return out


def file_mode_finding(path: Path, mode: int | None, subject: str) -> Finding | None:
    """A warning when a file holding passwords is readable by other users (POSIX modes)."""
    if mode is None or not mode & 0o077:
        return None
    return warn("credentials", subject,
                f"{path} is readable by other users (mode {stat.S_IMODE(mode):04o})",
                f"Run: chmod 600 {path}")


# ---------------------------------------------------------------------------------------------
# Instances


@dataclass(frozen=True)
class Probe:
    """What talking to one instance showed."""

    instance: str
    reachable: bool
    reason: str = ""
    api: str = ""
    version: str = ""
    directories: tuple[str, ...] = ()
    run_state_unknown: str = ""  # why the run state could not be read (counted full)
    rooms: str | None = None  # why it makes no worktrees for tasks ("": it does; None: not asked)
    cause: Cause | None = None  # why it was unreachable, as a code


# What to do about an unreachable instance, by its cause ({url}: the instance's address).
_UNREACHABLE_FIXES: dict[Cause | None, str] = {
    "refused": "Start `opencode serve` at {url} (check host and port), or correct the "
               "instance's url.",
    "dns": "Correct the host name in the instance's url, or make it resolvable (DNS/hosts).",
    "timeout": "Check that the host is up and no firewall blocks the port; on a slow link "
               "raise timeouts.connect_seconds / read_seconds.",
    "html": "The url reaches a web page, not the opencode API: use the server's base "
            "address with no path (e.g. http://host:4096).",
    "forbidden": "A proxy in front of the server refuses the hub: allow this host or use the "
                 "server's direct address.",
    "server_error": "The server failed internally: read its log (the `opencode serve` output) "
                    "and restart it.",
    "dropped": "The connection was cut mid-answer: check the server's log and any proxy "
               "in between, then retry.",
}
_UNREACHABLE_FIXES["garbled"] = _UNREACHABLE_FIXES["dropped"]
_NOT_OPENCODE = "Check that {url} is an opencode server: open {url}/global/health."


def _auth_fix(inst: InstanceConfig) -> str:
    var = password_var(inst.name, inst.password_env)
    if inst.password_source == "none":
        return (f"Set {var} to the server's OPENCODE_SERVER_PASSWORD, or add instances."
                f"{inst.name}.password to config.local.json.")
    return (f"The password from {inst.password_source} was refused: set it to the server's "
            f"OPENCODE_SERVER_PASSWORD, and username (now '{inst.username}') to its "
            "OPENCODE_SERVER_USERNAME (default opencode).")


def instance_findings(inst: InstanceConfig, probe: Probe) -> list[Finding]:
    """Reachability, auth, dialect/version and the credential source of one instance."""
    name = inst.name
    kind, _, where = inst.password_source.partition(":")
    source = {"env": f"env var {where}", "local": f"config.local.json {where}",
              "file": f"password_file {where}"}.get(kind, inst.password_source)
    cred = "no password configured" if inst.password_source == "none" else f"password from {source}"
    if probe.cause == "no_password":
        return [error("instance", name, str(inst.unreachable(probe.reason, probe.cause)),
                      _auth_fix(inst), ExitCode.USAGE)]
    if probe.cause == "auth":
        return [error("instance", name, f"{inst.url}: auth rejected (HTTP 401); {cred}",
                      _auth_fix(inst), ExitCode.UNREACHABLE)]
    out: list[Finding] = []
    if not probe.reachable:
        known = f"; {cred}" if inst.password_source != "none" else ""
        fix = _UNREACHABLE_FIXES.get(probe.cause, _NOT_OPENCODE).format(url=inst.url)
        out.append(error("instance", name, f"{inst.url}: unreachable: {probe.reason}{known}",
                         fix, ExitCode.UNREACHABLE))
        if inst.password_source == "none":
            out.append(warn("credentials", name, "no password configured", _auth_fix(inst)))
        return out
    version = f"opencode {classify(probe.version, probe.api or 'classic').describe()}"
    api = f"{probe.api} API" if probe.api else "API unknown"
    out.append(ok("instance", name,
                  f"{inst.url}: reachable, auth accepted, {version}, {api}, "
                  f"{len(probe.directories)} session(s); {cred}"))
    if probe.run_state_unknown:
        out.append(warn("instance", name, f"run state unknown ({probe.run_state_unknown}): its "
                        "project sessions count as running and it takes no new work",
                        "Run a supported opencode release (1.2 to 1.18, see "
                        "docs/opencode-releases.md) and let the hub read GET /session/status."))
    if inst.password_source == "none":
        out.append(warn("credentials", name,
                        "no password configured and the server answered without one: "
                        "anyone who can reach it can use it",
                        "Start the server with OPENCODE_SERVER_PASSWORD set and give the hub "
                        f"the same password in {password_var(name, inst.password_env)} or "
                        "config.local.json."))
    return out


def room_findings(cfg: Config, inst: InstanceConfig, probe: Probe) -> list[Finding]:
    """With ``project.isolation: "worktree"``: whether this server gives each task a worktree
    of its own, and what the hub does where it cannot."""
    if cfg.repository.isolation != "worktree" or probe.rooms is None:
        return []
    if not probe.rooms:
        return [ok("worktrees", inst.name, "gives each task a worktree and branch of its own")]
    return [warn("worktrees", inst.name,
                 f"makes no worktrees ({probe.rooms}): tasks there share its checkout",
                 "Make the instance's default_directory a clone of the project's repository "
                 "with at least one commit, on that server.")]


def repository_findings(cfg: Config) -> list[Finding]:
    """Without a repository the hub verifies nothing (and, with worktrees, lands nothing)."""
    if cfg.repository.url:
        return []
    fix = ("Set project.repository to the remote the agents push to (`xaf-hub init --root "
           "CHECKOUT` fills it from the checkout's origin).")
    if cfg.repository.isolation == "worktree":
        return [warn("worktrees", "project.repository",
                     "not set: tasks work in worktrees of their own, but the hub can neither "
                     "verify nor land their branches; they wait for a person", fix)]
    return [warn("verification", "project.repository",
                 "not set: the hub cannot check an agent's work, so no task is ever done and "
                 "verified; a task whose session finishes is 'finished, not verified'", fix)]


def _absolute(path: str) -> bool:
    return PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute()


def layout_findings(inst: InstanceConfig) -> list[Finding]:
    """Roots and default_directory: absolute, present, consistent (no server needed)."""
    name = inst.name
    out: list[Finding] = []
    if inst.production:
        out.append(info("roots", name,
                        "production instance (danger/readonly_default): every write needs "
                        "--allow-prod and nothing is dispatched there by default"))
    elif not inst.roots:
        out.append(warn("roots", name,
                        "no roots: dispatch never picks this instance for new sessions, and "
                        "only project.fallback_segments decide which sessions are the project's",
                        f"Add the project's folder(s) on that machine to {name}'s roots."))
    for root in inst.roots:
        if not _absolute(root):
            out.append(error("roots", name, f"root {root!r} is not an absolute path",
                             _CONFIG_FIXES["relative_path"], ExitCode.USAGE))
        elif inst.rules.classify(root) == "excluded":
            out.append(warn("roots", name,
                            f"root {root} is excluded by project.exclude_dirs or "
                            "exclude_substrings, so nothing under it counts",
                            "Remove the exclusion that covers it, or drop the root."))
    d = inst.default_directory
    if d:
        if not _absolute(d):
            out.append(error("roots", name, f"default_directory {d!r} is not an absolute path",
                             "Write the full path of the folder new sessions should start in.",
                             ExitCode.USAGE))
        elif inst.roots and inst.rules.classify(d) != "root":
            out.append(warn("roots", name,
                            f"default_directory {d} is not under any root "
                            f"({', '.join(inst.roots)}) or is excluded: dispatch refuses "
                            "it without --force and the patrol creates no session there",
                            "Move default_directory under one of the roots, or add its "
                            "parent folder to roots."))
    return out


def root_usage_findings(inst: InstanceConfig, probe: Probe) -> list[Finding]:
    """Warn about roots that hold no session at all on the instance (a typo, usually)."""
    if not probe.reachable:
        return []
    dirs = [normalize_dir(d) for d in probe.directories if d]
    out = []
    for root in inst.roots:
        key = normalize_dir(root)
        if any(is_under(d, key) for d in dirs):
            continue
        # Suggest a session folder at the same depth that looks like the root (typo hint).
        depth = key.count("/")
        prefixes = sorted({"/".join(d.split("/")[: depth + 1]) for d in dirs})
        near = difflib.get_close_matches(key, prefixes, n=1, cutoff=0.85)
        hint = f" (closest session folder: {near[0]})" if near else ""
        out.append(warn("roots", inst.name,
                        f"root {root} has no sessions on this instance{hint}",
                        "Check the path for a typo against `xaf-hub sessions` or the server's "
                        "folders; on a new project with no sessions yet this is expected."))
    return out


# ---------------------------------------------------------------------------------------------
# State, clock, patrol


def folder_finding(label: str, path: Path, problem: str | None, created_later: bool) -> Finding:
    """The line for one folder the hub writes to."""
    if problem is not None:
        return error("state", label, f"{path} is not writable: {problem}",
                     f"Give the user running the hub write access to {path}, or point "
                     f"{'lock.dir' if label == 'lock folder' else 'state_dir'} at a writable "
                     "folder.", ExitCode.USAGE)
    if created_later:
        return ok("state", label, f"{path} does not exist yet; it will be created on first use")
    return ok("state", label, f"{path} is writable")


def zone_name(tz: tzinfo, now: datetime) -> str:
    """A readable name for a zone: its IANA key when it has one."""
    key = getattr(tz, "key", None)
    return str(key) if key else str(now.astimezone(tz).tzname() or "system local time")


def _until(now: datetime, then: datetime) -> str:
    minutes = max(0, int((then - now).total_seconds() // 60))
    hours, minutes = divmod(minutes, 60)
    return f"in {hours}h {minutes:02d}m" if hours else f"in {minutes}m"


def clock_findings(
    models: ModelsConfig, tz: tzinfo, now: datetime, blackouts: Mapping[str, Blackout],
    families: Mapping[str, Sequence[str]] | None = None,
) -> list[Finding]:
    """The clock's zone, the daily reset of the blackout ``families`` a person chose (none:
    no line) and the rests in force at ``now``."""
    out = [ok("clock", "time zone",
              f"models.timezone {models.timezone!r} -> {zone_name(tz, now)} (today's spend, "
              "rest times)")]
    if families:
        reset = next_reset(now, models.blackout_reset_hour, tz)
        named = ", ".join(f"{n} ({' '.join(p)})" for n, p in sorted(families.items()))
        out.append(ok("clock", "blackouts",
                      f"a rate limit that states no end rests a model of {named} until "
                      f"{models.blackout_reset_hour:02d}:00; next "
                      f"{reset.astimezone(tz):%Y-%m-%d %H:%M %Z} ({_until(now, reset)})"))
    if getattr(tz, "key", None) is None:
        out.append(info("clock", "blackouts",
                        "no IANA zone name found for the local clock; offsets come from the "
                        "operating system",
                        "Set models.timezone to an IANA name (e.g. Asia/Shanghai) if resets "
                        "happen at the hour you do not expect."))
    for target, b in sorted(blackouts.items()):
        until = datetime.fromtimestamp(b.until_ms / 1000, tz)
        why = WHY_WORDS.get(b.why, b.why)
        out.append(warn("clock", f"{b.scope} {target}",
                        f"resting until {until:%Y-%m-%d %H:%M} ({_until(now, until)}; {why}): "
                        f"{b.reason or 'rate limit'} (seen by {b.source or 'unknown'})",
                        "Nothing to do: dispatch uses the next model of the chain until then; "
                        "if work stops, add a model of another family to the chain. "
                        f"`xaf-hub models clear {target}` ends the rest early."))
    return out


_BUBBLEWRAP = "Install bubblewrap (apt-get install bubblewrap; scripts/setup.sh does)"


def sandbox_finding(proof: Proof, network: bool, uncontained: bool) -> Finding:
    """What a probe check in the check's sandbox found (``project.check_command`` set): it
    must not read a secret planted in the state folder nor reach a loopback port the hub
    opened (unless ``project.check_network``)."""
    if proof.contained == "refused":
        if uncontained:
            said = f"checks run uncontained (project.check_uncontained): {proof.reason}"
            return warn("check", "sandbox", said, f"{_BUBBLEWRAP} to contain them.")
        fix = f"{_BUBBLEWRAP}, or see project.check_uncontained in docs/verification.md."
        said = f"no check can run: no sandbox works here: {proof.reason}"
        return error("check", "sandbox", said, fix, ExitCode.USAGE)
    where = f"127.0.0.1:{proof.port}"
    tried = (("read a secret planted in the state folder", proof.secret_read),
             (f"reached {where}", proof.reached and not network))
    leaks = [what for what, bad in tried if bad]
    if leaks:
        said = f"the check is not contained: a probe check {' and '.join(leaks)}"
        fix = "Run no check on this host until the sandbox holds (docs/verification.md)."
        return error("check", "sandbox", said, fix, ExitCode.INTERNAL)
    port = {
        True: f"reached {where} (project.check_network is on)",
        False: f"could not reach {where}",
        None: "could not try the loopback (no bash inside)",
    }[proof.reached]
    return ok("check", "sandbox",
              "contained (bubblewrap): a probe check could not read a secret planted in the state "
              f"folder, {port}, and saw only its own {proof.processes} processes")


def patrol_finding(flag: Path, pause: Mapping[str, Any] | None) -> Finding:
    """Paused or not, from the patrol's durable pause flag (its content when present)."""
    if pause is None:
        return ok("patrol", "pause flag", f"not paused (no {flag})")
    parts = (("since {}", "paused_at"), ("by {}", "by"), ("({})", "note"))
    detail = " ".join(form.format(pause[key]) for form, key in parts if pause.get(key))
    return warn("patrol", "pause flag",
                f"patrol paused{' ' + detail if detail else ''}: no cycle runs; flag {flag}",
                "Run `xaf-hub patrol resume` once the planned work is done; the flag "
                "survives restarts.")


def daemon_finding(beat: Mapping[str, Any] | None) -> Finding:
    """What the patrol daemon's heartbeat says (it cannot prove the daemon is alive)."""
    if beat is None:
        return info("patrol", "daemon", "no patrol daemon has run with this state folder")
    where = f"pid {beat.get('pid', '?')} on {beat.get('host') or '?'}"
    if beat.get("stopped_at"):
        state = f"stopped at {beat['stopped_at']}"
    else:
        state = f"started {beat.get('started_at') or '?'}, no clean stop recorded"
    last = (f"; {beat.get('ticks', 0)} cycle(s), last at {beat['tick_at']} ({beat.get('last')})"
            if beat.get("tick_at") else "")
    return info("patrol", "daemon", f"last daemon {where}: {state}{last}",
                "`xaf-hub patrol status` shows whether it runs now.")


_TO_REDIS = (
    "Give every hub the same Redis: lock.backend and pool.backend \"redis\" with one "
    "lock.redis_url (move the pool once with `xaf-hub backlog export` on the old host and "
    "`xaf-hub backlog import FILE` after the switch); with one host only, run one daemon."
)


def file_backend_findings(
    lock_backend: str, pool_backend: str, this_host: str, beat_host: str | None,
    daemon_hosts: Sequence[str],
) -> list[Finding]:
    """Warn when patrol daemons on two hosts use a backend that lives on one host (pure).

    What can be seen: ``daemon_hosts`` (the HA lease's daemon list in Redis, kept only when the
    gate or the pool is in Redis) and ``beat_host``, the host of the last daemon that wrote
    this state folder's heartbeat (another host only when the folder is shared, e.g. NFS). A
    daemon on another host with its own files and no Redis leaves no trace here.
    """
    hosts = sorted(set(daemon_hosts))
    seen = ""
    if len(hosts) > 1:
        seen = f"patrol daemons seen on {len(hosts)} hosts ({', '.join(hosts)})"
    if lock_backend == "redis" and pool_backend == "file":
        what = seen or "every hub that shares this gate"
        subject, said = "file pool, shared gate", (
            f'pool.backend is "file" while lock.backend is "redis": {what} each fill from '
            "their own pool file, so a task in two pool files can be sent twice"
        )
    elif lock_backend == "file" and pool_backend == "redis" and seen:
        subject, said = "file gate, shared pool", (
            f'lock.backend is "file" with the pool in Redis and {seen}: each host counts '
            "its own sessions, so dispatches from two hosts can go past an instance's limit"
        )
    elif lock_backend == "file" and pool_backend == "file" and beat_host and (
        beat_host != this_host
    ):
        subject, said = "file backends, two hosts", (
            f"this state folder's last patrol daemon ran on {beat_host}, this is {this_host}: "
            "daemons on two hosts with the file gate and pool each fill and count alone "
            "(tasks can be sent twice, limits do not hold across hosts)"
        )
    else:
        return []
    return [warn("patrol", subject, said, _TO_REDIS)]


async def stream_findings(
    cfg: Config, instances: Sequence[InstanceConfig],
    transport_factory: TransportFactory | None = None,
) -> list[Finding]:
    """One `doctor` line per instance: which event stream live views will follow."""
    modes = await aio.gather(*(probe_mode(cfg, i, transport_factory) for i in instances))
    out = []
    for inst, (mode, version, why) in zip(instances, modes, strict=True):
        on = f"opencode {version}" if version else "this server"
        if why:
            out.append(warn("events", inst.name,
                            f"{why}: watch, the patrol daemon and serve poll it every "
                            f"{POLL_SECONDS:g} s instead, and try its stream again every "
                            f"{BUDGET_COOLDOWN:g} s",
                            "Find what floods the server's event stream (a plugin, a proxy "
                            "replaying frames?); a healthy busy server stays far below it."))
        elif mode == "global":
            out.append(ok("events", inst.name, "live views follow /global/event"))
        elif mode == "directory":
            out.append(info("events", inst.name,
                            f"live views follow /event?directory= per project directory "
                            f"({on} does not stream /global/event)"))
        elif mode == "polling":
            out.append(warn("events", inst.name,
                            f"no event stream answered on {on}: watch, the patrol daemon and "
                            f"serve poll it every {POLL_SECONDS:g} s instead",
                            "Upgrade the server to opencode 1.18 or later, or check that no "
                            "proxy in front of it buffers or blocks text/event-stream."))
    return out
