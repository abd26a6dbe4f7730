"""One instance as one scan (or the live board) found it: its facts and its sessions.

Apart from ``fleet.scan`` so that a reader of the live board (``ops.live_board``) needs no
HTTP client: ``status`` from the board imports no httpx.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.records import InstanceSummary, SessionRecord, Snapshot, Tally
from xaf_hub.core.rules import ProjectRules
from xaf_hub.errors import Cause, UnreachableError


@dataclass
class InstanceScan:
    """Everything learnt about one instance in one scan."""

    inst: InstanceConfig
    reachable: bool = False
    reason: str = ""
    cause: Cause | None = None  # what ``reason`` says, as the code decisions read
    version: str = ""
    api: str = ""
    sessions: list[SessionRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    release: str = ""  # e.g. "1.14.41 (server-wide run state)": releases.Release.describe()
    # Why the run state could not be read ("" when it was): project sessions then count as
    # running and the instance as full.
    run_state_unknown: str = ""
    # Why pending permission requests and questions could not be read ("" when they were).
    waiting_unknown: str = ""
    # Set when ``sessions`` holds only some of the instance's sessions (the running ones, from
    # the live board's summary): the whole instance's counts and recent spend. None: all.
    tally: Tally | None = None
    # The project's worktrees the listing named: worktree folder -> the checkout it came from.
    sandboxes: dict[str, str] = field(default_factory=dict)

    def failure(self) -> UnreachableError:
        """Why this instance could not be used, as the error a command raises."""
        return self.inst.unreachable(self.reason, self.cause)

    def seen_by(self, inst: InstanceConfig) -> InstanceScan:
        """This scan of every project as the project chosen in ``inst`` sees it: ``inst`` its
        config, each session's verdict and owner as a scan of that project gives them."""
        verdicts: dict[str, tuple[bool, str]] = {}

        def one(rec: SessionRecord) -> SessionRecord:
            d = rec.directory
            if not d:  # running, no folder: counted as the project's (fail closed)
                return replace(rec, owner=inst.project if rec.project else "")
            if d not in verdicts:
                checkout = self.sandboxes.get(d, "")
                verdicts[d] = (inst.claims(d, checkout), inst.owner(d, checkout))
            project, owner = verdicts[d]
            same = (rec.project, rec.owner) == (project, owner)
            return rec if same else replace(rec, project=project, owner=owner)

        return replace(self, inst=inst, sessions=[one(r) for r in self.sessions],
                       warnings=list(self.warnings))

    def project_sandboxes(self) -> tuple[str, ...]:
        """The worktrees this scan found of the project's checkouts."""
        own = self.inst.rules
        return tuple(d for d, c in self.sandboxes.items() if own.is_project(c))

    def rules(self) -> ProjectRules:
        """The instance's directory rules with the project's worktrees this scan found inside."""
        return self.inst.rules.with_sandboxes(self.project_sandboxes())

    def summary(self) -> InstanceSummary:
        """Counts for tables and exports."""
        t = self.tally if self.tally is not None else Tally.of(self.sessions)
        inst = self.inst
        return InstanceSummary(
            inst.name,
            inst.url,
            limit=inst.concurrency_limit,
            danger=inst.production,
            note=inst.note,
            **{f: getattr(self, f) for f in _OWN},
            **{f: getattr(t, f) for f in _COUNTED},
        )


# A summary's fields that the scan itself or its counts hold under the same name.
_OWN = [f.name for f in fields(InstanceSummary) if f.name in InstanceScan.__dataclass_fields__]
_COUNTED = [f.name for f in fields(InstanceSummary) if f.name in Tally.__dataclass_fields__]


def snapshot_of(scans: Sequence[InstanceScan], generated_at: int | None = None) -> Snapshot:
    """One Snapshot of ``scans`` in their order (``generated_at``: default now, epoch ms)."""
    return Snapshot(
        generated_at=int(time.time() * 1000) if generated_at is None else generated_at,
        instances=tuple(s.summary() for s in scans),
        sessions=tuple(r for s in scans for r in s.sessions),
        warnings=tuple(w for s in scans for w in s.warnings),
    )
