"""The project's check, contained: the agents' code runs where it cannot reach the hub.

``run_check`` runs the check in a bubblewrap sandbox (no network unless ``project.check_network``)
and starts and waits for it in one call; where no sandbox works the check is ``refused``, or
``uncontained`` with ``project.check_uncontained``'s consent (docs/verification.md).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from xaf_hub.core.text import redact

# contained: in the sandbox; uncontained: as a plain process (the config consented);
# refused: not run, no sandbox works here and the config did not consent.
Containment = Literal["contained", "uncontained", "refused"]

BWRAP = "bwrap"  # the sandbox's program, looked up on PATH
TAIL_LINES = 40
TAIL_CHARS = 4000
# Inside the sandbox.
WORK = "/repo"
HOME = "/home/check"
# Read-only system folders (each bound when the host has it, a merged-/usr link as its target).
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Of /etc, what programs need to start and behave: the dynamic linker's cache, how names are
# looked up, localhost, the time zone, Debian's alternatives (awk, cc, java are links there).
# passwd and group are written for the check: only root, nobody and the hub's user.
ETC = ("ld.so.cache", "nsswitch.conf", "hosts", "localtime", "alternatives")
# With project.check_network: name resolution and the certificate authorities.
ETC_NETWORK = ("resolv.conf", "host.conf", "gai.conf", "ssl/certs")
# What a check is given of the hub's environment: enough to find its tools, never the hub's
# own secrets (webhook URLs, passwords and tokens live in its environment too).
_CHECK_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "TEMP", "TMP",
    "SYSTEMROOT", "COMSPEC", "PATHEXT",
)
# A child in a process group of its own: a new session on POSIX, a new group on Windows.
NEW_GROUP: int = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)


@dataclass(frozen=True)
class Reach:
    """What a check may reach beyond its copy (``project.check_paths``, ``check_network``)
    and whether it may run uncontained where no sandbox works (``check_uncontained``)."""

    paths: tuple[str, ...] = ()
    network: bool = False
    uncontained: bool = False


@dataclass(frozen=True)
class CheckRun:
    """The project's check command on one commit: passed (exit 0), the exit, the output's end
    (refused: why no sandbox works), and where it ran."""

    passed: bool
    code: int | None  # None: it ran out of time and was killed, or it never ran
    tail: str
    seconds: float
    contained: Containment = "contained"


def spawn(argv: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
    """Start ``argv`` with no stdin in a process group of its own, so ``kill_tree`` ends it
    and everything it started (``options``: Popen's others)."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        start_new_session=sys.platform != "win32",
        creationflags=NEW_GROUP,
        **options,
    )


def kill_tree(pid: int) -> None:
    """Kill ``pid`` and every process it started, now (no grace).

    POSIX: its process group (the child's own session), which also reaches grandchildren
    whose parent already exited. Windows has no process-group kill: ``kill_family``.
    """
    if sys.platform == "win32":
        kill_family(pid)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def kill_family(pid: int) -> None:
    """Kill ``pid`` and its descendants as psutil finds them (any OS; Windows' way)."""
    import psutil  # deferred: start-up, docs/performance.md

    try:
        root = psutil.Process(pid)
        family = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for proc in family:
        with contextlib.suppress(psutil.Error):
            proc.kill()


# -- the check's folder ----------------------------------------------------------------------


def new_folder(state_dir: Path) -> Path:
    """A fresh folder for one check under ``<state>/checks`` (its copy goes in ``repo``),
    named after this process; first the folders of processes that are gone are removed."""
    import psutil  # deferred: start-up, docs/performance.md

    checks = state_dir / "checks"
    checks.mkdir(parents=True, exist_ok=True, mode=0o700)
    for old in checks.iterdir():
        owner = old.name.partition("-")[0]
        if not (owner.isdigit() and psutil.pid_exists(int(owner))):
            remove(old)
    folder = checks / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    folder.mkdir(mode=0o700)
    return folder


def remove(folder: Path) -> None:
    """Delete a check's folder whatever modes its check left (links are never followed)."""
    with contextlib.suppress(OSError):
        if not folder.is_symlink():
            folder.chmod(0o700)
        for root, dirs, _ in os.walk(folder):
            for d in dirs:
                path = os.path.join(root, d)
                if not os.path.islink(path):
                    with contextlib.suppress(OSError):
                        os.chmod(path, 0o700)
    if folder.is_symlink():
        folder.unlink()
    else:
        shutil.rmtree(folder, ignore_errors=True)


# -- the sandbox -----------------------------------------------------------------------------


def sandbox_argv(folder: Path, reach: Reach) -> list[str]:
    """bwrap's options for a check in ``folder``: its copy (``repo``) and the passwd and group
    it is shown (``accounts``) are there; then the command."""
    argv = ["--unshare-all", *(["--share-net"] if reach.network else []), "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--hostname", "xaf-hub-check"]
    for path in SYSTEM:
        argv += ["--ro-bind-try", path, path]
    for name in ETC + (ETC_NETWORK if reach.network else ()):
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for name in ("passwd", "group"):
        argv += ["--ro-bind", str(folder / name), f"/etc/{name}"]
    for path in reach.paths:
        argv += ["--ro-bind", path, path]
    return [*argv, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", HOME,
            "--bind", str(folder / "repo"), WORK, "--chdir", WORK]


def accounts(folder: Path) -> None:
    """Write the passwd and group a check is shown: root, nobody and the hub's own user
    (its HOME the sandbox's), none of the host's other accounts."""
    uid, gid, name = _user()
    users = {0: "root", 65534: "nobody", uid: name}
    (folder / "passwd").write_text("".join(
        f"{n}:x:{u}:{gid if u == uid else u}::{HOME if u == uid else '/'}:/bin/sh\n"
        for u, n in users.items()), "utf-8")
    groups = {0: "root", 65534: "nogroup", gid: name}
    (folder / "group").write_text("".join(f"{n}:x:{g}:\n" for g, n in groups.items()), "utf-8")


def _user() -> tuple[int, int, str]:
    """The hub's uid, gid and user name (POSIX; a sandbox runs only there)."""
    if sys.platform == "win32":
        raise OSError("no sandbox on Windows")

    uid = os.getuid()
    try:
        return uid, os.getgid(), pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, os.getgid(), "check"


def _sandbox(folder: Path, reach: Reach) -> tuple[str, list[str]]:
    """Why no sandbox works here ("" when one does) and bwrap's argv for this check: bwrap
    itself is tried with these very options first, so a refusal is never the check's fault."""
    if not sys.platform.startswith("linux"):
        return f"no sandbox on {sys.platform}: the check's sandbox (bubblewrap) needs Linux", []
    bwrap = shutil.which(BWRAP)
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap", []
    missing = [p for p in reach.paths if not os.path.isdir(p)]
    if missing:
        return f"project.check_paths names {missing[0]}, which is not a folder here", []
    state = folder.resolve().parent.parent
    holding = [p for p in reach.paths if state.is_relative_to(Path(p).resolve())]
    if holding:
        return f"project.check_paths names {holding[0]}, which holds the hub's state folder", []
    accounts(folder)
    argv = [bwrap, *sandbox_argv(folder, reach)]
    try:
        with _args_file(folder, argv, ["/bin/sh", "-c", ":"]) as (cmd, fd):
            tried = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False,
                env=_env(""), pass_fds=(fd,),
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not start here: {exc}", []
    if tried.returncode != 0:
        said = tried.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bubblewrap refuses here: {said[0] if said else f'exit {tried.returncode}'}", []
    return "", argv


@contextlib.contextmanager
def _args_file(
    folder: Path, argv: Sequence[str], command: Sequence[str]
) -> Iterator[tuple[list[str], int]]:
    """``bwrap --args FD COMMAND``: bwrap's options NUL-separated in a file open at FD (pass it
    on with ``pass_fds``), off every command line, the sandbox's PID 1 included."""
    path = folder / "bwrap.args"
    path.write_bytes(b"".join(os.fsencode(a) + b"\0" for a in argv[1:]))
    fd = os.open(path, os.O_RDONLY)
    try:
        yield [argv[0], "--args", str(fd), *command], fd
    finally:
        os.close(fd)


def _env(commit: str, *, contained: bool = True) -> dict[str, str]:
    """The check's environment: the hub's PATH and language, never its secrets."""
    env = {k: os.environ[k] for k in _CHECK_ENV if k in os.environ}
    if contained:
        user = _user()[2]
        env.update(HOME=HOME, USER=user, LOGNAME=user, TMPDIR="/tmp")
        env.pop("TEMP", None)
        env.pop("TMP", None)
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if commit:
        env["XAF_HUB_CHECK_COMMIT"] = commit
    return env


def run_check(
    folder: Path, command: str, timeout: float, commit: str, secrets: Sequence[str], reach: Reach
) -> CheckRun:
    """Run ``command`` (a shell command) on the copy in ``folder/repo``: in the sandbox, or
    uncontained only where none works and ``Reach.uncontained``; else ``refused``, not run.

    Its output (stdout and stderr) is kept to the last lines, redacted; every process it
    started is gone when this returns (the sandbox's PID namespace, or its process group).
    """
    problem, argv = _sandbox(folder, reach)
    if not problem:
        with _args_file(folder, argv, ["/bin/sh", "-c", command]) as (cmd, fd):
            return _run(cmd, None, _env(commit), timeout, secrets, "contained", fd)
    if not reach.uncontained:
        return CheckRun(False, None, problem, 0.0, "refused")
    if sys.platform == "win32":
        cmd = [os.environ.get("COMSPEC", "cmd.exe"), "/d", "/c", command]
    else:
        cmd = ["/bin/sh", "-c", command]
    env = _env(commit, contained=False)
    return _run(cmd, folder / "repo", env, timeout, secrets, "uncontained", None)


def _run(
    argv: list[str],
    cwd: Path | None,
    env: dict[str, str],
    timeout: float,
    secrets: Sequence[str],
    contained: Containment,
    fd: int | None,
) -> CheckRun:
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        fds = () if fd is None else (fd,)
        proc = spawn(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, pass_fds=fds)
        code: int | None
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        # End the check's whole process group (what it left running too), then reap it. In
        # the sandbox that is bwrap, and its PID namespace (everything inside) goes with it.
        kill_tree(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    lines = text.rstrip().splitlines()[-TAIL_LINES:]
    tail = "\n".join(lines)[-TAIL_CHARS:]
    if code is None:
        tail += f"\n(killed: no end within {timeout:g}s)"
    return CheckRun(code == 0, code, redact(tail, secrets), time.monotonic() - started, contained)


# -- doctor's proof --------------------------------------------------------------------------


@dataclass(frozen=True)
class Proof:
    """What a probe check found: it ran in the sandbox (or why none works), whether it read
    a secret planted in the state folder, reached a loopback port the hub opened (None: it
    could not try, no bash inside), and how many processes it saw."""

    contained: Containment
    reason: str = ""
    secret_read: bool = False
    port: int = 0
    reached: bool | None = None
    processes: int = 0


_PROBE = (
    "cat {secret} 2>/dev/null && echo read-secret; "
    "if command -v bash >/dev/null; then bash -c ': </dev/tcp/127.0.0.1/{port}' 2>/dev/null; "
    "echo tried-port; fi; echo processes=$(ls /proc | grep -c '^[0-9]'); echo ran > ran"
)


def prove(state_dir: Path, reach: Reach) -> Proof:
    """Run a probe check in the sandbox: it must fail to read a secret planted in the state
    folder and to reach a loopback port the hub listens on (unless ``Reach.network``)."""
    folder = new_folder(state_dir)
    try:
        (folder / "repo").mkdir()
        secret = folder / "planted-secret"
        secret.write_text(uuid.uuid4().hex, "utf-8")
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            probe = _PROBE.format(secret=shlex.quote(str(secret)), port=port)
            run = run_check(folder, probe, 30, "", (), Reach(reach.paths, reach.network))
            listener.setblocking(False)
            try:
                listener.accept()[0].close()
                reached: bool | None = True
            except BlockingIOError:
                reached = None if "tried-port" not in run.tail else False
        if run.contained == "refused":
            return Proof("refused", run.tail)
        if not (folder / "repo" / "ran").is_file():
            return Proof("refused", f"the probe did not run in its copy: {run.tail}")
        counted = [line for line in run.tail.splitlines() if line.startswith("processes=")]
        return Proof(
            "contained",
            secret_read="read-secret" in run.tail.splitlines(),
            port=port,
            reached=reached,
            processes=int(counted[0].partition("=")[2] or 0) if counted else 0,
        )
    finally:
        remove(folder)
