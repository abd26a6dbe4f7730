"""Links into opencode's own web interface: the probe, the address, no secret in a link."""

from __future__ import annotations

import base64

import httpx
import pytest

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core import aio
from xaf_hub.fleet import web_ui
from xaf_hub.fleet.web_ui import WebUI, probe, public_base

# What opencode 1.18.33 answers at its root (head of the measured page).
APP = (
    b'<!doctype html>\n<html lang="en">\n  <head>\n    <meta charset="utf-8" />\n'
    b"    <title>OpenCode</title>\n  </head><body><div id=\"root\"></div></body></html>"
)


def inst(url: str = "http://127.0.0.1:4096", password: str = "pw-secret-123") -> InstanceConfig:
    return InstanceConfig(name="a", url=url, password=password)


def answer(status: int, body: bytes, ctype: str = "text/html") -> httpx.MockTransport:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, content=body, headers={"content-type": ctype})

    transport = httpx.MockTransport(handler)
    transport.seen = seen  # type: ignore[attr-defined]
    return transport


def test_the_app_is_found_and_asked_for_with_the_login() -> None:
    transport = answer(200, APP)
    ui = aio.run(probe(inst(), transport=transport))
    # The page says which user its login takes (never the password).
    assert ui == WebUI("http://127.0.0.1:4096", loopback=True, login="opencode")
    (request,) = transport.seen  # type: ignore[attr-defined]
    assert request.url == "http://127.0.0.1:4096/"
    token = base64.b64encode(b"opencode:pw-secret-123").decode()
    assert request.headers["authorization"] == f"Basic {token}"
    # A server without a password asks for no login.
    open_ui = aio.run(probe(inst(password=""), transport=answer(200, APP)))
    assert open_ui == WebUI("http://127.0.0.1:4096", loopback=True, login="")


@pytest.mark.parametrize(
    ("status", "body", "ctype"),
    [
        (401, b"", "text/plain"),
        (404, b"not found", "text/plain"),
        (200, b'{"healthy":true}', "application/json"),
        (200, b"<html><title>Some other app</title></html>", "text/html"),
        (200, APP + b" " * (70 * 1024), "text/html"),  # far bigger than the app page
        (302, b"", "text/html"),
    ],
)
def test_no_link_where_the_root_is_not_the_app(status: int, body: bytes, ctype: str) -> None:
    assert aio.run(probe(inst(), transport=answer(status, body, ctype))) is None


def test_an_unreachable_root_is_no_link() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    assert aio.run(probe(inst(), transport=httpx.MockTransport(refuse))) is None


def test_session_address_as_the_app_builds_it() -> None:
    ui = WebUI("http://127.0.0.1:4096", loopback=True)
    # The app's own encoding: UTF-8 bytes, URL-safe base64, no padding.
    assert ui.session_url("/tmp/w19/fleet2/proj", "ses_dce2e3bffffef4NThO4uz5MjXV") == (
        "http://127.0.0.1:4096/L3RtcC93MTkvZmxlZXQyL3Byb2o/session/ses_dce2e3bffffef4NThO4uz5MjXV"
    )
    folder = ui.session_url("/srv/项目/登录", "ses_1").split("/")[3]
    assert base64.urlsafe_b64decode(folder + "=" * (-len(folder) % 4)).decode() == "/srv/项目/登录"
    assert "=" not in folder and "+" not in folder and "/" not in folder
    assert ui.session_url("", "ses_1") == ""


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://127.0.0.1:4096", "http://127.0.0.1:4096"),
        ("http://127.0.0.1:4096/", "http://127.0.0.1:4096"),
        ("https://user:secret@hub.example.internal/oc/?x=1#y", "https://hub.example.internal/oc"),
        ("http://[::1]:4096/", "http://[::1]:4096"),
    ],
)
def test_a_link_never_carries_credentials(url: str, base: str) -> None:
    assert public_base(url) == base


def test_finder_probes_each_instance_once_per_window() -> None:
    from xaf_hub.config.load import parse_config

    cfg = parse_config(
        {"instances": [{"name": "a", "url": "http://127.0.0.1:4096"},
                       {"name": "b", "url": "http://127.0.0.1:4097"}]},
        path=__import__("pathlib").Path("/nonexistent/config.json"),
        env={},
    )
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return httpx.Response(200, content=APP, headers={"content-type": "text/html"})

    now = [0.0]
    finder = web_ui.Finder(cfg, lambda i: httpx.MockTransport(handler), 600, lambda: now[0])
    assert set(finder(["a"])) == {"a"}
    assert set(finder(["a", "b"])) == {"a", "b"}  # b answered later: probed then
    assert set(finder(["a", "b"])) == {"a", "b"}
    assert asked == ["http://127.0.0.1:4096/", "http://127.0.0.1:4097/"]
    now[0] = 601.0
    finder(["a"])
    assert len(asked) == 3
