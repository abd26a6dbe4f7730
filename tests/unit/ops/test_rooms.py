"""The pure parts of a task's room: its name, the script that starts it, what it reported."""

from __future__ import annotations

import base64
import re
import subprocess
from pathlib import Path

import pytest

from tests.gitrepo import git, make_origin
from xaf_hub.errors import UsageError
from xaf_hub.fleet.wire import session_from_classic
from xaf_hub.ops.rooms import base_script, based_commit, keeps_command, room_name
from xaf_hub.store.tasks import Task


def test_a_room_is_named_after_its_task() -> None:
    name = room_name("T-20261206-ab12", "Fix the login form!")
    assert re.fullmatch(r"t-20261206-ab12-fix-the-login-form-[0-9a-f]{4}", name), name
    assert len(room_name("T-1", "x" * 200)) <= 60
    assert room_name("T-1", "修复登录页").startswith("t-1-task-")


def test_the_script_starts_the_worktree_from_origin_whatever_the_shell(tmp_path: Path) -> None:
    """Run as the server would: a worktree of a checkout that is behind origin and holds a
    commit never pushed ends on origin's tip, and says so."""
    origin = make_origin(tmp_path / "remote")
    checkout = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(origin.bare), str(checkout))
    origin.commit("ahead")
    origin.push()
    (checkout / "mine.txt").write_text("local\n")
    git(checkout, "add", "mine.txt")
    git(checkout, "commit", "-q", "-m", "local only")
    room = tmp_path / "room"
    git(checkout, "worktree", "add", "-q", "-b", "opencode/t-1", str(room))
    command = base_script("main")
    assert "'" not in command and "$" not in command  # no shell may expand or re-quote it
    done = subprocess.run(
        ["bash", "-lc", command], cwd=room, capture_output=True, text=True, check=False
    )
    tip = git(origin.bare, "rev-parse", "main")
    assert based_commit(done.stdout) == tip, done
    assert git(room, "rev-parse", "HEAD") == tip and not (room / "mine.txt").exists()
    assert git(room, "rev-parse", "--abbrev-ref", "HEAD") == "opencode/t-1"


def test_a_failed_start_reports_no_commit() -> None:
    assert based_commit("fatal: couldn't find remote ref main\n") == ""
    assert based_commit("xaf-hub-base " + "a" * 40 + "\n") == "a" * 40
    with pytest.raises(UsageError):
        base_script("main; rm -rf /")
    decoded = base64.b64decode(base_script("release/2.0").split()[1]).decode()
    assert "git fetch --quiet origin release/2.0" in decoded


def test_a_listed_session_names_the_checkout_of_its_worktree() -> None:
    shop = {"id": "0a1b2c", "worktree": "/srv/shop"}
    room = {"id": "ses_1", "directory": "/data/wt/x", "project": shop}
    plain = {"id": "ses_2", "directory": "/srv/shop", "project": shop}
    loose = {"id": "ses_3", "directory": "/tmp/x", "project": {"id": "global", "worktree": "/"}}
    assert session_from_classic(room).checkout == "/srv/shop"
    assert session_from_classic(plain).checkout == ""
    assert session_from_classic(loose).checkout == ""
    assert session_from_classic({"id": "ses_4", "project": "junk"}).checkout == ""
    # A folder of the checkout is the checkout itself, not a worktree of it.
    below = {"id": "ses_5", "directory": "/srv/shop/app", "project": shop}
    assert session_from_classic(below).checkout == ""
    # "global" is every folder without a repository of its own: it has no worktrees.
    stray = {"id": "ses_6", "directory": "/tmp/y", "project": {"id": "global", "worktree": "/a"}}
    assert session_from_classic(stray).checkout == ""


def test_a_worktree_keeps_what_no_remote_holds(tmp_path: Path) -> None:
    """The script cleanup asks before removing a worktree: silent when nothing would be lost
    (a commit the checkout's own branch holds is not lost), a line for each uncommitted change
    and each commit that only the worktree's branch holds."""
    origin = make_origin(tmp_path / "remote")
    checkout = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(origin.bare), str(checkout))
    git(checkout, "commit", "-q", "--allow-empty", "-m", "the checkout's own, unpushed")
    room = tmp_path / "room"
    git(checkout, "worktree", "add", "-q", "-b", "opencode/t-1", str(room))

    def said() -> str:
        done = subprocess.run(["bash", "-lc", keeps_command()], cwd=room, capture_output=True,
                              text=True, check=False)
        return done.stdout

    assert said() == ""
    (room / "new.txt").write_text("x\n")
    assert said() == "changed: ?? new.txt\n"
    git(room, "add", "new.txt")
    git(room, "commit", "-q", "-m", "only here")
    assert said() == f"unpushed: {git(room, 'rev-parse', 'HEAD')}\n"
    git(room, "push", "-q", "origin", "HEAD")
    assert said() == ""


def test_a_tasks_second_attempt_gets_a_branch_of_its_own() -> None:
    """A task's first attempt pushed opencode/<name> and failed; its worktree was removed
    (cleanup, or the attempt ran on another server). Real opencode 1.18.33 gives the second
    attempt the same name, so its `git push -u origin HEAD` (the discipline) is refused as
    not a fast-forward of the first attempt's branch, or a forced push destroys that work."""
    # The row after the first attempt, with the branch the server named for it.
    task = Task(id="T-20261206-ab12", title="fix the login form", status="pending", attempts=1,
                branch="opencode/t-20261206-ab12-fix-the-login-form")
    assert "opencode/" + room_name(task.id, task.title) != task.branch
