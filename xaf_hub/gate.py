"""The dispatch gate: a per-instance lock plus slot reservations (SPEC §6a).

``locks/<instance>.lock`` serialises "read running state -> count -> decide -> create ->
prompt" across processes. ``slots/<instance>.<token>.slot`` holds a slot from the decision
until the server reports the run, so a session that is not yet visible as busy still counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from xaf_hub.config import LockConfig
from xaf_hub.statefile import file_lock, write_json_atomic

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_name(instance: str) -> str:
    """A file-name-safe spelling of an instance name."""
    return _SAFE.sub("_", instance)


def pid_alive(pid: int) -> bool:
    """True when a process with ``pid`` exists (portable: never signals it)."""
    import psutil  # Windows' os.kill(pid, 0) would terminate the process, so ask psutil.

    try:
        return bool(psutil.pid_exists(pid))
    except (OSError, ValueError):
        return True


@dataclass(frozen=True)
class Reservation:
    """One held slot."""

    path: Path
    instance: str
    pid: int
    host: str
    created: float
    session_id: str = ""

    def to_json(self) -> dict[str, object]:
        """The slot file's content."""
        return {
            "schema_version": 1,
            "instance": self.instance,
            "pid": self.pid,
            "host": self.host,
            "created": self.created,
            "session_id": self.session_id,
        }


class Gate:
    """Locks and reservations under one folder."""

    def __init__(
        self,
        root: Path,
        cfg: LockConfig,
        *,
        host: str | None = None,
        clock: Callable[[], float] = time.time,
        alive: Callable[[int], bool] = pid_alive,
    ) -> None:
        self.root = root
        self.cfg = cfg
        self.host = host or os.environ.get("XAF_HUB_HOSTNAME") or socket.gethostname()
        self.clock = clock
        self.alive = alive
        self.warnings: list[str] = []

    @contextlib.contextmanager
    def lock(self, instance: str) -> Iterator[None]:
        """Hold the instance's dispatch lock, or raise BusyError after lock_timeout_seconds."""
        path = self.root / "locks" / f"{safe_name(instance)}.lock"
        with file_lock(path, self.cfg.lock_timeout_seconds, what="dispatch lock"):
            yield

    def _slot_dir(self) -> Path:
        return self.root / "slots"

    def _read(self, path: Path) -> Reservation | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return Reservation(
                path=path,
                instance=str(data["instance"]),
                pid=int(data["pid"]),
                host=str(data["host"]),
                created=float(data["created"]),
                session_id=str(data.get("session_id") or ""),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            # A slot file cut short by a crash: count it until its mtime passes the TTL.
            try:
                mtime = path.stat().st_mtime
            except OSError:
                return None
            return Reservation(path, "?", -1, "?", mtime)

    def is_live(self, res: Reservation, running_ids: set[str] | None) -> bool:
        """Apply the liveness rules: TTL, session no longer running after grace, process gone."""
        age = self.clock() - res.created
        if age > self.cfg.slot_ttl_seconds:
            return False
        if (
            res.session_id
            and running_ids is not None
            and res.session_id not in running_ids
            and age > self.cfg.slot_grace_seconds
        ):
            return False
        return not (res.host == self.host and res.pid > 0 and not self.alive(res.pid))

    def live_reservations(
        self, instance: str, running_ids: set[str] | None = None
    ) -> list[Reservation]:
        """Live reservations of ``instance``; dead ones are deleted on the way."""
        folder = self._slot_dir()
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
            if self.is_live(res, running_ids):
                live.append(res)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        return live

    def pending(self, instance: str, running_ids: set[str]) -> list[Reservation]:
        """Live reservations whose session the server does not yet report as running.

        These are the ones to add to the running count: a reservation whose session already
        shows as running is counted once, as that running session.
        """
        return [
            r
            for r in self.live_reservations(instance, running_ids)
            if not r.session_id or r.session_id not in running_ids
        ]

    def reserve(self, instance: str) -> Reservation:
        """Write a new reservation for this process."""
        token = f"{int(self.clock() * 1000)}-{os.getpid()}-{secrets.token_hex(3)}"
        res = Reservation(
            path=self._slot_dir() / f"{safe_name(instance)}.{token}.slot",
            instance=instance,
            pid=os.getpid(),
            host=self.host,
            created=self.clock(),
        )
        write_json_atomic(res.path, res.to_json())
        return res

    def attach(self, res: Reservation, session_id: str) -> Reservation:
        """Record the created session and restart the reservation's timer."""
        new = Reservation(res.path, res.instance, res.pid, res.host, self.clock(), session_id)
        write_json_atomic(new.path, new.to_json())
        return new

    def release(self, res: Reservation) -> None:
        """Give the slot back at once (failure paths)."""
        with contextlib.suppress(FileNotFoundError):
            res.path.unlink()
