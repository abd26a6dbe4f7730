"""What a fleet event costs `serve`: HTTP requests to the servers and serve's CPU per 100
events, with an open page that fetches `/api/snapshot` after each change notice, as the page
does (architecture §5.1).

    python -m bench --serve-events                     # K=6 stand-in servers x M=100 sessions
    python -m bench --serve-events --k 10 --m 200 --events 100
    python -m bench --serve-events --tree /work/main   # the same against another checkout

The servers are bench/standin.py's light stand-ins on 127.0.0.1 (one process, many ports).
`serve` runs as a whole process from --tree (default: this checkout); one reader follows
`/api/events` (which starts serve's follower), waits until every instance is followed, then
each event is one run started or stopped on the stand-in (a `session.status` frame on its
stream), its notice awaited, and `/api/snapshot` fetched. Counted between the first and the
last event: requests the stand-ins answered (event streams included), serve's CPU (user +
system, /proc) and wall time. Writes bench/results/serve-events.json.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_serve_events(k: int, m: int, events: int, tree: Path, root: Path,
                         log: Callable[[str], None]) -> dict[str, Any]:
    """Run serve from ``tree`` over K stand-ins of M sessions; ``events`` runs started and
    stopped, each followed by a page fetch."""
    from bench.standin import StandIn

    with StandIn(k, m, running=0, directories=10) as fleet:
        doc = {"project": {"name": "bench"},
               "instances": [{"name": f"i{j:02d}", "url": url, "roots": ["/srv/proj"]}
                             for j, url in enumerate(fleet.urls)]}
        config = root / "config.json"
        config.write_text(json.dumps(doc), "utf-8")
        env = {**os.environ, "XAF_HUB_HOME": str(root / "home"), "PYTHONPATH": str(tree)}
        env.pop("XAF_HUB_VIEWER_PASSWORD", None)
        err = (root / "serve.err").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "xaf_hub", "--config", str(config),
                                 "serve", "--port", "0"], env=env, cwd=root,
                                stdout=subprocess.PIPE, stderr=err, text=True)
        notices: queue.Queue[dict[str, Any]] = queue.Queue()
        try:
            assert proc.stdout is not None
            base = proc.stdout.readline().strip().rstrip("/")
            if not base.startswith("http://127.0.0.1:"):
                raise RuntimeError(f"serve did not start: {base!r}")

            def listen() -> None:
                with httpx.Client(trust_env=False, timeout=httpx.Timeout(None)) as c, \
                        c.stream("GET", base + "/api/events") as resp:
                    for line in resp.iter_lines():
                        if line.startswith("data:"):
                            notices.put(json.loads(line[5:]))

            threading.Thread(target=listen, daemon=True).start()
            client = httpx.Client(trust_env=False, timeout=120)
            ready: set[str] = set()
            deadline = time.monotonic() + 120
            while len(ready) < k:
                n = notices.get(timeout=max(0.1, deadline - time.monotonic()))
                if n.get("event") == "ready":
                    ready.add(n["instance"])
            time.sleep(1.5)  # the follower's first views settle; then one fetch as the page
            while not notices.empty():
                notices.get_nowait()
            client.get(base + "/api/snapshot").raise_for_status()
            log(f"[serve] following {k} instances; {events} events ...")
            requests0, cpu0, wall0 = fleet.total(), _cpu_seconds(proc.pid), time.monotonic()
            sids = [list(rows) for rows in fleet.sessions]
            running = False
            for e in range(events):
                i = e % k
                if i == 0:
                    running = not running
                sid = sids[i][(e // (2 * k)) % m]
                fleet.run(i, sid, running)
                while True:  # the notice of this change
                    n = notices.get(timeout=300)
                    if n.get("session") == sid:
                        break
                doc = client.get(base + "/api/snapshot").json()
                if not any(s["id"] == sid for s in doc["sessions"]):
                    raise RuntimeError(f"{sid} missing from the served snapshot")
            requests = fleet.total() - requests0
            cpu = _cpu_seconds(proc.pid) - cpu0
            wall = time.monotonic() - wall0
            source = doc.get("source", "(not said)")
            client.close()
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
            err.close()
    per100 = 100 / events
    result = {"k": k, "m": m, "events": events, "tree": str(tree),
              "requests": requests, "requests_per_100_events": round(requests * per100),
              "cpu_s": round(cpu, 3), "cpu_s_per_100_events": round(cpu * per100, 3),
              "wall_s": round(wall, 2), "cpu_share_of_a_core": round(cpu / wall, 3),
              "last_source": source}
    log(f"[serve] {result['requests_per_100_events']} requests and "
        f"{result['cpu_s_per_100_events']:.2f} s of CPU per 100 events ({source})")
    return result


def render(result: dict[str, Any]) -> str:
    """One line of figures."""
    return (f"serve, K={result['k']} stand-ins x M={result['m']} sessions, {result['events']} "
            f"events (a page fetch after each), code from {result['tree']}:\n"
            f"  requests to the servers per 100 events: {result['requests_per_100_events']}\n"
            f"  serve's CPU per 100 events: {result['cpu_s_per_100_events']:.2f} s "
            f"({result['cpu_share_of_a_core'] * 100:.0f}% of a core over "
            f"{result['wall_s']:.1f} s)\n"
            f"  the last snapshot's source: {result['last_source']}\n")
