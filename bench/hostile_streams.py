"""Hostile event streams: one instance attacks the follower, a healthy one must still be heard.

    python -m bench.hostile_streams                 # every case, 15 s of attack each
    python -m bench.hostile_streams --seconds 8 --case flood --case endless-line

A loopback ``HostileStreamServer`` answers like opencode 1.18 (health, a listing with one
project session, status) and attacks on ``/global/event``, one way per case (``CASES``).
For each case a real ``xaf-hub watch --json`` runs as its own process over the hostile
instance and a healthy real ``opencode serve``; while the attack runs, sessions are created
on the healthy server and the time until `watch` prints each one is taken. Measured per
case: the follower's peak RSS (sampled every 50 ms), its CPU (% of one core over the
attack), the healthy server's change latency, and what the hostile stream cost it (bytes
sent, connections). ``tests/e2e/test_hostile_streams.py`` runs the same cases and asserts
the bounds; this script prints the table (and writes bench/results/hostile_streams.json).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.live import poll

RSS_LIMIT_MB = 150.0
CASES = (
    "none",  # the baseline: a well-behaved stream (heartbeats only)
    "bad-fields",
    "unknown-sessions",
    "foreign-sessions",
    "flood",
    "endless-line",
    "giant-frame",
    "malformed-json",
    "comments-only",
    "no-heartbeat",
    "reconnect-storm",
    "slowloris",
)
# The cases that send more than a stream's budget allows (frames/s or bytes/s).
OVER_BUDGET = frozenset({"flood", "endless-line", "giant-frame", "malformed-json"})
KNOWN = "ses_hostilestream"  # the one session the hostile listing holds (in the project)
FOREIGN = "ses_hostileforeign"  # a session the server has, outside the project


class _Quiet(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a follower that hangs up mid-attack is the point


class HostileStreamServer:
    """A loopback opencode 1.18 look-alike whose ``/global/event`` attacks (``mode``)."""

    def __init__(self, directory: str, mode: str) -> None:
        self.directory = directory
        self.mode = mode
        self.released = threading.Event()
        self.streams = 0  # event-stream connections opened
        self.sent = 0  # bytes written on event streams
        self.lookups = 0  # single-session reads (GET /session/<id>)
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - stdlib
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/global/health":
                        self._json(200, {"healthy": True, "version": "1.18.33"})
                    elif path == "/experimental/session":
                        self._json(200, [owner.session(KNOWN)])
                    elif path == "/session/status":
                        self._json(200, {})
                    elif path.endswith("/message"):
                        self._json(200, [])
                    elif path.startswith("/session/"):
                        with owner._lock:
                            owner.lookups += 1
                        if path == f"/session/{FOREIGN}":
                            self._json(200, owner.session(FOREIGN, "/elsewhere/not-ours"))
                        elif path == f"/session/{KNOWN}":
                            self._json(200, owner.session(KNOWN))
                        else:
                            self._json(404, {"name": "NotFoundError", "data": {}})
                    elif path == "/global/event":
                        owner._stream(self)
                    else:
                        self._json(404, {"name": "NotFoundError", "data": {}})
                except (BrokenPipeError, ConnectionResetError, OSError):
                    self.close_connection = True

            def _json(self, status: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = _Quiet(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> HostileStreamServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def session(self, ident: str, directory: str | None = None) -> dict[str, Any]:
        now = int(time.time() * 1000)
        return {"id": ident, "title": "hostile stream", "directory": directory or self.directory,
                "time": {"created": now - 60_000, "updated": now}, "cost": 0}

    def frame(self, kind: str, props: Any) -> bytes:
        doc = {"directory": self.directory, "payload": {"type": kind, "properties": props}}
        return b"data: " + json.dumps(doc).encode() + b"\n\n"

    # ------------------------------------------------------------------------- the attacks

    def _stream(self, h: http.server.BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.streams += 1
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("connection", "close")
        h.end_headers()
        h.close_connection = True
        out = h.wfile

        def send(data: bytes) -> None:
            out.write(data)
            out.flush()
            with self._lock:
                self.sent += len(data)

        hello = self.frame("server.connected", {})
        beat = self.frame("server.heartbeat", {})
        send(hello)
        mode = self.mode
        if mode == "reconnect-storm":
            return  # hang up at once, every time
        if mode == "none":
            while not self.released.wait(1.0):
                send(beat)
            return
        if mode == "no-heartbeat":
            self.released.wait()
            return
        if mode == "slowloris":
            while not self.released.is_set():
                for byte in beat:  # a heartbeat, one byte every 20 ms
                    send(bytes([byte]))
                    if self.released.wait(0.02):
                        return
            return
        if mode == "comments-only":
            send(beat)
            while not self.released.wait(0.05):
                send(b": keep-alive\n\n")
            return
        if mode == "endless-line":
            send(b'data: {"payload":{"type":"session.status","properties":{"pad":"')
            chunk = b"x" * 65536
            while not self.released.is_set():
                send(chunk)
            return
        for chunk in self._chunks(mode, beat):
            if self.released.is_set():
                return
            send(chunk)

    def _chunks(self, mode: str, beat: bytes) -> Iterator[bytes]:
        """The endless attack of the frame-based modes, chunk by chunk."""
        n = 0
        if mode == "flood":  # status frames for a project session, as fast as they go
            pair = (self.frame("session.status", {"sessionID": KNOWN, "status": {"type": "busy"}})
                    + self.frame("session.idle", {"sessionID": KNOWN}))
            block = pair * 400
            while True:
                yield block
        if mode == "malformed-json":
            bad = b'data: {"payload":{"type":"session.status","properties":{"sessionID":"s\n\n'
            block = bad * 1000
            while True:
                yield block
        if mode == "giant-frame":
            head = (b'data: {"payload":{"type":"session.status","properties":{"sessionID":"'
                    + KNOWN.encode() + b'","status":{"type":"busy"},"pad":"')
            bomb = (b'data: {"payload":{"type":"session.status","properties":{"sessionID":"'
                    + KNOWN.encode() + b'","x":[' + b"[]," * 330_000 + b'[]]}}}\n\n')
            while True:
                yield head  # a 32 MB frame, then a 1 MB one made of 330,000 empty lists
                for _ in range(512):
                    yield b"y" * 65536
                yield b'"}}}\n\n'
                yield bomb
                yield beat
        while True:  # the paced modes: a few hundred frames a second, heartbeats between
            n += 1
            if n % 100 == 0:
                yield beat
            time.sleep(0.002)
            if mode == "bad-fields":
                yield self._bad_field(n)
            elif mode == "unknown-sessions":
                yield self.frame("session.status", {"sessionID": f"ses_unknown{n:09d}",
                                                    "status": {"type": "busy"}})
            elif mode == "foreign-sessions":
                ghost = {"id": f"ses_ghost{n:09d}", "title": "ghost", "directory": self.directory,
                         "time": {"created": 1, "updated": 2}}
                foreign = {**ghost, "id": FOREIGN}
                yield self.frame("session.created", {"info": ghost})
                yield self.frame("session.updated", {"info": foreign})
                yield self.frame("session.status", {"sessionID": FOREIGN,
                                                    "status": {"type": "busy"}})
            else:
                raise ValueError(f"unknown case {mode!r}")

    def _bad_field(self, n: int) -> bytes:
        bad: list[tuple[str, Any]] = [
            ("session.status", {"sessionID": KNOWN, "status": {"type": "retry", "next": "soon",
                                                               "message": {"x": 1}}}),
            ("session.status", {"sessionID": KNOWN, "status": "busy"}),
            ("session.status", {"sessionID": 5, "status": {"type": "busy"}}),
            ("session.status", {"sessionID": "ses_\u0007bad", "status": {"type": "busy"}}),
            ("session.updated", {"info": [1, 2]}),
            ("session.updated", {"info": {"id": KNOWN, "time": "yesterday", "title": {"a": 1}}}),
            ("session.error", {"sessionID": KNOWN, "error": 7}),
            ("session.idle", {"sessionID": None}),
            ("session.deleted", {"sessionID": ["x"]}),
            ("session.status", "not an object"),
        ]
        kind, props = bad[n % len(bad)]
        return self.frame(kind, props)


# ----------------------------------------------------------------------------- measuring


@dataclass
class Row:
    """One case's figures."""

    case: str
    seconds: float
    peak_rss_mb: float = 0.0
    cpu_pct: float = 0.0  # during the attack after `watch` was following, % of one core
    cpu_total_s: float = 0.0  # CPU seconds of the whole process (start-up and attack)
    healthy_latency_s: list[float] = field(default_factory=list)
    healthy_missed: int = 0
    hostile_streams: int = 0
    hostile_mb_sent: float = 0.0
    hostile_reported: list[str] = field(default_factory=list)  # hostile sessions `watch` named
    warnings: list[str] = field(default_factory=list)  # watch's stderr lines about the hostile
    alive: bool = True
    errors: list[str] = field(default_factory=list)


class _Watch:
    """`xaf-hub watch --json --verbose` as its own process; lines collected with their time."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.out: list[tuple[float, str]] = []
        self.err: list[str] = []
        self._pumps = [threading.Thread(target=self._pump_out, daemon=True),
                       threading.Thread(target=self._pump_err, daemon=True)]
        for pump in self._pumps:
            pump.start()

    def _pump_out(self) -> None:
        for line in self.proc.stdout or ():
            self.out.append((time.monotonic(), line.rstrip("\n")))

    def _pump_err(self) -> None:
        for line in self.proc.stderr or ():
            self.err.append(line.rstrip("\n"))

    def events(self) -> list[tuple[float, dict[str, Any]]]:
        found = []
        for stamp, line in list(self.out):
            try:
                found.append((stamp, json.loads(line)))
            except ValueError:
                continue
        return found

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pump in self._pumps:
            pump.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def measure(
    case: str,
    *,
    watch_argv: list[str],
    env: dict[str, str],
    server: HostileStreamServer,
    hostile: str,
    new_healthy_session: Callable[[], str],
    seconds: float = 15.0,
    changes: int = 2,
    arrival_timeout: float = 60.0,
) -> Row:
    """Run ``watch`` while ``server`` attacks in ``case`` for ``seconds``; return the figures.

    ``new_healthy_session`` creates a session on the healthy server and returns its id;
    ``changes`` of them are made, spread over the attack.
    """
    import psutil

    server.mode = case
    row = Row(case, seconds)
    watch = _Watch(watch_argv, env)
    peak = [0]
    sampling = threading.Event()

    def sample() -> None:
        try:
            proc = psutil.Process(watch.proc.pid)
            while not sampling.is_set():
                peak[0] = max(peak[0], proc.memory_info().rss)
                time.sleep(0.05)
        except psutil.Error:
            return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        started = poll(lambda: any("watching" in line for line in watch.err), 90)
        if not started:
            row.errors.append("watch never said it was watching: " + " | ".join(watch.err[-3:]))
        cpu0 = psutil.Process(watch.proc.pid).cpu_times()
        t0 = time.monotonic()
        for i in range(changes):
            # Spread over the attack: the first after a third of it, the last near its end.
            at = t0 + seconds * (i + 1) / (changes + 1)
            time.sleep(max(0.0, at - time.monotonic()))
            made = time.monotonic()
            sid = new_healthy_session()

            def seen(sid: str = sid) -> float | None:
                for stamp, ev in watch.events():
                    if ev.get("event") == "new" and (ev.get("session") or {}).get("id") == sid:
                        return stamp
                return None

            arrived = poll(seen, arrival_timeout)
            if arrived is None:
                row.healthy_missed += 1
            else:
                row.healthy_latency_s.append(round(arrived - made, 2))
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))
        wall = time.monotonic() - t0
        row.alive = watch.proc.poll() is None
        if row.alive:
            cpu1 = psutil.Process(watch.proc.pid).cpu_times()
            used = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
            row.cpu_pct = round(100 * used / wall, 1)
            row.cpu_total_s = round(cpu1.user + cpu1.system, 2)
    finally:
        sampling.set()
        sampler.join(5)
        server.released.set()
        watch.stop()
        server.released.clear()
    row.peak_rss_mb = round(peak[0] / 1024 / 1024, 1)
    row.hostile_streams = server.streams
    row.hostile_mb_sent = round(server.sent / 1024 / 1024, 1)
    server.streams = server.sent = 0
    for _, ev in watch.events():
        session = ev.get("session") or {}
        if ev.get("instance") == hostile and session.get("id") and ev.get("event") == "new":
            row.hostile_reported.append(str(session["id"]))
    row.warnings = [line for line in watch.err if hostile in line][-5:]
    if any("Traceback" in line or "internal error" in line for line in watch.err):
        row.errors.append("watch: " + " | ".join(watch.err[-5:]))
    return row


def table(rows: list[Row]) -> str:
    """The figures as a fixed-width table."""
    head = (f"{'case':<22} {'peak RSS':>9} {'CPU':>6} {'CPU s':>6} "
            f"{'healthy change seen after':>26} "
            f"{'streams':>7} {'MB sent':>8}  hostile instance, as watch says")
    lines = [f"hostile event streams: the follower's cost (limit {RSS_LIMIT_MB:g} MB) and "
             "whether a healthy server's change still arrives", head, "-" * len(head)]
    for r in rows:
        seen = ", ".join(f"{s:.1f} s" for s in r.healthy_latency_s) or "-"
        if r.healthy_missed:
            seen += f" ({r.healthy_missed} MISSED)"
        said = r.warnings[-1].split(" ", 1)[-1][:70] if r.warnings else ""
        lines.append(f"{r.case:<22} {r.peak_rss_mb:>6.1f} MB {r.cpu_pct:>5.1f}% "
                     f"{r.cpu_total_s:>6.2f} {seen:>26} "
                     f"{r.hostile_streams:>7} {r.hostile_mb_sent:>8.1f}  {said}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- standalone


def main(argv: list[str] | None = None) -> int:
    from sandbox import fleet as sandbox

    p = argparse.ArgumentParser(prog="python -m bench.hostile_streams")
    p.add_argument("--seconds", type=float, default=15.0, help="attack length per case")
    p.add_argument("--case", action="append", choices=CASES, help="only these cases")
    args = p.parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        project = root / "proj"
        (project / "app").mkdir(parents=True)
        with sandbox.Fleet(root / "fleet", 1) as fl, \
                HostileStreamServer(str(project / "app"), "flood") as hostile:
            healthy = fl.servers[0]
            config = {
                "project": {"name": "hostile-streams"},
                "instances": [
                    {"name": "healthy", "url": healthy.url, "roots": [str(project)],
                     "default_directory": str(project / "app")},
                    {"name": "hostile", "url": hostile.url, "roots": [str(project)]},
                ],
            }
            (root / "config.json").write_text(json.dumps(config), "utf-8")
            env = {**os.environ, "XAF_HUB_HOME": str(root / "home"),
                   "XAF_HUB_PW_HEALTHY": fl.passwords[0] or ""}
            argv_ = [sys.executable, "-m", "xaf_hub", "--config", str(root / "config.json"),
                     "watch", "--json", "--verbose"]

            def new_session() -> str:
                made = sandbox.create_session(healthy.url, fl.passwords[0], project / "app",
                                              "healthy change")
                return str(made["id"])

            for case in args.case or CASES:
                rows.append(measure(case, watch_argv=argv_, env=env, server=hostile,
                                    hostile="hostile", new_healthy_session=new_session,
                                    seconds=args.seconds))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    out = Path(__file__).parent / "results" / "hostile_streams.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n", "utf-8")
    return 0 if all(_ok(r) for r in rows) else 1


def _ok(r: Row) -> bool:
    return (r.alive and not r.errors and not r.healthy_missed and not r.hostile_reported
            and r.peak_rss_mb < RSS_LIMIT_MB)


if __name__ == "__main__":
    raise SystemExit(main())
