"""Landing a task's branch on the base branch, against real git repositories (store.landing).

An "origin" bare repository in tmp_path and a clone that plays every agent: a task's branch
starts at main's tip, main moves on (another task landed), and the hub lands the branch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gitrepo import ENV, Origin, git, make_origin
from xaf_hub.store.landing import delete_branch, prepare, push
from xaf_hub.store.repository import GitFailed, Mirror


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    o = make_origin(tmp_path)
    write(o, "main", "shared.txt", "".join(f"line {i}\n" for i in range(10)))
    return o


def write(o: Origin, branch: str, name: str, text: str, *, start: str = "main") -> str:
    """Commit ``name`` with ``text`` on ``branch`` (made from ``start``) and push it."""
    git(o.work, "fetch", "-q", "origin")
    if branch == start:
        git(o.work, "checkout", "-q", "-B", branch, f"origin/{start}")
    else:
        exists = git(o.bare, "for-each-ref", f"refs/heads/{branch}")
        git(o.work, "checkout", "-q", "-B", branch, f"origin/{branch}" if exists else start)
    (o.work / name).write_text(text)
    git(o.work, "add", name)
    git(o.work, "commit", "-q", "-m", f"{branch}: {name}")
    git(o.work, "push", "-q", "origin", f"HEAD:refs/heads/{branch}")
    return git(o.work, "rev-parse", "HEAD")


def edit_line(o: Origin, branch: str, n: int, text: str) -> str:
    git(o.work, "fetch", "-q", "origin")
    exists = git(o.bare, "for-each-ref", f"refs/heads/{branch}")
    git(o.work, "checkout", "-q", "-B", branch, f"origin/{branch}" if exists else "origin/main")
    lines = (o.work / "shared.txt").read_text().splitlines(keepends=True)
    lines[n] = text + "\n"
    (o.work / "shared.txt").write_text("".join(lines))
    git(o.work, "commit", "-q", "-am", f"{branch}: line {n}")
    git(o.work, "push", "-q", "origin", f"HEAD:refs/heads/{branch}")
    return git(o.work, "rev-parse", "HEAD")


def mirror(o: Origin, tmp_path: Path) -> Mirror:
    return Mirror(str(o.bare), tmp_path / "state")


def test_a_branch_behind_main_is_replayed_on_its_tip_and_checked_again(
    origin: Origin, tmp_path: Path
) -> None:
    fork = git(origin.bare, "rev-parse", "main")
    top = edit_line(origin, "opencode/t1", 2, "task one")
    moved = edit_line(origin, "main", 7, "another task")
    m = mirror(origin, tmp_path)
    prep = prepare(m, "main", top, fork, "rebase", "")
    assert (prep.state, prep.tip, prep.rechecked) == ("ready", moved, True)
    assert git(m.path, "rev-parse", f"{prep.result}^") == moved
    assert git(m.path, "show", f"{prep.result}:shared.txt").splitlines()[2::5] == [
        "task one", "another task"
    ]
    # The mirror holds no branch of its own (a fetch would prune it), nor a worktree.
    assert git(m.path, "for-each-ref", "--format=%(refname)", "refs/heads").split() == [
        "refs/heads/main", "refs/heads/opencode/t1"
    ]
    assert len(git(m.path, "worktree", "list").splitlines()) == 1
    assert push(m, prep.result, "main", prep.tip) == "pushed"
    assert git(origin.bare, "rev-parse", "main") == prep.result
    # Done twice (a hub killed after the push, before it wrote it down): already there.
    again = prepare(m, "main", top, fork, "rebase", "")
    assert (again.state, again.tip) == ("already", prep.result)


def test_a_branch_on_main_tip_lands_as_it_is_with_no_second_check(
    origin: Origin, tmp_path: Path
) -> None:
    fork = git(origin.bare, "rev-parse", "main")
    top = write(origin, "opencode/t2", "new.txt", "hi\n")
    prep = prepare(mirror(origin, tmp_path), "main", top, fork, "rebase", "")
    assert (prep.state, prep.result, prep.rechecked) == ("ready", top, False)


def test_the_same_lines_conflict_and_name_the_files(origin: Origin, tmp_path: Path) -> None:
    fork = git(origin.bare, "rev-parse", "main")
    top = edit_line(origin, "opencode/t3", 4, "mine")
    edit_line(origin, "main", 4, "theirs")
    m = mirror(origin, tmp_path)
    prep = prepare(m, "main", top, fork, "rebase", "")
    assert (prep.state, prep.files) == ("conflict", ("shared.txt",))
    merged = prepare(m, "main", top, fork, "merge", "Merge t3")
    assert (merged.state, merged.files) == ("conflict", ("shared.txt",))
    assert len(git(m.path, "worktree", "list").splitlines()) == 1  # nothing left behind


def test_a_merge_keeps_the_commits_and_adds_one(origin: Origin, tmp_path: Path) -> None:
    fork = git(origin.bare, "rev-parse", "main")
    top = edit_line(origin, "opencode/t4", 1, "merged in")
    moved = write(origin, "main", "other.txt", "x\n")
    m = mirror(origin, tmp_path)
    prep = prepare(m, "main", top, fork, "merge", "Merge opencode/t4 (T4)")
    assert prep.state == "ready" and prep.rechecked
    assert git(m.path, "rev-list", "--parents", "-n1", prep.result).split()[1:] == [moved, top]
    assert git(m.path, "log", "-1", "--format=%s", prep.result) == "Merge opencode/t4 (T4)"
    assert push(m, prep.result, "main", prep.tip) == "pushed"
    assert prepare(m, "main", top, fork, "merge", "").state == "already"


def test_a_base_that_moved_after_preparing_refuses_the_push(
    origin: Origin, tmp_path: Path
) -> None:
    fork = git(origin.bare, "rev-parse", "main")
    top = write(origin, "opencode/t5", "five.txt", "5\n")
    m = mirror(origin, tmp_path)
    prep = prepare(m, "main", top, fork, "rebase", "")
    late = write(origin, "main", "late.txt", "late\n")
    assert push(m, prep.result, "main", prep.tip) == "moved"
    assert git(origin.bare, "rev-parse", "main") == late  # nothing overwritten
    # Started again from a fetch, it lands on the new tip.
    again = prepare(m, "main", top, fork, "rebase", "")
    assert again.tip == late and push(m, again.result, "main", again.tip) == "pushed"


def test_work_already_landed_by_content_is_not_landed_twice(
    origin: Origin, tmp_path: Path
) -> None:
    """The same change on main under another hash (a person cherry-picked it)."""
    fork = git(origin.bare, "rev-parse", "main")
    top = write(origin, "opencode/t6", "six.txt", "6\n")
    git(origin.work, "checkout", "-q", "-B", "main", "origin/main")
    git(origin.work, "cherry-pick", top)
    git(origin.work, "push", "-q", "origin", "main")
    prep = prepare(mirror(origin, tmp_path), "main", top, fork, "rebase", "")
    assert prep.state == "already"


def test_a_landed_branch_is_deleted_on_the_remote(origin: Origin, tmp_path: Path) -> None:
    write(origin, "opencode/t7", "seven.txt", "7\n")
    m = mirror(origin, tmp_path)
    delete_branch(m, "opencode/t7")
    assert git(origin.bare, "for-each-ref", "refs/heads/opencode") == ""
    delete_branch(m, "opencode/t7")  # gone already: fine


def test_a_push_the_remote_refuses_is_not_taken_for_a_base_that_moved(
    origin: Origin, tmp_path: Path
) -> None:
    """A protected branch (a hook on the remote declines every push to main): the push fails
    with the remote's refusal, so the landing stops and says why, instead of calling it a base
    that moved and building, checking and pushing again three times every round."""
    fork = git(origin.bare, "rev-parse", "main")
    top = write(origin, "opencode/t8", "eight.txt", "8\n")
    hook = origin.bare / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'main is protected' >&2\nexit 1\n")
    hook.chmod(0o755)
    m = mirror(origin, tmp_path)
    prep = prepare(m, "main", top, fork, "rebase", "")
    with pytest.raises(GitFailed, match="remote rejected"):
        push(m, prep.result, "main", prep.tip)
    assert git(origin.bare, "rev-parse", "main") == fork


def test_work_whose_twin_was_landed_then_reverted_is_not_called_landed(
    origin: Origin, tmp_path: Path
) -> None:
    """Another task made the very same change, it landed, and a person reverted it on main.
    This task's change is not on main, so it must not be recorded as landed (its branch would
    then be deleted and its work lost): it is replayed like any other."""
    fork = git(origin.bare, "rev-parse", "main")
    twin = write(origin, "main", "fix.txt", "fixed\n")
    git(origin.work, "revert", "--no-edit", twin)
    git(origin.work, "push", "-q", "origin", "main")
    git(origin.work, "checkout", "-q", "-B", "opencode/t9", fork)
    (origin.work / "fix.txt").write_text("fixed\n")
    git(origin.work, "add", "fix.txt")
    git(origin.work, "commit", "-q", "-m", "the same fix, made again")
    git(origin.work, "push", "-q", "origin", "HEAD:refs/heads/opencode/t9")
    top = git(origin.work, "rev-parse", "HEAD")
    m = mirror(origin, tmp_path)
    prep = prepare(m, "main", top, fork, "rebase", "")
    assert prep.state == "ready", prep
    assert git(m.path, "show", f"{prep.result}:fix.txt") == "fixed"


def test_a_hub_killed_mid_rebase_leaves_no_copy_of_the_work_behind(
    origin: Origin, tmp_path: Path
) -> None:
    """The hub SIGKILLed while git rebases in the landing's throw-away worktree (a git that
    kills its caller at "rebase" stands in for the kill): the next landing removes what the
    dead one left, as the next check does with a dead check's copy."""
    fork = git(origin.bare, "rev-parse", "main")
    top = edit_line(origin, "opencode/t10", 2, "task ten")
    edit_line(origin, "main", 7, "another task")
    real = subprocess.run(["which", "git"], capture_output=True, text=True, check=True)
    bin_dir, tmp = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    tmp.mkdir()
    (bin_dir / "git").write_text(
        f'#!/bin/sh\nfor a in "$@"; do [ "$a" = rebase ] && kill -9 $PPID && exit 1; done\n'
        f'exec {real.stdout.strip()} "$@"\n'
    )
    (bin_dir / "git").chmod(0o755)
    script = (
        "import sys; from xaf_hub.store.landing import prepare; "
        "from xaf_hub.store.repository import Mirror; "
        "prepare(Mirror(sys.argv[1], __import__('pathlib').Path(sys.argv[2])), 'main', "
        "sys.argv[3], sys.argv[4], 'rebase', '')"
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp)}
    killed = subprocess.run(
        [sys.executable, "-c", script, str(origin.bare), str(tmp_path / "state"), top, fork],
        env=env, capture_output=True, check=False,
    )
    assert killed.returncode == -9, killed.stderr

    def left() -> list[Path]:
        return [*tmp.rglob("shared.txt"), *(tmp_path / "state").rglob("shared.txt")]

    assert left()  # the dead landing's worktree: a checkout of the repository
    again = prepare(mirror(origin, tmp_path), "main", top, fork, "rebase", "")
    assert again.state == "ready"
    assert left() == []


def test_a_conflict_the_agent_resolved_by_merging_main_lands_as_it_was_checked(
    origin: Origin, tmp_path: Path
) -> None:
    """Sent back with a conflict, the agent merged origin/main into its branch (as `git pull`
    does) instead of rebasing. Its branch now holds main's tip: landing it is a fast-forward
    to the very commit that was judged and checked, where replaying its commits drops the
    merge and its resolution and conflicts again, every time."""
    edit_line(origin, "opencode/t11", 4, "mine")
    tip = edit_line(origin, "main", 4, "theirs")
    git(origin.work, "checkout", "-q", "opencode/t11")
    git(origin.work, "fetch", "-q", "origin")
    done = subprocess.run(["git", "merge", "-q", "origin/main"], cwd=origin.work, env=ENV,
                          capture_output=True, check=False)
    assert done.returncode == 1  # the conflict, as the agent met it
    lines = [f"line {i}\n" for i in range(10)]
    lines[4] = "theirs and mine\n"
    (origin.work / "shared.txt").write_text("".join(lines))
    git(origin.work, "commit", "-q", "-am", "merge origin/main, both kept")
    git(origin.work, "push", "-q", "origin", "HEAD:refs/heads/opencode/t11")
    top = git(origin.work, "rev-parse", "HEAD")
    m = mirror(origin, tmp_path)
    prep = prepare(m, "main", top, tip, "rebase", "")  # its base: the tip it was sent back at
    assert (prep.state, prep.result, prep.rechecked) == ("ready", top, False), prep
    assert push(m, prep.result, "main", prep.tip) == "pushed"
    assert git(origin.bare, "show", "main:shared.txt").splitlines()[4] == "theirs and mine"
