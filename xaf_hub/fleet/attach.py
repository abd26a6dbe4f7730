"""The shell command that opens a session in opencode's own terminal UI.

On opencode 1.18 (docs/known-limits.md): `opencode attach <url> --session <id> [--dir <dir>]`
attaches the TUI to a running server; `--dir` is tried as a local folder and otherwise passed to the
server as is, so the session's folder on the server is right; the password comes from
OPENCODE_SERVER_PASSWORD (or `-p`, which would put it in the shell history), the user name
from `-u` (default opencode). The command never holds a password: it names the variable.
"""

from __future__ import annotations

import shlex

from xaf_hub.config.credentials import password_var
from xaf_hub.config.load import InstanceConfig


def attach_command(inst: InstanceConfig, session_id: str, directory: str = "") -> str:
    """`opencode attach ...` for this session, its password taken from an env var."""
    words = ["opencode", "attach", inst.url, "--session", session_id]
    if directory:
        words += ["--dir", directory]
    if inst.username and inst.username != "opencode":
        words += ["-u", inst.username]
    command = " ".join(shlex.quote(w) for w in words)
    if inst.password_source == "none":
        return command
    kind, _, where = inst.password_source.partition(":")
    variable = where if kind == "env" else password_var(inst.name, inst.password_env)
    return f'OPENCODE_SERVER_PASSWORD="${variable}" {command}'


def attach_hint(inst: InstanceConfig) -> str:
    """What must be true for the command to work, when the password is not in an env var."""
    if inst.password_source == "none" or inst.password_source.startswith("env:"):
        return ""
    return f"(set {password_var(inst.name, inst.password_env)} to {inst.name}'s password first)"
