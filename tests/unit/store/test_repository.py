"""The hub's bare mirror of project.repository against real git repositories (store.repository).

Each test makes a bare "origin" in tmp_path and pushes to it from a clone, as an agent would;
the faults are real too: a loopback server that accepts and never answers, a closed port, a
force-push, two commits that share a short hash.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gitrepo import Origin, git, make_origin
from xaf_hub.store.repository import Mirror, mirror_path
from xaf_hub.store.statefile import file_lock


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    return make_origin(tmp_path)


def mirror(origin: Origin, tmp_path: Path, **kw: object) -> Mirror:
    return Mirror(str(origin.bare), tmp_path / "state", **kw)  # type: ignore[arg-type]


def test_a_pushed_commit_is_verified_in_full(origin: Origin, tmp_path: Path) -> None:
    sha = origin.commit("fix login")
    origin.push()
    m = mirror(origin, tmp_path)
    [check] = m.check_all([((sha[:7],), ("main",))])
    assert (check.state, check.commit) == ("verified", sha)
    # A bare mirror under the state folder: no working tree, the branch as on the remote.
    assert m.path == mirror_path(tmp_path / "state", str(origin.bare))
    assert m.path.is_relative_to(tmp_path / "state") and (m.path / "HEAD").is_file()
    assert git(m.path, "rev-parse", "--is-bare-repository") == "true"
    assert git(m.path, "rev-parse", "refs/heads/main") == sha
    # The remote was only read: its refs are what the clone pushed, nothing more.
    assert git(origin.bare, "for-each-ref", "--format=%(refname)") == "refs/heads/main"


def test_a_commit_never_pushed_is_not_verified(origin: Origin, tmp_path: Path) -> None:
    sha = origin.commit("only local")  # committed, never pushed
    [check] = mirror(origin, tmp_path).check_all([((sha[:7],), ("main",))])
    assert check.state == "missing"
    assert check.reason == f"claimed commit {sha[:7]} is not on origin/main"
    made_up = "0123456789abcdef0123456789abcdef01234567"
    [check] = mirror(origin, tmp_path).check_all([((made_up,), ("main",))])
    assert check.reason == "claimed commit 0123456 is not on origin/main"


def test_every_claimed_commit_must_be_there(origin: Origin, tmp_path: Path) -> None:
    first = origin.commit("one")
    origin.push()
    later = origin.commit("two, not pushed")
    [check] = mirror(origin, tmp_path).check_all([((first[:8], later[:8]), ("main",))])
    assert check.state == "missing" and later[:7] in check.reason
    origin.push()
    [check] = mirror(origin, tmp_path).check_all([((first[:8], later[:8]), ("main",))])
    assert (check.state, check.commit) == ("verified", later)  # the last one claimed


def test_no_hash_claimed_is_not_verified(origin: Origin, tmp_path: Path) -> None:
    [check] = mirror(origin, tmp_path).check_all([((), ("main",))])
    assert check.state == "no_claim"
    assert check.reason == "no commit hash in the final answer (expected on origin/main)"


def test_branch_mode_looks_on_the_feature_branch_only(origin: Origin, tmp_path: Path) -> None:
    sha = origin.commit("feature work", branch="feature/fix-login")
    origin.push("feature/fix-login")
    m = mirror(origin, tmp_path)
    on_feature, on_main, on_any, on_absent = m.check_all(
        [
            ((sha[:7],), ("feature/fix-login",)),
            ((sha[:7],), ("main",)),
            ((sha[:7],), ()),  # the discipline named no branch: any branch of the remote
            ((sha[:7],), ("feature/other",)),
        ]
    )
    assert (on_feature.state, on_feature.commit) == ("verified", sha)
    assert on_main.reason == f"claimed commit {sha[:7]} is not on origin/main"
    assert (on_any.state, on_any.commit) == ("verified", sha)
    assert on_absent.state == "missing"
    assert (
        on_absent.reason
        == f"claimed commit {sha[:7]} is not on origin/feature/other: no such branch"
    )
    # Either of two named branches will do (a task's title and its session's title).
    [both] = m.check_all([((sha[:7],), ("feature/other", "feature/fix-login"))])
    assert both.state == "verified"


def test_a_force_pushed_away_commit_is_no_longer_verified(origin: Origin, tmp_path: Path) -> None:
    base = git(origin.work, "rev-parse", "HEAD")
    sha = origin.commit("later rewritten")
    origin.push()
    m = mirror(origin, tmp_path)
    assert m.check_all([((sha[:7],), ("main",))])[0].state == "verified"
    git(origin.work, "reset", "-q", "--hard", base)
    other = origin.commit("the rewrite")
    origin.push(force=True)
    [gone, new] = m.check_all([((sha[:7],), ("main",)), ((other[:7],), ("main",))])
    # The mirror still holds the old object from its first fetch; it is just not on main.
    assert git(m.path, "cat-file", "-t", sha) == "commit"
    assert (
        gone.state == "missing" and gone.reason == f"claimed commit {sha[:7]} is not on origin/main"
    )
    assert new.state == "verified"


def _colliding_commits(tree: str) -> tuple[bytes, bytes, str]:
    """Two commit objects whose hashes share their first 7 hex digits (a birthday search)."""
    seen: dict[str, bytes] = {}
    for i in range(1_000_000):
        body = (
            f"tree {tree}\nauthor T <t@e.invalid> 1700000000 +0000\n"
            f"committer T <t@e.invalid> 1700000000 +0000\n\nattempt {i}\n"
        ).encode()
        oid = hashlib.sha1(b"commit %d\0" % len(body) + body).hexdigest()
        prefix = oid[:7]
        if prefix in seen:
            return seen[prefix], body, prefix
        seen[prefix] = body
    raise AssertionError("no collision found")


def test_an_ambiguous_short_hash_is_not_verified(origin: Origin, tmp_path: Path) -> None:
    tree = git(origin.work, "rev-parse", "HEAD^{tree}")
    one, two, prefix = _colliding_commits(tree)
    a = git(origin.bare, "hash-object", "-t", "commit", "-w", "--stdin", stdin=one)
    b = git(origin.bare, "hash-object", "-t", "commit", "-w", "--stdin", stdin=two)
    assert a[:7] == b[:7] == prefix and a != b
    head = git(origin.bare, "rev-parse", "refs/heads/main")
    merge = git(origin.bare, "commit-tree", tree, "-p", head, "-p", a, "-p", b, "-m", "merge")
    git(origin.bare, "update-ref", "refs/heads/main", merge)
    m = mirror(origin, tmp_path)
    [short, longer] = m.check_all([((prefix,), ("main",)), ((a[:12],), ("main",))])
    assert short.state == "ambiguous"
    assert (
        short.reason == f"claimed commit {prefix} is ambiguous: 2 commits of origin start with it"
    )
    assert (longer.state, longer.commit) == ("verified", a)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A loopback port that accepts connections and never says a word."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield sock.getsockname()[1]
    stop.set()
    t.join()
    for c in held:
        c.close()
    sock.close()


def _git_processes_under(root: Path) -> list[str]:
    """Command lines of running processes that name ``root`` (git children we may have left)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(root) in cmd:
            found.append(cmd)
    return found


def test_a_remote_that_does_not_answer_is_bounded(silent_server: int, tmp_path: Path) -> None:
    token = "ghp_s3cretT0kenValue"
    url = f"http://user:{token}@127.0.0.1:{silent_server}/shop.git"
    m = Mirror(url, tmp_path / "state", timeout=2.0, secrets=(token, f"user:{token}"))
    started = time.monotonic()
    [check] = m.check_all([(("0123456",), ("main",))])
    elapsed = time.monotonic() - started
    assert check.state == "unreachable"
    assert check.reason == "repository not checked: git fetch gave no answer within 2s"
    assert 2.0 <= elapsed < 30.0  # bounded by the timeout (generous for a loaded machine)
    assert token not in check.reason
    assert not _git_processes_under(m.path), "a git process outlived the bound"


def test_a_refused_remote_says_why_without_its_token(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "ghp_s3cretT0kenValue"
    url = f"https://{token}@127.0.0.1:{port}/shop.git"
    m = Mirror(url, tmp_path / "state", timeout=20.0, secrets=(token,))
    [check] = m.check_all([(("0123456",), ())])
    assert check.state == "unreachable" and "git fetch failed:" in check.reason
    assert token not in check.reason


def test_git_stderr_that_echoes_a_secret_is_redacted(tmp_path: Path) -> None:
    # git repeats a local path it cannot read word for word: a secret in it must not survive.
    url = str(tmp_path / "s3cret-in-the-path" / "shop.git")
    m = Mirror(url, tmp_path / "state", timeout=20.0, secrets=("s3cret-in-the-path",))
    [check] = m.check_all([(("0123456",), ("main",))])
    assert check.state == "unreachable"
    assert "does not appear to be a git repository" in check.reason
    assert "s3cret-in-the-path" not in check.reason and "***" in check.reason


def test_a_held_mirror_lock_is_waited_for_then_reported(origin: Origin, tmp_path: Path) -> None:
    m = mirror(origin, tmp_path, lock_wait=0.5)
    with file_lock(m.path.with_name(m.path.name + ".lock"), 1.0):
        [check] = m.check_all([(("0123456",), ("main",))])
    assert check.state == "unreachable" and "repository mirror lock" in check.reason


def test_two_processes_fetching_at_once_both_get_answers(origin: Origin, tmp_path: Path) -> None:
    sha = origin.commit("racing")
    origin.push()
    results: list[str] = []

    def one() -> None:
        [check] = mirror(origin, tmp_path).check_all([((sha[:7],), ("main",))])
        results.append(check.state)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["verified"] * 4


@pytest.mark.parametrize("how", ["kill_tree", "kill_family"])
def test_a_timed_out_child_goes_with_its_own_children(how: str, tmp_path: Path) -> None:
    """The time-out's kill reaches the grandchild that would keep the pipes open: by process
    group on POSIX (kill_tree), by psutil's walk on Windows (kill_family, run here too)."""
    import subprocess
    import sys

    import psutil

    from xaf_hub.store import repository

    script = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print(c.pid, flush=True); time.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        grandchild = psutil.Process(int(proc.stdout.readline()))
        getattr(repository, how)(proc.pid)
        proc.wait(timeout=30)
        grandchild.wait(timeout=30)  # psutil.TimeoutExpired if it outlived the kill
        assert not grandchild.is_running()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
