"""The hub's bare mirror of the project's repository: is a claimed commit where the team
looks?

``Mirror`` fetches with a time bound and never pushes, judges claimed commits (``check_all``) and
runs the contained check. No secret on a git command line, no process left after a timeout,
nothing the repository holds run on the hub, every reason redacted (docs/architecture.md §8).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit, urlunsplit

from xaf_hub.config.load import Config
from xaf_hub.core.commits import MAX_RANGE, locked_paths, short
from xaf_hub.core.text import redact
from xaf_hub.errors import BusyError
from xaf_hub.store.contain import CheckRun, Reach, kill_tree, new_folder, remove, run_check, spawn
from xaf_hub.store.statefile import file_lock

CheckState = Literal[
    "verified", "missing", "ambiguous", "no_claim", "unreachable", "old", "locked", "diverged",
    "too_many",
]

# Local git calls (rev-parse, merge-base) on the mirror are quick; this bounds a broken disk.
_LOCAL_TIMEOUT = 30.0
_STDERR_LINES = 3
# What git and the hub make in the mirror (``worktrees``: a landing's throw-away worktree,
# store.landing); any other name there (hooks, commondir, shallow...) was planted.
_MIRROR_NAMES = frozenset(
    {"HEAD", "config", "objects", "refs", "info", "packed-refs", "logs", "FETCH_HEAD",
     "ORIG_HEAD", "gc.pid", "gc.log", "worktrees"}
)
# info/attributes, first among attributes: no filter driver, ident or export rule in the
# commit's own .gitattributes runs or hides anything when the hub exports it.
_ATTRIBUTES = b"* -filter -ident -export-ignore -export-subst\n"
# A fetch of every branch: pruned, no tags, FETCH_HEAD left alone.
_FETCH = ("fetch", "--quiet", "--prune", "--no-tags", "--no-write-fetch-head")
# The paths each given commit's own change touches (``Mirror._paths``).
_CHANGED = ("log", "-z", "--no-walk=unsorted", "--root", "--name-only", "--no-renames", "-c")


@dataclass(frozen=True)
class Check:
    """What the mirror says of one task's claim.

    ``verified``: every claimed hash is on the branch and the task's range is clean;
    ``commit`` is the top (in full). ``missing`` / ``ambiguous`` / ``no_claim`` / ``old`` /
    ``locked`` / ``diverged`` / ``too_many``: not done, a person looks. ``unreachable``: the
    remote could not be read this round; nothing is decided.
    """

    state: CheckState
    commit: str = ""
    reason: str = ""
    new: tuple[str, ...] = ()  # verified: the task's range (base..top, oldest first)
    claimed: tuple[str, ...] = ()  # verified: the new commits the answer names, in full
    base_known: bool = False  # verified: the base was known (else: the claimed commits alone)
    paths: tuple[str, ...] = ()  # locked: the locked paths the commits touch, exactly


class GitFailed(Exception):
    """A git command failed or ran out of time; the message is redacted and one line."""


def mirror_path(state_dir: Path, url: str) -> Path:
    """Where the mirror of ``url`` lives: one per URL, so a changed URL starts afresh."""
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    return state_dir / "repository" / f"{digest}.git"


# git runs a "!" credential helper through its shell; the secret stays in the environment.
_HELPER = (
    '!f() { test "$1" = get && printf "username=%s\\npassword=%s\\n" '
    '"$XAF_HUB_GIT_USERNAME" "$XAF_HUB_GIT_PASSWORD"; }; f'
)


def split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """The URL git may see (no user name or password) and the environment that carries them.

    Only http(s) URLs carry a secret in that place; any other URL is returned as it is.
    ``https://TOKEN@host/x.git`` is a token as the user name with an empty password.
    """
    parts = urlsplit(url) if "://" in url else None
    if parts is None or parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return url, {}
    host = parts.netloc.rsplit("@", 1)[1]
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    raw = os.environ.get("GIT_CONFIG_COUNT", "0")  # entries the hub's environment holds
    first = int(raw) if raw.isdigit() else 0
    env = {
        "XAF_HUB_GIT_USERNAME": user,
        "XAF_HUB_GIT_PASSWORD": password,
        # An empty helper first: the user's own helpers are not asked for this remote.
        f"GIT_CONFIG_KEY_{first}": "credential.helper",
        f"GIT_CONFIG_VALUE_{first}": "",
        f"GIT_CONFIG_KEY_{first + 1}": "credential.helper",
        f"GIT_CONFIG_VALUE_{first + 1}": _HELPER,
        "GIT_CONFIG_COUNT": str(first + 2),
    }
    return bare, env


def origin_of(folder: Path) -> tuple[str, bool]:
    """The URL of the ``origin`` remote of the git checkout at ``folder`` ("" when it is none,
    or has none) without the user name and password an http(s) URL may hold, and whether it
    held them. Only git's config is read: nothing of the checkout runs."""
    if not (folder / ".git").exists():
        return "", False
    try:
        done = subprocess.run(
            [*git_safe(Path(os.devnull)), "-C", str(folder), "config", "--get",
             "remote.origin.url"],
            capture_output=True, timeout=_LOCAL_TIMEOUT, check=False,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return "", False
    url = done.stdout.decode("utf-8", "replace").strip() if done.returncode == 0 else ""
    bare, _ = split_credentials(url)
    return bare, bare != url


def remote_name(branches: Sequence[str]) -> str:
    """How a reason names the branches: origin/main, or "any branch of origin" for none."""
    return " or ".join(f"origin/{b}" for b in branches) or "any branch of origin"


class Mirror:
    """A bare mirror of one remote under the hub's state folder."""

    @classmethod
    def of(cls, cfg: Config) -> Mirror:
        """The mirror of ``project.repository`` as the config sets it (fetch bound, secrets,
        what its checks may reach); with several projects each keeps its mirror and its checks'
        copies in a folder of its own (``projects/NAME``), which no other project's check sees."""
        repo = cfg.repository
        own = cfg.state_dir / "projects" / cfg.project_name if len(cfg.projects) > 1 else None
        return cls(
            repo.url, own or cfg.state_dir, timeout=repo.fetch_timeout_seconds,
            secrets=repo.secrets(),
            reach=Reach(repo.check_paths, repo.check_network, bool(repo.check_uncontained)),
        )

    def __init__(
        self,
        url: str,
        state_dir: Path,
        *,
        timeout: float = 60.0,
        secrets: Sequence[str] = (),
        lock_wait: float | None = None,
        reach: Reach | None = None,
    ) -> None:
        self.url = url
        self.state = state_dir
        self.path = mirror_path(state_dir, url)
        # git's core.hooksPath on every call: a folder of the hub's that stays empty.
        self.hooks = self.path.parent / "no-hooks"
        self.timeout = timeout
        self.secrets = tuple(secrets)
        # Another hub process may be fetching: by default wait for its whole bound, no longer.
        self.lock_wait = timeout + 10.0 if lock_wait is None else lock_wait
        self.reach = reach or Reach()
        self.rebuilt = ""  # set when a fetch found the mirror planted and rebuilt it: why

    # -- git ---------------------------------------------------------------------------------

    def git(
        self,
        *args: str,
        timeout: float = _LOCAL_TIMEOUT,
        ok: Sequence[int] = (0,),
        extra_env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> tuple[int, str]:
        """Run git on the mirror (``cwd``: in that worktree of it): (exit, stdout) for an exit
        in ``ok``, GitFailed (redacted) on any other.

        Never a hook (git's core.hooksPath is an empty folder of the hub's) nor an fsmonitor
        command, whatever a config says, and none of the hub's own ``XAF_HUB_*`` variables.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("XAF_HUB_")}
        for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
            env.pop(name, None)
        env.update(
            GIT_TERMINAL_PROMPT="0",  # never wait for a password nobody will type
            GIT_ASKPASS="",
            SSH_ASKPASS="",
            GCM_INTERACTIVE="never",
            GIT_SSH_COMMAND=os.environ.get("GIT_SSH_COMMAND", "ssh -o BatchMode=yes"),
            LC_ALL="C",
            **(extra_env or {}),
        )
        where = ["-C", str(cwd)] if cwd is not None else ["--git-dir", str(self.path)]
        cmd = [*git_safe(self.hooks), *where, *args]
        verb = next(a for i, a in enumerate(args) if i == 0 or args[i - 1] != "-c")
        # Its own process group: on timeout the whole group goes (git-remote-http, ssh), so
        # no grandchild keeps the pipes open and no git outlives the bound.
        proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.communicate()
            raise GitFailed(f"git {verb} gave no answer within {timeout:g}s") from None
        if proc.returncode not in ok:
            lines = [line.strip() for line in err.decode("utf-8", "replace").splitlines()]
            lines = [line for line in lines if line]
            # git's own verdict ("fatal: ...") says more than the hints that follow it.
            fatal = [line for line in lines if line.startswith(("fatal:", "error:"))]
            said = " / ".join((fatal or lines)[:_STDERR_LINES]) or "no message"
            raise GitFailed(redact(f"git {verb} failed: {said}", self.secrets))
        return proc.returncode, out.decode("utf-8", "replace")

    def out(self, *args: str) -> str:
        """Run a local git command on the mirror: its stdout (GitFailed on a non-zero exit)."""
        return self.git(*args)[1]

    def is_ancestor(self, commit: str, of: str) -> bool:
        """Whether ``commit`` is ``of`` or one of its ancestors."""
        return self.git("merge-base", "--is-ancestor", commit, of, ok=(0, 1))[0] == 0

    def has(self, commit: str) -> bool:
        """Whether the mirror holds ``commit`` as a commit."""
        return self.git("cat-file", "-e", f"{commit}^{{commit}}", ok=(0, 1, 128))[0] == 0

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        lock = self.path.with_name(self.path.name + ".lock")
        return file_lock(lock, self.lock_wait, what="repository mirror lock")

    # -- the mirror --------------------------------------------------------------------------

    def fetch(self) -> None:
        """Bring the mirror up to date with every branch of the remote (GitFailed / BusyError)."""
        with self._locked():
            self._fetch()

    def _fetch(self) -> None:
        planted = self._planted()
        if planted:
            self._set_aside(planted)
        if not (self.path / "HEAD").is_file():
            self.path.mkdir(parents=True, exist_ok=True)
            self.git("init", "--bare", "--quiet", "--template=")  # no hooks, no samples
            (self.path / "info").mkdir(exist_ok=True)
            (self.path / "info" / "attributes").write_bytes(_ATTRIBUTES)
            self._written().write_bytes((self.path / "config").read_bytes())
            self.hooks.mkdir(exist_ok=True)
        url, env = split_credentials(self.url)
        every_branch = "+refs/heads/*:refs/heads/*"
        self.git(*_FETCH, "--", url, every_branch, timeout=self.timeout, extra_env=env)

    def _written(self) -> Path:
        """Beside the mirror: its config as git init wrote it, what the mirror's must match."""
        return self.path.with_name(self.path.name + ".config")

    def _planted(self) -> str:
        """What in the mirror the hub did not write ("" when nothing, or no mirror yet): a
        name git and the hub never make there, a config other than git init's, other
        attributes, alternates, or anything in the empty hooks folder."""
        found: list[str] = []
        if self.hooks.is_dir() and any(self.hooks.iterdir()):
            found.append(f"files in {self.hooks.name}/")
        p = self.path
        if not p.is_dir():
            return ", ".join(found)
        found += sorted(set(os.listdir(p)) - _MIRROR_NAMES)
        info = sorted(os.listdir(p / "info")) if (p / "info").is_dir() else []
        if info != ["attributes"] or _read(p / "info" / "attributes") != _ATTRIBUTES:
            found.append("info/")
        if _read(p / "config") != _read(self._written()):
            found.append("config")
        found += [
            f"objects/info/{n}" for n in ("alternates", "http-alternates")
            if (p / "objects" / "info" / n).exists()
        ]
        return ", ".join(found)

    def _set_aside(self, planted: str) -> None:
        """Move a planted mirror aside (the one before is deleted), empty the hooks folder,
        and remember it for the round's notes; the fetch that follows makes it anew."""
        aside = self.path.with_name(self.path.name + ".planted")
        remove(aside)
        if self.path.exists():
            os.replace(self.path, aside)
        self._written().unlink(missing_ok=True)
        remove(self.hooks)
        self.rebuilt = (
            f"repository mirror rebuilt: it was not as the hub wrote it ({planted}); "
            f"the old one is set aside as {aside}"
        )

    def _refuse_planted(self) -> None:
        planted = self._planted()
        if planted:
            raise GitFailed(
                f"repository mirror not as the hub wrote it ({planted}): rebuilt at the next fetch"
            )

    def resolve(self, claim: str) -> list[str]:
        """Every commit of the mirror whose hash starts with ``claim`` (full hashes)."""
        code, listed = self.git("rev-parse", "--disambiguate=" + claim, ok=(0, 1, 128))
        oids = listed.split() if code == 0 else []
        return [oid for oid in oids if self.out("cat-file", "-t", oid).strip() == "commit"]

    def branches(self) -> list[str]:
        """The mirror's branches (the remote's, as of the last fetch)."""
        return self.out("for-each-ref", "--format=%(refname:short)", "refs/heads/").split()

    # -- a task's claim ----------------------------------------------------------------------

    def tips(self) -> dict[str, str]:
        """Fetch, then every branch's tip (full hash): the bases of tasks sent now."""
        with self._locked():
            self._fetch()
            return self._tips()

    def known_tips(self) -> dict[str, str]:
        """Every branch's tip as of the last fetch, without fetching ({} before the first).

        For a manual dispatch, which should not wait for the remote: a base this old counts
        more commits as new than one fetched now, never fewer. git updates refs atomically,
        so no lock is needed to read them.
        """
        if not (self.path / "HEAD").is_file():
            return {}
        self._refuse_planted()
        return self._tips()

    def _tips(self) -> dict[str, str]:
        out = self.out("for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads/")
        pairs = (line.split() for line in out.splitlines() if line.strip())
        return {p[0]: p[1] for p in pairs if len(p) == 2}

    def check_all(
        self,
        wanted: Sequence[tuple[Sequence[str], Sequence[str]]],
        bases: Sequence[str | None] = (),
        locked: Sequence[str] = (),
    ) -> list[Check]:
        """Fetch once, then judge each (claimed hashes, expected branches; none: any branch),
        against its base (``bases``, aligned with ``wanted``; None: unknown) and ``locked``.

        The remote unreadable (no answer in time, refused, the lock held too long): every
        answer is ``unreachable`` with the reason, and nothing is decided on it.
        """
        try:
            with self._locked():
                self._fetch()
                return [
                    self._check(claims, branches, bases[i] if i < len(bases) else None, locked)
                    for i, (claims, branches) in enumerate(wanted)
                ]
        except (GitFailed, BusyError, OSError) as exc:
            reason = redact(f"repository not checked: {exc}", self.secrets)
            return [Check("unreachable", reason=reason) for _ in wanted]

    def _check(
        self,
        claims: Sequence[str],
        branches: Sequence[str],
        base: str | None = None,
        locked: Sequence[str] = (),
    ) -> Check:
        where = remote_name(branches)
        if not claims:
            return Check(
                "no_claim", reason=f"no commit hash in the final answer (expected on {where})"
            )
        known = self.branches()
        heads = [b for b in branches if b in known] if branches else known
        if not heads:
            return Check(
                "missing",
                reason=f"claimed commit {short(claims[-1])} is not on {where}: no such branch",
            )
        commits: list[str] = []
        for claim in claims:
            found = self.resolve(claim)
            if len(found) > 1:
                return Check(
                    "ambiguous",
                    reason=f"claimed commit {claim} is ambiguous: "
                    f"{len(found)} commits of origin start with it",
                )
            if not found or not any(self.is_ancestor(found[0], f"refs/heads/{h}") for h in heads):
                return Check("missing", reason=f"claimed commit {short(claim)} is not on {where}")
            if found[0] not in commits:
                commits.append(found[0])
        based = bool(base) and self.resolve(base or "") == [base]
        new = [c for c in commits if not (based and self.is_ancestor(c, base or ""))]
        if not new:
            return Check(
                "old",
                reason=f"claimed commit {short(commits[-1])} was already on {where} when "
                f"the task was sent (base {short(base or '')}): not new work",
            )
        tops = self.out("merge-base", "--independent", *new).split()
        if len(tops) != 1:
            named = ", ".join(short(t) for t in tops)
            return Check(
                "diverged",
                reason=f"claimed commits {named} are on diverging lines: none of them holds "
                "all the others",
            )
        top = tops[0]
        span = tuple(new)
        if based:
            listed = self.out("rev-list", f"--max-count={MAX_RANGE + 1}", top, f"^{base}").split()
            if len(listed) > MAX_RANGE:
                return Check(
                    "too_many",
                    commit=top,
                    reason=f"more than {MAX_RANGE} commits between the task's base "
                    f"{short(base or '')} and claimed commit {short(top)}",
                )
            span = tuple(reversed(listed))
        if locked:
            changed = set(self._paths(*span))
            if based:
                span_diff = ("diff", "-z", "--name-only", "--no-renames", f"{base}...{top}", "--")
                diff = self.out(*span_diff)
                changed.update(p for p in diff.split("\0") if p)
            hit = locked_paths(sorted(changed), locked)
            if hit:
                culprit = next((c for c in span if locked_paths(self._paths(c), locked)), top)
                shown = ", ".join(_shown(p) for p in hit[:10]) + (
                    f" and {len(hit) - 10} more" if len(hit) > 10 else ""
                )
                return Check(
                    "locked",
                    commit=culprit,
                    paths=hit,
                    reason=f"commit {short(culprit)} touches locked paths: {shown}",
                )
        return Check("verified", commit=top, new=span, claimed=tuple(new), base_known=based)

    def _paths(self, *commits: str) -> list[str]:
        """Every path the ``commits``' own changes touch, exactly as named (``-z``: never
        quoted); a merge's own change is what differs from every parent (``-c``)."""
        return [p for p in self.out(*_CHANGED, "--format=", *commits, "--").split("\0") if p]

    # -- the project's check -----------------------------------------------------------------

    def run_check(self, commit: str, command: str, timeout: float) -> CheckRun:
        """Run ``command`` (a shell command) on ``commit`` as ``store.contain`` runs a check:
        on an exported copy of the commit (never a worktree of the mirror: no ``.git``,
        nothing that leads back to it), deleted afterwards. GitFailed when the copy cannot
        be made.
        """
        folder = new_folder(self.state)
        try:
            copy = folder / "repo"
            copy.mkdir()
            with self._locked():
                self._refuse_planted()
                # git's own checkout writes the files: no path outside the copy, none through
                # a link; the index it needs stays outside the copy too.
                self.git(
                    "read-tree", "--reset", "-u", commit,
                    timeout=max(self.timeout, _LOCAL_TIMEOUT),
                    extra_env={"GIT_WORK_TREE": str(copy), "GIT_INDEX_FILE": str(folder / "index")},
                )
            return run_check(folder, command, timeout, commit, self.secrets, self.reach)
        finally:
            remove(folder)


def git_safe(hooks: Path) -> list[str]:
    """``git`` and the options every git command the hub runs starts with: no hook (an empty
    folder of the hub's) and no fsmonitor command, whatever a repository's config says."""
    return ["git", "-c", f"core.hooksPath={hooks}", "-c", "core.fsmonitor=false"]


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _shown(path: str) -> str:
    """A path in a one-line reason: as it is, or quoted with escapes when it holds controls."""
    return path if path.isprintable() else json.dumps(path, ensure_ascii=False)
