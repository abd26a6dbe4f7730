"""Exit codes and the exception tree (docs/architecture.md §10 shows it).

This module is the one home of the tree; only ``cli/main.py`` turns these into exit codes and
printed lines.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from typing import Literal, Protocol, cast, get_args

# Why an instance (or the fleet) could not be used, as a code beside the reason's words.
Cause = Literal[
    "dns", "refused", "connect", "timeout", "dropped", "bad_url", "network", "too_large",
    "garbled", "html", "tls", "auth", "forbidden", "server_error", "no_password", "fleet_down",
    "other",
]
CAUSES = frozenset(get_args(Cause))

# What is wrong with a configuration, as a code beside the ConfigError's words.
ConfigProblem = Literal[
    "no_config", "config_missing", "password_file_missing", "bad_json", "not_utf8",
    "literal_password", "unknown_key", "duplicate_instance", "bad_url", "url_credentials",
    "relative_path", "bad_timezone", "password_value", "unreadable", "value",
]


def cause_of(code: object) -> Cause | None:
    """A cause read back from its JSON form (its code; "" or anything else: none)."""
    return cast(Cause, code) if code in CAUSES else None


class ExitCode(IntEnum):
    """Process exit status, the same for every command."""

    OK = 0
    INTERNAL = 1
    UNREACHABLE = 2
    BUSY = 3
    USAGE = 4
    NOT_PROJECT = 5

    @classmethod
    def worst(cls, codes: Iterable[int]) -> ExitCode:
        """The most severe of several codes (OK for none): an internal error (the hub itself is
        broken), then a bad argument or config, an unreachable instance, busy or not the
        project's."""
        return max(map(cls, codes), key=_SEVERITY.__getitem__, default=cls.OK)


_SEVERITY = {ExitCode.OK: 0, ExitCode.BUSY: 1, ExitCode.NOT_PROJECT: 1, ExitCode.UNREACHABLE: 2,
             ExitCode.USAGE: 3, ExitCode.INTERNAL: 4}


class HubError(Exception):
    """Base of every error the hub reports to a person in one line.

    ``refusal`` names its class for an agent: the first words of an MCP tool error."""

    exit_code: ExitCode = ExitCode.INTERNAL
    refusal: str = "internal error"


class ConfigError(HubError):
    """The configuration is missing, malformed or invalid; ``problem`` says which way, as the
    code `doctor` chooses its fix by ("value": a key's value, the message names it)."""

    exit_code = ExitCode.USAGE
    refusal = "config error"

    def __init__(self, message: str, problem: ConfigProblem = "value") -> None:
        super().__init__(message)
        self.problem: ConfigProblem = problem


class UsageError(HubError):
    """A command-line argument is wrong or names something that does not exist."""

    exit_code = ExitCode.USAGE
    refusal = "bad argument"


class ProductionRefused(UsageError):
    """A write was aimed at a production (`danger`) instance without --allow-prod."""

    refusal = "production needs allow_prod"


class StateFileError(HubError):
    """A state file the hub owns is corrupt; it is reported, never silently reset."""

    exit_code = ExitCode.INTERNAL
    refusal = "state file damaged"


class UnreachableError(HubError):
    """An instance could not be used; ``reason`` is short, human and secret-free.

    ``cause`` is what went wrong as a code, the fact code acts on; ``reason`` its words.
    ``maybe_delivered`` is True when a write may have reached the server before it failed (a
    timeout or broken connection after the request went out, or a server error answering it).
    """

    exit_code = ExitCode.UNREACHABLE
    refusal = "instance unreachable"

    def __init__(
        self, instance: str, reason: str, *, cause: Cause = "other", maybe_delivered: bool = False
    ) -> None:
        super().__init__(f"{instance}: unreachable: {reason}")
        self.instance = instance
        self.reason = reason
        self.cause: Cause = cause
        self.maybe_delivered = maybe_delivered

    @classmethod
    def fleet_down(cls, reasons: str) -> UnreachableError:
        """No instance of the fleet answered; ``reasons`` names each one's."""
        return cls("fleet", f"no instance answered ({reasons})", cause="fleet_down")


class MissingPassword(UnreachableError):
    """The server answered 401 and the config gives this instance no password at all."""

    exit_code = ExitCode.USAGE
    refusal = "password missing"

    def __init__(self, instance: str, variable: str) -> None:
        super().__init__(instance, f"no password configured: set {variable}", cause="no_password")
        self.args = (f"no password configured for {instance}: set {variable}",)
        self.variable = variable


class BusyError(HubError):
    """The instance is at its concurrency limit or its dispatch lock is held."""

    exit_code = ExitCode.BUSY
    refusal = "limit reached"


class LockBusy(BusyError):
    """A lock (an instance's dispatch lock, a state file's) stayed held past its wait."""

    refusal = "lock busy"


class LockLostError(BusyError):
    """The dispatch lock stopped being this process's before the prompt was sent.

    Nothing was sent; the message names the instance and session and what was given back.
    """

    refusal = "lock lost"


class RunsAgain(BusyError):
    """A patrol re-send (a heal, a resume) found its session running again under the lock:
    someone (another daemon, a late prompt, a person) acted on it since it was judged, so a
    prompt now would queue a second run. Nothing was sent."""


class BudgetReached(BusyError):
    """Today's spend reached a daily budget: no new work is sent (a steer passes).

    ``instance`` names the instance whose own budget was reached, "" for the project's.
    """

    def __init__(self, message: str, instance: str = "") -> None:
        super().__init__(message)
        self.instance = instance


class NotProjectSession(HubError):
    """The target session, or the folder of a new one, does not belong to the project."""

    exit_code = ExitCode.NOT_PROJECT
    refusal = "not a project session"


class ApiError(HubError):
    """The server refused a request with a 4xx other than 401 (e.g. 400 bad request)."""

    def __init__(self, instance: str, status: int, message: str, name: str = "") -> None:
        super().__init__(f"{instance}: HTTP {status}: {message}")
        self.status = status
        self.name = name  # the server's own name for the error ("WorktreeNotGitError"), or ""


class SessionNotFound(UsageError):
    """A session id that the instance does not know."""


class RequestGone(UsageError):
    """A permission request or question that no longer waits (answered, or its run ended)."""

    refusal = "no longer waiting"


class RunStateUnknown(BusyError):
    """An instance's run state cannot be established: it is counted full (exit 3)."""

    refusal = "run state unknown"

    def __init__(self, instance: str, reason: str) -> None:
        super().__init__(f"{instance}: run state unknown ({reason}): counted full, no new work")
        self.instance = instance
        self.reason = reason


class _Row(Protocol):
    """What TaskChanged says of a pool row (``store.tasks.Task``; errors import no folder)."""

    @property
    def status(self) -> str: ...


class TaskChanged(HubError):
    """The task's row is no longer the one a dispatch planned from: nothing may be sent."""

    def __init__(self, task_id: str, now: _Row | None) -> None:
        what = "is gone" if now is None else f"changed meanwhile (now {now.status})"
        super().__init__(f"task {task_id} {what}; the change stands and nothing was sent")
        self.task_id = task_id
        self.now = now


class RoomFailed(HubError):
    """A server could not make a task's own worktree, or start it from the base branch;
    ``unsupported``: it makes none there (no git checkout, an API without worktrees)."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported
