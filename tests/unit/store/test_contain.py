"""The project's check in its sandbox (store.contain), run for real with bubblewrap: what it
is shown, what it cannot read or reach, that nothing it started outlives it (its end, its
bound, the hub SIGKILLed mid-check), and the refusal where no sandbox works."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.contained import needs_sandbox
from tests.gitrepo import Origin, git, make_origin
from tests.unit.config.projects_support import load, projects
from xaf_hub.store import contain
from xaf_hub.store.contain import ETC, HOME, SYSTEM, Reach, sandbox_argv
from xaf_hub.store.repository import Mirror


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    return make_origin(tmp_path / "remote")


def fetched(origin: Origin, tmp_path: Path, reach: Reach | None = None) -> tuple[Mirror, str]:
    m = Mirror(str(origin.bare), tmp_path / "state", reach=reach)
    m.fetch()
    return m, git(origin.bare, "rev-parse", "refs/heads/main")


def alive(marker: str) -> list[str]:
    """The processes whose command line holds ``marker`` (as the host sees them all)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # ended meanwhile
            if marker.encode() in cmdline.read_bytes():
                found.append(cmdline.parent.name)
    return found


def wait_gone(marker: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(marker):
        assert time.monotonic() < deadline, f"still running: {marker}"
        time.sleep(0.05)


def binds(argv: list[str]) -> dict[str, tuple[str, str]]:
    """Where each bind of bwrap's options lands: destination -> (option, source)."""
    out = {}
    for i, a in enumerate(argv):
        if a in ("--bind", "--ro-bind", "--ro-bind-try"):
            out[argv[i + 2]] = (a, argv[i + 1])
    return out


def test_the_sandbox_shows_the_copy_system_folders_and_named_paths_only(tmp_path: Path) -> None:
    argv = sandbox_argv(tmp_path, Reach())
    assert {"--unshare-all", "--die-with-parent", "--new-session"} <= set(argv)
    assert argv[argv.index("--cap-drop") + 1] == "ALL"  # root in it holds no capability
    assert "--share-net" not in argv  # its own network namespace: not even the host's loopback
    shown = binds(argv)
    writable = {dest: src for dest, (opt, src) in shown.items() if opt == "--bind"}
    assert writable == {"/repo": str(tmp_path / "repo")}
    read_only = {dest: src for dest, (opt, src) in shown.items() if opt != "--bind"}
    etc = {f"/etc/{n}" for n in ETC}
    assert read_only == {
        **{p: p for p in SYSTEM},
        **{p: p for p in etc},
        "/etc/passwd": str(tmp_path / "passwd"),
        "/etc/group": str(tmp_path / "group"),
    }
    # Private and empty: /tmp and HOME; its own /proc (its processes only) and /dev.
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"] == ["/tmp", HOME]
    assert argv[argv.index("--proc") + 1] == "/proc" and argv[-2:] == ["--chdir", "/repo"]

    wide = sandbox_argv(tmp_path, Reach(paths=("/opt/jdk",), network=True))
    assert "--share-net" in wide
    assert binds(wide)["/opt/jdk"] == ("--ro-bind", "/opt/jdk")
    assert binds(wide)["/etc/resolv.conf"] == ("--ro-bind-try", "/etc/resolv.conf")


def test_the_check_is_shown_no_account_of_the_host_but_root_nobody_and_its_own(
    tmp_path: Path,
) -> None:
    contain.accounts(tmp_path)
    names = [line.split(":")[0] for line in (tmp_path / "passwd").read_text().splitlines()]
    me = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    assert set(names) == {"root", "nobody", me}
    mine = [line for line in (tmp_path / "passwd").read_text().splitlines() if line.startswith(me)]
    assert mine[0].split(":")[5] == HOME


@needs_sandbox
def test_a_contained_check_reads_and_reaches_nothing_of_the_hub(
    origin: Origin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "state" / "planted.txt"
    m, sha = fetched(origin, tmp_path)
    secret.write_text("s3cret-planted", "utf-8")
    monkeypatch.setenv("XAF_HUB_PW_PLANTED", "s3cret-in-env")
    marker = f"4242.{os.getpid()}"
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        check = (
            f"cat {secret} 2>&1; cat /proc/*/environ 2>/dev/null | grep -c XAF_HUB_PW_; "
            f"bash -c ': </dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo REACHED; "
            f"ls {tmp_path} 2>&1 | head -1; ls {m.path}/hooks 2>&1 | head -1; "
            f"setsid sleep {marker} & echo processes $(ls /proc | grep -c '^[0-9]'); "
            "mkdir locked && touch locked/f && chmod 000 locked; echo done"
        )
        run = m.run_check(sha, check, 60)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing came through
    assert run.contained == "contained" and run.passed, run.tail
    said = run.tail.splitlines()
    assert said[0] == f"cat: {secret}: No such file or directory"
    assert said[1] == "0"  # no environment of any process holds a hub password
    assert "REACHED" not in said
    assert said[2] == f"ls: cannot access '{tmp_path}': No such file or directory"
    assert said[3].startswith(f"ls: cannot access '{m.path}/hooks'")
    assert said[4].startswith("processes ") and int(said[4].split()[1]) <= 6
    assert said[-1] == "done"
    wait_gone(marker)  # the check's setsid'd process went with its sandbox
    assert list((tmp_path / "state" / "checks").iterdir()) == []  # its copy too


@needs_sandbox
@pytest.mark.xfail(strict=True, reason="/proc/self/mountinfo names the source of each bind: "
                   "the copy's folder under the hub's state folder, and the hub's process id")
def test_a_check_does_not_learn_where_the_hubs_state_folder_is(
    origin: Origin, tmp_path: Path
) -> None:
    """bwrap's options come from a file descriptor so that no command line shows the hub's
    paths; the check's own mount table must not show them either."""
    m, sha = fetched(origin, tmp_path)
    run = m.run_check(sha, "cat /proc/self/mountinfo", 60)
    assert run.contained == "contained" and run.passed, run.tail
    assert str(tmp_path) not in run.tail, run.tail


@needs_sandbox
def test_a_hub_killed_mid_check_leaves_nothing_running(origin: Origin, tmp_path: Path) -> None:
    """A hub process runs a check as the patrol does (asyncio.to_thread); the check starts a
    setsid'd process; the hub is SIGKILLed: the whole sandbox goes with it. The next check
    removes the copy the killed hub left."""
    m, sha = fetched(origin, tmp_path)
    marker = f"4343.{os.getpid()}"
    hub = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from xaf_hub.store.repository import Mirror\n"
        "m = Mirror(sys.argv[1], Path(sys.argv[2]))\n"
        f"check = 'setsid sleep {marker} & touch started; sleep 300'\n"
        "asyncio.run(asyncio.to_thread(m.run_check, sys.argv[3], check, 600))\n"
    )
    checks = tmp_path / "state" / "checks"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen(
        [sys.executable, "-c", hub, str(origin.bare), str(tmp_path / "state"), sha], env=env
    )
    try:
        deadline = time.monotonic() + 60
        while not list(checks.glob("*/repo/started")) or not alive(marker):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        left = list(checks.iterdir())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_gone(marker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [p.name.partition("-")[0] for p in left] == [str(proc.pid)]
    run = m.run_check(sha, "true", 30)
    assert run.passed and list(checks.iterdir()) == []  # the killed hub's copy is swept


def test_no_sandbox_and_no_consent_runs_nothing(
    origin: Origin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m, sha = fetched(origin, tmp_path)
    monkeypatch.setattr(contain, "BWRAP", "no-such-bwrap")
    run = m.run_check(sha, "echo the check ran", 30)
    assert (run.contained, run.passed, run.code) == ("refused", False, None)
    assert run.tail == "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    # With the config's consent it runs, on the copy, as a plain process.
    m, _ = fetched(origin, tmp_path, Reach(uncontained=True))
    run = m.run_check(sha, "echo the check ran in $PWD", 30)
    assert (run.contained, run.passed) == ("uncontained", True)
    assert run.tail.startswith("the check ran in ") and run.tail.endswith("/repo")


def test_a_bwrap_that_refuses_is_no_sandbox(
    origin: Origin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bwrap present but refused by the kernel (user namespaces off, a container's seccomp)."""
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    m, sha = fetched(origin, tmp_path)
    run = m.run_check(sha, "echo the check ran", 30)
    assert run.contained == "refused"
    assert run.tail == "bubblewrap refuses here: bwrap: setting up uid map: Permission denied"
    proof = contain.prove(tmp_path / "state", Reach())
    assert (proof.contained, proof.reason) == ("refused", run.tail)


def test_a_toolchain_folder_that_is_missing_or_holds_the_state_folder_is_refused(
    origin: Origin, tmp_path: Path
) -> None:
    m, sha = fetched(origin, tmp_path, Reach(paths=(str(tmp_path / "no-jdk"),)))
    run = m.run_check(sha, "echo the check ran", 30)
    assert (run.contained, run.tail) == (
        "refused", f"project.check_paths names {tmp_path / 'no-jdk'}, which is not a folder here"
    )
    m, sha = fetched(origin, tmp_path, Reach(paths=(str(tmp_path),)))
    run = m.run_check(sha, "echo the check ran", 30)
    assert (run.contained, run.tail) == (
        "refused", f"project.check_paths names {tmp_path}, which holds the hub's state folder"
    )


@needs_sandbox
def test_doctors_probe_proves_the_sandbox(tmp_path: Path) -> None:
    proof = contain.prove(tmp_path, Reach())
    assert proof.contained == "contained"
    assert (proof.secret_read, proof.reached) == (False, False)
    assert 0 < proof.processes <= 6
    network = contain.prove(tmp_path, Reach(network=True))
    assert (network.secret_read, network.reached) == (False, True)  # the loopback is open then


@needs_sandbox
def test_one_projects_check_reads_nothing_of_another_projects_mirror(
    origin: Origin, tmp_path: Path
) -> None:
    doc = projects(state_dir=str(tmp_path / "state"))
    for entry in doc["projects"].values():
        entry["repository"] = str(origin.bare)  # even one remote: a mirror each
    cfg = load(tmp_path, doc)
    shop, blog = Mirror.of(cfg.choose("shop")), Mirror.of(cfg.choose("blog"))
    assert shop.path.is_relative_to(tmp_path / "state" / "projects" / "shop")
    assert blog.path.is_relative_to(tmp_path / "state" / "projects" / "blog")
    shop.fetch()
    blog.fetch()
    sha = git(origin.bare, "rev-parse", "refs/heads/main")
    run = shop.run_check(sha, f"cat {blog.path}/HEAD 2>&1; ls {blog.state} 2>&1; echo done", 60)
    assert run.contained == "contained" and run.passed, run.tail
    said = run.tail.splitlines()
    assert said[0] == f"cat: {blog.path}/HEAD: No such file or directory"
    assert said[1] == f"ls: cannot access '{blog.state}': No such file or directory"
