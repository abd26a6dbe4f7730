"""The dispatch gate: a per-instance lock plus slot reservations (docs/architecture.md §5).

``Gate`` is the interface and the rules, ``FileGate`` the one-host files; ``Stores.gate`` picks
``store.redis.gate.RedisGate`` for ``lock.backend`` "redis" (only then is redis imported).
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from xaf_hub.config.load import LockConfig
from xaf_hub.store.statefile import file_lock, write_json_atomic

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_name(instance: str) -> str:
    """A file-name-safe spelling of an instance name."""
    return _SAFE.sub("_", instance)


def pid_alive(pid: int) -> bool:
    """True when a process with ``pid`` exists (portable: never signals it)."""
    # Windows' os.kill(pid, 0) would terminate the process, so ask psutil.
    import psutil  # deferred: start-up, docs/performance.md

    try:
        return bool(psutil.pid_exists(pid))
    except (OSError, ValueError):
        return True


def host_name() -> str:
    """This host's name in reservations: $XAF_HUB_HOSTNAME, else the system's."""
    return os.environ.get("XAF_HUB_HOSTNAME") or socket.gethostname()


@dataclass(frozen=True)
class Reservation:
    """One held slot: a file under slots/ (``path``) or a Redis key (``key``)."""

    path: Path | None
    instance: str
    pid: int
    host: str
    created: float
    session_id: str = ""
    key: str = ""
    prompt: str = ""  # "" | PROMPT_SENT | PROMPT_ACCEPTED (see the module docstring)
    project: str = ""  # the project whose run it holds a slot for (its share counts it)

    def to_json(self) -> dict[str, object]:
        """The slot file's content."""
        return {"schema_version": 1, **{k: getattr(self, k) for k in (*_REQUIRED, *_OPTIONAL)}}


PROMPT_SENT = "sent"
PROMPT_ACCEPTED = "accepted"


# A reservation's stored fields: those it needs, each with how it is read back, and the texts
# it may leave out.
_REQUIRED: dict[str, Callable[[Any], Any]] = {
    "instance": str, "pid": int, "host": str, "created": float
}
_OPTIONAL = ("session_id", "prompt", "project")


def parse_reservation(data: dict[str, Any], path: Path | None, key: str = "") -> Reservation:
    """A reservation from its JSON document (raises on a missing or mistyped field)."""
    fields: dict[str, Any] = {k: read(data[k]) for k, read in _REQUIRED.items()}
    fields.update((k, str(data.get(k) or "")) for k in _OPTIONAL)
    return Reservation(path, key=key, **fields)


class Gate(abc.ABC):
    """A per-instance dispatch lock plus slot reservations: the interface, and the rules every
    store shares (a reservation's liveness, what counts as pending). Where they are kept is
    the store's: ``FileGate`` (files on this host) or ``store.redis.gate.RedisGate`` (one
    Redis for every host); ``store.backends.Stores.gate`` picks one."""

    def __init__(
        self,
        cfg: LockConfig,
        *,
        host: str | None = None,
        clock: Callable[[], float] = time.time,
        alive: Callable[[int], bool] = pid_alive,
    ) -> None:
        self.cfg = cfg
        self.host = host or host_name()
        self.clock = clock
        self.alive = alive
        self.warnings: list[str] = []
        self._held: set[str] = set()

    @abc.abstractmethod
    def lock(self, instance: str) -> contextlib.AbstractContextManager[None]:
        """Hold the instance's dispatch lock, or raise BusyError after lock_timeout_seconds."""

    def owns_lock(self, instance: str) -> bool:
        """True while this process still holds ``instance``'s dispatch lock.

        A file lock lives as long as its open handle, so here it is owned for the whole
        ``with lock()``; the Redis gate asks the server (a lease can run out).
        """
        return instance in self._held

    def fenced_out(self, instance: str) -> bool:
        """True when a write for ``instance`` was refused because this process (an HA patrol
        daemon) no longer holds the patrol lease; files are never fenced."""
        return False

    @abc.abstractmethod
    def holds(self, res: Reservation) -> bool:
        """True when the reservation is still stored (nobody deleted it)."""

    @abc.abstractmethod
    def live_reservations(
        self,
        instance: str,
        running_ids: set[str] | None = None,
        observed_at: float | None = None,
    ) -> list[Reservation]:
        """Live reservations of ``instance``; dead ones are deleted on the way."""

    @abc.abstractmethod
    def _place(self, res: Reservation, token: str) -> Reservation:
        """``res`` with where the store keeps it (a file or a key named by ``token``)."""

    @abc.abstractmethod
    def _store(self, res: Reservation, *, guarded: bool = True) -> None:
        """Write ``res`` where it is kept (the Redis gate: only while its lock is ours, when
        ``guarded``)."""

    def reserve(
        self, instance: str, session_id: str = "", prompt: str = "", project: str = ""
    ) -> Reservation:
        """Write a new reservation for this process (for a run of ``project``)."""
        now = self.clock()
        res = Reservation(None, instance, os.getpid(), self.host, now, session_id)
        # The reservation's unique name: time, pid and randomness (no dots, no colons).
        token = f"{int(now * 1000)}-{os.getpid()}-{os.urandom(3).hex()}"
        res = self._place(replace(res, prompt=prompt, project=project), token)
        self._store(res)
        return res

    def attach(self, res: Reservation, session_id: str, prompt: str | None = None) -> Reservation:
        """Record the session (and how far its prompt got); restart the reservation's timer.

        An accepted prompt is written even when the lock was lost meanwhile: the run is real
        and must keep counting (this also puts back a reservation that Redis lost).
        """
        new = replace(
            res,
            created=self.clock(),
            session_id=session_id,
            prompt=res.prompt if prompt is None else prompt,
        )
        self._store(new, guarded=prompt != PROMPT_ACCEPTED)
        return new

    @abc.abstractmethod
    def release(self, res: Reservation) -> None:
        """Give the slot back at once (failure paths)."""

    def accepted(self, res: Reservation) -> Reservation:
        """The server answered the prompt: from now on the grace rule applies."""
        return self.attach(res, res.session_id, PROMPT_ACCEPTED)

    def is_live(
        self,
        res: Reservation,
        running_ids: set[str] | None,
        now: float | None = None,
        observed_at: float | None = None,
    ) -> bool:
        """Apply the liveness rules (module docstring).

        ``running_ids`` were read at ``observed_at`` (default: now), on the gate's clock.
        """
        now = self.clock() if now is None else now
        if now - res.created > self.cfg.slot_ttl_seconds:
            return False
        seen = now if observed_at is None else min(observed_at, now)
        if (
            res.session_id
            and res.prompt != PROMPT_SENT  # a prompt still on its way: wait for the run or TTL
            and running_ids is not None
            and res.session_id not in running_ids
            and seen - res.created > self.cfg.slot_grace_seconds
        ):
            return False
        if res.prompt:
            return True  # the prompt went out: the server's state decides, not the process
        return not (res.host == self.host and res.pid > 0 and not self.alive(res.pid))

    def pending(
        self, instance: str, running_ids: set[str], observed_at: float | None = None
    ) -> list[Reservation]:
        """Live reservations whose session the server does not yet report as running.

        These are the ones to add to the running count: a reservation whose session already
        shows as running is counted once, as that running session.
        """
        return [
            r
            for r in self.live_reservations(instance, running_ids, observed_at)
            if not r.session_id or r.session_id not in running_ids
        ]


class FileGate(Gate):
    """Locks and reservations under one folder (this host's processes)."""

    def __init__(
        self,
        root: Path,
        cfg: LockConfig,
        *,
        host: str | None = None,
        clock: Callable[[], float] = time.time,
        alive: Callable[[int], bool] = pid_alive,
    ) -> None:
        super().__init__(cfg, host=host, clock=clock, alive=alive)
        self.root = root
        self.slots = root / "slots"  # one file per reservation

    @contextlib.contextmanager
    def lock(self, instance: str) -> Iterator[None]:
        """Hold the instance's dispatch lock, or raise BusyError after lock_timeout_seconds."""
        path = self.root / "locks" / f"{safe_name(instance)}.lock"
        with file_lock(path, self.cfg.lock_timeout_seconds, what="dispatch lock"):
            self._held.add(instance)
            try:
                yield
            finally:
                self._held.discard(instance)

    def holds(self, res: Reservation) -> bool:
        """True when the reservation's file is still there."""
        return res.path is not None and res.path.exists()

    def _read(self, path: Path) -> Reservation | None:
        try:
            return parse_reservation(json.loads(path.read_text(encoding="utf-8")), path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            # A slot file cut short by a crash: count it until its mtime passes the TTL.
            try:
                mtime = path.stat().st_mtime
            except OSError:
                return None
            return Reservation(path, "?", -1, "?", mtime)

    def live_reservations(
        self,
        instance: str,
        running_ids: set[str] | None = None,
        observed_at: float | None = None,
    ) -> list[Reservation]:
        """Live reservations of ``instance``; dead ones are deleted on the way."""
        folder = self.slots
        if not folder.is_dir():
            return []
        live = []
        want = safe_name(instance)
        for path in sorted(folder.glob("*.slot")):
            # <instance>.<token>.slot; the token has no dot, an instance name may.
            if path.name.rsplit(".", 2)[0] != want:
                continue
            res = self._read(path)
            if res is None:
                continue
            if self.is_live(res, running_ids, observed_at=observed_at):
                live.append(res)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        return live

    def _place(self, res: Reservation, token: str) -> Reservation:
        return replace(res, path=self.slots / f"{safe_name(res.instance)}.{token}.slot")

    def _store(self, res: Reservation, *, guarded: bool = True) -> None:
        assert res.path is not None, "a file gate's reservation has a path"
        write_json_atomic(res.path, res.to_json())

    def release(self, res: Reservation) -> None:
        """Give the slot back at once (failure paths)."""
        if res.path is None:
            return
        with contextlib.suppress(FileNotFoundError):
            res.path.unlink()
