"""Landing a verified task's work on the base branch, on the hub's own side
(docs/worktrees.md).

``prepare`` returns the commits replayed onto the base's tip (or already there, or the files that
conflict); ``push`` sends that result without force, so a base that moved is refused and the
caller starts again. No git command here runs a hook or creates a branch of the mirror's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from xaf_hub.core.commits import short
from xaf_hub.core.text import redact
from xaf_hub.store.contain import new_folder, remove
from xaf_hub.store.repository import GitFailed, Mirror, split_credentials

Method = Literal["rebase", "merge"]
PrepState = Literal["ready", "already", "conflict", "empty", "gone"]
PushState = Literal["pushed", "moved"]


@dataclass(frozen=True)
class Prepared:
    """What landing a task's work would put on the base branch.

    ``ready``: ``result`` is the new tip (``tip`` the base's tip it builds on; ``rechecked``:
    its tree differs from the checked commit's, so the check must run on it). ``already``:
    every commit's change is on the base (``tip`` holds them). ``conflict``: ``files`` clash.
    ``empty``: the task's range holds no commit. ``gone``: the mirror has no commit ``result`` (the
    claimed top: its branch was rewritten before this mirror fetched it).
    """

    state: PrepState
    tip: str = ""
    result: str = ""
    rechecked: bool = False
    files: tuple[str, ...] = ()


# The hub commits (a rebase replays, a merge joins) as itself; the authors stay the agents'.
_IDENTITY = ("-c", "user.name=xaf-hub", "-c", "user.email=xaf-hub@localhost")


def prepare(
    mirror: Mirror, base_branch: str, top: str, fork: str | None, method: Method, message: str
) -> Prepared:
    """Fetch, then what landing ``fork..top`` on ``base_branch`` gives (fork None: where
    ``top`` left the base). GitFailed when git itself fails."""
    mirror.fetch()
    tip = mirror.known_tips().get(base_branch, "")
    if not tip:
        raise GitFailed(f"the remote has no branch {base_branch}")
    if not mirror.has(top):
        return Prepared("gone", tip=tip, result=top)  # rewritten before this mirror saw it
    if mirror.is_ancestor(top, tip):
        return Prepared("already", tip=tip)
    start = fork or mirror.out("merge-base", tip, top).strip()
    if mirror.out("rev-list", "--count", f"{start}..{top}").strip() == "0":
        return Prepared("empty", tip=tip)
    if _holds(mirror, tip, top):
        return Prepared("already", tip=tip)
    if method == "rebase" and mirror.is_ancestor(tip, top):
        # It holds the tip already (it merged the base in): a fast-forward to what was judged;
        # replaying would drop that merge and its resolution.
        return Prepared("ready", tip=tip, result=top)
    with _scratch(mirror, tip) as work:
        if method == "merge":
            step = ("merge", "--no-ff", "--no-edit", "-m", message, top)
        else:
            step = ("rebase", "--no-autostash", "--onto", tip, start, top)
        code, _ = mirror.git(*_IDENTITY, *step, cwd=work, ok=(0, 1, 128))
        if code != 0:
            _, listed = mirror.git("diff", "--name-only", "--diff-filter=U", "-z", cwd=work)
            names = tuple(sorted({f for f in listed.split("\0") if f}))
            return Prepared("conflict", tip=tip, files=names or ("(git stopped: see the log)",))
        _, head = mirror.git("rev-parse", "HEAD", cwd=work)
    result = head.strip()
    rechecked = _tree(mirror, result) != _tree(mirror, top)
    return Prepared("ready", tip=tip, result=result, rechecked=rechecked)


def push(mirror: Mirror, result: str, base_branch: str, tip: str) -> PushState:
    """Put ``result`` on the remote's base branch, which must still be at ``tip`` (never a
    force: the lease makes the remote refuse when it moved on): "moved" then. GitFailed on
    any other failure."""
    ref = f"refs/heads/{base_branch}"
    code, out = _push(mirror, [f"--force-with-lease={ref}:{tip}"], f"{result}:{ref}")
    if code == 0:
        return "pushed"
    if _leased_out(out, ref):
        return "moved"
    raise _refused(mirror, f"to {base_branch}", out)


def delete_branch(mirror: Mirror, branch: str, expected: str | None = None) -> bool:
    """Delete a task's branch on the remote: True when it is gone (already gone too). With
    ``expected``, only while the branch is still at that commit (a lease): False when it
    moved on, and it stays. GitFailed when the remote refuses or cannot be reached."""
    if not (mirror.path / "HEAD").is_file():
        mirror.fetch()  # git needs a repository to push from
    ref = f"refs/heads/{branch}"
    lease = [f"--force-with-lease={ref}:{expected}"] if expected else []
    code, out = _push(mirror, lease, f":{ref}")
    if code == 0:
        return True
    if expected and _leased_out(out, ref):
        mirror.fetch()  # refused: moved on, or gone already
        return branch not in mirror.known_tips()
    raise _refused(mirror, f"deleting {branch}", out)


def _push(mirror: Mirror, lease: list[str], refspec: str) -> tuple[int, str]:
    """``git push --porcelain`` of ``refspec`` to the remote (exit 0 or 1, and its output)."""
    url, env = split_credentials(mirror.url)
    return mirror.git("push", "--porcelain", *lease, "--", url, refspec,
                      timeout=mirror.timeout, extra_env=env, ok=(0, 1))


def _refused(mirror: Mirror, what: str, out: str) -> GitFailed:
    said = redact(out.strip()[-300:] or "no message", mirror.secrets)
    return GitFailed(f"git push {what} failed: {said}")


def _leased_out(out: str, ref: str) -> bool:
    """Whether git's porcelain push output says the lease refused ``ref`` (it was not where
    the hub expected): ``[rejected]``; the remote's own no (a protected branch, a hook) is
    ``[remote rejected]``, which no fetch changes."""
    return any(
        line.startswith("!") and ref in line and "\t[rejected]" in line
        for line in out.splitlines()
    )


def describe(prep: Prepared, base_branch: str) -> str:
    """One line for people about a prepared landing."""
    if prep.state == "conflict":
        shown = ", ".join(prep.files[:10]) + (" ..." if len(prep.files) > 10 else "")
        return f"conflicts with origin/{base_branch} at {short(prep.tip)}: {shown}"
    if prep.state == "already":
        return f"already on origin/{base_branch} at {short(prep.tip)}"
    if prep.state == "empty":
        return "no commit to land"
    if prep.state == "gone":
        return f"its verified commit {short(prep.result)} is not on the remote (branch rewritten)"
    return f"lands on origin/{base_branch} at {short(prep.tip)} as {short(prep.result)}"


def contains(mirror: Mirror, tip: str, commit: str) -> bool:
    """Whether ``commit`` (or a commit of the same content: a landing rebuilds it) is part of
    ``tip``'s history; a commit the mirror does not have is not."""
    return mirror.has(commit) and mirror.is_ancestor(commit, tip)


def commits(mirror: Mirror, fork: str, top: str) -> list[str]:
    """The commits of ``fork..top`` (full hashes)."""
    return mirror.out("rev-list", f"{fork}..{top}").split()


def branch_of(mirror: Mirror, tip: str) -> str:
    """The name of a branch whose tip is ``tip`` (for a reason), or the hash."""
    return next((name for name, at in mirror.known_tips().items() if at == tip), short(tip))


def _holds(mirror: Mirror, tip: str, top: str) -> bool:
    """Whether ``tip`` holds every change of ``top`` already, by content: merging ``top`` into
    it changes nothing (a copy of the work landed under other hashes, or by a person; a change
    landed and then reverted is not held)."""
    code, out = mirror.git("merge-tree", "--write-tree", tip, top, ok=(0, 1))
    return code == 0 and out.split("\n", 1)[0].strip() == _tree(mirror, tip)


def _tree(mirror: Mirror, commit: str) -> str:
    return mirror.out("rev-parse", f"{commit}^{{tree}}").strip()


@contextlib.contextmanager
def _scratch(mirror: Mirror, tip: str) -> Iterator[Path]:
    """A detached worktree of the mirror at ``tip``, removed afterwards; in a folder of the
    checks' (``contain.new_folder``), so one a killed hub left is removed by the next."""
    folder = new_folder(mirror.state)
    work = folder / "work"
    try:
        mirror.git("worktree", "prune")
        mirror.git("worktree", "add", "--detach", "--quiet", str(work), tip)
        yield work
    finally:
        with contextlib.suppress(GitFailed, OSError):
            mirror.git("worktree", "remove", "--force", str(work), ok=(0, 128))
            mirror.git("worktree", "prune")
        remove(folder)
