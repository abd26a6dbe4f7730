"""Benchmark xaf-hub against K real opencode servers with M project sessions each.

    python -m bench                       # K=6 M=500, then K=12 M=2000; 5 timed rounds each
    python -m bench --sizes small --repeat 3
    python -m bench --k 3 --m 200         # one custom size
    python -m bench --sizes small --projects 3   # a config of three projects
    python -m bench --rounds              # a patrol round's cost, first and second, vs status
    python -m bench --pool                # the Redis task pool's claims at 1k and 10k tasks
    python -m bench --serve-events        # requests and CPU per fleet event in serve
    python -m bench --board-projected     # status from a 50-instance board vs a scan
    python -m bench --soak --minutes 3 --seed 53   # real faults at random, invariants checked

Every command runs as a whole process, as a user would run it. Per size it measures, over
--repeat rounds (after one warm-up round, in rotating order so drift hits all alike): the
hub commands, the floor (bench/floor.py: the same HTTP requests in one minimal httpx
process), that script's empty start-up, bare Python start-up and ``xaf-hub --help``; then
``-X importtime`` and a cProfile of each command once. The matcher is timed at 1k, 10k and
50k sessions in its own processes. Prints one table; writes bench/results/latest.json (and
latest.md, the table for the README). Every server is stopped at the end, also on Ctrl+C.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import pstats
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import (
    DISPATCH_TEXT,
    EXCLUDE_SUBSTRING,
    PROJECT_SUBDIRS,
    SessionSpec,
    sessions_for_server,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
FLOOR_SCRIPT = REPO / "bench" / "floor.py"

SIZES = {"small": (6, 500), "large": (12, 2000)}
COMMANDS: dict[str, tuple[str, ...]] = {
    "status": ("status",),
    "instances": ("instances",),
    "sessions --json": ("sessions", "--json"),
    "dispatch --dry-run": ("dispatch", "--dry-run", "--text", DISPATCH_TEXT),
    "watch --once": ("watch", "--once"),
}
# The floor each command is compared with: dispatch asks run state of project directories only.
FLOOR_OF = {name: "floor" for name in COMMANDS} | {"dispatch --dry-run": "floor project-only"}
# The floor as it was before it asked, as the hub does, for the runs waiting for a person:
# shown beside the floor, so that figures from before the change can still be compared.
NO_WAITING = "floor without waiting round"
RATIO_TARGET = 1.5
RATIO_COMMANDS = ("status", "sessions --json", "dispatch --dry-run")
HELP_TARGET_S = 0.25
MATCH_TARGET_S = 0.3
MEMORY_TARGET_MB = 250.0
FORBIDDEN_IN_STATUS = ("sklearn", "jinja2", "apscheduler")
MATCHER_SIZES = (1000, 10000, 50000)
SLOW_MODEL = "fake/slow-model"
SERVER_START_BATCH = 3
CREATE_THREADS = 8
# The hub's own settings for a scan (config defaults), mirrored by the floor.
PAGE_SIZE = 8000
STATUS_FAN_OUT = 16


# -- child processes ------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One finished child process."""

    wall: float
    cpu: float
    rss_mb: float
    code: int


# Runs one command from a tiny interpreter and reports its wall time, CPU time and peak RSS.
# Why a separate launcher: on Linux a child's ru_maxrss starts at the RSS of the process it
# was forked from (exec records the old mm's high-water mark, and vfork/posix_spawn share the
# parent's mm), so children of this ~50 MB benchmark would all report >= 50 MB. Forked from
# a ~10 MB `python -S -I`, a child's own peak shows (every measured child is bigger than that).
_LAUNCHER = """\
import os, sys, time
res, argv = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execv(argv[0], argv)
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(res, "w") as f:
    f.write("%r %r %r %d" % (wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss,
                             os.waitstatus_to_exitcode(status)))
"""


def run_child(argv: Sequence[str], env: dict[str, str], cwd: Path, out: Path, err: Path) -> Run:
    """Run ``argv`` to completion; wall time, CPU time and peak RSS of that child alone."""
    res = out.with_suffix(".rusage")
    res.unlink(missing_ok=True)
    exe = argv[0] if os.path.isabs(argv[0]) else (shutil.which(argv[0]) or argv[0])
    with open(out, "wb") as fo, open(err, "wb") as fe:
        subprocess.run([sys.executable, "-S", "-I", "-c", _LAUNCHER, str(res), exe, *argv[1:]],
                       stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                       check=True)
    wall, cpu, rss_kb, code = res.read_text().split()
    return Run(float(wall), float(cpu), int(rss_kb) / 1024.0, int(code))


def stats(values: Sequence[float]) -> dict[str, float]:
    """Median and spread of a sample."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def bytecode_env(root: Path) -> dict[str, str]:
    """Let children cache bytecode in a private folder, as an installed package would.

    This environment sets PYTHONDONTWRITEBYTECODE=1, which makes every run compile the
    hub's sources again (~0.15 s); a pip-installed hub has its .pyc files. The prefix keeps
    the cache out of the repository.
    """
    return {"PYTHONPYCACHEPREFIX": str(root / "pycache"), "PYTHONDONTWRITEBYTECODE": ""}


def hub_argv() -> list[str]:
    """The installed console script next to this interpreter (no pyenv shim in between)."""
    script = Path(sys.executable).with_name("xaf-hub")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "xaf_hub"]


def check_memory(minimum_gb: float = 2.0) -> None:
    """Stop before the machine runs out of memory (the servers grow with their sessions)."""
    import psutil

    available = psutil.virtual_memory().available / 2**30
    if available < minimum_gb:
        raise RuntimeError(f"only {available:.1f} GB of memory left; stopping the benchmark")


# -- the fleet ------------------------------------------------------------------------------


@dataclass
class BenchFleet:
    """K servers with their sessions, a hub config, and everything needed to stop them."""

    root: Path
    k: int
    m: int
    busy_per_server: int
    log: Callable[[str], None]
    servers: list[Any] = field(default_factory=list)
    passwords: list[str] = field(default_factory=list)
    llm: Any = None
    seeded: int = 0
    busy: int = 0
    seed_seconds: float = 0.0
    start_seconds: float = 0.0
    models: tuple[str, ...] = ("fake/fake-model", SLOW_MODEL)
    projects: int = 1  # the config's projects: the sub-folders shared out, the rest the last's

    @property
    def project_root(self) -> Path:
        return self.root / "work" / "shop"

    @property
    def outside_root(self) -> Path:
        return self.root / "elsewhere"

    def names(self) -> list[str]:
        return [f"bench-{i:02d}" for i in range(self.k)]

    def start(self) -> None:
        """Start the fake model and the servers, a few at a time (2 cores)."""
        from sandbox import fleet as sandbox
        from sandbox.fake_llm import FakeLLM

        binary = sandbox.find_opencode_binary(REPO)
        self.llm = FakeLLM()
        self.llm.start()
        # Busy sessions stream keep-alive frames for hours; stopping the fake releases them.
        self.llm.set_mode(SLOW_MODEL.split("/", 1)[1], "slow", delay=6 * 3600.0, interval=5.0)
        config = sandbox.fake_provider_config(self.llm.url, self.models)
        self.passwords = [secrets.token_urlsafe(12) for _ in range(self.k)]
        t0 = time.perf_counter()
        for first in range(0, self.k, SERVER_START_BATCH):
            check_memory(1.0 + 0.5 * min(SERVER_START_BATCH, self.k - first))
            batch = []
            for i in range(first, min(first + SERVER_START_BATCH, self.k)):
                server = sandbox.OpencodeServer(
                    binary, home=self.root / f"server{i}" / "home",
                    cwd=self.root / f"server{i}" / "cwd", password=self.passwords[i],
                    config=config, start_timeout=180.0)
                self.servers.append(server)  # before start: stop() must reach a half-started one
                batch.append(server)
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                for f in [pool.submit(s.start) for s in batch]:
                    f.result()
            self.log(f"  {len(self.servers)}/{self.k} servers listening")
        self.start_seconds = time.perf_counter() - t0

    def seed(self) -> list[list[tuple[str, str]]]:
        """Create every session through the API; returns (id, directory) of project ones."""
        import httpx

        from sandbox import fleet as sandbox

        specs = [
            sessions_for_server(str(self.project_root), str(self.outside_root), self.m, seed=i)
            for i in range(self.k)
        ]
        for d in {s.directory for per in specs for s in per}:
            Path(d).mkdir(parents=True, exist_ok=True)
        local = threading.local()
        clients: list[httpx.Client] = []
        lock = threading.Lock()

        def client(i: int) -> httpx.Client:
            # One pooled client per thread and server: a fresh client per request costs
            # more than the request (TLS context set-up) at 25k sessions.
            per: dict[int, httpx.Client] = getattr(local, "clients", {})
            local.clients = per
            if i not in per:
                c = httpx.Client(base_url=self.servers[i].url, trust_env=False,
                                 headers=sandbox.auth_headers(self.passwords[i]),
                                 timeout=httpx.Timeout(60.0, connect=5.0))
                per[i] = c
                with lock:
                    clients.append(c)
            return per[i]

        def create(i: int, spec: SessionSpec) -> tuple[int, str, str]:
            resp = client(i).post("/session", params={"directory": spec.directory},
                                  json={"title": spec.title})
            if resp.status_code >= 400:
                raise RuntimeError(f"create session on server {i}: HTTP {resp.status_code}")
            return i, str(resp.json()["id"]), spec.directory

        # Interleave servers so every one is being filled at once.
        jobs = [(i, per[j]) for j in range(max(map(len, specs))) for i, per in enumerate(specs)
                if j < len(per)]
        created: list[list[tuple[str, str]]] = [[] for _ in range(self.k)]
        outside = str(self.outside_root)
        t0 = time.perf_counter()
        pool = ThreadPoolExecutor(max_workers=CREATE_THREADS)
        try:
            futures: list[Future[tuple[int, str, str]]] = [
                pool.submit(create, i, s) for i, s in jobs]
            for n, f in enumerate(futures, 1):
                i, sid, directory = f.result()
                if not directory.startswith(outside):
                    created[i].append((sid, directory))
                if n % 2000 == 0:
                    self.log(f"  {n}/{len(jobs)} sessions created")
                    check_memory()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            for c in clients:
                c.close()
        self.seed_seconds = time.perf_counter() - t0
        self.seeded = len(jobs)
        return created

    def make_busy(self, created: list[list[tuple[str, str]]]) -> None:
        """Prompt a few project sessions per server with the slow model; wait until busy."""
        import httpx

        from sandbox import fleet as sandbox

        def client(i: int) -> httpx.Client:
            # Roomier than the sandbox helpers' 15 s: a loaded 2-core box answers slowly.
            return httpx.Client(base_url=self.servers[i].url, trust_env=False,
                                headers=sandbox.auth_headers(self.passwords[i]),
                                timeout=httpx.Timeout(90.0, connect=10.0))

        targets = []
        for i, per in enumerate(created):
            with client(i) as c:
                for sid, directory in per[: self.busy_per_server]:
                    body = {"parts": [{"type": "text", "text": "work on it slowly"}],
                            "model": {"providerID": SLOW_MODEL.split("/")[0],
                                      "modelID": SLOW_MODEL.split("/")[1]}}
                    resp = c.post(f"/session/{sid}/prompt_async", json=body)
                    if resp.status_code != 204:
                        raise RuntimeError(f"prompt_async on server {i}: HTTP {resp.status_code}")
                    targets.append((i, sid, directory))
        deadline = time.monotonic() + 300.0
        pending = set(targets)
        while pending and time.monotonic() < deadline:
            for t in sorted(pending):
                i, sid, directory = t
                with contextlib.suppress(httpx.TimeoutException), client(i) as c:
                    if sid in c.get("/session/status", params={"directory": directory}).json():
                        pending.discard(t)
            if pending:
                time.sleep(1.0)
        self.busy = len(targets) - len(pending)
        if pending:
            self.log(f"  warning: {len(pending)} session(s) did not turn busy within 300 s")

    def server_rss_mb(self) -> float:
        """Summed RSS of the servers now."""
        import psutil

        total = 0
        for s in self.servers:
            with contextlib.suppress(Exception):
                total += psutil.Process(s.pid).memory_info().rss
        return total / 2**20

    def write_config(self) -> tuple[Path, Path, dict[str, str]]:
        """The hub config, the floor's spec, and the hub's environment."""
        hub_home = self.root / "hub-home"
        hub_home.mkdir(parents=True, exist_ok=True)
        instances = [{"name": n, "url": s.url, "roots": [str(self.project_root)],
                      "default_directory": str(self.project_root)}
                     for n, s in zip(self.names(), self.servers, strict=True)]
        doc: dict[str, Any] = {
            "project": {"name": "bench", "exclude_substrings": [EXCLUDE_SUBSTRING]},
            "concurrency_limit": max(4, self.busy_per_server + 2),
            "timeouts": {"connect_seconds": 5, "read_seconds": 60},
            "page_size": PAGE_SIZE,
            "models": {"default_dispatch_model": "fake/fake-model"},
            "instances": instances,
        }
        if self.projects > 1:
            doc.pop("project")
            for inst in instances:
                inst.pop("roots"), inst.pop("default_directory")
            doc["projects"] = self.project_sections()
        cfg = self.root / "config.json"
        cfg.write_text(json.dumps(doc, ensure_ascii=False, indent=2), encoding="utf-8")
        spec = self.root / "floor.json"
        spec.write_text(json.dumps({
            "page_size": PAGE_SIZE, "fan_out": STATUS_FAN_OUT,
            "roots": [str(self.project_root)], "exclude_substrings": [EXCLUDE_SUBSTRING],
            "instances": [{"url": s.url, "username": "opencode", "password": pw}
                          for s, pw in zip(self.servers, self.passwords, strict=True)],
        }), encoding="utf-8")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("XAF_HUB_") and k.lower() not in ("http_proxy", "https_proxy",
                                                                      "all_proxy")}
        env["XAF_HUB_HOME"] = str(hub_home)
        env.update(bytecode_env(self.root.parent))
        for name, pw in zip(self.names(), self.passwords, strict=True):
            env["XAF_HUB_PW_" + name.upper().replace("-", "_")] = pw
        return cfg, spec, env

    def project_sections(self) -> dict[str, Any]:
        """``projects`` p1..pN: the top sub-folders shared out among all but the last, which
        holds the rest of the checkout (the first project whose roots hold a folder owns it)."""
        tops = sorted({sub.split("/")[0] for sub in PROJECT_SUBDIRS if sub})
        root = str(self.project_root)
        shares = [[f"{root}/{t}" for t in tops[i::self.projects - 1]]
                  for i in range(self.projects - 1)] + [[root]]
        return {f"p{i + 1}": {"exclude_substrings": [EXCLUDE_SUBSTRING],
                              "roots": {n: roots for n in self.names()}}
                for i, roots in enumerate(shares)}

    def commands(self) -> dict[str, tuple[str, ...]]:
        """``COMMANDS``, dispatch naming the last project when there are several."""
        last = ("--project", f"p{self.projects}") if self.projects > 1 else ()
        return {name: (*args, *last) if name.startswith("dispatch") else args
                for name, args in COMMANDS.items()}

    def stop(self) -> None:
        """Stop every server (in parallel), then the fake model."""
        if self.servers:
            with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
                list(pool.map(lambda s: s.stop(grace=3.0), self.servers))
        if self.llm is not None:
            self.llm.stop()
            self.llm = None


# -- measuring one size ---------------------------------------------------------------------


def settle(threshold: float, log: Callable[[str], None], max_wait: float = 120.0) -> float:
    """Wait (bounded) until the CPUs were busy under ``threshold`` % for a second; return it.

    The machine is shared: another engineer's test run can take both cores for minutes.
    The 1-minute load average lags too much (it mostly shows our own previous round).
    """
    import psutil

    busy = float(psutil.cpu_percent(interval=1.0))
    if threshold <= 0 or busy < threshold:
        return busy
    log(f"  CPUs {busy:.0f}% busy; waiting (at most {max_wait:.0f} s) for under {threshold:g}% ...")
    deadline = time.monotonic() + max_wait
    while busy >= threshold and time.monotonic() < deadline:
        busy = float(psutil.cpu_percent(interval=2.0))
    return busy


def parse_importtime(text: str) -> dict[str, Any]:
    """Total import time, top-level packages by cumulative time, and every module imported."""
    total_us = 0
    top: list[tuple[str, int]] = []
    modules: set[str] = set()
    for line in text.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if not m:
            continue
        self_us, cum_us, indent, name = int(m[1]), int(m[2]), len(m[3]), m[4]
        total_us += self_us
        modules.add(name)
        if indent <= 1:
            top.append((name, cum_us))
    top.sort(key=lambda x: -x[1])
    roots = sorted({n.split(".")[0] for n in modules})
    return {"total_ms": total_us / 1000, "modules": len(modules),
            "top": [{"module": n, "cumulative_ms": us / 1000} for n, us in top[:12]],
            "packages": roots}


def profile_summary(path: Path, limit: int = 25) -> dict[str, Any]:
    """The top functions by cumulative and by own time of a cProfile dump, as text."""
    out: dict[str, Any] = {}
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(str(path), stream=buf).strip_dirs().sort_stats(key).print_stats(limit)
        text = buf.getvalue()
        out[key] = text[text.find("ncalls"):] if "ncalls" in text else text
        total = re.search(r"in ([\d.]+) seconds", text)
        out["total_s"] = float(total[1]) if total else None
    return out


def measure_size(
    label: str, k: int, m: int, repeat: int, busy: int, root: Path,
    log: Callable[[str], None], settle_cpu: float, projects: int = 1,
) -> dict[str, Any]:
    """Start the fleet, time everything, stop the fleet."""
    fleet = BenchFleet(root, k, m, busy, log, projects=projects)
    result: dict[str, Any] = {"label": label, "k": k, "m": m, "repeat": repeat,
                              "projects": projects}
    try:
        log(f"[{label}] starting {k} opencode servers ...")
        fleet.start()
        log(f"[{label}] creating {k} x ({m} project + {m // 10} other) sessions ...")
        created = fleet.seed()
        log(f"[{label}] {fleet.seeded} sessions in {fleet.seed_seconds:.1f} s; "
            "making some busy ...")
        fleet.make_busy(created)
        cfg, spec, env = fleet.write_config()
        result["fleet"] = {
            "sessions_total": fleet.seeded,
            "project_sessions": sum(len(c) for c in created),
            "busy_sessions": fleet.busy,
            "directories_per_server": len({d for _, d in created[0]}) + 5,
            "server_start_s": round(fleet.start_seconds, 2),
            "seed_s": round(fleet.seed_seconds, 2),
            "servers_rss_mb": round(fleet.server_rss_mb()),
        }
        result.update(time_commands(cfg, spec, env, root, repeat, fleet, log, label,
                                    settle_cpu))
    finally:
        log(f"[{label}] stopping servers ...")
        fleet.stop()
    return result


def time_commands(
    cfg: Path, spec: Path, env: dict[str, str], root: Path, repeat: int, fleet: BenchFleet,
    log: Callable[[str], None], label: str, settle_cpu: float,
) -> dict[str, Any]:
    """Warm up, then time every item ``repeat`` times in rotating order."""
    hub = hub_argv()
    items: list[tuple[str, list[str]]] = [
        ("python start-up", [sys.executable, "-c", "pass"]),
        ("floor start-up", [sys.executable, str(FLOOR_SCRIPT), "--empty"]),
        ("floor", [sys.executable, str(FLOOR_SCRIPT), str(spec)]),
        ("floor project-only", [sys.executable, str(FLOOR_SCRIPT), str(spec), "--project-only"]),
        (NO_WAITING, [sys.executable, str(FLOOR_SCRIPT), str(spec), "--no-waiting"]),
        ("xaf-hub --help", [*hub, "--help"]),
        *[(name, [*hub, "--config", str(cfg), *args]) for name, args in fleet.commands().items()],
    ]
    cwd = root / "cwd"
    cwd.mkdir(exist_ok=True)
    outdir = root / "out"
    outdir.mkdir(exist_ok=True)
    runs: dict[str, list[Run]] = {name: [] for name, _ in items}
    floor_inproc: dict[str, list[float]] = {"floor": [], "floor project-only": [], NO_WAITING: []}
    floor_requests: dict[str, int] = {}
    checks: dict[str, Any] = {}

    def one(name: str, argv: list[str], record: bool) -> None:
        slug = re.sub(r"\W+", "_", name)
        out, err = outdir / f"{slug}.out", outdir / f"{slug}.err"
        r = run_child(argv, env, cwd, out, err)
        if r.code != 0:
            raise RuntimeError(f"{name} exited {r.code}: "
                               f"{err.read_text('utf-8', 'replace')[-800:]}")
        if name in floor_inproc:
            doc = json.loads(out.read_text("utf-8"))
            floor_requests[name] = int(doc["requests"])
            checks[f"{name} sessions"] = int(doc["sessions"])
            if record:
                floor_inproc[name].append(float(doc["seconds"]))
        if name == "sessions --json" and not record:
            checks["hub_project_sessions"] = len(json.loads(out.read_text("utf-8"))["sessions"])
        if record:
            runs[name].append(r)

    log(f"[{label}] warm-up round ...")
    for name, argv in items:
        one(name, argv, record=False)
    expected_project = fleet.k * fleet.m
    for floor in floor_inproc:
        if checks.get(f"{floor} sessions") != fleet.seeded:
            raise RuntimeError(f"{floor} saw {checks.get(f'{floor} sessions')} sessions, "
                               f"{fleet.seeded} were created")
    if checks.get("hub_project_sessions") != expected_project:
        raise RuntimeError(f"sessions --json listed {checks.get('hub_project_sessions')} "
                           f"project sessions, expected {expected_project}")
    load: list[float] = []
    cpu_busy: list[float] = []
    for rnd in range(repeat):
        cpu_busy.append(round(settle(settle_cpu, log), 1))
        load.append(round(os.getloadavg()[0], 2))
        log(f"[{label}] round {rnd + 1}/{repeat} (CPUs {cpu_busy[-1]:.0f}% busy, "
            f"load average {load[-1]:.2f}) ...")
        shift = rnd % len(items)
        for name, argv in items[shift:] + items[:shift]:
            one(name, argv, record=True)

    measures: dict[str, Any] = {}
    for name, rs in runs.items():
        measures[name] = {
            "wall": stats([r.wall for r in rs]),
            "cpu": stats([r.cpu for r in rs]),
            "peak_rss_mb": max(r.rss_mb for r in rs),
            "samples": [round(r.wall, 4) for r in rs],
        }
    for floor, values in floor_inproc.items():
        measures[floor]["requests_s"] = stats(values)
        measures[floor]["requests"] = floor_requests[floor]

    log(f"[{label}] import times and profiles ...")
    imports: dict[str, Any] = {}
    profiles: dict[str, Any] = {}
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name, args in [("xaf-hub --help", ("--help",)), *fleet.commands().items()]:
        slug = re.sub(r"\W+", "_", name).strip("_")
        full = list(args) if name == "xaf-hub --help" else ["--config", str(cfg), *args]
        err = outdir / f"importtime_{slug}.err"
        run_child([sys.executable, "-X", "importtime", "-m", "xaf_hub", *full], env, cwd,
                  outdir / f"importtime_{slug}.out", err)
        imports[name] = parse_importtime(err.read_text("utf-8", "replace"))
        if name in ("status", "dispatch --dry-run", "sessions --json"):
            prof = outdir / f"{slug}.prof"
            run_child([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "xaf_hub", *full],
                      env, cwd, outdir / f"prof_{slug}.out", outdir / f"prof_{slug}.err")
            summary = profile_summary(prof)
            profiles[name] = summary
            (RESULTS / f"profile-{label}-{slug}.txt").write_text(
                f"# cProfile of `xaf-hub {' '.join(args)}` at {label} "
                f"(K={fleet.k}, M={fleet.m})\n\n## by cumulative time\n{summary['cumulative']}\n"
                f"## by own time\n{summary['tottime']}\n", encoding="utf-8")
    return {"measures": measures, "imports": imports, "profiles": profiles, "checks": checks,
            "loadavg_per_round": load, "cpu_busy_percent_per_round": cpu_busy}


# -- the matcher ----------------------------------------------------------------------------


def probe_matcher(n: int, repeat: int) -> dict[str, Any]:
    """In this (child) process: import cost, then build+query time over ``n`` sessions."""
    import resource

    from bench import matcher_documents

    t0 = time.perf_counter()
    # Timed here so the rank() timing below is "after import".
    from xaf_hub.core.matcher import Evidence, rank

    import_s = time.perf_counter() - t0
    raw = matcher_documents(n)
    rank(DISPATCH_TEXT, [("warm", Evidence("warm up", "/srv/shop/web"))])
    build, query = [], []
    for _ in range(repeat):
        t1 = time.perf_counter()
        # What dispatch ranks: each session's title and folder as evidence (ops/dispatch.py).
        docs = [(f"k{i}", Evidence(t, d)) for i, (t, d) in enumerate(raw)]
        t2 = time.perf_counter()
        best = rank(DISPATCH_TEXT, docs, top=5)
        t3 = time.perf_counter()
        build.append(t2 - t1)
        query.append(t3 - t2)
    total = [b + q for b, q in zip(build, query, strict=True)]
    return {
        "n": n, "import_s": import_s, "documents_s": stats(build), "rank_s": stats(query),
        "total_s": stats(total), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF)
        .ru_maxrss / 1024.0, "best_score": best[0].score if best else 0.0,
    }


def measure_matcher(
    repeat: int, root: Path, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Each size in its own process, so memory and caches start clean."""
    out = []
    for n in MATCHER_SIZES:
        log(f"[matcher] {n} sessions ...")
        proc = subprocess.run(
            [sys.executable, "-m", "bench", "--probe-matcher", str(n), "--repeat", str(repeat)],
            cwd=REPO, capture_output=True, text=True, check=True,
            env={**os.environ, **bytecode_env(root)})
        out.append(json.loads(proc.stdout))
    return out


# -- machine, verdicts, table ---------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_gb = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    from xaf_hub.fleet.releases import OPENCODE_VERSION

    return {
        "nproc": os.cpu_count(), "cpu": cpu, "memory_gb": round(mem_gb, 1),
        "os": platform.platform(), "python": platform.python_version(),
        "opencode": OPENCODE_VERSION, "loadavg_start": list(os.getloadavg()),
    }


def code_state() -> str:
    """The commit plus a hash of uncommitted changes under xaf_hub/ (others edit while we run)."""
    import hashlib

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                              check=False).stdout

    head = git("rev-parse", "--short", "HEAD").decode().strip() or "unknown"
    diff = git("diff", "HEAD", "--", "xaf_hub")
    return f"{head}+{hashlib.sha1(diff).hexdigest()[:8]}" if diff else head


def denominator(
    size: dict[str, Any], command: str, key: str = "median", floor: str | None = None
) -> float:
    """Floor + Python start-up: the command's floor requests (or ``floor``'s) plus the script's
    empty start-up."""
    ms = size["measures"]
    floor = floor or FLOOR_OF[command]
    return float(ms[floor]["requests_s"][key] + ms["floor start-up"]["wall"][key])


def cpu_ratio(size: dict[str, Any], command: str, key: str = "median") -> float:
    """The command's CPU time over its floor process's (start-up and requests alike).

    Printed beside the wall-time ratio, never judged: on a loaded machine the wall time of
    either side stretches with the run queue, the CPU time much less."""
    ms = size["measures"]
    return float(ms[command]["cpu"][key] / ms[FLOOR_OF[command]]["cpu"][key])


def verdicts(
    sizes: dict[str, dict[str, Any]], matcher: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Every target of the issue with its measured value and whether it is met."""
    out: list[dict[str, Any]] = []

    def add(target: str, value: str, ok: bool) -> None:
        out.append({"target": target, "value": value, "met": ok})

    small, large = sizes.get("small"), sizes.get("large")
    if small is not None:
        ms = small["measures"]
        for name in RATIO_COMMANDS:
            ratio = ms[name]["wall"]["median"] / denominator(small, name)
            best = ms[name]["wall"]["min"] / denominator(small, name, "min")
            before = ""
            if FLOOR_OF[name] == "floor" and NO_WAITING in ms:
                old = ms[name]["wall"]["median"] / denominator(small, name, floor=NO_WAITING)
                before = f"; {old:.2f}x the floor without the waiting round"
            add(f"K=6 M=500 {name} <= {RATIO_TARGET}x (floor + start-up)",
                f"{ratio:.2f}x (best runs {best:.2f}x; CPU {cpu_ratio(small, name):.2f}x{before})",
                ratio <= RATIO_TARGET)
    any_size = small or large or next(iter(sizes.values()), None)
    if any_size is not None:
        help_s = any_size["measures"]["xaf-hub --help"]["wall"]["median"]
        add(f"xaf-hub --help <= {HELP_TARGET_S} s", f"{help_s:.3f} s", help_s <= HELP_TARGET_S)
        pk = any_size["imports"]["status"]["packages"]
        bad = [p for p in FORBIDDEN_IN_STATUS if p in pk]
        add("status imports none of " + ", ".join(FORBIDDEN_IN_STATUS),
            "imports " + ", ".join(bad) if bad else "none imported", not bad)
    for mres in matcher:
        if mres["n"] == 10000:
            t = mres["total_s"]["median"]
            add(f"matching 10k sessions <= {MATCH_TARGET_S} s after import", f"{t:.3f} s",
                t <= MATCH_TARGET_S)
    if small is not None and large is not None:
        lm, sm = large["measures"], small["measures"]
        for name in COMMANDS:
            floor_growth = denominator(large, name) / denominator(small, name)
            g = lm[name]["wall"]["median"] / sm[name]["wall"]["median"]
            # CPU growth too: on a 2-core box with local servers the wall time is mostly theirs.
            floor = FLOOR_OF[name]
            cpu_g = lm[name]["cpu"]["median"] / sm[name]["cpu"]["median"]
            floor_cpu_g = lm[floor]["cpu"]["median"] / sm[floor]["cpu"]["median"]
            add(f"K=12 M=2000 {name} grows no faster than the floor",
                f"x{g:.2f} vs floor x{floor_growth:.2f} (CPU x{cpu_g:.2f} vs x{floor_cpu_g:.2f})",
                g <= floor_growth)
        for name in COMMANDS:
            peak = large["measures"][name]["peak_rss_mb"]
            add(f"K=12 M=2000 {name} peak memory <= {MEMORY_TARGET_MB:.0f} MB",
                f"{peak:.0f} MB", peak <= MEMORY_TARGET_MB)
    return out


def render_table(result: dict[str, Any]) -> str:
    """The one table: every measure per size, then the matcher, then the targets."""
    from xaf_hub.core.text import table

    rows: list[list[str]] = []
    for label, size in result["sizes"].items():
        ms = size["measures"]
        tag = f"{label} K={size['k']} M={size['m']}"
        for floor in ("floor", "floor project-only", NO_WAITING):
            if floor not in ms:  # a result written before that floor was measured
                continue
            req = ms[floor]["requests_s"]
            rows.append([tag, f"{floor}: {ms[floor]['requests']} requests (in-process)",
                         f"{req['median']:.3f}", f"{req['min']:.3f}-{req['max']:.3f}",
                         "", "", ""])
        for name in ("python start-up", "floor start-up", "floor", "floor project-only",
                     "xaf-hub --help", *COMMANDS):
            w, c = ms[name]["wall"], ms[name]["cpu"]
            ratio = (f"{w['median'] / denominator(size, name):.2f}x, "
                     f"CPU {cpu_ratio(size, name):.2f}x" if name in COMMANDS else "")
            imp = size["imports"].get(name)
            shown = f"{name} (process)" if name in ("floor", "floor project-only") else name
            rows.append([tag, shown,
                         f"{w['median']:.3f}", f"{w['min']:.3f}-{w['max']:.3f}",
                         f"{c['median']:.3f} ({c['min']:.3f}-{c['max']:.3f})",
                         f"{ms[name]['peak_rss_mb']:.0f}",
                         ratio + (f"  imports {imp['total_ms']:.0f} ms" if imp else "")])
    for mres in result["matcher"]:
        t = mres["total_s"]
        rows.append([f"matcher n={mres['n']}", "documents + rank (after import)",
                     f"{t['median']:.3f}", f"{t['min']:.3f}-{t['max']:.3f}", "",
                     f"{mres['peak_rss_mb']:.0f}", f"import {mres['import_s']:.2f} s"])
    text = table(rows, ["size", "measure", "median s", "min-max s", "cpu s (min-max)", "peak MB",
                        "vs floor+start-up (CPU: vs floor process)"])
    checks = [[("met" if v["met"] else "NOT MET"), v["target"], v["value"]]
              for v in result["targets"]]
    m = result["machine"]
    head = (f"machine: {m['nproc']} x {m['cpu']}, {m['memory_gb']} GB, Python {m['python']}, "
            f"opencode {m['opencode']}; xaf_hub {result['code_start']}")
    for label, size in result["sizes"].items():
        load, busy = size["loadavg_per_round"], size["cpu_busy_percent_per_round"]
        head += (f"\n{label}: at round starts CPUs {min(busy):.0f}-{max(busy):.0f}% busy, "
                 f"1-min load average {min(load):.1f}-{max(load):.1f}")
    if result["code_end"] != result["code_start"]:
        head += (f"\nWARNING: xaf_hub changed during the run ({result['code_start']} -> "
                 f"{result['code_end']}); figures mix versions")
    return f"{head}\n\n{text}\n\n{table(checks, ['', 'target', 'measured'])}\n"


# -- main -----------------------------------------------------------------------------------


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl+C so the finally blocks stop every server."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", choices=("small", "large", "both"), default="both",
                   help="small: K=6 M=500; large: K=12 M=2000 (default both)")
    p.add_argument("--k", type=int, help="custom number of servers (with --m; replaces --sizes)")
    p.add_argument("--m", type=int, help="custom project sessions per server")
    p.add_argument("--repeat", type=int, default=5, help="timed rounds per size (default 5)")
    p.add_argument("--projects", type=int, default=1, metavar="N",
                   help="a config of N projects sharing each server's checkout, also for --rounds "
                        "(default 1)")
    p.add_argument("--busy", type=int, default=2, help="busy sessions per server (default 2)")
    p.add_argument("--settle-cpu", type=float, default=60.0, metavar="PERCENT",
                   help="before each round wait up to 2 min until the CPUs are less busy than "
                        "this over one second (default 60; 0 = never wait)")
    p.add_argument("--no-matcher", action="store_true", help="skip the matcher sizes")
    p.add_argument("--keep-artifacts", action="store_true",
                   help="keep the temp folder (server homes, configs, outputs)")
    p.add_argument("--out", type=Path, default=RESULTS / "latest.json", help="result JSON")
    p.add_argument("--live", action="store_true",
                   help="only the live views (watch, patrol daemon) at --k/--m, default 2 x 300")
    p.add_argument("--rounds", action="store_true",
                   help="only a patrol round's cost (first, second) against status at --k/--m, "
                        "default 3 x 1000 (bench/rounds.py)")
    p.add_argument("--board", action="store_true",
                   help="status read from a patrol daemon's live board against a scan "
                        "(default K=3 M=600), and projected to 50 instances")
    p.add_argument("--board-projected", action="store_true",
                   help="only --board's projections: status from a board written for 50 "
                        "instances against status --fresh scanning 50 light stand-in servers")
    p.add_argument("--serve-events", action="store_true",
                   help="what a fleet event costs serve: requests to the servers and CPU per "
                        "100 events, over light stand-in servers (default K=6 M=100; "
                        "bench/serve_events.py)")
    p.add_argument("--events", type=int, default=100, help="--serve-events: events (100)")
    p.add_argument("--tree", type=Path, default=REPO,
                   help="--serve-events: the checkout serve runs from (default this one)")
    p.add_argument("--pool", action="store_true",
                   help="only the Redis task pool: claims at --pool-sizes tasks by 1 and 5 "
                        "claimer processes (bench/pool.py)")
    p.add_argument("--pool-sizes", type=int, nargs="+", default=[1000, 10000], metavar="N",
                   help="--pool: pool sizes (default 1000 10000)")
    p.add_argument("--claimers", type=int, nargs="+", default=[1, 5], metavar="K",
                   help="--pool: claimer processes per case (default 1 5)")
    p.add_argument("--pool-seconds", type=float, default=20.0,
                   help="--pool: a claimer stops after this many seconds (default 20)")
    p.add_argument("--samples", type=int, default=5, help="--live: prompts timed (default 5)")
    p.add_argument("--idle-seconds", type=float, default=60.0,
                   help="--live: seconds of idle CPU measured per process (default 60)")
    p.add_argument("--match", action="store_true",
                   help="only the match evaluation on the labelled set (bench/match.py): "
                        "precision and recall of 'continues a session' per threshold")
    p.add_argument("--evidence", choices=("read", "prompts", "pool", "full", "title", "outside"),
                   default="read",
                   help="--match: what the matcher sees of a session: title, folder and the "
                        "task texts the hub sent into it, then the best 3 candidates' own "
                        "prompts, changed files, todo items and agent's reply (read, default: "
                        "what dispatch does); the same without the agent's words (prompts); "
                        "without that read (pool); every session's files (full); only title "
                        "and folder (title); sessions started outside the hub, then read "
                        "(outside)")
    p.add_argument("--soak", action="store_true",
                   help="only the soak: servers, Redis and two daemons under faults at random "
                        "while the invariants are checked (bench/soak.py); exit 1 if one broke")
    p.add_argument("--minutes", type=float, default=3.0, help="--soak: how long (default 3)")
    p.add_argument("--seed", type=int, default=53, help="--soak: the fault schedule's seed")
    p.add_argument("--probe-matcher", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if (args.k is None) != (args.m is None):
        p.error("--k and --m go together")
    if args.repeat < 1 or (args.k is not None and (args.k < 1 or args.m < 1)):
        p.error("--repeat, --k and --m must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the table; write the JSON."""
    args = parse_args(argv)
    if args.probe_matcher is not None:
        print(json.dumps(probe_matcher(args.probe_matcher, args.repeat)))
        return 0

    def log(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)

    if args.match:
        from bench.match import run as run_match

        return run_match(args.evidence, RESULTS / f"match-{args.evidence}.json")
    if args.soak:
        from bench.soak import main as soak

        try:
            with sigterm_as_interrupt():  # its servers, Redis and mount go with it
                return soak(args.minutes, args.seed, log, args.keep_artifacts)
        except KeyboardInterrupt:
            log("interrupted; servers stopped")
            return 130
    if args.live:
        return run_live(args, log)
    if args.rounds:
        return run_rounds(args, log)
    if args.pool:
        return run_pool(args, log)
    if args.board:
        return run_board(args, log)
    if args.serve_events:
        return run_serve_events(args, log)
    if args.board_projected:
        return run_board_projected(args, log)

    if args.k is not None:
        plan = {f"k{args.k}m{args.m}": (args.k, args.m)}
    else:
        plan = {n: SIZES[n] for n in ("small", "large") if args.sizes in (n, "both")}
    root = Path(tempfile.mkdtemp(prefix="xaf-bench-"))
    result: dict[str, Any] = {"machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                              "code_start": code_state(),
                              "hub": " ".join(hub_argv()), "sizes": {}, "matcher": []}
    t0 = time.perf_counter()
    try:
        with sigterm_as_interrupt():
            for label, (k, m) in plan.items():
                result["sizes"][label] = measure_size(label, k, m, args.repeat, args.busy,
                                                      root / label, log, args.settle_cpu,
                                                      args.projects)
            if not args.no_matcher:
                result["matcher"] = measure_matcher(args.repeat, root, log)
    except KeyboardInterrupt:
        log("interrupted; servers stopped")
        if result["sizes"]:
            partial = args.out.with_suffix(".partial.json")
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(result, ensure_ascii=False, indent=2), "utf-8")
            log(f"sizes finished before the interrupt are in {partial}")
        return 130
    finally:
        if args.keep_artifacts:
            log(f"artifacts kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["code_end"] = code_state()
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    result["targets"] = verdicts(result["sizes"], result["matcher"])
    text = render_table(result)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, ensure_ascii=False, indent=2), encoding="utf-8")
    args.out.with_suffix(".md").write_text(f"```\n{text}```\n", encoding="utf-8")
    log(f"wrote {args.out}")
    return 0


def run_live(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    """`python -m bench --live`: the live views' figures (bench/live.py)."""
    from bench.live import measure_live, render
    from sandbox.fleet import let_children_see_ctrl_c

    let_children_see_ctrl_c()  # `watch` is stopped with Ctrl+C (SIGINT), as a person does
    result = _in_scratch(
        "xaf-bench-live-",
        lambda root: measure_live(args.k or 2, args.m or 300, root, log,
                                  samples=args.samples, idle_seconds=args.idle_seconds),
        log,
    )
    if result is None:
        return 130
    text, checks = render(result)
    result["targets"] = checks
    print(text)
    out = RESULTS / "live.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, ensure_ascii=False, indent=2), encoding="utf-8")
    out.with_suffix(".md").write_text(f"```\n{text}```\n", encoding="utf-8")
    log(f"wrote {out}")
    return 0


def _in_scratch(
    prefix: str, measure: Callable[[Path], dict[str, Any]], log: Callable[[str], None]
) -> dict[str, Any] | None:
    """Run ``measure`` in a scratch folder removed after it; its result with the machine and
    code state, or None when interrupted (its servers stopped)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with sigterm_as_interrupt():
            result = measure(root)
    except KeyboardInterrupt:
        log("interrupted; servers stopped")
        return None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["machine"] = machine()
    result["code"] = code_state()
    return result


def _report(
    name: str,
    result: dict[str, Any] | None,
    render: Callable[[dict[str, Any]], str],
    log: Callable[[str], None],
) -> int:
    """Print a measure's table and write bench/results/<name>.json and .md (130: interrupted,
    nothing written)."""
    if result is None:
        return 130
    text = render(result)
    print(text)
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, ensure_ascii=False, indent=2), encoding="utf-8")
    out.with_suffix(".md").write_text(f"```\n{text}```\n", encoding="utf-8")
    log(f"wrote {out}")
    return 0


def run_rounds(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    """`python -m bench --rounds`: first and second patrol rounds against status."""
    from bench.rounds import measure_rounds, render

    result = _in_scratch(
        "xaf-bench-rounds-",
        lambda root: measure_rounds(args.k or 3, args.m or 1000, args.repeat, root, log,
                                    args.settle_cpu, args.projects),
        log,
    )
    return _report("rounds" if args.projects == 1 else f"rounds-{args.projects}-projects",
                   result, render, log)


def run_board(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    """`python -m bench --board`: status from the live board against a scan (bench/board.py)."""
    from bench.board import measure_board, render

    result = _in_scratch(
        "xaf-bench-board-",
        lambda root: measure_board(args.k or 3, args.m or 600, args.repeat, args.samples, root,
                                   log, args.settle_cpu),
        log,
    )
    return _report("board", result, render, log)


def run_board_projected(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    """`python -m bench --board-projected`: status from a 50-instance board against a scan."""
    from bench.board import measure_projection, render_projection

    result = _in_scratch(
        "xaf-bench-projected-", lambda root: measure_projection(args.repeat, root, log), log)
    return _report("board-projected", result, render_projection, log)


def run_serve_events(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    """`python -m bench --serve-events`: requests and CPU per fleet event in serve."""
    from bench.serve_events import measure_serve_events, render

    result = _in_scratch(
        "xaf-bench-serve-",
        lambda root: measure_serve_events(args.k or 6, args.m or 100, args.events,
                                          args.tree.resolve(), root, log),
        log,
    )
    return _report("serve-events", result, render, log)


def run_pool(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    """`python -m bench --pool`: claims on the Redis task pool (bench/pool.py)."""
    from bench.pool import measure_pool, render

    result = _in_scratch(
        "xaf-bench-pool-",
        lambda root: measure_pool(args.pool_sizes, args.claimers, args.pool_seconds, root, log),
        log,
    )
    return _report("pool", result, render, log)


if __name__ == "__main__":
    sys.exit(main())
