"""Scan the fleet in parallel and build one Snapshot (architecture §2, §3).

One instance's failure is recorded as its unreachable reason; it never stops the others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace

import httpx

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.records import SessionRecord, Snapshot, Waiting
from xaf_hub.errors import ApiError, HubError, RunStateUnknown, UnreachableError
from xaf_hub.fleet.client import OpencodeClient, RawStatus, ServerSession
from xaf_hub.fleet.dialects import Seen
from xaf_hub.fleet.instance_scan import InstanceScan as InstanceScan
from xaf_hub.fleet.instance_scan import snapshot_of
from xaf_hub.fleet.wire import Pending, session_record, tool_call
from xaf_hub.fleet.wire import read_status as read_status

TransportFactory = Callable[[InstanceConfig], httpx.AsyncBaseTransport | None]

# Per-instance parallel /session/status calls; the server answers each one quickly.
_STATUS_FAN_OUT = 16


def make_client(
    cfg: Config, inst: InstanceConfig, transport_factory: TransportFactory | None = None
) -> OpencodeClient:
    """A client for ``inst`` with the configured timeouts, retries and page size (its transport
    from ``transport_factory``, the tests' seam; default the network)."""
    transport = transport_factory(inst) if transport_factory else None
    return OpencodeClient(
        inst,
        connect_timeout=cfg.connect_timeout,
        read_timeout=cfg.read_timeout,
        retries=cfg.retries,
        page_size=cfg.page_size,
        transport=transport,
        deadline=cfg.scan_timeout,
    )


def build_record(
    inst: InstanceConfig,
    s: ServerSession,
    status: RawStatus | None,
    project: bool,
    owner: str | None = None,
) -> SessionRecord:
    """Combine a server session, its run state and the project verdict (``owner``: the
    configured project it belongs to; default the chosen one's, or seen as every project the
    one whose folders hold it, when it is the project's)."""
    if owner is None:
        owner = (inst.project or inst.owner(s.directory, s.checkout)) if project else ""
    return session_record(inst.name, s, project, *read_status(status), owner)


async def read_run_state(
    client: OpencodeClient, directories: list[str], seen: Seen | None = None
) -> tuple[dict[str, RawStatus], str]:
    """Running sessions, or (empty, why) when the listing answered but the run state cannot be
    established: an unknown release, or a refused /session/status (the caller fails closed).
    ``seen`` is told each directory's part as it is read."""
    try:
        return await client.running(directories, fan_out=_STATUS_FAN_OUT, seen=seen), ""
    except RunStateUnknown as exc:
        return {}, exc.reason
    except ApiError as exc:
        return {}, "/session/status " + str(exc).removeprefix(f"{client.name}: ")


async def scan_instance(
    client: OpencodeClient, inst: InstanceConfig, *, project_only: bool = False
) -> InstanceScan:
    """List every session of one instance and mark running and project ones.

    ``project_only`` asks the run state of project directories only: enough for dispatch and
    the gate (other sessions never count), cheaper on instances with many other folders; the
    running total then covers project directories only.
    """
    result = InstanceScan(inst)
    asks = _Asks(client)
    try:
        # The deadline bounds the whole scan: the read timeout only bounds each chunk, so a
        # server dribbling bytes or paging forever would otherwise hold us without end.
        async with asyncio.timeout(client.deadline):
            await _scan_into(result, client, inst, project_only, asks)
        result.reachable = True
    except TimeoutError:
        result.reason = f"scan not finished within {client.deadline:g}s (timed out; gave up)"
        result.cause = "timeout"
    except UnreachableError as exc:
        result.reason, result.cause = exc.reason, exc.cause
    except HubError as exc:
        result.reason, result.cause = str(exc).removeprefix(f"{inst.name}: "), "other"
    except Exception as exc:  # noqa: BLE001 - one instance's odd answer never stops the others
        result.reason = f"unreadable answer from the server ({type(exc).__name__})"
        result.cause = "other"
    finally:
        # Folders asked but not wanted in the end (or a scan that failed): none outlives it.
        await aio.cancel_and_wait(*asks.asked.values())
    result.warnings.extend(client.notes)
    if not result.reachable:
        result.sessions = []
    return result


async def _scan_into(
    result: InstanceScan, client: OpencodeClient, inst: InstanceConfig, project_only: bool,
    asks: _Asks,
) -> None:
    await client.detect()
    result.api = client.dialect or ""
    result.version = client.version
    sessions = await client.list_sessions()
    # A worktree's sessions name the checkout it was made from: theirs is its verdict.
    result.sandboxes = {s.directory: s.checkout for s in sessions if s.checkout and s.directory}
    # Sessions share a few hundred directories at most: classify each directory once.
    project_dir = {
        d: inst.claims(d, result.sandboxes.get(d, "")) for d in {s.directory for s in sessions} if d
    }
    owners = {d: _owner(inst, d, ok, result.sandboxes) for d, ok in project_dir.items()}
    result.release = client.release.describe()
    directories = sorted(d for d, ok in project_dir.items() if ok or owners[d] or not project_only)
    rooms = sorted(d for d in result.sandboxes if project_dir.get(d))
    asks.directory_of = {s.id: s.directory for s in sessions if s.directory}
    (statuses, result.run_state_unknown), branches = await asyncio.gather(
        read_run_state(client, directories, asks.seen if client.dialect == "classic" else None),
        _branches(client, rooms),
    )
    if result.run_state_unknown:
        result.warnings.append(
            f"{inst.name}: run state unknown ({result.run_state_unknown}); its project "
            "sessions count as running and it takes no new work"
        )
        # No run is known to wait either: `waiting` names the instance as unread, not empty.
        result.waiting_unknown = f"run state unknown ({result.run_state_unknown})"
    known = {s.id for s in sessions}
    for sid in statuses:
        if sid in known:
            continue
        # Running but missing from the list (created after the listing): look it up;
        # when even that fails, count it as a project session (fail closed).
        try:
            sessions.append(await client.get_session(sid))
        except HubError:
            result.warnings.append(
                f"{inst.name}: running session {sid} has no readable directory; "
                "counted as a project session"
            )
            sessions.append(ServerSession(sid, "(unknown)", "", 0, 0, 0.0, "", ""))
    for s in sessions:
        d = s.directory
        if d not in project_dir:  # a late arrival looked up above
            project_dir[d] = inst.claims(d, result.sandboxes.get(d, ""))
            owners[d] = _owner(inst, d, project_dir[d], result.sandboxes)
        project = project_dir[d] if d else s.id in statuses
        owner = owners[d] if d else (inst.project if project else "")
        status = statuses.get(s.id)
        if result.run_state_unknown and (project or owner):
            status = {"type": "busy"}
        rec = build_record(inst, s, status, project, owner)
        if d in branches:
            rec = replace(rec, branch=branches[d])
        result.sessions.append(rec)
    if statuses and not result.run_state_unknown and client.dialect == "classic":
        await _read_waiting(result, client, asks)


def _owner(inst: InstanceConfig, directory: str, project: bool, sandboxes: dict[str, str]) -> str:
    """The configured project a directory's sessions belong to ("" none)."""
    if len(inst.fleet) < 2:  # one project: the verdict already says
        return inst.project if project else ""
    return inst.owner(directory, sandboxes.get(directory, ""))


async def _branches(client: OpencodeClient, rooms: Sequence[str]) -> dict[str, str]:
    """The branch of each project worktree (one it cannot tell is left out, never fatal)."""
    async def one(d: str) -> tuple[str, str]:
        try:
            return d, await client.branch(d)
        except HubError:
            return d, ""

    return {d: b for d, b in await aio.bounded(_STATUS_FAN_OUT, one, rooms) if b}


class _Asks:
    """The requests waiting for a person in each folder with a running session, asked as soon
    as the folder's run state shows one (beside the rest of the run state, not after it all)."""

    def __init__(self, client: OpencodeClient) -> None:
        self.client = client
        self.directory_of: dict[str, str] = {}  # each listed session's folder
        self.asked: dict[str, asyncio.Future[list[Pending]]] = {}
        self._sem = asyncio.Semaphore(_STATUS_FAN_OUT)

    def seen(self, part: dict[str, RawStatus]) -> None:
        """A part of the run state is read: ask the folders of the runs it shows."""
        for sid, status in part.items():
            d = self.directory_of.get(sid)
            if d and read_status(status)[0] != "idle":
                self.of(d)

    def of(self, directory: str) -> asyncio.Future[list[Pending]]:
        """The folder's requests, asked now unless they already are."""
        if directory not in self.asked:
            self.asked[directory] = asyncio.ensure_future(self._ask(directory))
        return self.asked[directory]

    async def _ask(self, directory: str) -> list[Pending]:
        async with self._sem:
            return await self.client.pending_requests(directory)


async def _read_waiting(result: InstanceScan, client: OpencodeClient, asks: _Asks) -> None:
    """Mark the running sessions whose run waits on a permission request or a question.

    Only directories with a running session are asked (a waiting run is busy on the server):
    two small requests each, sent as soon as the directory's run state shows the run
    (``_Asks``), so they rarely add to the scan's time. A request the server lists for a
    session not running here is left alone (it ended meanwhile). Unreadable:
    ``waiting_unknown`` and a warning; the sessions stay "running" (they still count against
    the limit either way).
    """
    running = {s.id: s for s in result.sessions if s.running}
    directories = sorted({s.directory for s in running.values() if s.directory})
    try:
        listed = await aio.gather(*(asks.of(d) for d in directories))
        found = [p for ps in listed for p in ps]
    except HubError as exc:
        result.waiting_unknown = str(exc).removeprefix(f"{client.name}: ")
        result.warnings.append(
            f"{client.name}: pending permission requests and questions unreadable "
            f"({result.waiting_unknown}); a run waiting for a person shows as running"
        )
        return
    asked: dict[str, list[Pending]] = {}
    for p in found:  # each running session's requests, oldest first
        if p.session_id in running:
            asked.setdefault(p.session_id, []).append(p)

    async def waits_on(sid: str) -> tuple[str, Waiting | None]:
        """The request the session's run waits on: its oldest whose tool call still runs in
        the newest messages. opencode keeps listing a request after its run ended (an abort):
        a later run of the session does not wait on it. Without a call id or the messages,
        the oldest request stands."""
        rec, shown = running[sid], None
        if any(p.call_id for p in asked[sid]):
            with contextlib.suppress(HubError):
                shown = await client.messages(sid, 3, rec.directory)
        for p in asked[sid]:
            if not p.call_id or shown is None:  # cannot tell: it stands, its start unknown
                return sid, replace(p.waiting, since=0)
            state, started = tool_call(shown, p.call_id)
            if state in ("pending", "running"):
                return sid, replace(p.waiting, since=started)
        return sid, None

    marked = {sid: w for sid, w in await aio.bounded(_STATUS_FAN_OUT, waits_on, list(asked)) if w}
    result.sessions = [
        replace(s, waiting=marked[s.id]) if s.id in marked else s for s in result.sessions
    ]


async def scan_fleet(
    cfg: Config,
    instances: Sequence[InstanceConfig] | None = None,
    *,
    transport_factory: TransportFactory | None = None,
    project_only: bool = False,
    on_done: Callable[[str], None] | None = None,
) -> tuple[Snapshot, list[InstanceScan]]:
    """Scan ``instances`` (default: all) concurrently, at most ``scan_workers`` at once;
    ``on_done(name)`` is called as each instance's scan ends (for the progress line)."""
    chosen = list(cfg.instances if instances is None else instances)
    async def one(inst: InstanceConfig) -> InstanceScan:
        async with make_client(cfg, inst, transport_factory) as client:
            result = await scan_instance(client, inst, project_only=project_only)
        if on_done is not None:
            on_done(inst.name)
        return result

    scans = await aio.bounded(cfg.scan_workers, one, chosen)
    return snapshot_of(scans), scans


async def _outcomes_of_instance(
    cfg: Config, sc: InstanceScan, transport_factory: TransportFactory | None
) -> None:
    from xaf_hub.core.runstate import outcome_of  # deferred: start-up, docs/performance.md

    async with make_client(cfg, sc.inst, transport_factory) as client:

        async def one(s: SessionRecord) -> SessionRecord:
            if not s.project:
                return s
            if s.running:
                return replace(s, outcome="running")
            if s.outcome:  # known already (serve remembers it until the session changes)
                return s
            try:
                msgs = await client.messages(s.id, limit=2, directory=s.directory)
                return replace(s, outcome=outcome_of(msgs))
            except Exception:  # noqa: BLE001 - a failed or malformed answer: not read
                return s

        try:
            async with asyncio.timeout(client.deadline):
                sc.sessions = await aio.bounded(_STATUS_FAN_OUT, one, sc.sessions)
        except TimeoutError:
            sc.warnings.append(
                f"{sc.inst.name}: last results not all read within {client.deadline:g}s; "
                "shown as not checked"
            )


async def fill_outcomes(
    cfg: Config, scans: Sequence[InstanceScan], transport_factory: TransportFactory | None = None
) -> Snapshot:
    """Fetch each project session's last outcome (one small request per idle session that
    does not carry one yet)."""
    await aio.gather(
        *(_outcomes_of_instance(cfg, sc, transport_factory) for sc in scans if sc.reachable)
    )
    return snapshot_of(scans)
