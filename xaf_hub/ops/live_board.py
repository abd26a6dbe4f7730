"""The live board: the fleet as a follower keeps it, for the hub's other processes.

The processes that follow the fleet's streams (the patrol daemon, ``serve``) publish their view
here, one file per kind of writer written in one step, and ``status`` reads it instead of
scanning. A reader takes an instance's view only while it is fresh and judged with its own
address, rules and credentials (``instance_key``); anything else is scanned, as is everything
with ``--fresh``. The send path still re-reads the server under the instance lock. The rules:
docs/architecture.md §5.1.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.config.watch import ConfigState
from xaf_hub.core.clock import MAX_TIME_MS
from xaf_hub.core.outcomes import RUNS
from xaf_hub.core.records import SessionRecord, Snapshot, SpendSlots, Tally, Waiting, source_of
from xaf_hub.errors import HubError, cause_of
from xaf_hub.fleet.instance_scan import InstanceScan, snapshot_of
from xaf_hub.fleet.wire import MAX_SESSION_COST_USD, cost_value
from xaf_hub.store.statefile import write_text_atomic

if TYPE_CHECKING:
    from xaf_hub.fleet.live_view import LiveInstance
    from xaf_hub.fleet.scan import TransportFactory
    from xaf_hub.store.backends import Stores

FORMAT = 1
WRITERS = ("patrol", "serve")
# The record fields a board row carries, in order (``waiting`` as its own small object).
_FIELDS = tuple(f.name for f in fields(SessionRecord))
_WAITING = _FIELDS.index("waiting")
_OUTCOME = _FIELDS.index("outcome")
_READS = frozenset((*RUNS, ""))
_TALLY_COUNTS = tuple(f.name for f in fields(Tally) if f.name != "spend")
_SCAN_FACTS = ("reachable", "reason", "version", "api", "release", "run_state_unknown",
               "waiting_unknown")


def board_path(cfg: Config, writer: str) -> Path:
    """Where one kind of writer keeps its board: the state folder (a daemon and ``serve``
    may follow different instances; a reader takes the fresher view of each)."""
    return cfg.state_dir / f"live-board-{writer}.json"


def summary_path(cfg: Config, writer: str) -> Path:
    """Where one kind of writer keeps its board's summary: each instance's counts, recent
    spend and running sessions without the idle ones (what `status` reads: a large fleet's
    summary reads far faster than its board)."""
    return cfg.state_dir / f"live-summary-{writer}.json"


def instance_key(inst: InstanceConfig) -> str:
    """What a view was judged with: the instance's address, directory rules and credentials
    (the user name, and whether a password is given, never the password), and with several
    projects the one it was seen as (or every one) and every project's rules. A reader with a
    different config (another address, other rules, no password where the writer had one,
    another project) does not take the view: it scans, and says what the scan finds."""
    said = f"{inst.url}\0{inst.rules!r}\0{inst.username}\0{inst.password is not None}"
    if len(inst.fleet) > 1:
        said += f"\0{inst.project}\0{inst.fleet!r}"
    return hashlib.sha256(said.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- writing


def document(
    cfg: Config, view: Sequence[LiveInstance], writer: str, now_ms: int | None = None,
    *, summary: bool = False, state: ConfigState | None = None,
) -> dict[str, Any]:
    """The board's JSON form (compact rows, so that a large fleet reads fast);
    ``summary``: its summary's, each instance's tally (``records.Tally``, with its spend by
    quarter hour) and only its running sessions' rows; ``state``: how the writer stands with
    its config (a reader says so: ``BoardRead.notes``)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    by_name = {i.name: i for i in cfg.instances}
    instances = []
    for live in view:
        inst = by_name.get(live.scan.inst.name)
        if inst is None:
            continue
        sc = live.scan
        item = {
            "name": inst.name,
            "key": instance_key(inst),
            "mode": live.mode,
            "confirmed_at_ms": live.confirmed_at_ms,
            **{name: getattr(sc, name) for name in _SCAN_FACTS},
            "cause": sc.cause or "",
            "warnings": list(sc.warnings),
        }
        rows = sc.sessions
        if summary:
            item["tally"] = _tally_json(sc.sessions, now)
            rows = [s for s in sc.sessions if s.running]
        item["sessions"] = [_row(s) for s in rows]
        instances.append(item)
    doc = {
        "format": FORMAT,
        "writer": writer,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "written_at_ms": now,
        "fields": list(_FIELDS),
        "instances": instances,
    }
    if state is not None and (state.problem or state.restart):
        doc["config"] = state.to_json()
    return doc


def publish(
    cfg: Config, view: Sequence[LiveInstance], writer: str, stores: Stores | None = None,
    state: ConfigState | None = None,
) -> None:
    """Write the board and its summary, each in one step (a reader sees the old one or the
    new one, never half); with ``stores`` in Redis, there too, for the other hosts
    (``Stores.publish_board``); ``state``: the writer's config state (``document``)."""
    now = int(time.time() * 1000)
    text, short = (
        json.dumps(document(cfg, view, writer, now, summary=summary, state=state),
                   ensure_ascii=False, separators=(",", ":"))
        for summary in (False, True)
    )
    write_text_atomic(board_path(cfg, writer), text)
    write_text_atomic(summary_path(cfg, writer), short)
    if stores is not None:
        stores.publish_board(writer, text, short)


def _tally_json(sessions: Sequence[SessionRecord], now_ms: int) -> dict[str, Any]:
    from xaf_hub.ops.budget import spend_slots  # deferred: start-up, docs/performance.md

    tally = Tally.of(sessions)
    spend = spend_slots(sessions, now_ms)
    return {**{name: getattr(tally, name) for name in _TALLY_COUNTS},
            "spend_since_ms": spend.since_ms, "spend": [list(x) for x in spend.slots]}


def _row(s: SessionRecord) -> list[Any]:
    row: list[Any] = [getattr(s, name) for name in _FIELDS]
    if s.waiting is not None:
        row[_WAITING] = s.waiting.to_json()  # its export form, as `sessions --json` has it
    return row


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class BoardRead:
    """What a reader takes from the board: the fresh instances, and why the others are not."""

    scans: dict[str, InstanceScan]
    ages: dict[str, float]  # seconds since each taken instance was confirmed current
    stale: dict[str, str]  # instance -> why its view is not taken (it is scanned)
    # What the writers that publish now say of their config (kept an older one, a restart).
    notes: tuple[str, ...] = ()

    @property
    def age(self) -> float:
        """The oldest confirmation among the instances taken (0 when none was)."""
        return max(self.ages.values(), default=0.0)


def read_board(
    cfg: Config, instances: Iterable[InstanceConfig], *, now_ms: int | None = None,
    stores: Stores | None = None, summary: bool = False,
) -> BoardRead:
    """The fresh views of ``instances`` on the board (``patrol.live_board_seconds`` old at
    most; 0 takes none): the state folder's files and, with
    ``stores`` in Redis, every host's boards there. ``summary``: the boards' summaries, each
    scan with only its running sessions and its ``tally`` (what `status` needs)."""
    wanted = list(instances)
    limit = cfg.patrol.live_board_seconds
    if limit <= 0 or not wanted:
        return BoardRead({}, {}, {i.name: "the live board is off" for i in wanted})
    views: dict[str, Mapping[str, Any]] = {}
    troubles: list[str] = []
    notes: list[str] = []
    now = int(time.time() * 1000) if now_ms is None else now_ms
    for where, text in _texts(cfg, stores, troubles, summary):
        try:
            doc = json.loads(text)
            found = _views(doc)
        # RecursionError: nested deeper than the parser goes (a corrupt or hostile file).
        except (KeyError, TypeError, ValueError, RecursionError) as exc:
            troubles.append(f"live board unreadable ({where}: {type(exc).__name__}: {exc})")
            continue
        notes += _notes(doc, now, limit)
        for name, view in found.items():
            if _confirmed(view) > _confirmed(views.get(name)):
                views[name] = view
            else:
                views.setdefault(name, view)
    if not views:
        why = troubles[0] if troubles else "no live board (no patrol daemon or serve runs)"
        return BoardRead({}, {}, {i.name: why for i in wanted}, tuple(notes))

    def build(inst: InstanceConfig, seen: Mapping[str, Any]) -> InstanceScan | str:
        try:
            scan = _scan(inst, seen)
            if summary and "tally" in seen:  # else a whole board: all its sessions
                scan.tally = _tally(seen["tally"], scan.sessions)
        except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
            return f"its view on the live board is unreadable ({exc})"
        if scan.tally is not None and not _reaches_today(cfg, scan.tally, now):
            return ("its summary's spend does not reach back to today's start "
                    "(or today starts off the quarter hours)")
        return scan

    return replace(_pick(wanted, views, now, limit, build), notes=tuple(dict.fromkeys(notes)))


def _pick(
    wanted: Iterable[InstanceConfig], views: Mapping[str, Mapping[str, Any]], now_ms: int,
    limit: float, build: Callable[[InstanceConfig, Mapping[str, Any]], InstanceScan | str],
) -> BoardRead:
    """Each instance's view taken while fresh and judged with its own config, built into its
    scan (``build``: the scan, or why it is not taken); the others stale, with why."""
    scans: dict[str, InstanceScan] = {}
    ages: dict[str, float] = {}
    stale: dict[str, str] = {}
    for inst in wanted:
        seen = views.get(inst.name)
        got = _why_stale(inst, seen, now_ms, limit) or build(inst, seen or {})
        if isinstance(got, str):
            stale[inst.name] = got
        else:
            scans[inst.name] = got
            ages[inst.name] = max(0.0, (now_ms - _confirmed(seen)) / 1000)
    return BoardRead(scans, ages, stale)


_WRITERS = {"patrol": "the patrol daemon", "serve": "serve"}


def _notes(doc: Any, now_ms: int, limit: float) -> list[str]:
    """What a board's writer says of its config, while it publishes ([] for an old board)."""
    state = ConfigState.from_json(doc.get("config"))
    written = doc.get("written_at_ms")
    if state is None or type(written) is not int or abs(now_ms - written) > limit * 1000:
        return []
    who = f"{_WRITERS.get(str(doc.get('writer')), 'a hub')} (pid {doc.get('pid')}"
    who += f" on {doc['host']})" if isinstance(doc.get("host"), str) else ")"
    return state.words(who)


def _texts(
    cfg: Config, stores: Stores | None, troubles: list[str], summary: bool = False
) -> Iterable[tuple[str, str]]:
    """Every board's text and where it is (``summary``: the summaries): the files, then
    (stores in Redis) Redis's."""
    for writer in WRITERS:
        # A writer without a summary (an older hub still running): its whole board. So too
        # one whose board is newer than the summary beside it (``publish`` writes the board
        # first: that summary is not the board's, an older hub runs where a newer one ran).
        paths = [board_path(cfg, writer)]
        if summary and not _older(summary_path(cfg, writer), paths[0]):
            paths.insert(0, summary_path(cfg, writer))
        for path in paths:
            try:
                yield str(path), path.read_text(encoding="utf-8")
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:  # ValueError: not UTF-8
                troubles.append(f"live board unreadable ({path}: {type(exc).__name__}: {exc})")
            break
    if stores is None:
        return
    try:
        texts = stores.live_boards(summary)
    except HubError as exc:  # Redis unreachable: this host's files still count
        troubles.append(f"live boards in Redis unreadable ({exc})")
        return
    for text in texts:
        yield "Redis", text


def _older(path: Path, than: Path) -> bool:
    """True when ``path`` was last written before ``than`` (False when either is missing)."""
    try:
        return path.stat().st_mtime_ns < than.stat().st_mtime_ns
    except OSError:
        return False


def take(
    cfg: Config, instances: Iterable[InstanceConfig], view: Sequence[LiveInstance], *,
    now_ms: int | None = None,
) -> BoardRead:
    """The fresh instances of a follower's own live view, by the board's rules (``serve``
    reads its follower in memory instead of its board file: the same view, no JSON between).
    Each scan taken is a copy: its reader may change it (``fill_outcomes``)."""
    wanted = list(instances)
    limit = cfg.patrol.live_board_seconds
    if limit <= 0:
        return BoardRead({}, {}, {i.name: "the live board is off" for i in wanted})
    by_name = {live.scan.inst.name: live for live in view}
    now = int(time.time() * 1000) if now_ms is None else now_ms
    seen = {name: {"key": instance_key(live.scan.inst), "mode": live.mode,
                   "confirmed_at_ms": live.confirmed_at_ms} for name, live in by_name.items()}

    def build(inst: InstanceConfig, _: Mapping[str, Any]) -> InstanceScan:
        sc = by_name[inst.name].scan
        return replace(sc, sessions=list(sc.sessions), warnings=list(sc.warnings))

    return _pick(wanted, seen, now, limit, build)


def merged(
    instances: Sequence[InstanceConfig], board: BoardRead, scanned: Sequence[InstanceScan],
    generated_at: int | None = None,
) -> tuple[Snapshot, list[InstanceScan]]:
    """One snapshot of ``instances`` in their order: each from the board when it was taken
    there, else from ``scanned`` (the instances the board did not give)."""
    by_name = {**board.scans, **{sc.inst.name: sc for sc in scanned}}
    scans = [by_name[i.name] for i in instances]
    live = {name: age for name, age in board.ages.items() if name in by_name}
    return replace(snapshot_of(scans, generated_at), live=live), scans


def split(
    cfg: Config, instances: Sequence[InstanceConfig], *, fresh: bool = False,
    stores: Stores | None = None, summary: bool = False,
) -> tuple[BoardRead, list[InstanceConfig]]:
    """What the board gives of ``instances``, and the instances left to scan (``fresh``: the
    board is not read, every instance is left to scan; ``stores``: Redis's boards too;
    ``summary``: the summaries, ``read_board``). A view is taken as the project its writer
    saw (``instance_key``): one project's, or with several and none chosen, every one's."""
    board = read_board(cfg, [] if fresh else instances, stores=stores, summary=summary)
    return board, [i for i in instances if i.name not in board.scans]


async def board_or_scan(
    cfg: Config, instances: Sequence[InstanceConfig], *, fresh: bool = False,
    transport_factory: TransportFactory | None = None, project_only: bool = False,
    stores: Stores | None = None,
) -> tuple[Snapshot, list[InstanceScan], BoardRead]:
    """The fleet as the board has it where fresh, the rest scanned now (``fresh``: all)."""
    from xaf_hub.core import aio  # deferred: `status` reads the board with no event loop
    from xaf_hub.fleet.scan import scan_fleet  # deferred: start-up, docs/performance.md

    board, rest = await aio.blocking(split, cfg, instances, fresh=fresh, stores=stores)
    scanned: list[InstanceScan] = []
    generated = None
    if rest:
        snap, scanned = await scan_fleet(
            cfg, rest, transport_factory=transport_factory, project_only=project_only
        )
        generated = snap.generated_at
    snap, scans = merged(instances, board, scanned, generated)
    return snap, scans, board


def _views(doc: Any) -> dict[str, Mapping[str, Any]]:
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        raise ValueError("not a live board of this version")
    if list(doc["fields"]) != list(_FIELDS):
        raise ValueError("written by another version of xaf-hub")
    views = {}
    for item in doc["instances"]:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise ValueError("an instance without a name")
        views[item["name"]] = item
    return views


def _confirmed(view: Mapping[str, Any] | None) -> int:
    """When a view was confirmed current, epoch ms; 0 (not current) for anything no clock
    gives (JSON integers have any size: past a float's range the age would raise)."""
    value = view.get("confirmed_at_ms") if view is not None else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_TIME_MS:
        return value
    return 0


def _why_stale(
    inst: InstanceConfig, view: Mapping[str, Any] | None, now_ms: int, limit: float
) -> str:
    if view is None:
        return "not on the live board"
    if view.get("key") != instance_key(inst):
        return "on the live board with another address, other directory rules or credentials"
    confirmed = _confirmed(view)
    if confirmed <= 0:
        if view.get("mode") == "directory":
            return "followed per directory: the live board does not keep it"
        return "its stream is not followed right now"
    age = (now_ms - confirmed) / 1000
    if age > limit:
        return f"its view is {age:.0f} s old (over {limit:g} s)"
    if age < -limit:  # written in the future: another host's clock, or a forged file
        return "its view claims a time ahead of this host's clock"
    return ""


def _scan(inst: InstanceConfig, view: Mapping[str, Any]) -> InstanceScan:
    facts = {name: view[name] for name in _SCAN_FACTS}
    for name, value in facts.items():
        wanted = bool if name == "reachable" else str
        if not isinstance(value, wanted):
            raise ValueError(f"{name} is not a {wanted.__name__}")
    sessions = [_record(row) for row in view["sessions"]]
    for s in sessions:
        if s.instance != inst.name:
            raise ValueError(f"a session of {s.instance!r} under {inst.name!r}")
    warnings = [str(w) for w in view.get("warnings", [])]
    cause = cause_of(view.get("cause"))
    return InstanceScan(inst, sessions=sessions, warnings=warnings, cause=cause, **facts)


def _tally(doc: Any, rows: Sequence[SessionRecord]) -> Tally:
    """A summary's tally, checked against its rows (the instance's running sessions): counts
    or a spend no scan could give (a NaN would print "$nan" and never reach a budget) make the
    summary corrupt, and its instance is scanned."""
    if not isinstance(doc, Mapping):
        raise ValueError("a tally that is not an object")
    counts = [doc[name] for name in _TALLY_COUNTS]
    if any(type(n) is not int or n < 0 for n in counts):
        raise ValueError("a tally count that is not a whole number")
    since = doc["spend_since_ms"]
    if type(since) is not int:
        raise ValueError("a spend start that is not a time")
    slots = []
    in_slots = 0
    for slot in doc["spend"]:
        at, usd, unknown, count = slot
        if (type(at) is not int or isinstance(usd, bool) or not isinstance(usd, (int, float))
                or type(unknown) is not int or type(count) is not int):
            raise ValueError("a spend slot of the wrong shape")
        if not (0 <= usd <= count * MAX_SESSION_COST_USD and 0 <= unknown <= count):
            raise ValueError("a spend slot no scan could give")
        in_slots += count
        slots.append((at, float(usd), unknown, count))
    total, project, running_total, running, waiting = counts
    tally = Tally(total, project, running_total, running, waiting,
                  SpendSlots(since, tuple(slots)))
    if (not all(s.running for s in rows)
            or replace(Tally.of(rows), total_sessions=total, project_sessions=project)
            != replace(tally, spend=None)
            or not running <= project <= total - (running_total - running)
            or in_slots > project):
        raise ValueError("a tally its running sessions contradict")
    return tally


def _reaches_today(cfg: Config, tally: Tally, now_ms: int) -> bool:

    from xaf_hub.ops.budget import slots_today, zone  # deferred: start-up, docs/performance.md

    now = datetime.fromtimestamp(now_ms / 1000, UTC)
    return slots_today(tally, now, zone(cfg)) is not None


# The fields a row must have the right type in, and those types: what a reader counts with.
_TYPES: tuple[type | tuple[type, ...], ...] = (
    str, str, str, str, int, int, (int, float, type(None)), bool, str, str, int, str, str, str,
    bool, str, str,
)
_CHECKED = tuple(enumerate(_TYPES))
_COST = _FIELDS.index("cost")
_TIMES = tuple(_FIELDS.index(name) for name in ("created", "updated", "retry_next"))


def _record(row: Any) -> SessionRecord:
    if type(row) is not list or len(row) != len(_FIELDS):
        raise ValueError("a session row of the wrong length")
    for i, kind in _CHECKED:
        if not isinstance(row[i], kind):
            raise ValueError(f"a session row's {_FIELDS[i]} of the wrong type")
    for i in _TIMES:  # epoch ms as a scan gives them (``records.sane_ms``), 0 unknown
        if not 0 <= row[i] <= MAX_TIME_MS:
            raise ValueError(f"a session row's {_FIELDS[i]} no clock could give")
    cost = row[_COST]
    if cost is not None and cost_value(cost) is None:  # a scan reads that as unknown
        raise ValueError("a session row's cost no scan could give")
    if row[_OUTCOME] not in _READS:  # a word an older hub wrote: read again when shown
        row[_OUTCOME] = ""
    rec = SessionRecord(*row[:_WAITING])  # positional, the fields in their order: the fastest build
    waiting = row[_WAITING]
    if waiting is None:
        return rec
    if not isinstance(waiting, Mapping):
        raise ValueError("a waiting request that is not an object")
    return _with_waiting(rec, waiting)


def _with_waiting(rec: SessionRecord, w: Mapping[str, Any]) -> SessionRecord:
    since = w["since"]
    if type(since) is not int or not 0 <= since <= MAX_TIME_MS:  # as ``Waiting.to_json``
        raise ValueError("a waiting request's start that is not a time")  # wrote it
    pending = Waiting(
        kind=w["kind"], request_id=str(w["request_id"]), asked=str(w["asked"]),
        since=since, permission=str(w["permission"]),
        patterns=tuple(str(p) for p in w["patterns"]),
        always=tuple(str(p) for p in w["always"]),
        choices=tuple(tuple(str(o) for o in c) for c in w["options"]),
        whole=w.get("whole") is True,
    )
    if pending.kind not in ("permission", "question"):
        raise ValueError(f"a waiting request of kind {pending.kind!r}")
    return replace(rec, waiting=pending)


__all__ = [
    "BoardRead", "board_or_scan", "board_path", "document", "instance_key", "merged", "publish",
    "read_board", "source_of", "split", "summary_path", "take",
]
