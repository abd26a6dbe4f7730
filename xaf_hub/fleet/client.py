"""Async client for one opencode instance; what differs between the two API dialects is one
adapter of ``fleet.dialects``, chosen by ``detect``.

Every transport or protocol failure becomes an UnreachableError with a short, secret-free
reason; ``httpx.HTTPError`` never escapes this module. Retries (``retries`` times) happen on
network errors, 5xx and truncated bodies, never on 4xx; a non-idempotent request is retried
only when the connection was never made.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

import httpx

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.core.backoff import Backoff
from xaf_hub.core.records import Message, Room
from xaf_hub.core.text import redact
from xaf_hub.errors import ApiError, Cause, HubError, RequestGone, SessionNotFound, UnreachableError
from xaf_hub.fleet import wire
from xaf_hub.fleet.dialects import DIALECTS, V2, Api, Classic, Dialect, Seen
from xaf_hub.fleet.dialects import RawStatus as RawStatus
from xaf_hub.fleet.releases import Release, classify
from xaf_hub.fleet.retry import maybe_delivered
from xaf_hub.fleet.wire import ServerSession as ServerSession
from xaf_hub.fleet.wire import as_mapping as _obj
from xaf_hub.fleet.wire import text_field as _text

RETRY = Backoff(first=0.2, cap=1.0)  # between the tries of one request (`retries`)
_HTML = "answered with an HTML page instead of JSON (wrong URL or path prefix?)"


class _TooLarge(Exception):
    """An answer grew past the client's body cap."""


_DNS_HINTS = (
    "name or service not known",
    "nodename nor servname",
    "getaddrinfo failed",
    "temporary failure in name resolution",
    "no address associated",
    "name resolution",
    "11001",
)
_REFUSED_HINTS = (
    "connection refused",
    "connectionrefusederror",
    "errno 111",
    "10061",
    "actively refused",
)


def _chain_text(exc: BaseException) -> str:
    """The messages of an exception and its causes (anyio hides the errno two levels down)."""
    parts, seen = [], set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        parts.append(f"{type(cur).__name__} {cur}")
        cur = cur.__cause__ or cur.__context__
    return " | ".join(parts).lower()


def explain(exc: BaseException, connect_timeout: float, read_timeout: float) -> tuple[Cause, str]:
    """An httpx exception as its cause and a short human reason (never with credentials): the
    one place that reads the words of an OS or httpx message."""
    text = _chain_text(exc)
    if isinstance(exc, httpx.ConnectTimeout):
        return "timeout", f"connection timed out after {connect_timeout:g}s"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout", f"no answer within {read_timeout:g}s (timed out)"
    if isinstance(exc, httpx.ConnectError):
        if "ssl" in text or "certificate" in text:
            return "tls", "could not connect (TLS: the certificate or handshake failed)"
        if any(h in text for h in _DNS_HINTS):
            return "dns", "DNS lookup failed (host name not found)"
        if any(h in text for h in _REFUSED_HINTS):
            return "refused", "connection refused (nothing listening on that port)"
        return "connect", "could not connect"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "dropped", "truncated response (the server closed the connection mid-answer)"
    if isinstance(exc, httpx.ReadError | httpx.WriteError):
        return "dropped", "connection dropped while talking to the server"
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return "bad_url", "bad URL in the config"
    return "network", f"network error ({type(exc).__name__})"


class OpencodeClient:
    """One instance, one ``httpx.AsyncClient``; use as ``async with``."""

    def __init__(
        self,
        inst: InstanceConfig,
        *,
        connect_timeout: float = 8.0,
        read_timeout: float = 30.0,
        retries: int = 1,
        page_size: int = 8000,
        transport: httpx.AsyncBaseTransport | None = None,
        deadline: float | None = None,
        max_body_bytes: int = wire.MAX_BODY_BYTES,
        max_pages: int = wire.MAX_PAGES,
        max_sessions: int = wire.MAX_SESSIONS,
    ) -> None:
        self.inst = inst
        self.name = inst.name
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.retries = retries
        self.page_size = page_size
        # The read timeout counts per chunk; the deadline bounds a whole answer (and a scan).
        self.deadline = read_timeout + 5.0 if deadline is None else deadline
        self.max_body_bytes = max_body_bytes
        self.max_pages = max_pages
        self.max_sessions = max_sessions
        self.notes: list[str] = []  # entries skipped while reading listings, one line each
        # The dialect's adapter: as the config says, else found by ``detect``.
        self.api: Api | None = None if inst.api == "auto" else DIALECTS[inst.api](self)
        self.version = ""
        # Session id -> directory of every session seen: per-session calls send it (_where).
        self._dirs: dict[str, str] = {}
        auth = httpx.BasicAuth(inst.username, inst.password) if inst.password else None
        if transport is None:
            # Loading the CA bundle is slow (docs/performance.md); plain-http instances need none
            # and https ones share one verified context per process.
            https = inst.url.startswith("https:")
            transport = httpx.AsyncHTTPTransport(verify=_tls_context() if https else False)
        self._http = httpx.AsyncClient(
            base_url=inst.url,
            auth=auth,
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
            transport=transport,
            headers={"accept": "application/json"},
            follow_redirects=False,
            trust_env=False,
        )

    @property
    def dialect(self) -> Dialect | None:
        """The API dialect the server speaks (None before ``detect`` when the config says auto)."""
        return self.api.name if self.api is not None else None

    async def __aenter__(self) -> OpencodeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    # -----------------------------------------------------------------------------------
    # transport

    def _fail(self, reason: str, cause: Cause = "other") -> UnreachableError:
        return UnreachableError(self.name, reason, cause=cause)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        expect_json: bool = True,
        idempotent: bool = True,
        gone: HubError | None = None,
        shape: type | None = None,
    ) -> Any:
        """The answer's JSON (None with ``expect_json`` off); ``gone`` is raised on a 404, an
        unexpected shape when the JSON is not a ``shape`` (list, dict)."""
        attempts = self.retries + 1
        cause: Cause
        cause, last_reason = "other", "no attempt made"
        # Whether a failed write may still have reached the server (callers that recorded the
        # write beforehand must then keep that record).
        uncertain = False
        timed_out, waited = 0, 0.0  # a retried timeout says so: the user waited for each try
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(RETRY.delay(attempt))
            try:
                async with asyncio.timeout(self.deadline):
                    resp, content = await self._read(method, path, params, body)
            except (TimeoutError, _TooLarge) as exc:
                # Retrying would only wait as long again, or read as much.
                if isinstance(exc, TimeoutError):
                    cause, last_reason = "timeout", (
                        f"no complete answer within {self.deadline:g}s (timed out; "
                        "the server sends too slowly)"
                    )
                else:
                    cause, last_reason = "too_large", (
                        f"answer larger than {self.max_body_bytes // 2**20} MB (stopped reading; "
                        "not an opencode server?)"
                    )
                uncertain = not idempotent
                break
            except httpx.ConnectError as exc:
                cause, last_reason = explain(exc, self.connect_timeout, self.read_timeout)
                if cause == "dns":
                    break  # a missing host name will not appear on retry
                continue
            except httpx.HTTPError as exc:
                cause, last_reason = explain(exc, self.connect_timeout, self.read_timeout)
                if not idempotent:
                    # Nothing left the machine on a connect or pool timeout; after that, unknown.
                    uncertain = maybe_delivered(exc)
                    break
                if isinstance(exc, httpx.TimeoutException):
                    timed_out += 1
                    waited += (
                        self.connect_timeout
                        if isinstance(exc, httpx.ConnectTimeout)
                        else self.read_timeout
                    )
                continue
            status = resp.status_code
            if status == 401:
                if not self.inst.password:
                    raise self.inst.unreachable("", "no_password")
                raise self._fail(
                    "auth rejected (HTTP 401): check the username and password", "auth"
                )
            if status == 403:
                raise self._fail("access forbidden (HTTP 403)", "forbidden")
            if status == 404 and gone is not None:
                raise gone
            if 400 <= status < 500:
                said, name = wire.server_error(content)
                # Redacted before it is cut short: a cut could leave half a secret behind.
                raise ApiError(self.name, status, self._scrub(said)[:300], name)
            if status >= 500:
                cause, last_reason = "server_error", f"server error (HTTP {status})"
            elif not expect_json:
                return None
            elif "html" in resp.headers.get("content-type", "") or content.lstrip()[:1] == b"<":
                raise self._fail(_HTML, "html")
            else:
                try:
                    data = wire.server_json(content)
                except (ValueError, RecursionError):  # bad UTF-8 or JSON, a 5000-digit number
                    cause, last_reason = "garbled", "truncated or invalid JSON in the response"
                else:
                    if shape is not None and not isinstance(data, shape):
                        raise self._shape(path)
                    return data
            # A server error or a garbled answer: tried again, unless a write may have landed.
            if not idempotent:
                uncertain = True
                break
        if timed_out > 1 and cause == "timeout":
            last_reason += f"; {timed_out} tries, {waited:g}s in all"
        raise UnreachableError(self.name, last_reason, cause=cause, maybe_delivered=uncertain)

    async def _read(
        self, method: str, path: str, params: Mapping[str, Any] | None, body: Any
    ) -> tuple[httpx.Response, bytes]:
        """Send one request and read its answer in chunks, stopping past the size cap."""
        request = self._http.build_request(method, path, params=params, json=body)
        resp = await self._http.send(request, stream=True)
        try:
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                raise _TooLarge
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise _TooLarge
                chunks.append(chunk)
        finally:
            await resp.aclose()
        return resp, b"".join(chunks)

    def _scrub(self, text: str) -> str:
        """A server's error text without our own credential, should it echo the request."""

        return redact(text, self.inst.secrets())

    def no_session(self, session_id: str) -> SessionNotFound:
        """What a call on a session the instance does not know raises."""
        return SessionNotFound(f"{self.name}: session {session_id} not found")

    def _shape(self, what: str) -> UnreachableError:
        return self._fail(f"unexpected response shape from {what} (not an opencode server?)")

    def open_stream(
        self, path: str, params: Mapping[str, Any] | None = None
    ) -> contextlib.AbstractAsyncContextManager[httpx.Response]:
        """A streaming GET of server-sent events (``fleet.stream`` reads it line by line).

        The one exception to this module's rule: httpx errors reach the caller, which turns
        them into reasons with ``explain``. No read timeout: the caller keeps the
        heartbeat deadline.
        """
        return self._http.stream(
            "GET",
            path,
            params=params,
            headers={"accept": "text/event-stream"},
            timeout=httpx.Timeout(None, connect=self.connect_timeout),
        )

    # -----------------------------------------------------------------------------------
    # discovery

    async def detect(self) -> Dialect:
        """Find the API dialect (classic first) and the server version."""
        if self.dialect == "classic" or self.dialect is None:
            try:
                data = await self._request("GET", "/global/health")
            except UnreachableError as exc:
                if self.dialect == "classic" or exc.cause != "html":
                    raise
            else:
                if not isinstance(data, dict) or "healthy" not in data:
                    raise self._shape("/global/health")
                self.api = Classic(self)
                self.version = str(data.get("version") or "")
                return "classic"
        for path in ("/api/info", "/api/health"):
            try:
                data = await self._request("GET", path)
            except UnreachableError as exc:
                if exc.cause == "html":
                    continue
                raise
            if isinstance(data, dict):
                self.api = V2(self)
                self.version = str(data.get("version") or self.version or "")
                return "v2"
        raise self._fail(_HTML, "html")

    async def _api(self) -> Api:
        if self.api is None:
            await self.detect()
        assert self.api is not None
        return self.api

    @property
    def release(self) -> Release:
        """The release and its run-state behaviour, from the version ``detect`` read."""
        return classify(self.version, self.dialect or "classic")

    def _seen(self, session: ServerSession) -> ServerSession:
        if session.directory:
            self._dirs[session.id] = session.directory
        return session

    async def _where(
        self, session_id: str, directory: str | None, write: bool = False
    ) -> dict[str, str] | None:
        """``?directory=`` of a session's call: the caller's, remembered or (writes) looked up; none
        while it runs in the server's own directory (1.2-1.14: else 2 runs, or no abort)."""
        if directory:
            self._dirs[session_id] = directory  # later calls on this session send it too
        d = directory or self._dirs.get(session_id)
        if write:
            d = d or (await self.get_session(session_id)).directory
            if not self.version:
                await self.detect()
            if d and self.release.reads_server_wide and session_id in await self._status_map(None):
                d = ""
        return {"directory": d} if d else None

    async def list_sessions(self) -> list[ServerSession]:
        """Every session on the instance, all pages, page size sent explicitly."""
        return await (await self._api()).list_sessions()

    def _read_page(
        self,
        items: list[Any],
        parse: Callable[[Any], ServerSession],
        seen: dict[str, ServerSession],
        what: str,
    ) -> tuple[list[ServerSession], int]:
        """Parse one page into ``seen`` (by id): the page and how many were new; entries
        without a usable id are skipped with a note."""
        page: list[ServerSession] = []
        for obj in items:
            with contextlib.suppress(KeyError):
                page.append(parse(obj))
        skipped = len(items) - len(page)
        if skipped:
            entries = "entry" if skipped == 1 else "entries"
            self.notes.append(f"{self.name}: skipped {skipped} {entries} of {what} without a "
                              "usable session id")
        before = len(seen)
        for s in page:
            seen.setdefault(s.id, s)
        if len(seen) > self.max_sessions:
            raise self._fail(_over_cap(self.max_sessions, "sessions listed"))
        return page, len(seen) - before

    async def _listing(
        self,
        path: str,
        parse: Callable[[Any], ServerSession],
        rows: Callable[[Any], list[Any] | None],
        turn: Callable[[Any, list[ServerSession], Any], Any],
    ) -> list[ServerSession]:
        """Every session a paged listing at ``path`` gives, by id: ``rows`` finds a page's
        entries in its answer, ``turn`` the next page's cursor (None: the last page)."""
        seen: dict[str, ServerSession] = {}
        cursor: Any = None
        for pages in range(1, self.max_pages + 1):
            params = {"limit": self.page_size, **({} if cursor is None else {"cursor": cursor})}
            data = await self._request("GET", path, params=params)
            items = rows(data)
            if items is None:
                raise self._shape(path)
            page, new = self._read_page(items, parse, seen, path)
            cursor = turn(data, page, cursor)
            if len(items) < self.page_size or new == 0 or cursor is None:
                break
            if pages >= self.max_pages:
                raise self._fail(_over_cap(self.max_pages, "pages of sessions"))
        return list(seen.values())

    async def _status_map(self, directory: str | None) -> dict[str, RawStatus]:
        params = {"directory": directory} if directory is not None else None
        data = await self._request("GET", "/session/status", params=params, shape=dict)
        return {str(k): cast(RawStatus, v) for k, v in data.items() if isinstance(v, dict)}

    async def status(self, directory: str) -> dict[str, RawStatus]:
        """Busy/retry sessions of one directory (idle ones are absent); see ``running``."""
        return await self.running([directory])

    async def running(
        self, directories: Sequence[str], fan_out: int = 16, seen: Seen | None = None
    ) -> dict[str, RawStatus]:
        """Running sessions of ``directories`` as this release reports them (fleet/releases.py);
        RunStateUnknown when the hub cannot read it (the caller counts the instance full).
        ``seen`` is told each part (a directory's map) as soon as it is read."""
        return await (await self._api()).running(directories, fan_out, seen)

    async def get_session(self, session_id: str, directory: str | None = None) -> ServerSession:
        """One session by id; SessionNotFound when the instance does not know it."""
        api = await self._api()
        path = f"{api.sessions}/{session_id}"
        if not session_id.startswith("ses"):
            # opencode answers 500 to malformed ids; say what is wrong instead.
            raise SessionNotFound(f"{self.name}: {session_id!r} is not a session id (ses_...)")
        params = await api.where(session_id, directory)
        data = await self._request("GET", path, params=params, gone=self.no_session(session_id))
        try:
            return api.session(data)
        except (KeyError, TypeError, AttributeError, ValueError):
            raise self._shape(path) from None

    async def children(self, session_id: str, directory: str | None = None) -> list[ServerSession]:
        """The sessions a session's sub-agents run in (``parentID``: the ``task`` tool's); none
        on the v2 dialect, which has no such route. SessionNotFound for an unknown session."""
        return await (await self._api()).children(session_id, directory)

    async def messages(
        self, session_id: str, limit: int = 5, directory: str | None = None
    ) -> list[Message]:
        """The newest ``limit`` messages of a session, oldest first."""
        api = await self._api()
        path = f"{api.sessions}/{session_id}/message"
        where = await api.where(session_id, directory)
        params = {"limit": limit, **(where or {})}
        data = await self._request("GET", path, params=params, gone=self.no_session(session_id))
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise self._shape(path)
        return wire.messages_of(data)

    async def pending_requests(self, directory: str) -> list[wire.Pending]:
        """The permission requests and questions waiting for a person in ``directory``.

        Both routes answer only for the directory asked (``?directory=``; without it, the
        server's own folder). Entries without a usable id or session are skipped, noted.
        """
        async def listed(
            path: str, read: Callable[[Any], wire.Pending | None]
        ) -> list[wire.Pending]:
            data = await self._request("GET", path, params={"directory": directory}, shape=list)
            items = [read(obj) for obj in data[: wire.MAX_SESSIONS]]
            skipped = sum(1 for i in items if i is None)
            if skipped:
                self.notes.append(f"{self.name}: skipped {skipped} unreadable entries of {path}")
            return [i for i in items if i is not None]

        # Both at once: a scan asks them as soon as the folder shows a run (fleet/scan.py).
        permissions, questions = await aio.gather(
            listed("/permission", wire.waiting_from_permission),
            listed("/question", wire.waiting_from_question),
        )
        return permissions + questions

    async def reply_permission(
        self, request_id: str, reply: Literal["once", "always", "reject"], message: str,
        directory: str,
    ) -> None:
        """Answer a permission request (``POST /permission/{id}/reply``)."""
        body = {"reply": reply, **({"message": message} if message else {})}
        await self._reply(f"/permission/{request_id}/reply", body, directory)

    async def reply_question(
        self, request_id: str, answers: Sequence[Sequence[str]] | None, directory: str
    ) -> None:
        """Answer a question (``answers``: each question's labels) or reject it (None)."""
        if answers is None:
            await self._reply(f"/question/{request_id}/reject", None, directory)
        else:
            body = {"answers": [list(a) for a in answers]}
            await self._reply(f"/question/{request_id}/reply", body, directory)

    async def _reply(self, path: str, body: Any, directory: str) -> None:
        gone = RequestGone(f"{self.name}: request {path.split('/')[2]} no longer waits")
        await self._request(
            "POST", path, params={"directory": directory}, body=body, expect_json=False,
            idempotent=False, gone=gone,
        )

    # -----------------------------------------------------------------------------------
    # writes

    async def create_session(self, directory: str, title: str) -> ServerSession:
        """Create a session in ``directory`` (the query parameter; a body field is ignored)."""
        return await (await self._api()).create_session(directory, title)

    async def prompt_async(
        self, session_id: str, text: str, model: str | None, directory: str | None = None
    ) -> None:
        """Send a prompt without waiting for the model (classic 204), in the session's folder."""
        await (await self._api()).prompt_async(session_id, text, model, directory)

    async def branch(self, directory: str) -> str:
        """The branch checked out in ``directory`` ("" when the server says none)."""
        data = await self._request("GET", "/vcs", params={"directory": directory})
        return _text(_obj(data).get("branch"))

    async def project_of(self, directory: str) -> tuple[str, str, str]:
        """(id, checkout, vcs) of the project ``directory`` belongs to, as the server sees it:
        a git checkout with a first commit has that commit's id; "global" otherwise."""
        data = await self._request("GET", "/project/current", params={"directory": directory})
        obj = _obj(data)
        return _text(obj.get("id")), _text(obj.get("worktree")), _text(obj.get("vcs"))

    async def create_worktree(self, checkout: str, name: str) -> Room:
        """A new git worktree of ``checkout`` on its own branch, named after ``name`` (opencode
        makes both; its answer says where: releases differ in the name they pick)."""
        data = await self._worktree("POST", checkout, body={"name": name}, idempotent=False)
        made = Room(_text(_obj(data).get("directory")), _text(_obj(data).get("branch")), checkout)
        if not made.directory or not made.branch:
            raise self._shape("/experimental/worktree")
        return made

    async def worktrees(self, checkout: str) -> list[str]:
        """The folders of ``checkout``'s worktrees that opencode made."""
        data = await self._worktree("GET", checkout, shape=list)
        return [d for d in data if isinstance(d, str) and d]

    async def remove_worktree(self, checkout: str, directory: str) -> None:
        """Remove one worktree of ``checkout`` and its local branch (opencode removes both)."""
        await self._worktree(
            "DELETE", checkout, body={"directory": directory}, expect_json=False, idempotent=False
        )

    async def _worktree(self, method: str, checkout: str, **kw: Any) -> Any:
        """One call of opencode's worktree route, for the project of ``checkout``."""
        return await self._request(
            method, "/experimental/worktree", params={"directory": checkout}, **kw
        )

    async def shell(self, session_id: str, directory: str, command: str) -> str:
        """Run ``command`` in the session's folder through the server's shell (no model):
        what it printed. The session's history shows the command and its output."""
        path, body = f"/session/{session_id}/shell", {"agent": "build", "command": command}
        data = await self._request(
            "POST", path, params={"directory": directory}, body=body, idempotent=False
        )
        for part in wire.message_of(data).parts:
            if part.type == "tool":
                return _text(part.state.get("output"))
        raise self._shape(path)

    async def abort(self, session_id: str, directory: str | None = None) -> None:
        """Stop a running session (a no-op when idle), in the directory it runs in."""
        api = await self._api()
        params = await api.where(session_id, directory, write=True)
        path = f"{api.sessions}/{session_id}/{api.stop}"
        await self._request("POST", path, params=params, expect_json=False)

    async def delete(self, session_id: str, directory: str | None = None) -> None:
        """Delete a session (callers abort first: deleting does not stop a run)."""
        params = await self._where(session_id, directory)
        await self._request("DELETE", f"/session/{session_id}", params=params, expect_json=False)


def _over_cap(cap: int, what: str) -> str:
    """The reason given when a listing goes beyond one of ``wire``'s caps."""
    return f"more than {cap} {what} (stopped reading; endless pagination?)"


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """One certificate-verifying TLS context for every https instance of this process."""
    return ssl.create_default_context()
