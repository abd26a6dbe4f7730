"""The patrol's state files in ``<state_dir>/patrol/``: pause flag, daemon heartbeat, latest report,
the one-daemon lock (``daemon_lock``) and the memory of last runs read (``RunMemory``;
docs/architecture.md §8 and §9).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from xaf_hub.config.load import Config
from xaf_hub.core.outcomes import RUNS
from xaf_hub.core.runstate import LastRun
from xaf_hub.errors import BusyError, StateFileError
from xaf_hub.store.gate import pid_alive
from xaf_hub.store.statefile import file_lock, read_json, write_json_atomic

PAUSE_FILE = "paused.json"
HEARTBEAT_FILE = "daemon.json"
DAEMON_LOCK = "daemon.lock"  # held (OS lock) by the one daemon of this state folder
DAEMON_PID = "daemon.pid"  # who holds it: written under the lock, for the refusal's message
LATEST = "report-latest"  # <LATEST>.json / .md: the newest round's report
RUNS_FILE = "last-runs.json"
RUNS_SCHEMA = 1
_RUNS_WHAT = "patrol last-runs memory"
_RUN_STATES = ("busy", "retry", "idle")
_NO_RUNS = {"schema_version": RUNS_SCHEMA, "instances": {}}  # the memory before any round


def patrol_dir(cfg: Config) -> Path:
    """Where the patrol keeps its reports, pause flag, heartbeat and locks."""
    return cfg.state_dir / "patrol"


def pause_info(folder: Path) -> dict[str, Any] | None:
    """The pause flag's content when paused, else None (a damaged flag still means paused)."""
    try:
        data = read_json(folder / PAUSE_FILE, what="patrol pause flag")
    except FileNotFoundError:
        return None
    except StateFileError as exc:
        return {"paused_at": "", "by": "", "note": str(exc)}
    return data if isinstance(data, dict) else {"paused_at": "", "by": ""}


def paused_message(info: dict[str, Any]) -> str:
    """The line a paused patrol prints instead of running."""
    since = f" since {info['paused_at']}" if info.get("paused_at") else ""
    by = f" by {info['by']}" if info.get("by") else ""
    return f"patrol is paused{since}{by}; no cycle run (xaf-hub patrol resume)"


def set_paused(folder: Path, who: str, now: datetime) -> bool:
    """Write the pause flag; False when it was already paused."""
    if pause_info(folder) is not None:
        return False
    write_json_atomic(
        folder / PAUSE_FILE,
        {"schema_version": 1, "paused_at": now.isoformat(timespec="seconds"), "by": who},
    )
    return True


def clear_paused(folder: Path) -> bool:
    """Remove the pause flag; False when it was not paused."""
    try:
        (folder / PAUSE_FILE).unlink()
    except FileNotFoundError:
        return False
    return True


def _document(path: Path, what: str) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when there is none (StateFileError when damaged)."""
    doc = read_json(path, what=what, missing=lambda: None)
    return doc if isinstance(doc, dict) else None


def heartbeat(folder: Path) -> dict[str, Any] | None:
    """The daemon heartbeat, or None when no daemon ever ran."""
    with contextlib.suppress(StateFileError):
        return _document(folder / HEARTBEAT_FILE, "patrol heartbeat")
    return None


def daemon_alive(beat: dict[str, Any] | None) -> bool:
    """True when the heartbeat's daemon is a live process on this host that has not stopped."""

    return bool(
        beat
        and not beat.get("stopped_at")
        and beat.get("host") == socket.gethostname()
        and isinstance(beat.get("pid"), int)
        and pid_alive(beat["pid"])
    )


@contextlib.contextmanager
def daemon_lock(folder: Path, now: datetime) -> Iterator[None]:
    """Be the one patrol daemon of ``folder`` while the block runs, else BusyError naming
    the running one's pid.

    The lock is the OS's (portalocker), taken without waiting and released by the OS when the
    process ends, even by SIGKILL: a stale ``daemon.pid`` never blocks, it is only read for
    the message. The pid sits in its own file because a Windows lock forbids reading the
    locked file itself.
    """
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(file_lock(folder / DAEMON_LOCK, 0, what="patrol daemon lock"))
        except BusyError:
            raise BusyError(_running_daemon(folder)) from None
        pid_file = folder / DAEMON_PID
        me = dict(schema_version=1, pid=os.getpid(), host=socket.gethostname())
        write_json_atomic(pid_file, {**me, "started_at": now.isoformat(timespec="seconds")})
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                pid_file.unlink()


def _running_daemon(folder: Path) -> str:
    """The refusal of a second daemon, naming the first one from ``daemon.pid``."""
    doc = None
    with contextlib.suppress(StateFileError):
        doc = _document(folder / DAEMON_PID, "patrol daemon pid file")
    pid = doc.get("pid") if doc is not None else None
    if isinstance(pid, int) and doc is not None:
        host, since = doc.get("host"), doc.get("started_at")
        elsewhere = isinstance(host, str) and host and host != socket.gethostname()
        who = f"pid {pid}" + (f" on {host}" if elsewhere else "")
        who += f", started {since}" if since else ""
        stop = f"stop it first (kill {pid})"
    else:  # it has the lock but has not written its pid yet (or it was removed)
        who, stop = "its pid not yet written", "stop it first"
    return (
        f"another patrol daemon is running for this state folder ({who}; lock "
        f"{folder / DAEMON_LOCK}): {stop}; `xaf-hub patrol --once` may run beside it"
    )


def latest_report(folder: Path) -> dict[str, Any] | None:
    """The newest report document, or None when no cycle has run yet."""
    return _document(folder / f"{LATEST}.json", "patrol report")


# ---------------------------------------------------------------------------------------------
# What the rounds last read of each session's last run


@dataclass(frozen=True)
class SeenRun:
    """One session's last run as a round read it, and the scan's view of the session then."""

    updated: int  # the session's ``time.updated`` (ms) in the scan the read belonged to
    run_state: str  # busy | retry | idle, from the status endpoint in that scan
    run: LastRun


class RunMemory:
    """``last-runs.json``: per (instance, session), what the last read of its last run saw.

    A round uses an entry only while the scan shows the session with the same ``updated``
    and run state (``recall``); anything else is read again. Only the result of the read is
    kept, never a decision, so every decision that waits on time is taken again each round
    from it (``patrol.context.TIME_DECISIONS``). Written atomically with a schema version;
    the rounds that write it hold ``patrol/cycle.lock``. A damaged file is a
    ``StateFileError`` naming it and the entry, and is never overwritten.
    """

    def __init__(self, path: Path, entries: dict[tuple[str, str], SeenRun]) -> None:
        self.path = path
        self.where = str(path)  # what messages name: the file, or the Redis key
        self._entries = entries
        # Since the last save: entries written or changed, entries dropped (the Redis store
        # writes entry by entry; the file is written whole, when either holds one).
        self._dirty: set[tuple[str, str]] = set()
        self._gone: set[tuple[str, str]] = set()

    @classmethod
    def load(cls, folder: Path) -> RunMemory:
        """The memory in ``folder`` (empty when there is none); StateFileError when damaged."""
        path = folder / RUNS_FILE
        doc = read_json(path, what=_RUNS_WHAT, missing=lambda: {**_NO_RUNS})
        return cls(path, _parse_runs(path, doc))

    def __len__(self) -> int:
        return len(self._entries)

    def recall(self, instance: str, session: str, updated: int, run_state: str) -> LastRun | None:
        """The remembered last run, if the session has not moved since it was read."""
        seen = self._entries.get((instance, session))
        if seen is None or seen.updated != updated or seen.run_state != run_state:
            return None
        return seen.run

    def remember(
        self, instance: str, session: str, updated: int, run_state: str, run: LastRun
    ) -> None:
        """Keep what a read just saw, with the scan's ``updated`` and run state."""
        seen = SeenRun(updated, run_state, run)
        key = (instance, session)
        if self._entries.get(key) != seen:
            self._entries[key] = seen
            self._dirty.add(key)
            self._gone.discard(key)

    def _drop(self, key: tuple[str, str]) -> None:
        if self._entries.pop(key, None) is not None:
            self._dirty.discard(key)
            self._gone.add(key)

    def forget(self, keys: Iterable[tuple[str, str]]) -> None:
        """Drop sessions (e.g. prompted this round: their next read must not be skipped)."""
        for key in keys:
            self._drop(key)

    def keep_only(self, keys: Iterable[tuple[str, str]], instances: Iterable[str] = ()) -> None:
        """Drop every session not in ``keys`` (gone, or out of the rounds' window), except
        those of ``instances`` (unreachable this round: nothing was asked about them)."""
        wanted, kept = set(keys), set(instances)
        for key in [k for k in self._entries if k not in wanted and k[0] not in kept]:
            self._drop(key)

    def save(self) -> None:
        """Write the memory when it changed (atomically; a failed write keeps the changes)."""
        if not (self._dirty or self._gone):
            return
        self._write()
        self._dirty.clear()
        self._gone.clear()

    def _write(self) -> None:
        by_instance: dict[str, dict[str, Any]] = {}
        for (instance, session), seen in sorted(self._entries.items()):
            by_instance.setdefault(instance, {})[session] = seen_json(seen)
        write_json_atomic(self.path, {"schema_version": RUNS_SCHEMA, "instances": by_instance})


def seen_json(seen: SeenRun) -> dict[str, Any]:
    """One entry as the memory stores it (the file, a Redis hash field)."""
    run = seen.run  # its answer is never kept
    return {"updated": seen.updated, "run_state": seen.run_state, "run": {
        "outcome": run.outcome, "message_id": run.message_id, "model": run.model,
        "error": dict(run.error) if run.error is not None else None, "created_ms": run.created_ms,
    }}


def _parse_runs(path: Path, doc: Any) -> dict[tuple[str, str], SeenRun]:
    def bad(where: str, problem: str) -> StateFileError:
        return StateFileError(f"{_RUNS_WHAT} {path}: {where}: {problem}")

    if not isinstance(doc, dict):
        raise bad("top level", "not an object")
    version = doc.get("schema_version")
    if version != RUNS_SCHEMA:
        raise bad(
            "schema_version", f"{version!r} is not {RUNS_SCHEMA} (written by another version?)"
        )
    instances = doc.get("instances")
    if not isinstance(instances, dict):
        raise bad("instances", "not an object")
    entries: dict[tuple[str, str], SeenRun] = {}
    for instance, sessions in instances.items():
        if not isinstance(sessions, dict):
            raise bad(f"instances.{instance}", "not an object")
        for session, raw in sessions.items():
            seen = parse_seen(raw)
            if isinstance(seen, str):
                raise bad(f"instances.{instance}.{session}", seen)
            entries[(instance, session)] = seen
    return entries


def parse_seen(raw: Any) -> SeenRun | str:
    """One entry, or what is wrong with it."""
    if not isinstance(raw, Mapping):
        return "not an object"
    updated, run_state, run = raw.get("updated"), raw.get("run_state"), raw.get("run")
    if not isinstance(updated, int) or isinstance(updated, bool):
        return "updated is not an integer"
    if run_state not in _RUN_STATES:
        return f"run_state {run_state!r} is not one of {', '.join(_RUN_STATES)}"
    if not isinstance(run, Mapping):
        return "run is not an object"
    texts = [run.get(k) for k in ("outcome", "message_id", "model")]
    if not all(isinstance(t, str) for t in texts) or not texts[0]:
        return "run.outcome, run.message_id or run.model is not text"
    error, created = run.get("error"), run.get("created_ms")
    if error is not None and not isinstance(error, Mapping):
        return "run.error is neither null nor an object"
    if not isinstance(created, int) or isinstance(created, bool):
        return "run.created_ms is not an integer"
    outcome = _OLD_OUTCOMES.get(str(texts[0]), str(texts[0]).partition(":")[0])
    if outcome not in _OUTCOMES:
        return f"run.outcome {texts[0]!r} is not an outcome"
    return SeenRun(
        updated,
        str(run_state),
        LastRun(cast(Any, outcome), str(texts[1]), str(texts[2]), error, created),
    )


_OUTCOMES = frozenset((*RUNS, "pending"))
# Read as written by a hub before outcomes were values ("failed:<name>" is read as "failed").
_OLD_OUTCOMES = {"aborted": "interrupted", "none": "not_started", "unknown": "not_started"}
