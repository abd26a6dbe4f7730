"""Live views against real servers: `watch` and the patrol daemon following event streams.

    python -m bench --live                  # K=2 servers x M=300 project sessions
    python -m bench --live --k 12 --m 2000

Measured, each as a whole process the way a user runs it:

1. how long after ``prompt_async`` `watch --json` prints the session's start (``--samples``
   prompts, one after the other);
2. the CPU `watch` and the patrol daemon use while nothing changes, over ``--idle-seconds``,
   as % of one core (CPU seconds per wall second);
3. how long after the model first answered 429 the daemon — its round set to 60 minutes, its
   first round already run — re-prompts the session on the next model of the chain (the
   first request of that model reaching the fake model server);
4. slot-free to next-start: one instance at limit 1, ``--samples`` + 1 three-second tasks
   queued in the pool (`dispatch --new --queue`), a daemon filling (round every 60 minutes);
   from the server streaming one run's end to it streaming the next run's start.
5. work arrives: free slots, the same daemon set-up (filling: it looks at the pool every
   second; its idle CPU measured first), ``--samples`` tasks added one at a time with
   `backlog add`; from the command's exit to the server streaming the new run's start.

Writes bench/results/live.json and prints one table with the targets.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LIVE_MODELS = ("fake/fake-model", "fake/slow-model", "opencode/free-model", "backup/good-model")
START_TARGET_S = 2.0
IDLE_TARGET_PCT = 5.0
HEAL_TARGET_S = 90.0


class Child:
    """A hub process whose output lines are collected with their arrival time."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.out: list[tuple[float, str]] = []
        self.err: list[str] = []
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, None)):
            threading.Thread(target=self._pump, args=(stream, into), daemon=True).start()

    def _pump(self, stream: Any, into: list[tuple[float, str]] | None) -> None:
        for line in stream:
            if into is None:
                self.err.append(line.rstrip("\n"))
            else:
                into.append((time.monotonic(), line.rstrip("\n")))

    def cpu(self) -> float:
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return float(t.user + t.system)

    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def poll(predicate: Callable[[], Any], timeout: float) -> Any:
    """The predicate's first true value within ``timeout`` seconds, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return None


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    value = poll(predicate, timeout)
    if not value:
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
    return value


def _idle_cpu(child: Child, seconds: float) -> float:
    c0, t0 = child.cpu(), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (child.cpu() - c0) / (time.monotonic() - t0)


def _prompt(url: str, password: str, sid: str, directory: str, model: str) -> None:
    import httpx

    from xaf_hub.sandbox import fleet as sandbox

    provider, _, ident = model.partition("/")
    body = {"parts": [{"type": "text", "text": "hello"}],
            "model": {"providerID": provider, "modelID": ident}}
    with httpx.Client(base_url=url, headers=sandbox.auth_headers(password), trust_env=False,
                      timeout=60) as c:
        resp = c.post(f"/session/{sid}/prompt_async", params={"directory": directory}, json=body)
        if resp.status_code != 204:
            raise RuntimeError(f"prompt_async: HTTP {resp.status_code}")


def measure_live(
    k: int, m: int, root: Path, log: Callable[[str], None], *, samples: int = 5,
    idle_seconds: float = 60.0,
) -> dict[str, Any]:
    """Start K servers with M project sessions each, measure, stop them."""
    from bench.__main__ import BenchFleet, bytecode_env, hub_argv

    fleet = BenchFleet(root, k, m, 0, log, models=LIVE_MODELS)
    result: dict[str, Any] = {"k": k, "m": m, "samples": samples, "idle_seconds": idle_seconds}
    try:
        log(f"[live] starting {k} opencode servers ...")
        fleet.start()
        created = fleet.seed()
        log(f"[live] {fleet.seeded} sessions in {fleet.seed_seconds:.1f} s")
        cfg, _spec, env = fleet.write_config()
        doc = json.loads(cfg.read_text("utf-8"))
        doc["models"] = {"default_dispatch_model": "fake/fake-model",
                         "chain": ["opencode/free-model", "backup/good-model"]}
        cfg.write_text(json.dumps(doc), "utf-8")
        env = {**env, **bytecode_env(root)}
        hub = [*hub_argv(), "--config", str(cfg)]
        result["watch"] = _watch(hub, env, root, fleet, created, samples, idle_seconds, log)
        result["daemon"] = _daemon(hub, env, root, fleet, created, idle_seconds, log)
        result["fill"] = _fill(cfg, env, root, fleet, samples, log)
        result["arrive"] = _arrive(cfg, env, root, fleet, samples, idle_seconds, log)
    finally:
        log("[live] stopping servers ...")
        fleet.stop()
    return result


def _raw_busy(url: str, password: str, into: dict[str, float]) -> None:
    """When the server itself streamed each session's first busy status (the reference)."""
    import httpx

    from xaf_hub.sandbox import fleet as sandbox

    try:
        with httpx.Client(base_url=url, headers=sandbox.auth_headers(password),
                          trust_env=False, timeout=httpx.Timeout(None, connect=10)) as c, \
                c.stream("GET", "/global/event") as resp:
            for line in resp.iter_lines():
                if '"session.status"' in line and '"busy"' in line:
                    sid = json.loads(line[5:])["payload"]["properties"]["sessionID"]
                    into.setdefault(sid, time.monotonic())
    except httpx.HTTPError:
        return  # the servers stopped at the end of the run


def _watch(hub: list[str], env: dict[str, str], root: Path, fleet: Any,
           created: list[list[tuple[str, str]]], samples: int, idle_seconds: float,
           log: Callable[[str], None]) -> dict[str, Any]:
    watch = Child([*hub, "watch", "--json"], env, root)
    raw: dict[str, float] = {}
    for server, pw in zip(fleet.servers, fleet.passwords, strict=True):
        threading.Thread(target=_raw_busy, args=(server.url, pw, raw), daemon=True).start()
    own: list[float] = []
    try:
        t0 = time.monotonic()
        _wait(lambda: any("watching" in e for e in watch.err), 600, "watch to start")
        ready_s = time.monotonic() - t0
        log(f"[live] watch following after {ready_s:.1f} s; idle for {idle_seconds:.0f} s ...")
        idle = _idle_cpu(watch, idle_seconds)
        latencies = []
        for i in range(samples):
            server = i % len(fleet.servers)
            sid, directory = created[server][i // len(fleet.servers)]

            def seen(kind: str, sid: str = sid) -> float | None:
                for at, line in list(watch.out):
                    if f'"{sid}"' in line and f'"event": "{kind}"' in line:
                        return at
                return None

            sent = time.monotonic()
            _prompt(fleet.servers[server].url, fleet.passwords[server], sid, directory,
                    "fake/fake-model")
            shown = _wait(lambda: seen("started"), 120, "the start")
            latencies.append(shown - sent)
            server_busy = raw.get(sid)
            if server_busy is not None:
                own.append(shown - server_busy)
            _wait(lambda: seen("stopped"), 120, "the stop")
            log(f"[live] start #{i + 1} shown after {latencies[-1]:.2f} s"
                + (f" (the server streamed it after {server_busy - sent:.2f} s)"
                   if server_busy is not None else ""))
    finally:
        code = watch.stop()
    return {"ready_s": ready_s, "idle_cpu_pct": idle, "start_latency_s": latencies,
            "start_latency_median_s": statistics.median(latencies),
            "after_server_event_s": own,
            "after_server_event_median_s": statistics.median(own) if own else None,
            "exit_code": code}


def _daemon(hub: list[str], env: dict[str, str], root: Path, fleet: Any,
            created: list[list[tuple[str, str]]], idle_seconds: float,
            log: Callable[[str], None]) -> dict[str, Any]:
    beat = Path(env["XAF_HUB_HOME"]) / "patrol" / "daemon.json"

    def ticks() -> int:
        try:
            return int(json.loads(beat.read_text("utf-8")).get("ticks", 0))
        except (OSError, ValueError):
            return 0

    daemon = Child([*hub, "patrol", "--interval-seconds", "3600", "--no-design", "--no-fill"],
                   env, root)
    try:
        _wait(lambda: ticks() >= 1, 900, "the daemon's first round")
        log(f"[live] daemon's first round done; idle for {idle_seconds:.0f} s ...")
        time.sleep(5.0)  # its follower connects and rescans after the round
        idle = _idle_cpu(daemon, idle_seconds)
        llm = fleet.llm
        llm.set_mode("free-model", "429", retry_after=1)
        sid, directory = created[0][-1]
        start = time.time()
        _prompt(fleet.servers[0].url, fleet.passwords[0], sid, directory, "opencode/free-model")

        def first(model: str) -> float | None:
            times = [r["time"] for r in llm.requests()
                     if r["model"] == model and not r["title_call"] and r["time"] >= start]
            return min(times) if times else None

        failed_at = _wait(lambda: first("free-model"), 300, "the first 429")
        healed_at = _wait(lambda: first("good-model"), 600, "the re-prompt on the next model")
        rounds = ticks()
        log(f"[live] re-prompted on the next model {healed_at - failed_at:.1f} s after the 429")
    finally:
        code = daemon.stop(signal.SIGTERM)
    return {"idle_cpu_pct": idle, "heal_after_429_s": healed_at - failed_at,
            "rounds_run": rounds, "exit_code": code}


FILL_TARGET_S, FILL_P90_TARGET_S = 2.0, 4.0


def _raw_states(url: str, password: str, into: list[tuple[float, str, str]]) -> None:
    """Every run-state change the server streams: (when, session id, busy|idle|retry)."""
    import httpx

    from xaf_hub.sandbox import fleet as sandbox

    try:
        with httpx.Client(base_url=url, headers=sandbox.auth_headers(password),
                          trust_env=False, timeout=httpx.Timeout(None, connect=10)) as c, \
                c.stream("GET", "/global/event") as resp:
            for line in resp.iter_lines():
                if '"session.status"' not in line:
                    continue
                props = json.loads(line[5:])["payload"]["properties"]
                into.append((time.monotonic(), props["sessionID"], props["status"]["type"]))
    except httpx.HTTPError:
        return


def _fill(cfg: Path, env: dict[str, str], root: Path, fleet: Any, samples: int,
          log: Callable[[str], None]) -> dict[str, Any]:
    """Slot-free to next-start with the daemon filling from the pool (module docstring)."""
    from bench.__main__ import hub_argv

    doc = json.loads(cfg.read_text("utf-8"))
    doc["instances"] = doc["instances"][:1]
    doc["instances"][0]["concurrency_limit"] = 1
    doc["models"] = {"default_dispatch_model": "fake/slow-model"}
    doc["lock"] = {"slot_grace_seconds": 2}
    one = root / "fill.json"
    one.write_text(json.dumps(doc), "utf-8")
    hub = [*hub_argv(), "--config", str(one)]
    fleet.llm.set_mode("slow-model", "slow", delay=3)
    seen: list[tuple[float, str, str]] = []
    threading.Thread(target=_raw_states, args=(fleet.servers[0].url, fleet.passwords[0], seen),
                     daemon=True).start()
    for i in range(samples + 1):
        code = subprocess.run([*hub, "dispatch", "--new", "--queue", "--text",
                               f"Bench fill task {i}: write note {i}"], env=env, cwd=root,
                              capture_output=True, text=True).returncode
        if code != 0:
            raise RuntimeError(f"dispatch --queue exited {code}")
    log(f"[live] {samples + 1} tasks queued on one instance at limit 1; the daemon fills ...")
    daemon = Child([*hub, "patrol", "--interval-seconds", "3600", "--no-design"], env, root)
    try:
        def started() -> int:
            return len({sid for _, sid, kind in list(seen) if kind == "busy"})

        _wait(lambda: started() >= samples + 1, 120 + 30 * samples, "every queued task to start")
        time.sleep(4)  # the last run's end
    finally:
        code = daemon.stop()
    gaps = []
    events = sorted(seen)
    first_busy: dict[str, float] = {}
    for at, sid, kind in events:
        if kind == "busy":
            first_busy.setdefault(sid, at)
    for at, sid, kind in events:
        if kind != "idle":
            continue
        later = [t for s, t in first_busy.items() if s != sid and t >= at]
        if later:
            gaps.append(min(later) - at)
    gaps.sort()
    p90 = gaps[max(0, int(round(0.9 * len(gaps))) - 1)] if gaps else None
    log(f"[live] slot-free to next-start: {', '.join(f'{g:.2f}' for g in gaps)} s")
    return {"gaps_s": gaps, "median_s": statistics.median(gaps) if gaps else None,
            "p90_s": p90, "exit_code": code}


ARRIVE_TARGET_S = 5.0


def _arrive(cfg: Path, env: dict[str, str], root: Path, fleet: Any, samples: int,
            idle_seconds: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Work started when it arrives (module docstring, 5.): free slots, a daemon whose next
    round is an hour away, one `backlog add` at a time; from the command's exit to the server
    streaming the new run's start."""
    from bench.__main__ import hub_argv

    doc = json.loads(cfg.read_text("utf-8"))
    doc["instances"] = doc["instances"][:1]
    doc["instances"][0]["concurrency_limit"] = samples
    doc["models"] = {"default_dispatch_model": "fake/slow-model"}
    one = root / "arrive.json"
    one.write_text(json.dumps(doc), "utf-8")
    hub = [*hub_argv(), "--config", str(one)]
    fleet.llm.set_mode("slow-model", "slow", delay=600)  # each run keeps its slot
    seen: list[tuple[float, str, str]] = []
    threading.Thread(target=_raw_states, args=(fleet.servers[0].url, fleet.passwords[0], seen),
                     daemon=True).start()
    beat = Path(env["XAF_HUB_HOME"]) / "patrol" / "daemon.json"
    daemon = Child([*hub, "patrol", "--interval-seconds", "3600", "--no-design"], env, root)
    took: list[float] = []
    try:
        def first_round() -> bool:
            try:
                doc = json.loads(beat.read_text("utf-8"))
            except (OSError, ValueError):
                return False
            return bool(doc["pid"] == daemon.proc.pid and doc["ticks"] >= 1)

        _wait(first_round, 900, "the daemon's first round")
        time.sleep(5.0)  # its follower connects and rescans after the round
        idle = _idle_cpu(daemon, idle_seconds)  # looking at the pool every second included
        for i in range(samples):
            code = subprocess.run([*hub, "backlog", "add", "--title", f"Bench arrival {i}"],
                                  env=env, cwd=root, capture_output=True, text=True).returncode
            if code != 0:
                raise RuntimeError(f"backlog add exited {code}")
            added = time.monotonic()
            before = {sid for _, sid, kind in list(seen) if kind == "busy"}

            def started(after: float = added, known: set[str] = before) -> float | None:
                new = [t for t, sid, kind in list(seen)
                       if kind == "busy" and sid not in known and t >= after]
                return min(new) if new else None

            took.append(_wait(started, 120, f"arrival {i} to start") - added)
        rounds = json.loads(beat.read_text("utf-8"))["ticks"]
    finally:
        code = daemon.stop()
    log(f"[live] added to started: {', '.join(f'{t:.2f}' for t in took)} s")
    return {"arrive_s": took, "median_s": statistics.median(took), "max_s": max(took),
            "rounds_run": rounds, "idle_cpu_pct": idle, "exit_code": code}


def render(result: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The table and the verdicts."""
    from xaf_hub.core.text import table

    w, d = result["watch"], result["daemon"]
    size = f"K={result['k']} M={result['m']}"
    lat = w["start_latency_s"]
    checks = [
        {"target": f"{size} watch shows a start <= {START_TARGET_S:g} s after prompt_async "
                   "(median)", "value": f"{w['start_latency_median_s']:.2f} s "
                   f"(min {min(lat):.2f}, max {max(lat):.2f}, n={len(lat)})",
         "met": w["start_latency_median_s"] <= START_TARGET_S},
        {"target": f"{size} watch prints it after the server streamed it (median; the hub's "
                   "own share of the above)",
         "value": (f"{w['after_server_event_median_s']:.2f} s"
                   if w["after_server_event_median_s"] is not None else "not measured"),
         "met": (w["after_server_event_median_s"] or 0.0) <= START_TARGET_S},
        {"target": f"{size} watch idle CPU <= {IDLE_TARGET_PCT:g} % of one core",
         "value": f"{w['idle_cpu_pct']:.2f} %", "met": w["idle_cpu_pct"] <= IDLE_TARGET_PCT},
        {"target": f"{size} patrol daemon idle CPU <= {IDLE_TARGET_PCT:g} % of one core",
         "value": f"{d['idle_cpu_pct']:.2f} %", "met": d["idle_cpu_pct"] <= IDLE_TARGET_PCT},
        {"target": f"{size} rate-limited session re-prompted on the next model <= "
                   f"{HEAL_TARGET_S:g} s after the 429, round every 60 min",
         "value": f"{d['heal_after_429_s']:.1f} s (rounds run: {d['rounds_run']})",
         "met": d["heal_after_429_s"] <= HEAL_TARGET_S and d["rounds_run"] == 1},
    ]
    fill = result.get("fill")
    if fill and fill["gaps_s"]:
        checks.append({
            "target": f"a freed slot filled from the pool (median <= {FILL_TARGET_S:g} s, "
                      f"p90 <= {FILL_P90_TARGET_S:g} s), round every 60 min",
            "value": f"median {fill['median_s']:.2f} s, p90 {fill['p90_s']:.2f} s "
                     f"(n={len(fill['gaps_s'])})",
            "met": fill["median_s"] <= FILL_TARGET_S and fill["p90_s"] <= FILL_P90_TARGET_S})
    arrive = result.get("arrive")
    if arrive:
        checks.append({
            "target": f"work added to the pool (backlog add) starts on a free slot <= "
                      f"{ARRIVE_TARGET_S:g} s after the command, round every 60 min",
            "value": f"median {arrive['median_s']:.2f} s, max {arrive['max_s']:.2f} s "
                     f"(n={len(arrive['arrive_s'])}, rounds run: {arrive['rounds_run']})",
            "met": arrive["max_s"] <= ARRIVE_TARGET_S and arrive["rounds_run"] == 1})
        checks.append({
            "target": f"patrol daemon filling, idle CPU <= {IDLE_TARGET_PCT:g} % of one core "
                      "(the pool and its config looked at every second)",
            "value": f"{arrive['idle_cpu_pct']:.2f} %",
            "met": arrive["idle_cpu_pct"] <= IDLE_TARGET_PCT})
    rows = [["met" if c["met"] else "NOT MET", c["target"], c["value"]] for c in checks]
    head = (f"live views, {size}; watch following after {w['ready_s']:.1f} s; "
            f"load average {os.getloadavg()[0]:.1f}")
    return f"{head}\n\n{table(rows, ['', 'target', 'measured'])}\n", checks
