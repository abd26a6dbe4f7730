"""Real git repositories for the tests: a bare "origin" on disk and a clone that pushes to it."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Fixed identity and no system or user config: the same commands give the same results.
ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> str:
    """Run git in ``cwd``; its stdout (stripped); a failure fails the test with git's words."""
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=ENV, input=stdin, capture_output=True, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace')}")
    return done.stdout.decode().strip()


@dataclass
class Origin:
    """A bare repository (the remote the agents push to) and a working clone of it."""

    bare: Path
    work: Path

    def commit(
        self, message: str, branch: str = "main", files: dict[str, str | None] | None = None
    ) -> str:
        """Commit a change on ``branch`` of the clone (not pushed); its full hash. ``files``:
        paths to write (None: delete) besides the line added to log.txt."""
        git(self.work, "checkout", "-q", "-B", branch)
        with (self.work / "log.txt").open("a") as log:
            log.write(message + "\n")
        for name, text in (files or {}).items():
            path = self.work / name
            if text is None:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, "utf-8")
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "-m", message)
        return git(self.work, "rev-parse", "HEAD")

    def push(self, branch: str = "main", *, force: bool = False) -> None:
        git(self.work, "push", "-q", *(["--force"] if force else []), "origin", branch)


def make_origin(root: Path) -> Origin:
    """A bare origin with one commit on main, and its clone."""
    root.mkdir(parents=True, exist_ok=True)
    bare, work = root / "origin.git", root / "work"
    git(root, "init", "-q", "--bare", "-b", "main", str(bare))
    git(root, "clone", "-q", str(bare), str(work))
    origin = Origin(bare, work)
    # Its own root commit: opencode names a project after it, and two origins made in the same
    # second with the same words would be one project to a server the tests share.
    origin.commit(f"initial of {root}")
    origin.push()
    return origin
