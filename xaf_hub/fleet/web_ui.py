"""Links from the overview page into opencode's own web interface, where an instance has one
(docs/overview-page.md).

A link is offered only where a probe saw the app served, never carries a user name or password,
and is left out of a page viewed from another machine when the instance's address is loopback.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from xaf_hub.config.load import Config, InstanceConfig
from xaf_hub.core import aio

# The app page is a few KB; a root answering more than this is not it (and is not read further).
_MAX_BODY = 64 * 1024
_TITLE = re.compile(rb"<title>\s*opencode\s*</title>", re.IGNORECASE)
PROBE_SECONDS = 5.0
CACHE_SECONDS = 600.0


@dataclass(frozen=True)
class WebUI:
    """An instance's web interface: where it lives and how to open one session there."""

    base: str  # scheme://host:port[/prefix], no credentials, no trailing slash
    loopback: bool
    login: str = ""  # the user name its page asks for with the server's password ("": none)

    def session_url(self, directory: str, session_id: str) -> str:
        """The address of one session in the app (empty when the session lacks a folder)."""
        if not directory or not session_id:
            return ""
        folder = base64.urlsafe_b64encode(directory.encode("utf-8")).decode("ascii").rstrip("=")
        return f"{self.base}/{folder}/session/{quote(session_id, safe='')}"


def public_base(url: str) -> str:
    """``url`` without user name, password, query or fragment, and without a trailing slash."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def _is_loopback_host(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def looks_like_the_app(status: int, content_type: str, head: bytes) -> bool:
    """Whether a root answer is opencode's web app (200, HTML, its title)."""
    return status == 200 and "text/html" in content_type.lower() and bool(_TITLE.search(head))


async def probe(
    inst: InstanceConfig,
    *,
    timeout: float = PROBE_SECONDS,
    transport: httpx.AsyncBaseTransport | None = None,
) -> WebUI | None:
    """Ask ``inst`` for its root page; its WebUI when that is opencode's app, else None."""
    auth = httpx.BasicAuth(inst.username, inst.password) if inst.password else None
    try:
        async with httpx.AsyncClient(
            auth=auth,
            timeout=httpx.Timeout(timeout),
            transport=transport,
            follow_redirects=False,
            trust_env=False,
            verify=not inst.url.startswith("http:"),
        ) as client, client.stream(
            "GET", public_base(inst.url) + "/", headers={"accept": "text/html"}
        ) as resp:
            head = b""
            async for chunk in resp.aiter_bytes():
                head += chunk
                if len(head) > _MAX_BODY:
                    return None
            ok = looks_like_the_app(resp.status_code, resp.headers.get("content-type", ""), head)
    except (httpx.HTTPError, OSError, ValueError):
        return None
    if not ok:
        return None
    return WebUI(public_base(inst.url), _is_loopback_host(inst.url),
                 inst.username if inst.password else "")


async def probe_all(
    instances: Iterable[InstanceConfig],
    transport_factory: Callable[[InstanceConfig], httpx.AsyncBaseTransport | None] | None = None,
) -> dict[str, WebUI]:
    """Probe every instance at once; {name: WebUI} for those serving the app."""
    chosen = list(instances)
    found = await aio.gather(
        *(probe(i, transport=transport_factory(i) if transport_factory else None) for i in chosen)
    )
    return {i.name: ui for i, ui in zip(chosen, found, strict=True) if ui is not None}


@dataclass(eq=False, repr=False)  # no repr: its config holds passwords
class Finder:
    """Probe results for a long-running viewer, each kept ``max_age`` seconds."""

    cfg: Config
    transport_factory: Callable[[InstanceConfig], httpx.AsyncBaseTransport | None] | None = None
    max_age: float = CACHE_SECONDS
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _at: float | None = field(default=None, init=False)
    _probed: set[str] = field(default_factory=set, init=False)
    _found: dict[str, WebUI] = field(default_factory=dict, init=False)

    def __call__(self, reachable: Iterable[str]) -> Mapping[str, WebUI]:
        """Web interfaces of the named (reachable) instances, probing when the memory is old."""

        names = set(reachable)
        with self._lock:
            if self._at is None or self.clock() - self._at >= self.max_age:
                self._probed, self._found = set(), {}
                self._at = self.clock()
            # An instance that was down at the last probe is probed once it answers.
            chosen = [i for i in self.cfg.instances if i.name in names - self._probed]
            if chosen:
                self._found.update(aio.run(probe_all(chosen, self.transport_factory)))
                self._probed.update(i.name for i in chosen)
            return {n: ui for n, ui in self._found.items() if n in names}
