"""`xaf-hub serve` under a crowd: latency, memory and threads with slow clients holding sockets.

    python bench/serve.py                    # 50 slow-loris connections, 300 sessions
    python bench/serve.py --loris 50 --sessions 300 --requests 200

Self-contained (standard library, httpx, psutil), so it can measure another checkout: the
`xaf_hub` it starts is the one ``PYTHONPATH`` (or the venv) gives ``python -m xaf_hub``.
One fake opencode server (the classic dialect: health, a listing of ``--sessions`` project
sessions, an empty status) on 127.0.0.1 stands for the fleet; `serve` runs as a whole
process. Measured:

1. ``GET /health`` and ``GET /api/snapshot`` latency (median, p95; one keep-alive client,
   ``--requests`` each, the scan cached) with nobody else connected, then with ``--loris``
   connections open that sent half a request line and nothing more, then with ``--loris``
   ``/api/events`` viewers that never read;
2. the serve process's RSS and thread count in each of those states;
3. ``python -X importtime -m xaf_hub --help``: its wall time (median of 5 runs) and whether
   it imported starlette, uvicorn or h11.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil


def fake_fleet(directory: str, sessions: int) -> http.server.ThreadingHTTPServer:
    """One opencode-like server on 127.0.0.1 listing ``sessions`` sessions in ``directory``."""
    now = int(time.time() * 1000)
    rows = [
        {"id": f"ses_bench{i:06d}", "title": f"bench session {i}", "directory": directory,
         "time": {"created": now - 60_000 - i, "updated": now - i}, "cost": 0.01 * i}
        for i in range(sessions)
    ]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            path = self.path.split("?", 1)[0]
            if path == "/global/health":
                body = b'{"healthy":true,"version":"1.18.33"}'
            elif path == "/experimental/session":
                body = json.dumps(rows).encode()
            elif path == "/session/status":
                body = b"{}"
            elif path.endswith("/message"):
                body = b"[]"
            else:
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def latency(client: httpx.Client, url: str, n: int) -> dict[str, float]:
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.get(url)
        took.append((time.perf_counter() - t0) * 1000)
        assert r.status_code in (200, 503), r.status_code
    took.sort()
    return {"median_ms": round(statistics.median(took), 2),
            "p95_ms": round(took[int(0.95 * (len(took) - 1))], 2)}


def process_figures(proc: psutil.Process) -> dict[str, float]:
    return {"rss_mb": round(proc.memory_info().rss / 2**20, 1), "threads": proc.num_threads()}


def measure_state(base: str, n: int, ps: psutil.Process) -> dict[str, Any]:
    with httpx.Client(trust_env=False, timeout=60) as client:
        return {"health": latency(client, base + "health", n),
                "snapshot": latency(client, base + "api/snapshot", n),
                **process_figures(ps)}


def help_time(runs: int = 5) -> dict[str, Any]:
    walls, heavy = [], set()
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "xaf_hub", "--help"],
                           capture_output=True, text=True, check=True)
        walls.append((time.perf_counter() - t0) * 1000)
        heavy |= {mod for mod in ("starlette", "uvicorn", "h11")
                  if any(line.rstrip().endswith(f"| {mod}") for line in r.stderr.splitlines())}
    return {"wall_median_ms": round(statistics.median(walls), 1), "imports": sorted(heavy)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--loris", type=int, default=50)
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "app"
        project.mkdir()
        fleet = fake_fleet(str(project), args.sessions)
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps({
            "project": {"name": "bench"},
            "instances": [{"name": "a", "url": f"http://127.0.0.1:{fleet.server_port}",
                           "roots": [str(project)]}],
        }), "utf-8")
        env = {**os.environ, "XAF_HUB_HOME": str(Path(tmp) / "home")}
        env.pop("XAF_HUB_VIEWER_PASSWORD", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "xaf_hub", "--config", str(config), "serve", "--port", "0",
             "--cache-seconds", "600"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )
        held: list[socket.socket] = []
        try:
            assert proc.stdout is not None
            base = proc.stdout.readline().strip()
            port = int(base.rsplit(":", 1)[1].rstrip("/"))
            ps = psutil.Process(proc.pid)
            with httpx.Client(trust_env=False, timeout=60) as client:
                assert client.get(base + "api/snapshot").status_code == 200  # the first scan
            results: dict[str, Any] = {"quiet": measure_state(base, args.requests, ps)}
            for _ in range(args.loris):
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                s.sendall(b"GET /api/snapshot HTT")  # and never the rest
                held.append(s)
            time.sleep(0.5)
            # Within the request deadline (10 s): every loris is still held.
            results["loris"] = measure_state(base, args.requests, ps)
            for s in held:
                s.close()
            held.clear()
            time.sleep(0.5)
            for _ in range(args.loris):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(("127.0.0.1", port))
                s.sendall(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                held.append(s)  # and never read
            time.sleep(1.0)
            results["viewers"] = measure_state(base, args.requests, ps)
        finally:
            for s in held:
                s.close()
            proc.terminate()
            proc.wait(30)
            fleet.shutdown()
    results["help"] = help_time()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
