"""The two API dialects of an opencode server, behind one interface.

``Classic`` is the routes every release from 1.2 answers (``/session``, ``/session/status``
per directory, ``prompt_async``); ``V2`` the ``/api/...`` routes (a cursor object, one map of
the runs, a model set apart from the prompt). ``OpencodeClient`` detects which one a server
speaks and holds one adapter, which reaches the server through the client's own transport
(``_request``) and directory memory (``_where``, ``_seen``); what both share, and the routes
only the classic dialect has, stay in the client.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypedDict

from xaf_hub.core import aio
from xaf_hub.errors import RunStateUnknown
from xaf_hub.fleet.wire import ServerSession, session_from_classic, session_from_v2
from xaf_hub.fleet.wire import as_mapping as _obj
from xaf_hub.fleet.wire import text_field as _text
from xaf_hub.fleet.wire import usable_id as _id

if TYPE_CHECKING:
    from xaf_hub.fleet.client import OpencodeClient

Dialect = Literal["classic", "v2"]


class RawStatus(TypedDict, total=False):
    """One entry of the classic ``/session/status`` map."""

    type: str
    attempt: int
    message: str
    next: int


#: Told each part of the run state as it is read (``OpencodeClient.running``'s ``seen``).
Seen = Callable[[dict[str, RawStatus]], None]


def split_model(model: str) -> dict[str, str]:
    """'provider/model' -> {providerID, modelID} as prompt bodies want it."""
    provider, _, ident = model.partition("/")
    return {"providerID": provider, "modelID": ident}


class Api(abc.ABC):
    """What differs between the dialects, over one client's transport."""

    name: ClassVar[Dialect]
    #: Where a session's routes start, and the last part of the route that stops its run.
    sessions: ClassVar[str]
    stop: ClassVar[str]

    def __init__(self, client: OpencodeClient) -> None:
        self.client = client

    @abc.abstractmethod
    async def where(
        self, session_id: str, directory: str | None, write: bool = False
    ) -> dict[str, str] | None:
        """The query that places a call on a session (its ``?directory=``), or None."""

    @abc.abstractmethod
    def session(self, data: Any) -> ServerSession:
        """One session from the answer of ``GET <sessions>/{id}`` (raises on a bad shape)."""

    @abc.abstractmethod
    async def list_sessions(self) -> list[ServerSession]:
        """Every session on the instance, all pages."""

    @abc.abstractmethod
    async def running(
        self, directories: Sequence[str], fan_out: int, seen: Seen | None = None
    ) -> dict[str, RawStatus]:
        """The running sessions of ``directories`` (``OpencodeClient.running``)."""

    @abc.abstractmethod
    async def children(self, session_id: str, directory: str | None) -> list[ServerSession]:
        """The sessions a session's sub-agents run in."""

    @abc.abstractmethod
    async def create_session(self, directory: str, title: str) -> ServerSession:
        """A new session in ``directory``."""

    @abc.abstractmethod
    async def prompt_async(
        self, session_id: str, text: str, model: str | None, directory: str | None
    ) -> None:
        """Start a run without waiting for the model."""


class Classic(Api):
    """The routes of releases 1.2 and later; a session's calls carry its directory."""

    name = "classic"
    sessions = "/session"
    stop = "abort"

    async def where(
        self, session_id: str, directory: str | None, write: bool = False
    ) -> dict[str, str] | None:
        return await self.client._where(session_id, directory, write)

    def session(self, data: Any) -> ServerSession:
        return self.client._seen(session_from_classic(data))

    async def list_sessions(self) -> list[ServerSession]:
        c = self.client

        def turn(data: Any, page: list[ServerSession], cursor: Any) -> Any:
            if not page:
                return None
            # The cursor returns time.updated < cursor; +1 re-reads the boundary millisecond
            # so sessions sharing it are not skipped (duplicates are dropped by id).
            last = min(s.updated for s in page)
            return last + 1 if cursor is None or last + 1 < cursor else last

        listed = await c._listing("/experimental/session", session_from_classic, _rows, turn)
        return [c._seen(s) for s in listed]

    async def running(
        self, directories: Sequence[str], fan_out: int, seen: Seen | None = None
    ) -> dict[str, RawStatus]:
        c = self.client
        if not c.version:
            await c.detect()
        release = c.release
        if not release.known:
            raise RunStateUnknown(c.name, release.note)
        # Each directory, plus the server-wide map where this release keeps runs started
        # without a directory (1.2 to 1.14).
        wide: list[str | None] = [None] if release.reads_server_wide else []

        async def part(directory: str | None) -> dict[str, RawStatus]:
            got = await c._status_map(directory)
            if seen is not None:
                seen(got)
            return got

        parts = await aio.bounded(fan_out, part, [*directories, *wide])
        return {k: v for part in parts for k, v in part.items()}

    async def children(self, session_id: str, directory: str | None) -> list[ServerSession]:
        c = self.client
        path = f"/session/{session_id}/children"
        where = await self.where(session_id, directory)
        data = await c._request("GET", path, params=where, gone=c.no_session(session_id))
        if not isinstance(data, list):
            raise c._shape(path)
        page, _ = c._read_page(data, session_from_classic, {}, path)
        return [c._seen(s) for s in page]

    async def create_session(self, directory: str, title: str) -> ServerSession:
        data = await self.client._request(
            "POST", "/session", params={"directory": directory}, body={"title": title},
            idempotent=False,
        )
        if not isinstance(data, dict) or not _id(data):
            raise self.client._shape("/session")
        return self.session(data)

    async def prompt_async(
        self, session_id: str, text: str, model: str | None, directory: str | None
    ) -> None:
        body: dict[str, Any] = {"parts": [{"type": "text", "text": text}]}
        if model:
            body["model"] = split_model(model)
        await self.client._request(
            "POST",
            f"/session/{session_id}/prompt_async",
            params=await self.where(session_id, directory, write=True),
            body=body,
            expect_json=False,
            idempotent=False,
            gone=self.client.no_session(session_id),
        )


class V2(Api):
    """The ``/api/...`` routes: no directory per call, no sub-agent route."""

    name = "v2"
    sessions = "/api/session"
    stop = "interrupt"

    async def where(
        self, session_id: str, directory: str | None, write: bool = False
    ) -> dict[str, str] | None:
        return None

    def session(self, data: Any) -> ServerSession:
        return session_from_v2(data.get("data", data))

    async def list_sessions(self) -> list[ServerSession]:
        def turn(data: Any, page: list[ServerSession], cursor: Any) -> Any:
            return _text(_obj(data.get("cursor")).get("next")) or None

        return await self.client._listing("/api/session", session_from_v2, _data_rows, turn)

    async def running(
        self, directories: Sequence[str], fan_out: int, seen: Seen | None = None
    ) -> dict[str, RawStatus]:
        data = await self.client._request("GET", "/api/session/active")
        if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
            raise self.client._shape("/api/session/active")
        active: dict[str, RawStatus] = {str(k): {"type": "busy"} for k in data["data"]}
        if seen is not None:
            seen(active)
        return active

    async def children(self, session_id: str, directory: str | None) -> list[ServerSession]:
        return []

    async def create_session(self, directory: str, title: str) -> ServerSession:
        data = await self.client._request(
            "POST", "/api/session", body={"location": {"directory": directory}}, idempotent=False
        )
        obj = data.get("data", data) if isinstance(data, dict) else None
        if not isinstance(obj, dict) or not _id(obj):
            raise self.client._shape("/api/session")
        return session_from_v2(obj)

    async def prompt_async(
        self, session_id: str, text: str, model: str | None, directory: str | None
    ) -> None:
        c = self.client
        if model:
            provider, _, ident = model.partition("/")
            await c._request(
                "POST", f"/api/session/{session_id}/model",
                body={"model": {"providerID": provider, "id": ident}},
                expect_json=False, idempotent=False,
            )
        await c._request(
            "POST", f"/api/session/{session_id}/prompt", body={"prompt": {"text": text}},
            expect_json=False, idempotent=False,
        )


def _rows(data: Any) -> list[Any] | None:
    """A classic listing's entries (None: not a listing)."""
    return data if isinstance(data, list) else None


def _data_rows(data: Any) -> list[Any] | None:
    """A v2 listing's entries, under ``data`` (None: not a listing)."""
    rows = data.get("data") if isinstance(data, dict) else None
    return rows if isinstance(rows, list) else None


DIALECTS: dict[str, type[Api]] = {"classic": Classic, "v2": V2}
