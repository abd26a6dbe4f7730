"""A dispatched task's session that the round's scan did not list is asked for by id
(``settle_tasks._look_up``) before anything is decided: only the instance's "not found" makes it
gone; an error is judged like an unreachable instance (kept, requeued after stale_minutes);
a session that is there (created after the scan, or archived) is judged like any other."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from xaf_hub.config.load import load_config
from xaf_hub.core import aio
from xaf_hub.core.records import SessionRecord
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.jobs.settle_tasks import _look_up

SID = "ses_0123456789abcdefABCDEF"
SESSION = {
    "id": SID,
    "title": "made after the scan",
    "directory": "/srv/p/app",
    "projectID": "global",
    "version": "1.18.33",
    "time": {"created": 1_796_000_000_000, "updated": 1_796_000_000_000},
}


def look_up(
    tmp_path: Path, answer: Callable[[httpx.Request], httpx.Response]
) -> tuple[SessionRecord | None, bool]:
    doc = {"instances": [{"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    cfg = load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)

    def route(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        return answer(req)

    ops = OpsContext(cfg, env={}, transport_factory=lambda _: httpx.MockTransport(route))
    return aio.run(_look_up(ops, cfg.instances[0], SID))


def test_not_found_is_gone(tmp_path: Path) -> None:
    assert look_up(tmp_path, lambda req: httpx.Response(404, json={})) == (None, True)


@pytest.mark.parametrize(
    "answer",
    [
        lambda req: httpx.Response(500, text="boom"),
        lambda req: httpx.Response(200, text="{truncated"),
        lambda req: (_ for _ in ()).throw(httpx.ConnectError("refused", request=req)),
    ],
    ids=["500", "truncated", "refused"],
)
def test_an_error_is_not_gone_but_unreachable(
    tmp_path: Path, answer: Callable[[httpx.Request], httpx.Response]
) -> None:
    assert look_up(tmp_path, answer) == (None, False)


def test_a_session_that_is_there_is_judged_with_its_run_state(tmp_path: Path) -> None:
    def answer(req: httpx.Request) -> httpx.Response:
        if req.url.path == f"/session/{SID}":
            return httpx.Response(200, json=SESSION)
        if req.url.path == "/session/status":
            return httpx.Response(200, json={SID: {"type": "busy"}})
        return httpx.Response(404, json={})

    rec, reachable = look_up(tmp_path, answer)
    assert reachable and rec is not None
    assert (rec.id, rec.project, rec.running) == (SID, True, True)
    assert rec.created == 1_796_000_000_000  # the server's clock: settle's "just created"
