"""`patrol --once` under the HA lease (real Redis, steps replaced by probes).

The round runs only while this process holds the lease and with its fence on the context; it
gives the lease back afterwards. Another holder means no round (exit 3); Redis away means no
round and nothing sent (exit 2) in one line.
"""

from __future__ import annotations

import io
import json
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.redis_fixture import RedisServer
from tests.unit.patrol.runner_support import make_cfg, pctx_for
from xaf_hub.cli.main import main
from xaf_hub.errors import ExitCode
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.context import Cycle
from xaf_hub.patrol.runner import open_lease, run_once


def redis_doc(server: RedisServer, prefix: str) -> dict[str, Any]:
    return {
        "lock": {"backend": "redis", "redis_url": server.url, "redis_prefix": prefix},
        "pool": {"backend": "redis"},
        "patrol": {"lease_seconds": 5},
    }


def test_once_holds_the_lease_for_its_round_then_gives_it_back(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    prefix = RedisServer.prefix()
    cfg = make_cfg(tmp_path, **redis_doc(redis_server, prefix))
    cfg = replace(cfg, lock=replace(cfg.lock, redis_password=redis_server.password))
    seen: list[Any] = []

    async def probe(pctx: OpsContext, cycle: Cycle) -> None:
        fence = pctx.fence()
        assert fence is not None
        seen.append((fence.token, redis_server.client().get(fence.key), pctx.stop_requested()))

    pctx = pctx_for(cfg)
    result = run_once(pctx, steps=(("probe", probe),), lease=open_lease(pctx))
    assert result.status == "ran" and result.code == 0, result.message
    [(token, stored, stopping)] = seen
    assert token and token == stored and not stopping  # fenced by the live token
    assert redis_server.client().get(f"{prefix}:patrol:lease") is None  # given back

    # A round longer than the lease keeps it: renewed while it runs, never lapsing.
    short = replace(cfg, patrol=replace(cfg.patrol, lease_seconds=1))

    async def slow(pctx: OpsContext, cycle: Cycle) -> None:
        import asyncio

        await asyncio.sleep(3)
        await probe(pctx, cycle)

    result = run_once(pctx_for(short), steps=(("slow", slow),), lease=open_lease(pctx_for(short)))
    assert result.code == 0, result.message
    token, stored, stopping = seen.pop()
    assert token and token == stored and not stopping

    # Another daemon holds it: no round, exit 3, its host named.
    other = open_lease(pctx)
    assert other is not None and other.acquire()
    result = run_once(pctx, steps=(("probe", probe),), lease=open_lease(pctx))
    assert (result.status, result.code) == ("standby", int(ExitCode.BUSY))
    assert "held by" in result.message and len(seen) == 1


def test_once_with_redis_away_exits_2_in_one_line_and_runs_nothing(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    doc = {
        "lock": {"redis_url": f"redis://127.0.0.1:{port}/0"},
        "pool": {"backend": "redis"},
        "instances": [{"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}],
    }
    config = tmp_path / "config.json"
    config.write_text(json.dumps(doc), "utf-8")
    out, err = io.StringIO(), io.StringIO()
    env = {"XAF_HUB_HOME": str(tmp_path / "home")}
    code = main(["--config", str(config), "patrol", "--once"], stdout=out, stderr=err, env=env)
    assert code == 2, (out.getvalue(), err.getvalue())
    text = out.getvalue() + err.getvalue()
    assert f"no patrol lease (redis: unreachable: 127.0.0.1:{port}/0: connection refused" in text
    assert "nothing sent" in text and len(text.strip().splitlines()) == 1
    assert not (tmp_path / "home" / "patrol" / "report-latest.json").exists()  # no round ran
    out, err = io.StringIO(), io.StringIO()
    args = ["--config", str(config), "patrol", "status", "--json"]
    code = main(args, stdout=out, stderr=err, env=env)
    assert code == 2
    doc = json.loads(out.getvalue())
    assert doc["active_host"] is None and "connection refused" in doc["lease_error"]


def test_a_daemon_without_redis_keeps_no_lease_says_so_and_runs_nothing(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    doc = {
        "lock": {"backend": "redis", "redis_url": f"redis://127.0.0.1:{port}/0"},
        "pool": {"backend": "redis"},
        "patrol": {"lease_seconds": 1},
        "instances": [{"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}],
    }
    config = tmp_path / "config.json"
    config.write_text(json.dumps(doc), "utf-8")
    env = {"PATH": "/usr/bin:/bin", "XAF_HUB_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "xaf_hub", "--config", str(config), "patrol",
         "--interval-seconds", "0.5", "--no-live"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        beat = tmp_path / "home" / "patrol" / "daemon.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # several intervals pass as a standby
            if beat.exists() and json.loads(beat.read_text("utf-8")).get("role") == "standby":
                break
            time.sleep(0.2)
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert f"patrol lease: standby (redis: unreachable: 127.0.0.1:{port}/0: connection" in out
    assert "patrol cycle" not in out  # not one round without the lease
    assert not (tmp_path / "home" / "patrol" / "report-latest.json").exists()
    assert json.loads(beat.read_text("utf-8"))["ticks"] == 0


def test_the_lease_is_off_on_files_and_with_lease_seconds_0(tmp_path: Path) -> None:
    import pytest

    from xaf_hub.errors import ConfigError

    files = make_cfg(tmp_path)
    assert files.patrol.lease_seconds == 15 and open_lease(pctx_for(files)) is None
    url = {"redis_url": "redis://127.0.0.1:9/0"}
    on = make_cfg(tmp_path, lock=url, pool={"backend": "redis"})
    assert open_lease(pctx_for(on)) is not None
    off = make_cfg(tmp_path, lock=url, pool={"backend": "redis"}, patrol={"lease_seconds": 0})
    assert open_lease(pctx_for(off)) is None
    with pytest.raises(ConfigError, match="lease_seconds"):
        make_cfg(tmp_path, patrol={"lease_seconds": -1})
