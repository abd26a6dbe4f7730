"""Reading what a server sent, defensively: field readers, session records, error text.

A hostile or broken server may send any JSON: every reader here returns a usable value
("" or 0 for unknown) instead of raising, except that a session without a usable id is a
KeyError (the caller skips that entry and says so).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xaf_hub.core.records import Message, Part, RunState, SessionRecord, Waiting, sane_ms
from xaf_hub.core.rules import normalize_dir

# What a hostile or broken server may cost us, at most: one answer's size (decompressed), the
# pages and the sessions of one listing. Real instances stay far below (docs/performance.md).
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_PAGES = 1000
MAX_SESSIONS = 100_000
# One session costing more than this is a broken or hostile report, not spend: unknown.
MAX_SESSION_COST_USD = 100_000.0


@dataclass(frozen=True)
class ServerSession:
    """A session as the server described it, before project rules and run state."""

    id: str
    title: str
    directory: str
    created: int
    updated: int
    cost: float | None  # None: the server reported no usable cost (unknown, never 0)
    parent_id: str
    model: str
    # The project's main checkout when the session works in one of its worktrees (opencode's
    # sandboxes), else "": such a session is the project's when its checkout is.
    checkout: str = ""


def session_record(
    instance: str,
    s: ServerSession,
    project: bool,
    state: RunState = "idle",
    message: str = "",
    nxt: int = 0,
    owner: str = "",
) -> SessionRecord:
    """A server session as the hub records it, with its project verdict, run state and the
    configured project it belongs to (``owner``)."""
    return SessionRecord(
        instance=instance,
        id=s.id,
        title=s.title,
        directory=s.directory,
        created=s.created,
        updated=s.updated,
        cost=s.cost,
        running=state != "idle",
        run_state=state,
        retry_message=message,
        retry_next=nxt,
        parent_id=s.parent_id,
        model=s.model,
        project=project,
        owner=owner,
    )


def read_status(status: Mapping[str, Any] | None) -> tuple[RunState, str, int]:
    """One session's ``/session/status`` entry read (a scan's, or a ``session.status`` frame's):
    (run state, retry message, retry next ms). No entry is idle; a kind this hub does not know
    is busy, never idle."""
    if not status:
        return "idle", "", 0
    kind = status.get("type")
    if kind == "retry":
        raw = status.get("message")
        # next: "soon", 1e400, 10**22 are unknown (0)
        return "retry", raw if isinstance(raw, str) else "", sane_ms(status.get("next"))
    return ("idle" if kind == "idle" else "busy"), "", 0


# A tuple, not ``int | float``: that expression builds a new union object on every call, and
# these readers run a few times per session of every listing.
_NUMBER = (int, float)


def _is_mapping(value: Any) -> bool:
    # JSON objects are dicts: the exact-type test spares the ABC's slower isinstance check.
    return type(value) is dict or isinstance(value, Mapping)


def text_field(value: Any) -> str:
    """A string field; numbers as text, anything else (object, list, null) as ''."""
    if isinstance(value, str):
        return value
    if isinstance(value, _NUMBER) and not isinstance(value, bool):
        return str(value)
    return ""


def as_mapping(value: Any) -> Mapping[str, Any]:
    """An object field, or an empty one when the server sent anything else."""
    return value if _is_mapping(value) else {}


def cost_value(value: Any) -> float | None:
    """A session's cost in USD, or None (unknown) when it is missing or absurd.

    Absurd: not a number (text, a boolean), NaN, infinite, negative, or above
    ``MAX_SESSION_COST_USD``. Releases before 1.18 put cost on messages only, so their sessions
    have none (docs/architecture.md, "Daily budgets").
    """
    if isinstance(value, _NUMBER) and not isinstance(value, bool):
        number = float(value)  # NaN and infinities fail the range test
        return number if 0 <= number <= MAX_SESSION_COST_USD else None
    return None


def usable_id(obj: Any) -> str:
    """A session's id, or '' when the entry is not an object with a usable id."""
    ident = obj.get("id") if _is_mapping(obj) else None
    return ident if isinstance(ident, str) and 0 < len(ident) <= 200 else ""


def _model_name(model: Any) -> str:
    if _is_mapping(model):
        provider = text_field(model.get("providerID"))
        ident = text_field(model.get("id")) or text_field(model.get("modelID"))
        if provider and ident:
            return f"{provider}/{ident}"
    return ""


def _part(obj: Any) -> Part:
    p = as_mapping(obj)
    path = text_field(as_mapping(p.get("source")).get("path")) or text_field(p.get("filename"))
    return Part(
        text_field(p.get("type")), text_field(p.get("text")), p.get("synthetic") is True,
        text_field(p.get("tool")), text_field(p.get("callID")), as_mapping(p.get("state")), path,
    )


def message_of(obj: Any) -> Message:
    """A message as listed (``{"info", "parts"}``) or its bare ``info`` object, as a record;
    any field of the wrong type reads as unknown."""
    msg = as_mapping(obj)
    info = as_mapping(msg.get("info")) or msg
    times, tokens = as_mapping(info.get("time")), as_mapping(info.get("tokens"))
    err = info.get("error")
    counts = sum(sane_ms(tokens.get(k)) for k in ("input", "output", "reasoning"))
    model = {"providerID": info.get("providerID"), "id": info.get("modelID")}
    parts = msg.get("parts")
    return Message(
        text_field(info.get("role")), text_field(info.get("id")), text_field(info.get("sessionID")),
        sane_ms(times.get("created")), sane_ms(times.get("completed")),
        _model_name(model) or _model_name(info.get("model")), cost_value(info.get("cost")),
        sane_ms(tokens.get("total")) or counts, text_field(info.get("finish")),
        err if _is_mapping(err) else None,
        tuple(_part(p) for p in parts) if isinstance(parts, list) else (),
    )


def messages_of(data: list[Any]) -> list[Message]:
    """A message listing as records; entries that are not objects are left out."""
    return [message_of(m) for m in data if _is_mapping(m)]


def session_from_classic(obj: Mapping[str, Any]) -> ServerSession:
    """Normalise a classic Session / GlobalSession object (KeyError without a usable id).

    Every other field of the wrong type or range reads as unknown: '' or 0.
    """
    ident = usable_id(obj)
    if not ident:
        raise KeyError("id")
    t = as_mapping(obj.get("time"))
    directory = text_field(obj.get("directory"))
    project = as_mapping(obj.get("project"))
    # Only a project of its own (a repository with a first commit) has worktrees; "global"
    # stands for every folder without one and names whichever folder it saw last.
    real = text_field(project.get("id")) not in ("", "global")
    checkout = text_field(project.get("worktree")) if real else ""
    return ServerSession(
        id=ident,
        title=text_field(obj.get("title")),
        directory=directory,
        created=sane_ms(t.get("created")),
        updated=sane_ms(t.get("updated")),
        cost=cost_value(obj.get("cost")),
        parent_id=text_field(obj.get("parentID")),
        model=_model_name(obj.get("model")),
        checkout=_worktree_of(directory, checkout),
    )


def _worktree_of(directory: str, checkout: str) -> str:
    """``checkout`` when ``directory`` is a worktree of it (a folder outside it: opencode keeps
    worktrees in its data folder), "" when the session works in the checkout or a folder of it."""
    if not checkout or checkout == "/" or not directory:
        return ""
    inside = normalize_dir(directory)
    top = normalize_dir(checkout)
    return "" if inside == top or inside.startswith(top.rstrip("/") + "/") else checkout


def session_from_v2(obj: Mapping[str, Any]) -> ServerSession:
    """Normalise a v2 SessionV2Info object (directory lives in ``location``)."""
    loc = as_mapping(obj.get("location")) if _is_mapping(obj) else {}
    plain = session_from_classic(obj)
    directory = text_field(loc.get("directory")) or plain.directory
    return dataclasses.replace(plain, directory=directory)


# JSON may spell half a surrogate pair on its own ("\ud800"): json.loads makes it a str that
# no UTF-8 writer takes, so one such title from a server made its whole scan fail
# (UnicodeEncodeError: "unreachable") and would break any file, page or line it reached.
# (json.loads also takes one written as bytes, ED A0-BF xx, whatever UTF-8 says.)
_SURROGATE_ESCAPE = re.compile("\\\\u[dD][89a-fA-F]|[\ud800-\udfff]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def server_json(content: bytes | str) -> Any:
    """A server's JSON answer or frame, decoded; a half surrogate pair in any text or key
    becomes U+FFFD. (Raises what json.loads raises: ValueError, RecursionError.)"""
    data = json.loads(content)
    if isinstance(content, bytes):
        lone = _SURROGATE_ESCAPE_BYTES.search(content) is not None
    else:
        lone = _SURROGATE_ESCAPE.search(content) is not None
    # No half pair, escaped or written: there is none lone (the parser joins whole pairs).
    return _whole(data) if lone else data


def _whole(data: Any) -> Any:
    """``data`` with every lone surrogate in its texts and keys replaced by U+FFFD; walked
    without recursion (a server's nesting goes as deep as json.loads lets it)."""
    if isinstance(data, str):
        return _LONE_SURROGATE.sub("\ufffd", data)
    if not isinstance(data, dict | list):
        return data
    top: list[Any] = [data]
    stack: list[tuple[Any, Any]] = [(top, 0)]
    while stack:
        holder, key = stack.pop()
        value = holder[key]
        if isinstance(value, str):
            holder[key] = _LONE_SURROGATE.sub("\ufffd", value)
        elif isinstance(value, list):
            stack.extend((value, i) for i in range(len(value)))
        elif isinstance(value, dict):
            if any(_LONE_SURROGATE.search(k) for k in value):
                fixed = {_LONE_SURROGATE.sub("\ufffd", k): v for k, v in value.items()}
                value.clear()
                value.update(fixed)
            stack.extend((value, k) for k in value)
    return top[0]


def server_error(content: bytes) -> tuple[str, str]:
    """A server's error answer read: its message on one line (not yet redacted nor cut), and
    the name it gives itself (``WorktreeNotGitError``, or "")."""
    try:
        data = server_json(content)
    except (ValueError, RecursionError):
        return one_line(content.decode("utf-8", "replace")) or "no message", ""
    if not isinstance(data, dict):
        return "no message", ""
    name = data["name"][:100] if isinstance(data.get("name"), str) else ""
    inner = data.get("data")
    if isinstance(inner, dict) and inner.get("message"):
        return one_line(str(inner["message"])), name
    said = next((data[key] for key in ("message", "name", "_tag") if data.get(key)), None)
    return (one_line(str(said)) if said else "no message"), name


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) as one space."""
    return " ".join(text.split())


# What one pending request may cost a view: what it asks, each list of words and each word.
MAX_ASKED_CHARS = 32_000
MAX_WORDS = 20
MAX_WORD_CHARS = 300


def _words(value: Any) -> tuple[str, ...]:
    """A list of short strings (patterns, labels), each one line; anything else dropped."""
    if not isinstance(value, list):
        return ()
    return tuple(one_line(v)[:MAX_WORD_CHARS] for v in value[:MAX_WORDS] if isinstance(v, str))


def request_id(obj: Any, prefix: str) -> str:
    """A request's id when it is a usable ``per…`` / ``que…`` id, else ''."""
    ident = usable_id(obj)
    return ident if ident.startswith(prefix) and ident.isprintable() and " " not in ident else ""


@dataclass(frozen=True)
class Pending:
    """One pending request as a server listed it: whose, what, and the tool call it holds."""

    session_id: str
    waiting: Waiting
    call_id: str  # the tool call waiting on it ("" unknown): its part says since when


def _call_id(obj: Mapping[str, Any]) -> str:
    return text_field(as_mapping(obj.get("tool")).get("callID"))[:200]


def waiting_from_permission(obj: Any, since: int = 0) -> Pending | None:
    """One ``GET /permission`` entry read; None when unusable."""
    ident = request_id(obj, "per")
    sid = text_field(obj.get("sessionID")) if ident else ""
    if not ident or not sid:
        return None
    kind = one_line(text_field(obj.get("permission")))[:80]
    raw = obj.get("patterns")
    patterns = _words(raw)
    # bash names its command (releases before 1.18 only its pieces, the patterns); edit and
    # the others their file paths (the patterns).
    command = as_mapping(obj.get("metadata")).get("command")
    command = command if isinstance(command, str) else ""
    asked = (command or ", ".join(patterns))[:MAX_ASKED_CHARS]
    if kind == "bash":
        whole = 0 < len(command) <= MAX_ASKED_CHARS
    else:
        # Every pattern kept as it was by ``_words``: none dropped, cut or joined.
        whole = bool(patterns) and isinstance(raw, list) and list(patterns) == raw
    always = _words(obj.get("always"))
    waiting = Waiting("permission", ident, asked, since, kind, patterns, always, whole=whole)
    return Pending(sid, waiting, _call_id(obj))


def waiting_from_question(obj: Any, since: int = 0) -> Pending | None:
    """One ``GET /question`` entry read; None when unusable."""
    ident = request_id(obj, "que")
    sid = text_field(obj.get("sessionID")) if ident else ""
    questions = obj.get("questions") if ident else None
    if not ident or not sid or not isinstance(questions, list):
        return None
    texts: list[str] = []
    choices: list[tuple[str, ...]] = []
    for q in questions[:MAX_WORDS]:
        q = as_mapping(q)
        texts.append(one_line(text_field(q.get("question")) or text_field(q.get("header"))))
        options = q.get("options")
        labels = [as_mapping(o).get("label") for o in options] if isinstance(options, list) else []
        choices.append(_words(labels))
    asked = " / ".join(t for t in texts if t)
    waiting = Waiting("question", ident, asked[:MAX_ASKED_CHARS], since, choices=tuple(choices))
    return Pending(sid, waiting, _call_id(obj))


def tool_call(messages: list[Message], call_id: str) -> tuple[str, int]:
    """The state of the tool call ``call_id`` (``pending``, ``running``, ``completed``,
    ``error``) and when it began (its part's ``state.time.start``, or 0); ("", 0) when no
    message shown holds it."""
    for msg in reversed(messages):
        for part in msg.parts:
            if part.call_id == call_id:
                when = as_mapping(part.state.get("time")).get("start")
                return text_field(part.state.get("status")), sane_ms(when)
    return "", 0


# What a session's own messages say about its work, read for the best few match
# candidates only: the prompts typed into it (by the hub or a person, the discipline block cut
# off, the hub's resume and continue prompts left out), the files its tools read or changed,
# the agent's todo list (its newest `todowrite` call holds the whole list, the same items
# `GET /session/{id}/todo` answers, so no request more; docs/matching.md) and its newest
# reply. Bounded whatever the server sends.
MAX_TRACE_PROMPTS = 20
MAX_TRACE_PROMPT_CHARS = 2000
MAX_TRACE_FILES = 50
MAX_TRACE_TODOS = 30
MAX_TRACE_TODO_CHARS = 300
# Tool inputs naming one file (read, write, edit; some releases spell it file_path) or a folder
# (list, grep, glob: a folder below the session's own is evidence too).
_TRACE_FILE_KEYS = ("filePath", "file_path", "path")
# apply_patch names its files inside the patch text.
_PATCH_FILE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+?)\s*$", re.MULTILINE)
# The states of a tool call that did not write what its input says (a todowrite's list).
_UNWRITTEN = frozenset({"pending", "error"})
# The tools that change the files they name (the others read, list or search them).
_CHANGING_TOOLS = frozenset({"write", "edit", "multiedit", "patch", "apply_patch"})


@dataclass(frozen=True)
class SessionTrace:
    """The prompts and files a session's newest messages show, oldest first: every file its
    tools touched or a person attached (``files``), and of those the ones its tools wrote,
    edited or patched (``changed``); and the agent's own words: its todo list as its newest
    ``todowrite`` call left it (``todos``) and its newest reply (``reply``)."""

    prompts: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    todos: tuple[str, ...] = ()
    reply: str = ""


def _under(path: str, directory: str) -> str:
    """``path`` relative to ``directory`` when below it ("" for the folder itself)."""
    clean = path.strip().replace("\\", "/")
    base = directory.strip().replace("\\", "/").rstrip("/")
    if base and (clean == base or clean.startswith(base + "/")):
        return clean[len(base) + 1 :]
    return clean


def session_trace(messages: list[Message], directory: str = "") -> SessionTrace:
    """The prompts and file paths in ``messages`` (a message listing, oldest first), paths
    relative to the session's ``directory`` when below it. Anything unreadable is skipped."""
    from xaf_hub.core.discipline import (  # deferred: start-up, docs/performance.md
        CONTINUE_PROMPT,
        RESUME_PROMPT,
        strip_discipline,
    )

    # The hub's own prompts (the patrol's resume, a heal's continue) name no task.
    no_task = (RESUME_PROMPT, CONTINUE_PROMPT)

    prompts: dict[str, None] = {}
    files: dict[str, None] = {}
    changed: dict[str, None] = {}
    todos: tuple[str, ...] = ()
    said: list[str] = []  # the texts of the newest assistant message that has any

    def add_file(path: str, changes: bool = False) -> None:
        name = _under(path, directory)
        if name and len(name) <= 500:
            files[name] = None
            if changes:
                changed[name] = None

    for msg in messages:
        role = msg.role
        texts: list[str] = []
        for part in msg.parts:
            kind = part.type
            if kind == "text" and not part.synthetic:
                text = part.text
                if role == "user":
                    text = strip_discipline(text).strip()
                    if text and text not in no_task:
                        prompts[text[:MAX_TRACE_PROMPT_CHARS]] = None
                elif role == "assistant" and text.strip():
                    texts.append(text.strip())
            elif kind == "tool":
                state, tool = part.state, part.tool
                given = as_mapping(state.get("input"))
                # Each call gives the whole list; one refused ("error") or not yet run
                # ("pending") left the list as it was.
                ran = text_field(state.get("status")) not in _UNWRITTEN
                if tool == "todowrite" and ran and isinstance(given.get("todos"), list):
                    todos = _todo_items(given["todos"])
                changes = tool in _CHANGING_TOOLS
                for key in _TRACE_FILE_KEYS:
                    add_file(text_field(given.get(key)), changes)
                for path in _PATCH_FILE.findall(text_field(given.get("patchText"))):
                    add_file(path, changes)
            elif kind == "file":
                add_file(part.path)
        if texts:
            said = texts
    return SessionTrace(
        tuple(list(prompts)[-MAX_TRACE_PROMPTS:]),
        tuple(list(files)[-MAX_TRACE_FILES:]),
        tuple(list(changed)[-MAX_TRACE_FILES:]),
        todos,
        "\n".join(said)[:MAX_TRACE_PROMPT_CHARS],  # joined once, for the newest only
    )


def _todo_items(todos: list[Any]) -> tuple[str, ...]:
    """The texts of a ``todowrite`` call's items (``content``), each cut, at most
    MAX_TRACE_TODOS; anything else in the list is skipped."""
    out: dict[str, None] = {}
    for item in todos:
        text = text_field(as_mapping(item).get("content")).strip()
        if text:
            out[text[:MAX_TRACE_TODO_CHARS]] = None
        if len(out) >= MAX_TRACE_TODOS:
            break
    return tuple(out)
