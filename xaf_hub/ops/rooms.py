"""A room for every task: its own git worktree and branch on its server (docs/worktrees.md).

With ``project.isolation: "worktree"`` every new session the hub makes for a task works in a
worktree of the project's checkout on that server, made through the server's own API, so
parallel agents never share a working tree. ``open_room`` makes it, waits until the server
has filled it, and moves its branch to the base branch as ``origin`` has it now (never what
the server's checkout last pulled); ``close_room`` removes it and its local branch.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
from dataclasses import replace

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.discipline import slugify
from xaf_hub.core.records import Room, SessionRecord
from xaf_hub.errors import ApiError, HubError, RoomFailed, UsageError
from xaf_hub.fleet.client import OpencodeClient

# How long the server may take to fill a new worktree (polls of 0.1 s), well inside a read's
# time-out; then the script goes on and the reset reports what it finds.
READY_POLLS = 100
_BASED = re.compile(r"xaf-hub-base ([0-9a-f]{40})")
_BRANCH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


async def room_support(client: OpencodeClient, inst: InstanceConfig) -> str:
    """Whether ``inst`` can give tasks worktrees of their own: "" yes, else why not (a
    sentence; the hub then runs them in its checkout)."""
    checkout = inst.default_directory or (inst.roots[0] if inst.roots else "")
    if not checkout:
        return "no default_directory or root to make worktrees of"
    return (await _support(client, checkout))[0]


async def _support(client: OpencodeClient, checkout: str) -> tuple[str, str]:
    """(why it makes no worktrees of ``checkout``, "" when it does; the checkout's top folder
    as the server resolved it)."""
    if await client.detect() != "classic":
        return "its API makes no worktrees", ""
    ident, top, vcs = await client.project_of(checkout)
    if vcs != "git":
        return f"{checkout} is not a git checkout on it", top
    if ident in ("", "global"):
        return f"{checkout} is a git repository with no commit yet", top
    return "", top


def room_name(task_id: str, title: str) -> str:
    """The worktree's name: the task id, a slug of its title and a mark of this attempt
    (``t-20261206-ab12-fix-login-3f9a``): each attempt of a task gets a branch of its own, so
    an earlier attempt's pushed branch is never in its way, nor overwritten."""
    named = f"{task_id.lower()}-{slugify(title or task_id, 32)}"[:54].rstrip("-")
    return f"{named}-{os.urandom(2).hex()}"


def in_room(inst: InstanceConfig, session: SessionRecord | None) -> bool:
    """Whether a project session works in a worktree (its folder is the project's only
    through the checkout the worktree was made from)."""
    return session is not None and session.project and not inst.rules.is_project(session.directory)


def base_script(base_branch: str) -> str:
    """The shell command that waits for the server to fill the worktree, then moves its branch
    to ``origin/<base_branch>`` and prints the commit it now starts from."""
    if not _BRANCH.match(base_branch) or ".." in base_branch:
        raise UsageError(f"patrol.base_branch {base_branch!r} is not a branch name")
    script = (
        f"i=0; while [ $i -lt {READY_POLLS} ]; do "
        'if [ -z "$(git ls-tree HEAD | head -n 1)" ]; then break; fi; '
        'if [ -n "$(git ls-files | head -n 1)" ] && '
        '[ ! -e "$(git rev-parse --git-dir)/index.lock" ]; then break; fi; '
        "i=$((i+1)); sleep 0.1; done; "
        f"git fetch --quiet origin {base_branch} && git reset --quiet --hard FETCH_HEAD && "
        'echo "xaf-hub-base $(git rev-parse HEAD)"'
    )
    return _packed(script)


def _packed(script: str) -> str:
    """``script`` handed over encoded: servers run it through shells that expand and quote
    differently, and this way none does."""
    return f"echo {base64.b64encode(script.encode()).decode()} | base64 -d | sh"


def based_commit(output: str) -> str:
    """The commit ``base_script`` reported, or "" when it failed."""
    m = _BASED.search(output)
    return m.group(1) if m else ""


async def open_room(client: OpencodeClient, checkout: str, name: str) -> Room:
    """Make the worktree (not yet started from the base: ``start_room`` does that).

    RoomFailed with ``unsupported`` when the server makes none there (an API without
    worktrees, a folder that is no git checkout): the caller may share the checkout instead.
    """
    why, top = await _support(client, checkout)
    if why:
        raise RoomFailed(f"{client.name}: no worktree: {why}", unsupported=True)
    try:
        made = await client.create_worktree(checkout, name)
    except ApiError as exc:
        unsupported = exc.name == "WorktreeNotGitError" or exc.status == 404
        why = "it is not a git checkout" if exc.name == "WorktreeNotGitError" else str(exc)
        raise RoomFailed(
            f"{client.name}: no worktree of {checkout}: {why}", unsupported=unsupported
        ) from exc
    except HubError as exc:
        raise RoomFailed(f"{client.name}: no worktree of {checkout}: {exc}") from exc
    return replace(made, checkout=top or checkout)


async def start_room(client: OpencodeClient, room: Room, session_id: str, base_branch: str) -> Room:
    """Wait for the server to fill the worktree, then start its branch from
    ``origin/<base_branch>`` (through the session's shell: the server's git and credentials)."""
    try:
        said = await client.shell(session_id, room.directory, base_script(base_branch))
    except HubError as exc:  # the prompt never left: the caller takes the room back
        raise RoomFailed(f"{client.name}: the worktree {room.directory} did not start: {exc}") \
            from exc
    commit = based_commit(said)
    if not commit:
        tail = " / ".join(line.strip() for line in said.strip().splitlines()[-3:] if line.strip())
        raise RoomFailed(
            f"{client.name}: the worktree {room.directory} could not start from "
            f"origin/{base_branch}: {tail or 'no output'}"
        )
    return replace(room, base=commit)


async def close_room(client: OpencodeClient, room: Room) -> str:
    """Remove the worktree and its local branch on the server: "" when done, else why not."""
    try:
        await client.remove_worktree(room.checkout, room.directory)
    except HubError as exc:
        return f"its worktree {room.directory} stays on {client.name} ({exc})"
    return ""


# Nothing of a worktree's would be lost if it went: no change left uncommitted, no commit that no
# remote branch holds (after a fetch). The script prints a line per thing that would be lost.
_KEEPS = (
    "git fetch -q origin 2>/dev/null; git status --porcelain | sed 's/^/changed: /'; "
    'own=$(git symbolic-ref -q HEAD); '
    "git for-each-ref --format='%(refname)' refs/heads | grep -vxF \"$own\" | "
    "xargs git log --format='unpushed: %H' HEAD --not --remotes"
)


# What each line ``_KEEPS`` prints starts with, and how a count of them is said.
_LOST = (("changed: ", "uncommitted change(s)"), ("unpushed: ", "commit(s) on no remote branch"))


def keeps_command() -> str:
    """The shell command that prints what removing the worktree it runs in would lose."""
    return _packed(_KEEPS)


async def what_stays(client: OpencodeClient, directory: str) -> str:
    """Why removing the worktree ``directory`` would lose work ("": it would lose nothing),
    asked through a throw-away session's shell on its server."""
    probe = await client.create_session(directory, "xaf-hub cleanup: is everything pushed?")
    try:
        said = await client.shell(probe.id, directory, keeps_command())
    finally:
        with contextlib.suppress(HubError):
            await client.delete(probe.id, directory)
    lines = said.splitlines()
    found = ((sum(1 for line in lines if line.startswith(mark)), what) for mark, what in _LOST)
    return ", ".join(f"{n} {what}" for n, what in found if n)
