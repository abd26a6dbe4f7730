"""The fleet's changes as the hub's own records (``FleetEvent``), and the pure bookkeeping
that finds them.

``Board`` turns one instance's event frames or a full rescan into changes, each reported once (a
change is a difference of state); ``parse_frame`` reads one ``data:`` line of either stream
(docs/live.md).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.records import SessionRecord
from xaf_hub.core.runstate import error_text, waiting_detail
from xaf_hub.fleet.wire import (
    ServerSession,
    message_of,
    read_status,
    server_json,
    session_from_classic,
    session_record,
    waiting_from_permission,
    waiting_from_question,
)

EventKind = Literal[
    "ready",
    "new",
    "started",
    "retry",
    "asked",  # the run stopped on a permission request or a question: it waits for a person
    "answered",  # that request was answered (by anyone) or withdrawn
    "stopped",
    "error",
    "spent",  # a step of the session finished and reported its cost (boards with ``steps``)
    "gone",
    "down",
    "up",
    "polling",
]

# How a frame that asks a person is read, and the word for how one was answered.
_ASKED = {"permission.asked": waiting_from_permission, "question.asked": waiting_from_question}
_ANSWERED = {
    "permission.replied": "replied",
    "question.replied": "answered",
    "question.rejected": "rejected",
}
# Server event types that can change what the hub shows; everything else is skipped unparsed.
WANTED_TYPES = frozenset(
    {
        "server.connected",
        "server.heartbeat",
        "server.instance.disposed",
        "session.created",
        "session.updated",
        "session.deleted",
        "session.status",
        "session.idle",
        "session.error",
        *_ASKED,
        *_ANSWERED,
        "project.updated",
        "message.updated",
    }
)
# Cheap skip before parsing: message deltas are most of the traffic of a busy fleet.
_MAYBE_WANTED = re.compile(
    r'"(?:session\.|server\.|permission\.|question\.|project\.updated"|message\.updated")'
)


# Sessions and directories outside the project a board remembers before it starts over.
MAX_REMEMBERED = 10_000
# What a board keeps of each text a frame tells of a session outside the project (its title,
# folder, model, parent): real ones are far shorter; a frame's megabyte of title kept whole for
# each of MAX_REMEMBERED sessions would cost gigabytes.
MAX_FOREIGN_TEXT = 1000


def now_ms() -> int:
    """The time now, epoch ms (every event's ``at_ms``)."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class FleetEvent:
    """One change in the fleet, as every live view reads it."""

    kind: EventKind
    instance: str
    session: SessionRecord | None = None
    outcome: str = ""  # stopped: the last run's outcome (a core.outcomes.Run), when read
    detail: str = ""  # retry message, error text, down reason, stream mode
    answer: str = ""  # answered: the reply the request got ("replied once"), when the stream said
    source: str = "stream"  # stream | rescan | poll
    at_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        """The ``watch --json`` / server-sent form."""
        doc = {"event" if k == "kind" else k: v for k, v in self.__dict__.items()}
        return {**doc, "session": self.session.to_json() if self.session is not None else None}


def following_words(ev: FleetEvent) -> str | None:
    """How an instance is followed, when an event changes that (logs and ``watch -v``)."""
    said = _FOLLOWING.get(ev.kind)
    return f"{ev.instance}: {said.format(ev.detail)}" if said is not None else None


_FOLLOWING = {
    "ready": "following its {} event stream",
    "up": "back, following its {} event stream",
    "down": "lost ({})",
    "polling": "{}; polling it",
}


@dataclass(frozen=True)
class Frame:
    """One parsed server event: its type, its properties and the directory it came from."""

    type: str
    properties: Mapping[str, Any]
    directory: str = ""


def parse_frame(line: str, stream_directory: str = "") -> Frame | None:
    """One SSE ``data:`` line -> Frame; None for anything else or an unwanted type (pure)."""
    if not line.startswith("data:"):
        return None
    raw = line[5:].strip()
    if not _MAYBE_WANTED.search(raw):
        return None
    try:
        obj = server_json(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    directory = stream_directory
    payload: Any = obj
    if isinstance(obj.get("payload"), dict):
        payload = obj["payload"]
        if isinstance(obj.get("directory"), str):
            directory = obj["directory"]
    kind = payload.get("type")
    if not isinstance(kind, str) or kind not in WANTED_TYPES:
        return None
    props = payload.get("properties")
    return Frame(kind, props if isinstance(props, dict) else {}, directory)


def diff(
    before: Mapping[str, SessionRecord], after: Mapping[str, SessionRecord]
) -> list[tuple[EventKind, SessionRecord]]:
    """Changes between two views of the same sessions: new, started, stopped, retry, gone."""
    events: list[tuple[EventKind, SessionRecord]] = []
    for key, s in after.items():
        old = before.get(key)
        if old is None:
            events.append(("new", s))
            if s.running:
                events.append(("started", s))
        elif s.running and not old.running:
            events.append(("started", s))
        elif old.running and not s.running:
            events.append(("stopped", s))
        elif s.run_state != old.run_state and s.run_state == "retry":
            events.append(("retry", s))
        if (was := _request(old)) != _request(s):
            if was:
                events.append(("answered", replace(s, waiting=before[key].waiting)))
            if _request(s):
                events.append(("asked", s))
    for key, s in before.items():
        if key not in after:
            events.append(("gone", s))
    return events


def _request(s: SessionRecord | None) -> str:
    """The request a session's run waits on ("" none, or no session)."""
    return s.waiting.request_id if s is not None and s.running and s.waiting is not None else ""


def asked_detail(rec: SessionRecord) -> str:
    """What an ``asked`` or ``answered`` event's session waits (waited) on, in one line."""

    return waiting_detail(rec.waiting) if rec.waiting is not None else ""


def _detail(kind: EventKind, rec: SessionRecord) -> str:
    if kind == "retry":
        return rec.retry_message
    if kind in ("asked", "answered"):
        return asked_detail(rec)
    return ""


class Board:
    """One instance's project sessions as last seen, and the changes each frame makes.

    ``missing`` lists sessions the last frame named that the board does not know: the caller looks
    them up and calls ``learn``, and only the server's answer decides whether one is the project's.
    Sessions outside the project report no changes, but ``foreign`` keeps their runs for the
    instance's running total; what is remembered of them is bounded (``MAX_REMEMBERED``).
    """

    def __init__(self, inst: InstanceConfig, steps: bool = False) -> None:
        self.inst = inst
        self.steps = steps  # report ``spent``: each step a project session finished
        self.sessions: dict[str, SessionRecord] = {}
        self._verdicts: dict[str, bool] = {}
        # Sessions seen outside the project: their frames are ignored without a lookup.
        self.outside: set[str] = set()
        self.foreign: dict[str, SessionRecord] = {}  # sessions outside the project, by id
        self._foreign_added = 0  # new ones learnt from frames since the last rescan
        self.missing: list[tuple[str, str]] = []  # (session id, directory hint)
        # Worktree folder -> the checkout it was made from (rescans, ``project.updated``).
        self.sandboxes: dict[str, str] = {}

    def is_project(self, directory: str) -> bool:
        """The project verdict of a directory (asked once per directory, kept for directories of
        up to ``MAX_FOREIGN_TEXT`` characters: a stream of endless long names keeps nothing)."""
        if len(directory) > MAX_FOREIGN_TEXT:
            return self.inst.claims(directory, self.sandboxes.get(directory, ""))
        if directory not in self._verdicts:
            if len(self._verdicts) >= MAX_REMEMBERED:
                self._verdicts.clear()  # a stream naming endless directories: ask again
            self._verdicts[directory] = bool(directory) and self.inst.claims(
                directory, self.sandboxes.get(directory, "")
            )
        return self._verdicts[directory]

    def placed(self, s: ServerSession) -> ServerSession:
        """``s`` with the checkout its worktree was made from, as this board knows it: a session
        read by id does not say it, and a task's room is a project's only through its checkout."""
        if s.checkout or not s.directory:
            return s
        return replace(s, checkout=self.sandboxes.get(s.directory, ""))

    def learn_sandboxes(self, sandboxes: Mapping[str, str]) -> None:
        """Know these worktrees (folder -> the checkout each was made from) from now on."""
        for folder, checkout in sandboxes.items():
            if len(folder) > MAX_FOREIGN_TEXT or self.sandboxes.get(folder) == checkout:
                continue
            if len(self.sandboxes) >= MAX_REMEMBERED:
                self.sandboxes.clear()  # endless made-up worktrees: the next rescan tells
            self.sandboxes[folder] = checkout
            self._verdicts.pop(folder, None)

    def _event(
        self, kind: EventKind, rec: SessionRecord, source: str, detail: str = ""
    ) -> FleetEvent:
        return FleetEvent(kind, self.inst.name, rec, detail=detail, source=source, at_ms=now_ms())

    def reconcile(
        self,
        records: Iterable[SessionRecord],
        source: str,
        sandboxes: Mapping[str, str] | None = None,
    ) -> list[FleetEvent]:
        """Replace the view with a full scan's; the differences are the changes."""
        records = list(records)
        self.learn_sandboxes(sandboxes or {})
        after = {r.id: r for r in records if r.project}
        changes = diff(self.sessions, after)
        self.sessions = after
        self.outside = set()
        self.foreign = {r.id: r for r in records if not r.project}
        self._foreign_added = 0
        return [self._event(kind, rec, source, _detail(kind, rec)) for kind, rec in changes]

    def ignore(self, session_id: str) -> None:
        """Leave this session's frames alone from now on (outside the project, or unknown)."""
        if len(self.outside) >= MAX_REMEMBERED:
            self.outside.clear()  # endless made-up ids: forget, a lookup each tells again
        self.outside.add(session_id)

    def _remember_foreign(self, rec: SessionRecord) -> None:
        """Leave the frames of a session outside the project alone from now on (``ignore``), and
        keep the session when the last rescan did not list it."""
        self.ignore(rec.id)
        if rec.id not in self.foreign and self._foreign_added < MAX_REMEMBERED:
            self._foreign_added += 1  # endless made-up sessions: the next rescan tells
            cut = MAX_FOREIGN_TEXT
            self.foreign[rec.id] = replace(
                rec, project=False, title=rec.title[:cut], directory=rec.directory[:cut],
                model=rec.model[:cut], parent_id=rec.parent_id[:cut],
            )

    def learn(self, rec: SessionRecord) -> list[FleetEvent]:
        """Add a session looked up after a frame named it (``missing``)."""
        if not self.is_project(rec.directory):
            self._remember_foreign(rec)
            return []
        if rec.id in self.sessions:
            return []
        self.sessions[rec.id] = rec
        return [self._event("new", rec, "stream")]

    def apply(self, frame: Frame) -> list[FleetEvent]:
        """The changes one frame makes (state is updated in place)."""
        self.missing = []
        props = frame.properties
        kind = frame.type
        if kind in ("session.created", "session.updated"):
            return self._info(props.get("info"))
        if kind == "project.updated":
            self._project(props)
            return []
        if kind == "message.updated" and not (self.steps and _step_cost(props.get("info"))):
            return []
        sid = props.get("sessionID")
        if not isinstance(sid, str) or not sid:
            return []
        if kind == "session.deleted":
            self.foreign.pop(sid, None)
            rec = self.sessions.pop(sid, None)
            return [self._event("gone", rec, "stream")] if rec is not None else []
        if sid in self.foreign:  # outside the project: only its run is kept
            if (said := _run_said(kind, props)) is not None:
                self.foreign[sid] = _with_run(self.foreign[sid], said)
            return []
        if sid in self.outside:
            return []
        rec = self.sessions.get(sid)
        if rec is None:
            if frame.directory and not self.is_project(frame.directory):
                self.ignore(sid)
            else:
                self.missing.append((sid, frame.directory))
            return []
        if kind == "session.error":
            err = props.get("error")
            words = error_text(err if isinstance(err, Mapping) else None) or "error"
            return [self._event("error", rec, "stream", words)]
        if kind == "message.updated":
            return [self._event("spent", rec, "stream")]
        if kind in _ASKED:
            return self._asked(rec, kind, props)
        if kind in _ANSWERED:
            return self._answered(rec, props, _ANSWERED[kind])
        said = _run_said(kind, props)
        return self._status(rec, said) if said is not None else []

    def _project(self, props: Mapping[str, Any]) -> None:
        """A project's worktrees: their sessions are the project's when its checkout is."""
        checkout, folders = props.get("worktree"), props.get("sandboxes")
        if not isinstance(checkout, str) or not isinstance(folders, list):
            return
        if props.get("id") in (None, "", "global"):  # folders without a repository of their own
            return
        if self.inst.claims(checkout):  # any configured project's, when none is chosen
            self.learn_sandboxes({f: checkout for f in folders if isinstance(f, str) and f})

    def _asked(self, rec: SessionRecord, kind: str, props: Mapping[str, Any]) -> list[FleetEvent]:
        pending = _ASKED[kind](props, now_ms())
        if pending is None or (rec.waiting is not None and rec.running):
            return []  # unreadable, or the run already waits on an older request
        new = replace(rec, waiting=pending.waiting, running=True,
                      run_state="busy" if rec.run_state == "idle" else rec.run_state)
        self.sessions[rec.id] = new
        return [self._event("asked", new, "stream", asked_detail(new))]

    def _answered(
        self, rec: SessionRecord, props: Mapping[str, Any], word: str
    ) -> list[FleetEvent]:
        if rec.waiting is None or props.get("requestID") != rec.waiting.request_id:
            return []
        reply = props.get("reply")
        said = f"{word} {reply}" if isinstance(reply, str) and reply else word
        self.sessions[rec.id] = replace(rec, waiting=None)
        event = self._event("answered", rec, "stream", f"{asked_detail(rec)} -> {said}")
        return [replace(event, answer=said)]

    def _info(self, info: Any) -> list[FleetEvent]:
        if not isinstance(info, Mapping) or not isinstance(info.get("id"), str):
            return []
        try:
            s = session_from_classic(info)
        except (KeyError, TypeError, ValueError, AttributeError):
            return []
        old = self.sessions.get(s.id)
        if old is not None:
            self.sessions[s.id] = _refreshed(old, s)
            return []
        if s.id in self.foreign:
            self.foreign[s.id] = _refreshed(self.foreign[s.id], s, MAX_FOREIGN_TEXT)
            return []
        if not self.is_project(s.directory):  # even when ignored already: an earlier frame
            # may have named it before its info came
            self._remember_foreign(session_record(self.inst.name, s, False))
            return []
        if s.id in self.outside:
            return []
        # New and said to be ours: the caller asks the server (``learn``), never the frame.
        self.missing.append((s.id, s.directory))
        return []

    def _status(self, rec: SessionRecord, status: Mapping[str, Any]) -> list[FleetEvent]:
        new = _with_run(rec, status)
        word, message = new.run_state, new.retry_message
        self.sessions[rec.id] = new
        if word != "idle" and not rec.running:
            out = [self._event("started", new, "stream")]
            if word == "retry":
                out.append(self._event("retry", new, "stream", message))
            return out
        if word == "idle" and rec.running:
            return [self._event("stopped", new, "stream")]
        if word == "retry" and (rec.run_state != "retry" or rec.retry_message != message):
            return [self._event("retry", new, "stream", message)]
        return []


def _step_cost(info: Any) -> bool:
    """Whether a message.updated frame's message is a finished step that cost money."""
    m = message_of(info)
    return m.role == "assistant" and bool(m.cost) and m.completed > 0


def _refreshed(old: SessionRecord, s: ServerSession, cut: int | None = None) -> SessionRecord:
    """``old`` with what a session.updated frame's info tells (its texts cut at ``cut``)."""
    return replace(
        old, title=s.title[:cut], updated=max(old.updated, s.updated), cost=s.cost,
        model=(s.model or old.model)[:cut],
    )


def _run_said(kind: str, props: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The status entry a frame tells ({} for idle), read as a scan reads one
    (``wire.read_status``: a state this hub does not know is busy, never idle); None when it
    tells none."""
    if kind == "session.idle":
        return {}
    status = props.get("status") if kind == "session.status" else None
    if isinstance(status, Mapping) and isinstance(status.get("type"), str) and status["type"]:
        return status
    return None


def _with_run(rec: SessionRecord, status: Mapping[str, Any]) -> SessionRecord:
    """``rec`` in the run state a frame told."""
    word, message, nxt = read_status(status)
    new = replace(
        rec, run_state=word, running=word != "idle", retry_message=message, retry_next=nxt,
        updated=max(rec.updated, now_ms()),
    )
    return replace(new, waiting=None) if word == "idle" else new  # an ended run waits on nothing
