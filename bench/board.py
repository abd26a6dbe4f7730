"""What the live board saves: `status` read from a patrol daemon's board against `status
--fresh` (a scan) of the same fleet, how soon a run's start shows on the board, and what
reading a board costs at fleet sizes no machine here can serve (architecture §5.1).

    python -m bench --board                   # K=3 servers x M=600 project sessions
    python -m bench --board --k 6 --m 300 --repeat 5
    python -m bench --board-projected         # the 50-instance projections alone (no opencode)

Real part: K opencode servers with M sessions each, a patrol daemon (`--no-design --no-fill`)
publishing its board; then, --repeat times in rotating order, `status` (which must say it read
the board) and `status --fresh`, each a whole process; then --samples prompts, each timed from
`prompt_async` to the board file showing the run, beside when the server itself streamed
`busy`. Projected part: a board written for N instances x S sessions (no server is asked when
every instance is fresh on the board) and `status` timed over it, beside `status --fresh`
scanning as many light stand-in servers of those sessions (bench/standin.py, one process on
127.0.0.1; up to SCAN_UP_TO sessions each). Printed figures only; no target is asserted.
Writes bench/results/board.json (board-projected.json).
"""

from __future__ import annotations

import functools
import json
import os
import re
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROJECTIONS = ((50, 200), (50, 2000), (50, 10_000))  # instances x sessions each
SCAN_UP_TO = 2000  # sessions each: a scan of stand-in servers is measured up to this size


def measure_board(
    k: int, m: int, repeat: int, samples: int, root: Path, log: Callable[[str], None],
    settle_cpu: float,
) -> dict[str, Any]:
    """The real fleet's figures, then the projections."""
    result: dict[str, Any] = {"k": k, "m": m, "repeat": repeat}
    result["real"] = _real(k, m, repeat, samples, root / "real", log, settle_cpu)
    result["projected"] = [_projected(n, s, min(repeat, 3), root / f"p{n}x{s}", log)
                           for n, s in PROJECTIONS]
    return result


def _real(k: int, m: int, repeat: int, samples: int, root: Path, log: Callable[[str], None],
          settle_cpu: float) -> dict[str, Any]:
    from bench.__main__ import BenchFleet, bytecode_env, hub_argv, run_child, settle, stats
    from bench.live import Child, _prompt, _raw_busy, _wait

    root.mkdir(parents=True)
    fleet = BenchFleet(root, k, m, 0, log)
    try:
        log(f"[board] starting {k} opencode servers ...")
        fleet.start()
        created = fleet.seed()
        log(f"[board] {fleet.seeded} sessions in {fleet.seed_seconds:.1f} s")
        cfg, _spec, env = fleet.write_config()
        env = {**env, **bytecode_env(root)}
        hub = [*hub_argv(), "--config", str(cfg)]
        board = Path(env["XAF_HUB_HOME"]) / "live-board-patrol.json"
        raw: dict[str, float] = {}
        for server, pw in zip(fleet.servers, fleet.passwords, strict=True):
            threading.Thread(target=_raw_busy, args=(server.url, pw, raw), daemon=True).start()
        daemon = Child([*hub, "patrol", "--interval-seconds", "3600", "--no-design",
                        "--no-fill"], env, root)
        out = root / "out"
        out.mkdir()
        try:
            started = time.monotonic()
            _wait(lambda: _fresh(board, k), 900, "the daemon's board")
            ready = time.monotonic() - started
            log(f"[board] board fresh for all {k} instances after {ready:.1f} s")
            items = [("status (board)", [*hub, "status", "--json"]),
                     ("status --fresh (scan)", [*hub, "status", "--json", "--fresh"])]
            walls: dict[str, list[float]] = {n: [] for n, _ in items}
            cpus: dict[str, list[float]] = {n: [] for n, _ in items}
            for rnd in range(repeat + 1):  # the first is a warm-up
                settle(settle_cpu, log)
                for name, argv in items[rnd % 2:] + items[:rnd % 2]:
                    slug = re.sub(r"\W+", "_", name)
                    r = run_child(argv, env, root, out / f"{slug}.out", out / f"{slug}.err")
                    doc = json.loads((out / f"{slug}.out").read_text("utf-8"))
                    want = "scan" if "--fresh" in argv else "live"
                    if r.code != 0 or doc["source"] != want:
                        raise RuntimeError(f"{name}: exit {r.code}, source {doc['source']}")
                    if rnd:
                        walls[name].append(r.wall)
                        cpus[name].append(r.cpu)
            starts, server_starts = [], []
            for i in range(samples):
                server = i % k
                sid, directory = created[server][i // k]
                sent = time.monotonic()
                _prompt(fleet.servers[server].url, fleet.passwords[server], sid, directory,
                        "fake/fake-model")
                shown = _wait(functools.partial(_running_on, board, sid), 120, "the start")
                starts.append(shown - sent)
                if sid in raw:
                    server_starts.append(raw[sid] - sent)
                log(f"[board] start #{i + 1} on the board after {starts[-1]:.2f} s"
                    + (f" (the server streamed it after {server_starts[-1]:.2f} s)"
                       if sid in raw else ""))
                _wait(functools.partial(_stopped_on, board, sid), 120, "the stop")
        finally:
            code = daemon.stop()
    finally:
        log("[board] stopping servers ...")
        fleet.stop()
    return {
        "project_sessions": k * m, "board_ready_s": ready, "daemon_exit": code,
        "measures": {n: {"wall": stats(walls[n]), "cpu": stats(cpus[n])} for n, _ in items},
        "start_on_board_s": starts,
        "start_on_board_median_s": statistics.median(starts) if starts else None,
        "server_streamed_busy_s": server_starts,
        "loadavg_end": list(os.getloadavg()),
    }


def _read(board: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(board.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _fresh(board: Path, k: int) -> bool:
    doc = _read(board)
    now = time.time() * 1000
    return doc is not None and sum(
        1 for i in doc["instances"] if now - i["confirmed_at_ms"] < 5000) == k


def _running_on(board: Path, sid: str) -> float | None:
    doc = _read(board)
    if doc is None:
        return None
    at = doc["fields"].index("running")
    for inst in doc["instances"]:
        for row in inst["sessions"]:
            if row[1] == sid and row[at]:
                return time.monotonic()
    return None


def _stopped_on(board: Path, sid: str) -> bool:
    return _running_on(board, sid) is None


def measure_projection(repeat: int, root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The projections alone (`python -m bench --board-projected`): no opencode server."""
    projected = [_projected(n, s, min(repeat, 3), root / f"p{n}x{s}", log)
                 for n, s in PROJECTIONS]
    return {"repeat": repeat, "projected": projected, "loadavg_end": list(os.getloadavg())}


def _projected(n: int, s: int, repeat: int, root: Path, log: Callable[[str], None]
               ) -> dict[str, Any]:
    """`status` over a board of ``n`` instances x ``s`` sessions (a config of the same), and,
    up to ``SCAN_UP_TO`` sessions each, `status --fresh` scanning as many light stand-in
    servers (bench/standin.py) of those sessions."""
    from bench.standin import StandIn

    if s > SCAN_UP_TO:
        return _projected_on(n, s, repeat, root, log, None)
    with StandIn(n, s, running=2) as fleet:
        return _projected_on(n, s, repeat, root, log, fleet)


def _projected_on(n: int, s: int, repeat: int, root: Path, log: Callable[[str], None],
                  fleet: Any) -> dict[str, Any]:
    from bench.__main__ import bytecode_env, hub_argv, run_child, stats
    from xaf_hub.config.load import load_config
    from xaf_hub.core.records import SessionRecord
    from xaf_hub.fleet.live_view import LiveInstance
    from xaf_hub.fleet.scan import InstanceScan
    from xaf_hub.ops.live_board import publish

    root.mkdir(parents=True)
    home = root / "home"
    urls = fleet.urls if fleet is not None else [f"http://127.0.0.1:{20000 + j}"
                                                  for j in range(n)]
    doc = {"instances": [{"name": f"i{j:02d}", "url": urls[j], "roots": ["/srv/proj"]}
                         for j in range(n)]}
    path = root / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    env = {**os.environ, "XAF_HUB_HOME": str(home), **bytecode_env(root)}
    cfg = load_config(str(path), env=env)
    now = int(time.time() * 1000)
    walls, cpus, sizes = [], [], []
    out = root / "out"
    out.mkdir()
    for rnd in range(repeat + 1):
        confirmed = int(time.time() * 1000)
        view = [LiveInstance(InstanceScan(inst, reachable=True, version="1.18.33", sessions=[
            SessionRecord(inst.name, f"ses_{j:06d}", f"task {j}", f"/srv/proj/w{j % 40}",
                          created=now - j, updated=now - j, cost=0.01, running=j < 2,
                          run_state="busy" if j < 2 else "idle", project=True)
            for j in range(s)]), "global", confirmed) for inst in cfg.instances]
        publish(cfg, view, "patrol")
        sizes.append((home / "live-board-patrol.json").stat().st_size)
        r = run_child([*hub_argv(), "--config", str(path), "status", "--json"], env, root,
                      out / "status.out", out / "status.err")
        got = json.loads((out / "status.out").read_text("utf-8"))
        if r.code != 0 or got["source"] != "live":
            raise RuntimeError(f"projected status: exit {r.code}, source {got.get('source')}")
        if rnd:
            walls.append(r.wall)
            cpus.append(r.cpu)
    scan: dict[str, Any] | None = None
    if fleet is not None:
        scan_walls, scan_cpus, answers = [], [], []
        for rnd in range(repeat + 1):
            asked = fleet.total()
            r = run_child([*hub_argv(), "--config", str(path), "status", "--json", "--fresh"],
                          env, root, out / "fresh.out", out / "fresh.err")
            got = json.loads((out / "fresh.out").read_text("utf-8"))
            if r.code not in (0, 2) or got["source"] != "scan":  # 2: some did not answer
                raise RuntimeError(f"projected status --fresh: exit {r.code}")
            if rnd:  # a scan past its deadline (a loaded machine) is counted, not hidden
                answers.append(sum(1 for i in got["instances"] if i["reachable"]))
                scan_walls.append(r.wall)
                scan_cpus.append(r.cpu)
        scan = {"wall": stats(scan_walls), "cpu": stats(scan_cpus),
                "requests": fleet.total() - asked, "answered": answers}
    log(f"[board] {n} x {s}: status {statistics.median(walls):.3f} s "
        f"({sizes[-1] / 1e6:.1f} MB board)"
        + (f", status --fresh {scan['wall']['median']:.3f} s ({scan['requests']} requests, "
           f"{min(scan['answered'])} of {n} answered at worst)" if scan else ""))
    return {"instances": n, "sessions_each": s, "board_mb": round(sizes[-1] / 1e6, 2),
            "wall": stats(walls), "cpu": stats(cpus), "scan": scan}


def render_projection(result: dict[str, Any]) -> str:
    """The projections' table: status from a board against a scan of stand-in servers."""
    from xaf_hub.core.text import table

    def cell(m: dict[str, Any] | None, key: str) -> str:
        return f"{m[key]['median']:.3f}" if m else "-"

    rows = [[f"{p['instances']} x {p['sessions_each']}", f"{p['board_mb']:.1f}",
             cell(p, "wall"), cell(p, "cpu"), cell(p.get("scan"), "wall"),
             cell(p.get("scan"), "cpu"),
             f"{p['scan']['wall']['median'] / p['wall']['median']:.1f}x" if p.get("scan")
             else "-",
             f"{min(p['scan']['answered'])}/{p['instances']}" if p.get("scan") else "-"]
            for p in result["projected"]]
    return ("status over a written board (no server asked) and status --fresh scanning as "
            "many light stand-in servers (bench/standin.py, 127.0.0.1)\n\n"
            + table(rows, ["instances x sessions", "board MB", "board s", "board cpu s",
                           "scan s", "scan cpu s", "scan / board", "answered (worst)"])
            + f"\nload average at the end: {result.get('loadavg_end', [0.0])[0]:.1f}\n")


def render(result: dict[str, Any]) -> str:
    """The real fleet's table, the start latencies, the projections."""
    from xaf_hub.core.text import table

    real = result["real"]
    ms = real["measures"]
    scan_w = ms["status --fresh (scan)"]["wall"]["median"]
    scan_c = ms["status --fresh (scan)"]["cpu"]["median"]
    rows = [[name, f"{m['wall']['median']:.3f}", f"{m['wall']['min']:.3f}-{m['wall']['max']:.3f}",
             f"{m['wall']['median'] / scan_w:.2f}x", f"{m['cpu']['median']:.3f}",
             f"{m['cpu']['median'] / scan_c:.2f}x"] for name, m in ms.items()]
    head = (f"live board, K={result['k']} M={result['m']} ({real['project_sessions']} project "
            f"sessions), {result['repeat']} rounds; load average at the end "
            f"{real['loadavg_end'][0]:.1f}")
    text = f"{head}\n\n" + table(rows, ["measure", "median s", "min-max s", "vs scan",
                                         "cpu s", "cpu vs scan"]) + "\n"
    starts = real["start_on_board_s"]
    if starts:
        text += (f"\nrun start on the board after prompt_async: median "
                 f"{real['start_on_board_median_s']:.2f} s ({min(starts):.2f}-{max(starts):.2f})")
        if real["server_streamed_busy_s"]:
            text += (f"; the server streamed busy after a median "
                     f"{statistics.median(real['server_streamed_busy_s']):.2f} s")
        text += "\n"
    return text + "\n" + render_projection(result)

