"""Load and validate config.json, config.local.json and credentials (architecture §11).

Validation is strict: an unknown key, a wrong type, a duplicate instance or a literal
password in config.json stops the run with a ConfigError that names the file and key.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from xaf_hub.config.credentials import (
    CREDENTIAL_KEYS,
    REDIS_PASSWORD_ENV,
    local_overrides,
    password_var,
    pw_env_name,
    resolve_password,
)
from xaf_hub.config.notify import NotifyConfig, parse_notify
from xaf_hub.config.reader import (
    Check,
    each,
    http_url,
    instances_list,
    json_type,
    load_json_file,
    read_section,
    read_settings,
    setting,
)
from xaf_hub.config.reader import Reader as _Reader
from xaf_hub.core.rules import ProjectRules
from xaf_hub.errors import Cause, ConfigError, MissingPassword, UnreachableError, UsageError

_ABSOLUTE = re.compile(r"^(/|[A-Za-z]:[\\/]|\\\\)")
_DOT_SEGMENT = re.compile(r"(^|[\\/])\.{1,2}([\\/]|$)")


MAX_SCAN_WORKERS = 64  # the default scan_workers: one per instance, at most this many
DEFAULT_CONCURRENCY = 2  # runs at once on an instance: concurrency_limit, the config's and one's
BRANCH_POLICIES = ("branch", "mainline")  # what an instance's or a project's branch_policy says


def hub_home(env: Mapping[str, str] | None = None) -> Path:
    """The hub's home folder: $XAF_HUB_HOME or ~/.xaf_hub."""
    env = os.environ if env is None else env
    raw = env.get("XAF_HUB_HOME")
    return Path(raw).expanduser() if raw else Path.home() / ".xaf_hub"


_REDIS_PREFIX = re.compile(r"^[A-Za-z0-9_.:-]+$")


# The checks of single keys (reader.Check): each gets the value the file gives, after its type
# and limits, and returns the value kept.


def _must(
    ok: Callable[[Any], object], message: str, keep: Callable[[Any], Any] = lambda v: v
) -> Check:
    """The check that refuses a value ``ok`` rejects with ``message`` (``{value}`` in it: the
    value) and keeps ``keep(value)`` of any other."""

    def check(r: _Reader, name: str, value: Any) -> Any:
        if not ok(value):
            raise r.fail(name, message.format(value=value))
        return keep(value)

    return check


# An amount of US dollars: a finite number, at least 0 (a project's daily budget: above 0).
usd = _must(lambda v: math.isfinite(v) and v >= 0,
            "must be an amount of US dollars, at least 0, got {value}", float)
_budget_usd = _must(lambda v: math.isfinite(v) and v > 0,
                    "must be an amount of US dollars above 0, got {value}", float)


def _user_path(r: _Reader, name: str, value: str) -> Path | None:
    """A folder as written (``~`` is the user's home); "" is none."""
    return Path(value).expanduser() if value else None


def _beside_config(r: _Reader, name: str, value: str) -> Path:
    """A file or folder; a relative one is the config file's neighbour."""
    candidate = Path(value).expanduser()
    return candidate if candidate.is_absolute() else Path(r.file).parent / candidate


def _redis_url(r: _Reader, name: str, url: str) -> str:
    if not url:
        return url
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise r.fail(name, f"must be a redis://, rediss:// or unix:// URL, got {url!r}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError:
        raise r.fail(name, f"bad port in {url!r}") from None
    if parts.scheme != "unix" and not parts.hostname:
        raise r.fail(name, f"names no host: {url!r}")
    if parts.password or re.search(r"(^|&)password=", parts.query):
        raise r.fail(name, f"must not carry a password; put it in the env var {REDIS_PASSWORD_ENV}")
    return url


_redis_prefix = _must(_REDIS_PREFIX.match, "use letters, digits and _ . : - only, got {value!r}")
# A root or an exclusion is where the hub draws the project's line: one spelt with `..` is
# refused, not guessed at.
_folder = _must(lambda path: not _DOT_SEGMENT.search(path),
                "must not hold '.' or '..' segments, got {value!r}: write the folder")


def _absolute_path(r: _Reader, name: str, path: str) -> str:
    if path and not _ABSOLUTE.match(path):
        raise r.fail(name, f"must be an absolute path, got {path!r}", "relative_path")
    return str(_folder(r, name, path))


_absolute_paths = each(_absolute_path)


_model_id = _must(lambda v: "/" in v and not v.startswith("/") and not v.endswith("/"),
                  "expected 'provider/model', got {value!r}")


_model_ids = each(_model_id)


def _time_zone(r: _Reader, name: str, tz: str) -> str:
    if tz != "local":
        # deferred: start-up, docs/performance.md
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise r.fail(name, f"unknown time zone {tz!r}", "bad_timezone") from None
    return tz


def _repository(r: _Reader, name: str, url: str) -> str:
    """A git URL as written, or a path (a relative one is the config file's neighbour)."""
    url = url.strip()
    if url.startswith("-"):
        raise r.fail(name, "must be a git URL or a path, not an option")
    local = "://" not in url and not re.match(r"^[^/]*:", url)  # not scp-like host:path either
    if url and local and not _ABSOLUTE.match(url):
        url = str((Path(r.file).parent / Path(url).expanduser()).resolve())
    return url


def _commit_url(r: _Reader, name: str, url: str) -> str:
    url = url.strip()
    if url:
        http_url(r, name, url)
        if "{commit}" not in url:
            raise r.fail(name, "must hold {commit} where the hash goes")
    return url


_command = _must(lambda c: c.strip() or not c, "must not be blank (leave it out for no check)",
                 str.strip)


# The words project.check_uncontained must hold for a check to run where no sandbox works.
UNCONTAINED = "the check may read and change everything the hub can"


_consent = _must(lambda words: words in ("", UNCONTAINED),
                 f"must be exactly {UNCONTAINED!r} (or left out: no uncontained check)")


def _relative_glob(r: _Reader, name: str, glob: str) -> str:
    if not glob.strip():
        raise r.fail(name, "must not be empty")
    if glob.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", glob):
        raise r.fail(name, f"must be relative to the repository's root, got {glob!r}")
    if ".." in glob.replace("\\", "/").split("/"):
        raise r.fail(name, f"must not climb out of the repository with '..', got {glob!r}")
    return glob.strip()


_more_than_zero = _must(lambda v: v > 0, "must be more than 0 (or null: off), got {value}", float)


def _page_language(r: _Reader, name: str, value: str) -> str:
    """"auto" (the browser's), "en" or "zh"; a tag such as "zh-CN" counts as its language."""
    return r.choice(name, ("auto", "en", "zh"), value, tags=True)


def _integration_branch(r: _Reader, name: str, branch: str) -> str:
    base = branch.strip().removeprefix("origin/")
    if not base or base.startswith("feature/"):
        raise r.fail(name, f"must name the integration branch, got {branch!r}")
    return branch


def _regex(r: _Reader, name: str, pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise r.fail(name, f"invalid regular expression: {exc}") from None
    return pattern


@dataclass(frozen=True)
class InstanceConfig:
    """One opencode server as configured."""

    name: str
    url: str
    username: str = setting("opencode")
    password: str | None = field(default=None, repr=False)
    password_source: str = "none"
    roots: tuple[str, ...] = setting((), check=_absolute_paths)
    default_directory: str = setting("", check=_absolute_path)
    danger: bool = setting(False)
    readonly_default: bool = setting(False)
    # The config's default is the chosen project's, else "mainline" for an instance whose
    # name starts with "local"; ``own_branch_policy`` is its own key ("": not set), which wins.
    branch_policy: str = setting("branch", choices=BRANCH_POLICIES)
    own_branch_policy: str = ""
    # The config's default is its top-level concurrency_limit.
    concurrency_limit: int = setting(DEFAULT_CONCURRENCY, minimum=1)
    dir_aliases: tuple[tuple[str, str], ...] = ()
    models: tuple[str, ...] = setting((), check=_model_ids)
    api: str = setting("auto", choices=("auto", "classic", "v2"))
    note: str = setting("")
    rules: ProjectRules = field(default_factory=ProjectRules)
    # The env var the config names for the password, if any.
    password_env: str = setting("")
    # This instance's spend today, at most (None: no cap).
    budget_daily_usd: float | None = setting(None, check=usd)
    # One run's cost on it, at most (None: budget.run_usd).
    budget_run_usd: float | None = setting(None, check=usd)
    # The chosen project ("" none: ``rules`` then hold nothing), its share of the limit, and
    # every configured project's rules here: the load counts the runs of them all.
    project: str = ""
    share: int | None = None
    fleet: tuple[tuple[str, ProjectRules], ...] = ()

    def owner(self, directory: str, checkout: str = "") -> str:
        """The configured project whose sessions ``directory`` holds ("" none), the chosen
        one first."""
        return next((name for name, rules in self.fleet if rules.owns(directory, checkout)), "")

    def claims(self, directory: str, checkout: str = "") -> bool:
        """Whether ``directory``'s sessions are the project's: the chosen project's by its
        rules; seen as every project (none chosen), any configured project's."""
        if self.project or not self.fleet:
            return self.rules.owns(directory, checkout)
        return bool(self.owner(directory, checkout))

    @property
    def production(self) -> bool:
        """True when writes need --allow-prod."""
        return self.danger or self.readonly_default

    def secrets(self) -> tuple[str, ...]:
        """Never printed: the password, and user:password (its base64 is the Basic credential)."""
        return (self.password, f"{self.username}:{self.password}") if self.password else ()

    def unreachable(self, reason: str, cause: Cause | None) -> UnreachableError:
        """The error of this instance failing with ``reason``: MissingPassword (a config fix)
        when the server asked for a password the config does not give."""
        if cause == "no_password":
            return MissingPassword(self.name, password_var(self.name, self.password_env))
        return UnreachableError(self.name, reason, cause=cause or "other")


@dataclass(frozen=True)
class RepositoryConfig:
    """project.repository and its neighbours: where "done" is checked (architecture §8)."""

    # A git remote URL or a local path; "" = tasks are done on the agent's word.
    url: str = setting("", key="repository", check=_repository)
    # The page's link for a commit, "{commit}" stands for its hash.
    commit_url: str = setting("", check=_commit_url)
    fetch_timeout_seconds: float = setting(60.0, minimum=1)
    # Green: a shell command run on the claimed commit in a throw-away worktree of
    # the mirror ("" = none), its bound, and how often a failure goes back to the session.
    check_command: str = setting("", check=_command)
    check_timeout_seconds: float = setting(600.0, minimum=1)
    check_retries: int = setting(1)
    # Globs of paths a task's commits must not touch to be done automatically (tests/**).
    locked_paths: tuple[str, ...] = setting((), check=each(_relative_glob))
    # The test runner's own configuration (core.commits.RUNNER_CONFIG) is locked too.
    locked_defaults: bool = setting(True)
    # What the contained check may reach beyond its copy: read-only folders (a toolchain)
    # and the network (loopback included).
    check_paths: tuple[str, ...] = setting((), check=_absolute_paths)
    check_network: bool = setting(False)
    # Where no sandbox works the check runs uncontained only when this holds UNCONTAINED.
    check_uncontained: str = setting("", check=_consent)

    # "worktree": each new session for a task works in a worktree and branch of its own on its
    # server (docs/worktrees.md); "shared": in the project's one checkout there.
    isolation: str = setting("shared", choices=("shared", "worktree"))
    # With worktrees: who brings a verified task's branch onto the base branch ("auto": the
    # hub; "review": a person, `xaf-hub land`; "off": nobody, the task is done when verified),
    # how (rebase and fast-forward, or a merge commit), and how often a conflict goes back
    # to the session before a person decides.
    integrate: str = setting("auto", choices=("auto", "review", "off"))
    integrate_method: str = setting("rebase", choices=("rebase", "merge"))
    conflict_retries: int = setting(1)

    @property
    def locked(self) -> tuple[str, ...]:
        """Every glob a task's commits must not touch: ``locked_paths`` and the defaults."""
        # deferred: start-up (its patterns compile on import), docs/performance.md
        from xaf_hub.core.commits import RUNNER_CONFIG

        return self.locked_paths + (RUNNER_CONFIG if self.locked_defaults else ())

    def secrets(self) -> tuple[str, ...]:
        """A token in the URL (``https://user:TOKEN@host/...``, or ``https://TOKEN@host/...``)."""
        parts = urlsplit(self.url) if "://" in self.url else None
        if parts is None or not parts.netloc or "@" not in parts.netloc:
            return ()
        user, password = parts.username or "", parts.password or ""
        if password:
            return (password, f"{user}:{password}")
        # A user with no password over http(s) is a token in that place (ssh://git@ is not).
        return (user,) if user and parts.scheme in ("http", "https") else ()


@dataclass(frozen=True)
class LockConfig:
    """Gate settings (architecture §5)."""

    slot_ttl_seconds: float = setting(60.0, minimum=1)
    lock_timeout_seconds: float = setting(20.0)
    slot_grace_seconds: float = setting(5.0)
    dir: Path | None = setting(None, check=_user_path)
    # "file": locks/ and slots/ on this host. "redis": one gate shared by every host using it.
    backend: str = setting("file", choices=("file", "redis"))
    # Required with the redis backend (no default: a silent localhost fallback would give
    # each host its own private gate); its password only ever comes from the environment.
    redis_url: str = setting("", check=_redis_url)
    redis_prefix: str = setting("xaf-hub", check=_redis_prefix)
    redis_password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ModelsConfig:
    """Dispatch model policy (architecture §7)."""

    default_dispatch_model: str | None = setting(None, check=_model_id)
    chain: tuple[str, ...] = setting((), check=_model_ids)
    blackout_families: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("opencode", ("opencode/", "opencode-go/")),
    )
    families_named: bool = False  # the config names blackout_families (else the built-in one)
    blackout_reset_hour: int = setting(8, maximum=23)
    timezone: str = setting("local", check=_time_zone)
    # Where blackouts and healed memory live; "redis" shares them through lock.redis_url.
    state_backend: str = setting("file", choices=("file", "redis"))
    # What a rate limit rests: its model's whole "family" (seed), or only that "model".
    rest_scope: str = setting("family", choices=("family", "model"))
    # The longest rest a rate limit calls for, whatever the provider says (a week; a year at most).
    max_rest_hours: float = setting(168.0, minimum=0.01, maximum=8760)

    def families(self) -> dict[str, list[str]]:
        """Blackout families as a plain mapping."""
        return {name: list(prefixes) for name, prefixes in self.blackout_families}


@dataclass(frozen=True)
class PoolConfig:
    """Where the task pool lives: "file" (tasks_backlog.json) or "redis" (lock.redis_url)."""

    backend: str = setting("file", choices=("file", "redis"), quoted=False)


@dataclass(frozen=True)
class BudgetConfig:
    """The daily spend ceiling of every configured project together (None: no ceiling)."""

    daily_usd: float | None = setting(None, check=usd)
    # One run's cost, from its prompt to idle, at most (None: no ceiling per run).
    run_usd: float | None = setting(None, check=usd)


@dataclass(frozen=True)
class PermissionRule:
    """One policy rule: a permission ``kind`` (bash, edit, ...; ``*`` any) whose every pattern
    matches ``pattern`` (shell-style: ``git status*``) is answered ``action``."""

    kind: str
    pattern: str
    action: str  # "allow" | "deny"

    def describe(self) -> str:
        """How the audit names the rule."""
        return f"{self.kind} {self.pattern!r} {self.action}"


@dataclass(frozen=True)
class PermissionsConfig:
    """How the patrol answers runs waiting for a person (docs/waiting.md): the ordered
    ``rules`` (first match wins; nothing is allowed unless a rule says so) and
    ``deny_after_minutes`` (None: never deny for want of an answer)."""

    rules: tuple[PermissionRule, ...] = ()
    deny_after_minutes: float | None = setting(None, check=_more_than_zero)


@dataclass(frozen=True)
class PatrolConfig:
    """Patrol settings (architecture §8)."""

    interval_minutes: float = setting(60.0, minimum=0.01)
    minute_offset: int = setting(0, maximum=59)
    stale_minutes: float = setting(90.0)
    repo_root: Path | None = setting(None, check=_beside_config)
    design_dirs: tuple[str, ...] = setting(("docs/superpowers/plans", "docs/superpowers/specs"))
    design_max_age_days: int = setting(30)
    pending_markers: tuple[str, ...] = setting(())
    batch_patterns: tuple[str, ...] = setting((), check=each(_regex))
    base_branch: str = setting("main", check=_integration_branch)
    backlog_path: Path | None = setting(None, check=_beside_config)
    lead_backlog_path: Path | None = setting(None, check=_beside_config)
    max_attempts: int = setting(3, minimum=1)
    # Infrastructure failures in a row that park a task.
    max_infra_failures: int = setting(4, minimum=1)
    # A prompt unanswered this long was refused.
    no_answer_grace_seconds: float = setting(120.0)
    # A pool row younger than this is not judged yet (its prompt may not show on the server).
    just_dispatched_seconds: float = setting(10.0)
    # A run that "stopped without finishing" must be this quiet before it is resumed (it may
    # still be starting: its status can lag behind its messages).
    run_start_grace_seconds: float = setting(60.0)
    # HA on Redis: how long the active daemon's lease lasts without a renewal; 0: no lease,
    # every daemon runs rounds (the shared pool's claims still send each task once).
    lease_seconds: float = setting(15.0)
    # `status` takes an instance from the live board (ops.live_board) when the follower that
    # publishes it confirmed its view at most this many seconds ago; 0: always scan.
    live_board_seconds: float = setting(15.0)


@dataclass(frozen=True)
class MatchRule:
    """How strong a smart match must be (docs/matching.md): reusing an idle session needs
    ``reuse`` and a lead of ``margin`` over the next candidate; steering a running one, whose
    agent is mid-work, needs the higher ``steer`` and ``steer_margin``. Defaults come from the
    labelled set's curve (`python -m bench --match`)."""

    reuse: float = setting(0.30, key="match_threshold")
    margin: float = setting(0.10, key="match_margin")
    steer: float = setting(0.35, key="steer_threshold")
    steer_margin: float = setting(0.15)
    # A text that refers back to earlier work ("also", 还) needs less (core.cues).
    cue: float = setting(0.10, key="cue_threshold")
    cue_margin: float = setting(0.05)

    def to_json(self) -> dict[str, float]:
        """The config keys and values."""
        return {f.metadata["setting"].key or f.name: getattr(self, f.name) for f in fields(self)}


_PROJECT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
# The patrol keys an entry of ``projects`` may set for itself (the ``patrol`` ones are defaults).
PROJECT_PATROL = ("repo_root", "design_dirs", "design_max_age_days", "pending_markers",
                  "batch_patterns", "base_branch")


@dataclass(frozen=True)
class ProjectConfig:
    """One project of the config: ``project`` alone, or one entry of ``projects``."""

    name: str = setting("project")  # an entry of ``projects``: its key
    fallback_segments: tuple[str, ...] = setting(())
    exclude_dirs: tuple[str, ...] = setting((), check=each(_folder))
    exclude_substrings: tuple[str, ...] = setting(())
    repository: RepositoryConfig = field(default_factory=RepositoryConfig)
    roots: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # per instance name
    default_directory: Mapping[str, str] = field(default_factory=dict)  # per instance name
    share: int | None = None  # its runs on each server, at most (None: up to the limit)
    # Its spend today, at most (None: no cap of its own); budget.daily_usd is every project's.
    budget_daily_usd: float | None = setting(None, check=_budget_usd)
    budget_run_usd: float | None = setting(None, check=usd)  # one run's cost (None: budget's)
    discipline: str | None = setting(None)  # its prompts' discipline text (None: the pool's)
    # Its instances' branch_policy where an instance sets none (None: by instance name).
    branch_policy: str | None = setting(None, choices=BRANCH_POLICIES)
    # ``patrol`` with this project's own PROJECT_PATROL keys (repository, design documents,
    # base branch); the rest are the config's.
    patrol: PatrolConfig = field(default_factory=PatrolConfig)

    def rules(self, instance: str) -> ProjectRules:
        """Its directory rules on ``instance``."""
        return ProjectRules.build(
            roots=self.roots.get(instance, ()),
            fallback_segments=self.fallback_segments,
            exclude_dirs=self.exclude_dirs,
            exclude_substrings=self.exclude_substrings,
        )


@dataclass(frozen=True)
class Config:
    """The whole validated configuration, seen as its chosen project (``project_name``, the
    project keys, each instance's roots and rules): a config of several projects has none
    chosen until ``choose`` (``chosen`` False, no session is the project's)."""

    path: Path | None
    home: Path
    state_dir: Path
    # The chosen project's keys, as ``ProjectConfig`` declares them (``_seen_as`` copies them
    # here): its spend today, at most, its own run ceiling (None: budget.run_usd), the
    # discipline text of its prompts (None: the task pool's override) and the branch_policy
    # of an instance that sets none (None: by instance name).
    project_name: str = "project"
    fallback_segments: tuple[str, ...] = ()
    exclude_dirs: tuple[str, ...] = ()
    exclude_substrings: tuple[str, ...] = ()
    project_budget_usd: float | None = None
    project_run_usd: float | None = None
    discipline: str | None = None
    branch_policy: str | None = None
    repository: RepositoryConfig = field(default_factory=RepositoryConfig)
    concurrency_limit: int = setting(DEFAULT_CONCURRENCY, minimum=1)
    session_ttl_days: float = setting(10.0)
    match: MatchRule = field(default_factory=MatchRule)
    auto_match: bool = setting(True)
    connect_timeout: float = setting(8.0, key="connect_seconds", section="timeouts", minimum=0.1)
    read_timeout: float = setting(30.0, key="read_seconds", section="timeouts", minimum=0.1)
    # One instance's whole scan (and any one answer), at most; the config's default is
    # read_seconds + 5.
    scan_timeout: float = setting(35.0, key="scan_seconds", section="timeouts", minimum=0.1)
    retries: int = setting(1)
    page_size: int = setting(8000, minimum=1)
    # Instances scanned at once; the config's default is one per instance, at most
    # MAX_SCAN_WORKERS (scanning is waiting on servers).
    scan_workers: int = setting(6, minimum=1)
    lock: LockConfig = field(default_factory=LockConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    patrol: PatrolConfig = field(default_factory=PatrolConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    permissions: PermissionsConfig = field(default_factory=PermissionsConfig)
    instances: tuple[InstanceConfig, ...] = ()
    local_config: Path | None = None
    local_scope: str = ""
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    # The overview page's: "auto" (the browser's), "en" or "zh".
    page_language: str = setting("auto", key="language", section="page", check=_page_language)
    projects: tuple[ProjectConfig, ...] = ()
    chosen: bool = True

    def choose(self, name: str) -> Config:
        """This config seen as project ``name`` (UsageError naming the projects if unknown)."""

        p = next((p for p in self.projects if p.name == name), None)
        if p is None:
            raise UsageError(f"unknown project {name!r} (configured: {self.project_names()})")
        return _seen_as(self, p)

    def every_project(self) -> Config:
        """This config's instances as every project sees them (itself with one project): what
        one scan shared by every project's view reads."""
        return self if len(self.projects) < 2 else _seen_as(self, None)

    def discipline_or(self, pool: str | None) -> str | None:
        """The discipline text of the chosen project's prompts: its own, else ``pool``'s (the
        task pool's override)."""
        return pool if self.discipline is None else self.discipline

    def one_project(self) -> Config:
        """This config when a project is chosen; else UsageError naming the projects."""

        if not self.chosen:
            raise UsageError(
                f"this config has several projects: say which with --project NAME "
                f"(configured: {self.project_names()})"
            )
        return self

    def shown_projects(self) -> tuple[str, ...]:
        """The projects a view shows apart: every one when none is chosen, else none."""
        return () if self.chosen else tuple(p.name for p in self.projects)

    def project_names(self) -> str:
        """The configured projects' names, for a message."""
        return ", ".join(p.name for p in self.projects)

    @property
    def lock_dir(self) -> Path:
        """Folder for locks/ and slots/."""
        return self.lock.dir or self.state_dir

    @property
    def backlog_path(self) -> Path:
        """The task pool file."""
        return self.patrol.backlog_path or self.state_dir / "tasks_backlog.json"

    def instance(self, name: str) -> InstanceConfig:
        """Look up one instance by name, or raise a UsageError listing the known ones."""

        for inst in self.instances:
            if inst.name == name:
                return inst
        known = ", ".join(i.name for i in self.instances) or "none"
        raise UsageError(f"unknown instance {name!r} (configured: {known})")

    def secrets(self) -> tuple[str, ...]:
        """Every secret value held, for redaction."""
        redis = (self.lock.redis_password,) if self.lock.redis_password else ()
        hooks = self.notify.secrets() + tuple(
            s for p in self.projects for s in p.repository.secrets()
        ) + self.repository.secrets()
        return tuple(s for inst in self.instances for s in inst.secrets()) + redis + hooks


# ---------------------------------------------------------------------------------------


def find_config(explicit: str | None, env: Mapping[str, str], cwd: Path) -> Path:
    """Find the config: --config, XAF_HUB_CONFIG, ./config.json, $XAF_HUB_HOME/config.json."""
    if explicit:
        return Path(explicit).expanduser()
    if env.get("XAF_HUB_CONFIG"):
        return Path(env["XAF_HUB_CONFIG"]).expanduser()
    local = cwd / "config.json"
    if local.is_file():
        return local
    home_cfg = hub_home(env) / "config.json"
    if home_cfg.is_file():
        return home_cfg
    raise ConfigError(
        f"no config found: tried --config, $XAF_HUB_CONFIG, {local} and {home_cfg}; "
        "run `xaf-hub init` to write a starter config.json",
        "no_config",
    )


def load_config(
    explicit: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Config:
    """Find, read and validate the configuration and its credentials."""
    env = dict(os.environ) if env is None else dict(env)
    cwd = Path.cwd() if cwd is None else cwd
    path = find_config(explicit, env, cwd)
    raw = load_json_file(path)
    return parse_config(raw, path=path, env=env)


def parse_config(raw: Any, *, path: Path, env: Mapping[str, str]) -> Config:
    """Validate an already-parsed config document (credentials resolved from env and files)."""
    home = hub_home(env)
    top = _Reader(raw, path, "")
    several = "projects" in top.data
    if several and "project" in top.data:
        raise top.fail("projects", "give either project (one project) or projects, not both")
    project = top.sub("project")
    named = read_settings(ProjectConfig, project)
    repository = _parse_repository(project)
    project.finish()

    top.seen.add("instances")
    inst_raw = instances_list(top.data.get("instances", []), path)
    workers = min(MAX_SCAN_WORKERS, max(1, len(inst_raw)))  # one per instance, at most 64
    numbers = read_settings(Config, top, defaults={"scan_workers": workers})
    match = read_section(MatchRule, top)
    state_raw = top.get("state_dir", (str,), None)
    state_dir = Path(state_raw).expanduser() if state_raw else home
    timeouts = top.sub("timeouts")
    times = read_settings(Config, timeouts, section="timeouts")
    if timeouts.data.get("scan_seconds") is None:  # a scan: its reads and 5 s more
        times["scan_timeout"] = times["read_timeout"] + 5.0
    timeouts.finish()

    lock_r = top.sub("lock")
    lock = read_section(LockConfig, lock_r, redis_password=env.get(REDIS_PASSWORD_ENV) or None)
    if lock.backend == "redis" and not lock.redis_url:
        raise lock_r.fail("redis_url", "required when lock.backend is 'redis' (redis://HOST:6379/0)")
    lock_r.finish()

    models = _parse_models(top.sub("models"), path)
    patrol = _whole_section(PatrolConfig, top.sub("patrol"))
    pool = _whole_section(PoolConfig, top.sub("pool"))
    shared = {"models.state_backend": models.state_backend, "pool.backend": pool.backend}
    for key in (k for k, backend in shared.items() if backend == "redis" and not lock.redis_url):
        example = "redis://hub-redis.example.internal:6379/0"
        raise top.fail(key, f"'redis' needs lock.redis_url (e.g. {example})")
    budget = _whole_section(BudgetConfig, top.sub("budget"))
    permissions = _parse_permissions(top.sub("permissions"))
    page = top.sub("page")
    page.seen.add("url")  # notify/ reads and checks page.url
    language = read_settings(Config, page, section="page")
    page.finish()

    # config.local.json beside the config file overrides instance fields; the one in the hub
    # home only lends credential fields for instances this config already has.
    local_path: Path | None = path.parent / "config.local.json"
    local_scope = "beside"
    assert local_path is not None
    if not local_path.is_file():
        local_path, local_scope = home / "config.local.json", "home"
        if not local_path.is_file() or local_path.resolve() == path.resolve():
            local_path, local_scope = None, ""
    overrides: dict[str, dict[str, Any]] = {} if local_path is None else local_overrides(
        load_json_file(local_path, "config.local.json"), local_path)

    instances = []
    for i, obj in enumerate(inst_raw):
        label = f"instances[{i}]"
        name = obj["name"]
        if any(earlier["name"] == name for earlier in inst_raw[:i]):
            problem = f"duplicate instance name '{name}'"
            raise top.fail(f"{label}.name", problem, "duplicate_instance")
        if obj.get("password") not in (None, ""):
            fix = f"move it to config.local.json or the env var {pw_env_name(name)}"
            problem = f"a literal password does not belong in {path.name}; {fix}"
            raise top.fail(f"{label}.password", problem, "literal_password")
        merged = dict(obj)
        for key, value in overrides.get(name, {}).items():
            if local_scope == "home" and key not in CREDENTIAL_KEYS:
                continue
            if key in CREDENTIAL_KEYS and value is not None and not isinstance(value, str):
                # Checked here: a wrong type would otherwise be ignored (password) or blamed
                # on the main config file (the others).
                raise ConfigError(
                    f"{local_path}: key 'instances.{name}.{key}': expected a string, "
                    f"got {json_type(value)}"
                )
            merged["_local_password" if key == "password" else key] = value
        for key in (k for k in ("roots", "default_directory") if several and k in obj):
            per = f"each project names its {key} per instance (projects.NAME.{key}.{name})"
            raise top.fail(f"{label}.{key}", f"with projects, {per}")
        instances.append(
            _parse_instance(merged, path, label, env, local_path, numbers["concurrency_limit"])
        )
    if several:
        projects = _parse_projects(top.sub("projects"), [i.name for i in instances], patrol)
    else:
        roots = {i.name: i.roots for i in instances}
        default = {i.name: i.default_directory for i in instances}
        projects = (ProjectConfig(**named, repository=repository, roots=roots, patrol=patrol,
                                  default_directory=default),)

    # notify/ owns its section; it also reads page.language and page.url (the page owns them).
    top.seen.update({"$schema", "_comment", "notify", "page"})
    notify = parse_notify(top.data.get("notify"), top.data.get("page"), file=path, env=env)
    top.finish()
    whole = Config(
        path=path,
        home=home,
        state_dir=state_dir,
        repository=repository,
        match=match,
        lock=lock,
        models=models,
        patrol=patrol,
        pool=pool,
        budget=budget,
        permissions=permissions,
        instances=tuple(instances),
        local_config=local_path,
        local_scope=local_scope,
        notify=notify,
        projects=projects,
        **numbers,
        **times,
        **language,
    )
    return _seen_as(whole, projects[0] if len(projects) == 1 else None)


# The keys a Config takes from its chosen project under the same name (``_seen_as``).
_AS_CHOSEN = ("fallback_segments", "exclude_dirs", "exclude_substrings", "repository",
              "discipline", "branch_policy", "patrol")


def _seen_as(cfg: Config, p: ProjectConfig | None) -> Config:
    """``cfg`` as project ``p`` sees it (None: as no project)."""
    order = sorted(cfg.projects, key=lambda q: p is None or q.name != p.name)
    instances = tuple(
        replace(
            inst,
            roots=p.roots.get(inst.name, ()) if p else (),
            default_directory=p.default_directory.get(inst.name, "") if p else "",
            rules=p.rules(inst.name) if p else ProjectRules(),
            project=p.name if p else "",
            share=p.share if p else None,
            branch_policy=inst.own_branch_policy or (p.branch_policy if p else None)
            or _name_policy(inst.name),
            fleet=tuple((q.name, q.rules(inst.name)) for q in order),
        )
        for inst in cfg.instances
    )
    if p is None:
        return replace(cfg, instances=instances, chosen=False, project_name="",
                       project_budget_usd=None, project_run_usd=None, discipline=None,
                       branch_policy=None)
    return replace(cfg, instances=instances, chosen=True, project_name=p.name,
                   project_budget_usd=p.budget_daily_usd, project_run_usd=p.budget_run_usd,
                   **{key: getattr(p, key) for key in _AS_CHOSEN})


def _parse_projects(
    r: _Reader, instances: list[str], patrol: PatrolConfig
) -> tuple[ProjectConfig, ...]:
    """The ``projects`` section: each entry today's ``project`` keys, its roots and default
    folder per instance, its share and its own PROJECT_PATROL keys (``patrol``'s by default)."""
    if not r.data:
        raise ConfigError(f"{r.file}: key 'projects': must name at least one project")
    found = []
    for name in r.data:
        r.seen.add(name)
        if not _PROJECT_NAME.match(name):
            raise r.fail(
                name, "a project's name is a short identifier: a letter, then letters, digits, "
                "_ or -, at most 32 in all"
            )
        p = _Reader(r.data[name], r.file, r.key(name))
        if "name" in p.data:
            raise p.fail("name", "the project's key is its name; leave name out")
        named = read_settings(ProjectConfig, p, defaults={"name": name})
        repository = _parse_repository(p)
        roots = _per_instance(p, "roots", instances, lambda q, k: _absolute_paths(
            q, k, q.strings(k)))
        default = _per_instance(p, "default_directory", instances, lambda q, k: _absolute_path(
            q, k, q.get(k, (str,), "", nullable=False)))
        own = _Reader({k: p.data[k] for k in PROJECT_PATROL if k in p.data}, r.file, p.where)
        p.seen.update(own.data)
        share = p.get("share", (int, float), None)
        if share is not None and (share != int(share) or share < 1):
            raise p.fail("share", f"must be a whole number, at least 1 (or left out: up to the "
                         f"limit), got {share}")
        p.finish()
        found.append(ProjectConfig(
            **named, repository=repository, roots=roots, default_directory=default,
            share=None if share is None else int(share),
            patrol=read_section(PatrolConfig, own, defaults=vars(patrol)),
        ))
    return tuple(found)


_T = TypeVar("_T")


def _per_instance(
    r: _Reader, key: str, instances: list[str], read: Callable[[_Reader, str], _T]
) -> dict[str, _T]:
    """An object keyed by instance name (``roots``, ``default_directory``) of one project."""
    sub = r.sub(key)
    for name in sub.data:
        if name not in instances:
            raise sub.fail(name, f"no such instance (configured: {', '.join(instances)})")
    got = {name: read(sub, name) for name in sub.data}
    sub.finish()
    return got


def _parse_repository(r: _Reader) -> RepositoryConfig:
    """project.repository, commit_url, fetch_timeout_seconds and the checks of done work."""
    repo = read_section(RepositoryConfig, r)
    if (repo.check_command or repo.locked_paths) and not repo.url:
        what = "check_command" if repo.check_command else "locked_paths"
        raise r.fail(what, "needs project.repository (the commits it judges are read there)")
    return repo


def _parse_models(r: _Reader, path: Path) -> ModelsConfig:
    families = r.get("blackout_families", (dict,), None)
    computed: dict[str, Any] = {}
    if families is not None:  # an object of lists of model-id prefixes
        fam_r = _Reader(families, path, r.key("blackout_families"))
        computed["blackout_families"] = tuple((k, fam_r.strings(k)) for k in families)
        computed["families_named"] = True
    return _whole_section(ModelsConfig, r, **computed)


def _whole_section(cls: type[_T], r: _Reader, **computed: Any) -> _T:
    """A section whose every key ``cls`` declares, and its fields read another way."""
    section = read_section(cls, r, **computed)
    r.finish()
    return section


def _parse_instance(
    obj: dict[str, Any],
    path: Path,
    label: str,
    env: Mapping[str, str],
    local_path: Path | None,
    default_limit: int,
) -> InstanceConfig:
    name = obj["name"]
    password, source = resolve_password(obj, name, env, path, local_path)
    r = _Reader({k: v for k, v in obj.items() if k != "_local_password"}, path, label)
    r.seen.update({"name", "password"})
    url = r.get("url", (str,), None, nullable=False)
    if url is None:
        raise r.fail("url", "missing (e.g. http://127.0.0.1:4096)")
    http_url(
        r, "url", url, "must not carry credentials; use username and config.local.json",
        "url_credentials",
    )
    r.get("password_file", (str,), None)
    r.get("password_key", (str,), None)
    aliases = r.get("dir_aliases", (dict,), {})
    for k, v in aliases.items():
        if not isinstance(v, str):
            raise r.fail(f"dir_aliases.{k}", f"expected a string, got {json_type(v)}")
        _folder(r, "dir_aliases", k)
        _folder(r, f"dir_aliases.{k}", v)
    got = read_settings(InstanceConfig, r, defaults={
        "branch_policy": _name_policy(name), "concurrency_limit": default_limit})
    r.finish()
    return InstanceConfig(
        name=name,
        url=url.rstrip("/"),
        password=password,
        password_source=source,
        dir_aliases=tuple(aliases.items()),
        own_branch_policy=got["branch_policy"] if r.data.get("branch_policy") is not None else "",
        **got,
    )


def _name_policy(name: str) -> str:
    """The branch policy of an instance no key gives one: "mainline" for a "local..." one."""
    return "mainline" if name.startswith("local") else "branch"


def _parse_permissions(r: _Reader) -> PermissionsConfig:
    """The ``permissions`` section: ordered rules and the unanswered-request timeout."""
    raw = r.get("rules", (list,), [])
    rules = []
    for i, item in enumerate(raw):
        rule = _Reader(item, r.file, f"{r.key('rules')}[{i}]")
        kind = rule.get("kind", (str,), "").strip()
        if not kind:
            raise rule.fail("kind", "must name a permission (bash, edit, ...) or *")
        pattern = rule.get("pattern", (str,), "*").strip() or "*"
        action = rule.choice("action", ("allow", "deny"), "")
        rule.finish()
        rules.append(PermissionRule(kind, pattern, action))
    return _whole_section(PermissionsConfig, r, rules=tuple(rules))
