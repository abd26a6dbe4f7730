"""The hub's bare mirror of project.repository against real git repositories (store.repository).

Each test makes a bare "origin" in tmp_path and pushes to it from a clone, as an agent would;
the faults are real too: a loopback server that accepts and never answers, a closed port, a
force-push, two commits that share a short hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contained import needs_sandbox
from tests.gitrepo import Origin, git, make_origin
from xaf_hub.store.repository import GitFailed, Mirror, mirror_path
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

    from xaf_hub.store import contain

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
        getattr(contain, how)(proc.pid)
        proc.wait(timeout=30)
        grandchild.wait(timeout=30)  # psutil.TimeoutExpired if it outlived the kill
        assert not grandchild.is_running()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_token_reaches_git_but_no_process_list(tmp_path: Path) -> None:
    """A slow loopback remote asks for credentials (401), then takes its time: meanwhile every
    process's command line is read, and none holds the token; the server got it all the same."""
    import base64
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    token = "ghp_argvT0kenNeverShown42"
    heard: list[str] = []

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            auth = self.headers.get("Authorization")
            if auth is None:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="shop"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            heard.append(auth)
            time.sleep(3)  # a slow remote: the fetch is under way while the lists are read
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://agent:{token}@127.0.0.1:{server.server_address[1]}/shop.git"
    seen: list[str] = []
    stop = threading.Event()

    def read_process_lists() -> None:
        while not stop.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                with contextlib.suppress(OSError):  # the process ended meanwhile
                    seen.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            time.sleep(0.05)

    reader = threading.Thread(target=read_process_lists)
    reader.start()
    try:
        m = Mirror(url, tmp_path / "state", timeout=20, secrets=(token,))
        [check] = m.check_all([(("a1b2c3d",), ("main",))])
    finally:
        stop.set()
        reader.join()
        server.shutdown()
        server.server_close()
    assert check.state == "unreachable" and token not in check.reason
    # The lists were read while git talked to the remote, and the token was in none of them.
    git_lines = [line for line in seen if "remote-http" in line]
    assert git_lines and all("127.0.0.1" in line for line in git_lines), git_lines[:3]
    assert all(token not in line for line in seen)
    assert heard and all(base64.b64decode(h.split()[1]).decode() == f"agent:{token}" for h in heard)


# -- issue 37: new work only, locked paths, the project's check ---------------------------------


def test_only_commits_newer_than_the_base_count(origin: Origin, tmp_path: Path) -> None:
    base = git(origin.bare, "rev-parse", "refs/heads/main")  # the tip when the task was sent
    m = mirror(origin, tmp_path)
    assert m.tips() == {"main": base}
    new = origin.commit("the task's work")
    origin.push()
    wanted = [((base[:7],), ("main",)), ((new[:7],), ("main",)), ((base, new), ("main",))]
    old, fresh, both = m.check_all(wanted, bases=[base, base, base])
    assert old.state == "old" and f"claimed commit {base[:7]} was already on origin/main" in (
        old.reason
    )
    assert (fresh.state, fresh.commit, fresh.new, fresh.base_known) == (
        "verified",
        new,
        (new,),
        True,
    )
    # The base named beside new work is tolerated; only the new commit is the task's.
    assert (both.state, both.new) == ("verified", (new,))
    # No base (a task sent before this change): judged as before, and said so.
    [unknown] = m.check_all([((base[:7],), ("main",))], bases=[None])
    assert (unknown.state, unknown.base_known) == ("verified", False)


def test_branch_mode_an_old_main_commit_is_not_the_tasks(origin: Origin, tmp_path: Path) -> None:
    older = git(origin.bare, "rev-parse", "refs/heads/main")
    base = origin.commit("main moves on")
    origin.push()
    work = origin.commit("feature work", branch="feature/x")
    origin.push("feature/x")
    m = mirror(origin, tmp_path)
    old, new = m.check_all(
        [((older[:7],), ("feature/x",)), ((work[:7],), ("feature/x",))], bases=[base, base]
    )
    assert (old.state, new.state, new.commit) == ("old", "verified", work)


def test_a_commit_touching_a_locked_path_is_held(origin: Origin, tmp_path: Path) -> None:
    base = git(origin.bare, "rev-parse", "refs/heads/main")
    (origin.work / "tests").mkdir()
    (origin.work / "tests" / "test_a.py").write_text("assert True\n")
    git(origin.work, "add", "tests/test_a.py")
    touched = origin.commit("weaken the tests")
    origin.push()
    clean = origin.commit("real work")  # log.txt only; the range from base still has tests/
    origin.push()
    m = mirror(origin, tmp_path)
    locked = ("tests/**", ".ci/**")
    a, b, c = m.check_all(
        [((touched[:7],), ("main",)), ((clean[:7],), ("main",)), ((clean[:7],), ("main",))],
        bases=[base, base, touched],
        locked=locked,
    )
    assert (a.state, a.paths) == ("locked", ("tests/test_a.py",))
    assert "touches locked paths: tests/test_a.py" in a.reason
    assert (b.state, b.paths) == ("locked", ("tests/test_a.py",))  # diff from the base
    assert c.state == "verified"  # its own base was after the tests changed
    # Base unknown: each new commit's own change is looked at.
    d, e = m.check_all(
        [((touched[:7],), ("main",)), ((clean[:7],), ("main",))], bases=[None, None], locked=locked
    )
    assert (d.state, e.state) == ("locked", "verified")


@needs_sandbox
def test_the_check_runs_on_an_exported_copy_of_the_commit(
    origin: Origin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sha = origin.commit("work")
    origin.push()
    m = mirror(origin, tmp_path)
    m.fetch()
    monkeypatch.setenv("HOOK_SECRET_URL", "https://hooks.example/s3cret")
    run = m.run_check(
        sha,
        'grep -q work log.txt && echo "at $XAF_HUB_CHECK_COMMIT in $PWD";'
        " env | grep -c HOOK_SECRET || true; ls -a",
        30,
    )
    assert run.passed and run.code == 0, run.tail
    lines = run.tail.splitlines()
    assert lines[0] == f"at {sha} in /repo"  # the sandbox's working folder
    assert lines[1] == "0"  # the hub's environment is not handed to the project's code
    assert sorted(lines[2:]) == [".", "..", "log.txt"]  # the commit's files, no .git
    assert list((tmp_path / "state" / "checks").iterdir()) == []  # removed afterwards
    assert not (m.path / "worktrees").exists()
    # A failure: exit code and the end of its output, long output cut to the tail.
    run = m.run_check(sha, "seq 1 500; echo 'FAILED test_login' >&2; exit 3", 30)
    assert (run.passed, run.code) == (False, 3)
    assert run.tail.endswith("FAILED test_login") and "\n1\n" not in run.tail
    assert len(run.tail.splitlines()) == 40


def alive(marker: str) -> list[Path]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # ended meanwhile
            if marker.encode() in cmdline.read_bytes():
                found.append(cmdline)
    return found


@needs_sandbox
def test_a_check_out_of_time_is_killed_with_all_it_started(origin: Origin, tmp_path: Path) -> None:
    sha = git(origin.bare, "rev-parse", "refs/heads/main")
    m = mirror(origin, tmp_path)
    m.fetch()
    marker = f"301.{os.getpid()}"  # in the command lines of the sleeps it starts
    started = time.monotonic()
    run = m.run_check(sha, f"(sleep {marker}; echo) & setsid sleep {marker} & sleep 300", 1)
    assert time.monotonic() - started < 15
    assert (run.passed, run.code) == (False, None) and "no end within 1s" in run.tail
    deadline = time.monotonic() + 20
    while alive(marker):  # the background sleeps go with the sandbox, setsid or not
        assert time.monotonic() < deadline, alive(marker)
        time.sleep(0.05)


def test_known_tips_read_the_mirror_without_fetching(origin: Origin, tmp_path: Path) -> None:
    m = mirror(origin, tmp_path)
    assert m.known_tips() == {}  # no mirror yet: nothing known, nothing fetched
    assert not m.path.exists()
    first = git(origin.bare, "rev-parse", "refs/heads/main")
    assert m.tips() == {"main": first}
    origin.commit("later")
    origin.push()
    assert m.known_tips() == {"main": first}  # as of the last fetch


# -- every commit of a task's work is judged -----------------------------------------------------

LOGIN = "tests/test_login.py"


def test_names_in_reverse_order_judge_the_whole_line(origin: Origin, tmp_path: Path) -> None:
    """M (plain) then N (edits a locked test), named N first and M last: N is the top and the
    locked edit is seen, whichever hash the answer names last."""
    base = git(origin.bare, "rev-parse", "refs/heads/main")
    m_ = origin.commit("plain work")
    n_ = origin.commit("weaken the login test", files={LOGIN: "assert True\n"})
    origin.push()
    m = mirror(origin, tmp_path)
    claim = ((n_[:7], m_[:7]), ("main",))
    [locked] = m.check_all([claim], bases=[base], locked=["tests/**"])
    [clean] = m.check_all([claim], bases=[base])
    assert (locked.state, locked.commit, locked.paths) == ("locked", n_, (LOGIN,))
    assert locked.reason == f"commit {n_[:7]} touches locked paths: {LOGIN}"
    # No locked paths: the top (N) is where the check runs, and both commits are the work.
    assert (clean.state, clean.commit, clean.new, clean.claimed) == (
        "verified",
        n_,
        (m_, n_),
        (n_, m_),
    )


def test_a_locked_edit_in_the_middle_of_the_range_is_held(origin: Origin, tmp_path: Path) -> None:
    """Edited and reverted between the base and the claim: the range's diff is clean, the
    commit that made the edit is not."""
    base = git(origin.bare, "rev-parse", "refs/heads/main")
    first = origin.commit("start")
    edit = origin.commit("edit the test", files={LOGIN: "assert True\n"})
    origin.commit("put it back", files={LOGIN: None})
    claim = origin.commit("finish")
    origin.push()
    assert git(origin.bare, "diff", "--name-only", f"{base}...{claim}") == "log.txt"
    [check] = mirror(origin, tmp_path).check_all(
        [((claim[:7],), ("main",))], bases=[base], locked=["tests/**"]
    )
    assert (check.state, check.commit, check.paths) == ("locked", edit, (LOGIN,))
    assert check.reason == f"commit {edit[:7]} touches locked paths: {LOGIN}"
    assert first != edit


def test_two_tasks_claiming_from_one_range(origin: Origin, tmp_path: Path) -> None:
    """Both sent at one base; T1's agent pushed A, T2's pushed B on top. Each range holds what
    it names and what lies below; the crediting (patrol.settle) gives each its own."""
    from xaf_hub.patrol.settle import Settlement, settle_claim

    base = git(origin.bare, "rev-parse", "refs/heads/main")
    a = origin.commit("T1's work")
    b = origin.commit("T2's work")
    origin.push()
    t1, t2, both = mirror(origin, tmp_path).check_all(
        [((a[:7],), ("main",)), ((b[:7],), ("main",)), ((a[:7], b[:7]), ("main",))],
        bases=[base, base, base],
    )
    assert (t1.commit, t1.new, t1.claimed) == (a, (a,), (a,))
    assert (t2.commit, t2.new, t2.claimed) == (b, (a, b), (b,))
    assert (both.commit, both.new, both.claimed) == (b, (a, b), (a, b))
    claims = {a: ["T1"], b: ["T2"]}
    done = {}
    for task, check in (("T2", t2), ("T1", t1)):  # either order
        out = settle_claim(Settlement("done"), check, claims=claims, credited=done, task=task)
        assert out.action == "done", out
        done.update(dict.fromkeys(out.commits, task))
    assert done == {a: "T1", b: "T2"}
    # A later task naming both: A is T1's, credited already; it waits for a person.
    late = settle_claim(Settlement("done"), both, credited=done, task="T3")
    assert (late.action, late.judged) == ("keep", "already credited")


def test_claims_on_diverging_lines_wait_for_a_person(origin: Origin, tmp_path: Path) -> None:
    base = git(origin.bare, "rev-parse", "refs/heads/main")
    one = origin.commit("one line", branch="feature/one")
    origin.push("feature/one")
    git(origin.work, "checkout", "-q", base)
    two = origin.commit("another line", branch="feature/two")
    origin.push("feature/two")
    git(origin.work, "checkout", "-q", "feature/one")
    git(origin.work, "merge", "-q", "--no-edit", "-s", "ours", "feature/two")
    merged = git(origin.work, "rev-parse", "HEAD")
    origin.push("feature/one")
    m = mirror(origin, tmp_path)
    apart, joined = m.check_all(
        [((one[:7], two[:7]), ()), ((one[:7], merged[:7], two[:7]), ())], bases=[base, base]
    )
    assert apart.state == "diverged" and apart.commit == ""
    assert apart.reason.startswith("claimed commits ") and one[:7] in apart.reason
    assert apart.reason.endswith("are on diverging lines: none of them holds all the others")
    # The merge of both named too: it holds them, the check runs there.
    assert (joined.state, joined.commit, set(joined.new)) == (
        "verified",
        merged,
        {one, two, merged},
    )


def test_too_long_a_range_waits_for_a_person(
    origin: Origin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xaf_hub.store import repository

    monkeypatch.setattr(repository, "MAX_RANGE", 3)
    base = git(origin.bare, "rev-parse", "refs/heads/main")
    for i in range(3):
        origin.commit(f"step {i}")
    three = git(origin.work, "rev-parse", "HEAD")
    four = origin.commit("one too many")
    origin.push()
    ok, many = mirror(origin, tmp_path).check_all(
        [((three[:7],), ("main",)), ((four[:7],), ("main",))], bases=[base, base]
    )
    assert (ok.state, len(ok.new)) == ("verified", 3)
    assert (many.state, many.commit) == ("too_many", four)
    assert many.reason == (
        f"more than 3 commits between the task's base {base[:7]} and claimed commit {four[:7]}"
    )


@pytest.mark.parametrize(
    ("name", "glob"),
    [
        ("tests/测试_登录.py", "tests/**"),
        ("tests/测试_登录.py", "tests/测试_登录.py"),
        ("tests/测试_登录.py", "测试_*.py"),
        ("tests/a\nb.py", "tests/**"),
        ("tests/a\nb.py", "tests/a\nb.py"),
        ('tests/"quoted"\tand tab.py', "tests/**"),
        ('tests/"quoted"\tand tab.py', 'tests/"quoted"\tand tab.py'),
    ],
)
def test_locked_paths_are_compared_exactly(
    origin: Origin, tmp_path: Path, name: str, glob: str
) -> None:
    """git quotes such names in its usual output ("tests/\\346..."); read with -z they come
    through as they are and the lock holds, in the commit's own change and in the range's."""
    base = git(origin.bare, "rev-parse", "refs/heads/main")
    edit = origin.commit("edit it", files={name: "x\n"})
    origin.push()
    m = mirror(origin, tmp_path)
    ranged, own = m.check_all(
        [((edit[:7],), ("main",)), ((edit[:7],), ("main",))], bases=[base, None], locked=[glob]
    )
    assert (ranged.state, ranged.paths) == ("locked", (name,))
    assert (own.state, own.paths) == ("locked", (name,))
    # The reason stays one line: a name holding a control character is quoted with escapes.
    assert "\n" not in ranged.reason and "\t" not in ranged.reason
    # A near name is not locked: the comparison is exact, not by a lookalike.
    [near] = m.check_all([((edit[:7],), ("main",))], bases=[base], locked=[glob + "x"])
    assert near.state == "verified"


def plant(m: Mirror, tmp_path: Path) -> Path:
    """What an attacker who reached the mirror leaves: hooks in it and a config that names
    other hooks and an fsmonitor command; each writes to the marker it returns when run."""
    marker = tmp_path / "planted-ran"
    script = f"#!/bin/sh\necho \"$0\" >> {marker}\n"
    for folder in (m.path / "hooks", tmp_path / "evil-hooks"):
        folder.mkdir(exist_ok=True)
        for name in ("reference-transaction", "post-checkout", "pre-auto-gc", "fsmonitor"):
            (folder / name).write_text(script)
            (folder / name).chmod(0o755)
    with (m.path / "config").open("a") as config:
        config.write(
            f"[core]\n\thooksPath = {tmp_path / 'evil-hooks'}\n"
            f"\tfsmonitor = {tmp_path / 'evil-hooks' / 'fsmonitor'}\n"
        )
    return marker


def test_no_git_command_runs_a_hook_or_an_fsmonitor_of_the_mirror(
    origin: Origin, tmp_path: Path
) -> None:
    m = mirror(origin, tmp_path)
    m.fetch()
    marker = plant(m, tmp_path)
    sha = git(origin.bare, "rev-parse", "refs/heads/main")
    work = tmp_path / "wt"
    work.mkdir()
    m.git("update-ref", "refs/heads/planted", sha)  # reference-transaction
    m.git("--work-tree", str(work), "read-tree", "-u", "--reset", sha,
           extra_env={"GIT_INDEX_FILE": str(tmp_path / "index")})
    m.git("--work-tree", str(work), "status", "--porcelain",
           extra_env={"GIT_INDEX_FILE": str(tmp_path / "index")})  # fsmonitor
    assert not marker.exists()
    # Plain git, as the hub ran it before, runs them: the plant works.
    git(tmp_path, "--git-dir", str(m.path), "update-ref", "refs/heads/other", sha)
    assert marker.exists()


def test_every_git_command_of_the_hub_goes_through_git_safe() -> None:
    """No module starts git but with git_safe's options (no hook, no fsmonitor)."""
    import re

    package = Path(__file__).resolve().parents[3] / "xaf_hub"
    starts = re.compile(r"""\[\s*["']git["']""")
    found = [p.name for p in package.rglob("*.py") if starts.search(p.read_text("utf-8"))]
    assert found == ["repository.py"]  # git_safe itself
    assert "*git_safe(" in (package.parent / "sandbox" / "demo.py").read_text("utf-8")


def test_a_planted_mirror_is_set_aside_and_fetched_anew(origin: Origin, tmp_path: Path) -> None:
    m = mirror(origin, tmp_path)
    sha = origin.commit("work")
    origin.push()
    m.fetch()
    m.fetch()
    assert m.rebuilt == ""  # what the hub wrote itself is never taken for a plant
    assert sorted(os.listdir(m.path)) == ["HEAD", "config", "info", "objects", "refs"]
    marker = plant(m, tmp_path)
    with pytest.raises(GitFailed, match="not as the hub wrote it"):
        m.known_tips()  # a manual dispatch reads no planted mirror
    again = mirror(origin, tmp_path)
    [check] = again.check_all([((sha[:7],), ("main",))])
    assert check.state == "verified" and check.commit == sha
    assert again.rebuilt.startswith("repository mirror rebuilt: it was not as the hub wrote it")
    assert "hooks" in again.rebuilt and "config" in again.rebuilt
    assert not (m.path / "hooks").exists() and b"hooksPath" not in (m.path / "config").read_bytes()
    assert (m.path.with_name(m.path.name + ".planted") / "hooks" / "post-checkout").exists()
    assert not marker.exists()
    # A hook dropped into the hub's own empty hooks folder counts too.
    (m.hooks / "post-checkout").write_text("#!/bin/sh\n")
    third = mirror(origin, tmp_path)
    third.fetch()
    assert "files in no-hooks/" in third.rebuilt and list(m.hooks.iterdir()) == []


@needs_sandbox
def test_the_commits_attributes_neither_hide_files_nor_run_filters(
    origin: Origin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "filter-ran"
    config = tmp_path / "gitconfig"
    config.write_text(f"[filter \"evil\"]\n\tsmudge = touch {marker}; cat\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))  # the hub user's own git config
    (origin.work / ".gitattributes").write_text("* filter=evil\ntests/** export-ignore\n")
    (origin.work / "tests").mkdir()
    (origin.work / "tests" / "test_login.py").write_text("assert False\n")
    git(origin.work, "add", "-A")
    sha = origin.commit("attributes")
    origin.push()
    m = mirror(origin, tmp_path)
    m.fetch()
    run = m.run_check(sha, "cat tests/test_login.py", 30)
    assert run.passed and run.tail == "assert False"
    assert not marker.exists()
