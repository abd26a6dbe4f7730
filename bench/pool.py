"""The Redis task pool under claimers: what one claim costs at 1k and 10k tasks.

    python -m bench --pool                    # 1,000 and 10,000 tasks; 1 and 5 claimers
    python -m bench --pool --pool-sizes 10000 --claimers 5 --pool-seconds 30

A throw-away ``redis-server`` on loopback (no persistence) holds the pool under a fresh prefix
per case. Per case: the tasks are imported (timed), one ``load`` is timed, then K claimer
processes each read the pool once (their plan, untimed, as a patrol round plans from one read)
and claim the planned tasks one after the other through ``TaskPool.claim``, starting at
different points of the plan (K hubs working through one queue). Each ``claim`` call is timed,
won or lost (a lost one is a TaskChanged: another claimer had it). A claimer stops when its
plan is done or after --pool-seconds. Printed per case: claims won, claims/s (from the start
to the last claim won), p50/p95/max of one claim call, and the check that no task was won
twice and, when every claimer finished its plan, that every task was won.
Writes bench/results/pool.json.

The claimers run whatever ``xaf_hub`` is on PYTHONPATH, so the same bench measures the code
before and after a change (point PYTHONPATH at a checkout of the older commit).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

P95_TARGET_MS = 50.0
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@contextmanager
def redis_on_loopback(folder: Path) -> Iterator[str]:
    """A redis-server on a free loopback port (no password: protected mode, loopback only);
    yields its URL and stops it."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    conf = folder / "redis.conf"
    conf.write_text(
        f'port {port}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {folder}\n'
        f"logfile {folder / 'redis.log'}\n",
        encoding="utf-8",
    )
    proc = subprocess.Popen([binary, str(conf)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _pool(url: str, prefix: str) -> Any:
    from xaf_hub.config.load import Config, LockConfig, PoolConfig
    from xaf_hub.store.backends import Stores

    cfg = Config(
        path=None,
        home=Path("/nonexistent"),
        state_dir=Path("/nonexistent"),
        lock=LockConfig(
            backend="redis", redis_url=url, redis_prefix=prefix, lock_timeout_seconds=600
        ),
        pool=PoolConfig(backend="redis"),
    )
    return Stores(cfg).pool()


def _claimer(url: str, prefix: str, offset: int, seconds: float, start: Any, out: Any) -> None:
    """One hub: read the pool once, claim every planned task from ``offset`` on (wrapping)."""
    from xaf_hub.errors import TaskChanged

    pool = _pool(url, prefix)
    plan = [t for t in pool.load().tasks if t.status == "pending"]
    plan = plan[offset:] + plan[:offset]
    start.wait(60)
    deadline = time.monotonic() + seconds
    won: list[str] = []
    took: list[float] = []
    last_win = 0.0  # time.monotonic is one clock for every process of the host
    finished = True
    me = f"hub-{os.getpid()}"
    for task in plan:
        if time.monotonic() > deadline:
            finished = False
            break
        t0 = time.perf_counter()
        try:
            pool.claim(task, f"ses-{task.id}", me, None, NOW)
        except TaskChanged:
            pass
        else:
            won.append(task.id)
            last_win = time.monotonic()
        took.append(time.perf_counter() - t0)
    out.put((won, took, finished, last_win))


def measure_case(
    url: str, tasks: int, claimers: int, seconds: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """Import ``tasks`` tasks under a fresh prefix, time a load and ``claimers`` processes."""
    from xaf_hub.store.tasks import BacklogData, Task

    prefix = f"bench{os.getpid()}x{tasks}x{claimers}x{time.monotonic_ns() % 10**6}"
    pool = _pool(url, prefix)
    rows = [
        Task(id=f"B-{n:05d}", title=f"bench task {n}", priority=("P0", "P1", "P2", "P3")[n % 4])
        for n in range(tasks)
    ]
    t0 = time.perf_counter()
    pool.import_data(BacklogData(tasks=rows))
    imported = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert len(pool.load().tasks) == tasks
    loaded = time.perf_counter() - t0
    log(f"[pool] {tasks} tasks: import {imported:.2f} s, load {loaded:.3f} s; "
        f"{claimers} claimer(s) ...")
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_claimer, args=(url, prefix, w * tasks // claimers, seconds, start, out)
        )
        for w in range(claimers)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    start.set()
    got = [out.get(timeout=seconds + 600) for _ in procs]
    for proc in procs:
        proc.join(60)
    # Until the last task was won: a claimer that goes on to lose the rest adds nothing.
    wall = max(g[3] for g in got) - t0
    won = [t for g in got for t in g[0]]
    took = sorted(x for g in got for x in g[1])
    complete = all(g[2] for g in got)
    rows_after = pool.load().tasks
    dispatched = {t.id for t in rows_after if t.status == "dispatched"}
    once = len(won) == len(set(won)) and set(won) == dispatched
    if complete:
        once = once and len(won) == tasks
    pool.client.delete(*[k for k in pool.client.scan_iter(f"{prefix}:*", count=1000)] or ["-"])
    return {
        "tasks": tasks,
        "claimers": claimers,
        "import_s": round(imported, 3),
        "load_s": round(loaded, 4),
        "claims": len(won),
        "attempts": len(took),
        "seconds": round(wall, 2),
        "claims_per_s": round(len(won) / wall, 1) if wall else 0.0,
        "p50_ms": round(1000 * _quantile(took, 0.50), 2),
        "p95_ms": round(1000 * _quantile(took, 0.95), 2),
        "max_ms": round(1000 * took[-1], 2) if took else 0.0,
        "complete": complete,
        "each_once": once,
    }


def _quantile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return 0.0
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]


def measure_pool(
    sizes: Sequence[int],
    claimers: Sequence[int],
    seconds: float,
    root: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Every size x claimer count on one throw-away Redis server."""
    import xaf_hub

    result: dict[str, Any] = {
        "xaf_hub": str(Path(xaf_hub.__file__).parent),
        "seconds_per_case": seconds,
        "loadavg_start": [round(x, 1) for x in os.getloadavg()],
        "cases": [],
    }
    with redis_on_loopback(root) as url:
        for n in sizes:
            for k in claimers:
                case = measure_case(url, n, k, seconds, log)
                log(f"[pool] {n} tasks x {k}: {case['claims_per_s']} claims/s, "
                    f"p95 {case['p95_ms']} ms")
                result["cases"].append(case)
    result["loadavg_end"] = [round(x, 1) for x in os.getloadavg()]
    return result


def render(result: dict[str, Any]) -> str:
    """The table: one line per case, the p95 target on the 10k x 5 line."""
    head = (f"{'tasks':>6} {'claimers':>8} {'import s':>8} {'load s':>7} {'claims':>7} "
            f"{'claims/s':>9} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  each once")
    load = f"1-min load average {result['loadavg_start'][0]} -> {result['loadavg_end'][0]}"
    lines = [f"task pool on Redis ({result['xaf_hub']}); {load}", head]
    for c in result["cases"]:
        once = ("yes" if c["each_once"] else "NO") + ("" if c["complete"] else " (time up)")
        lines.append(
            f"{c['tasks']:>6} {c['claimers']:>8} {c['import_s']:>8.2f} {c['load_s']:>7.3f} "
            f"{c['claims']:>7} {c['claims_per_s']:>9.1f} {c['p50_ms']:>8.2f} "
            f"{c['p95_ms']:>8.2f} {c['max_ms']:>8.2f}  {once}"
        )
    lines.append(f"target: 10,000 tasks x 5 claimers, p95 under {P95_TARGET_MS:g} ms per claim")
    return "\n".join(lines) + "\n"
