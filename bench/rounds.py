"""What a patrol round costs against `status` of the same fleet: the first round, which reads
every project session's last run, and a second round over a fleet where nothing changed,
which reads only what moved since (architecture §8, ``patrol/last-runs.json``).

    python -m bench --rounds                  # K=3 servers x M=1000 project sessions
    python -m bench --rounds --k 12 --m 2000 --repeat 3
    python -m bench --rounds --projects 10   # one daemon's round over 10 projects

Each is a whole process, as cron runs it (`patrol --once --no-design --no-fill`: the heal and
check steps), timed --repeat times in rotating order after one warm-up: `status`; a first
round (the memory deleted before it); a second round (the memory of the round before). Wall
and CPU seconds are printed with each one's ratio to `status`, and the last runs each round
read, from its log line. With ``--projects N`` the config names N projects: the first holds
every seeded session, the others a folder of their own with none, so the figures show what each
more project adds to one daemon's round. Printed figures only; no target is asserted. Writes
bench/results/rounds.json.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROUND = ("patrol", "--once", "--no-design", "--no-fill")
_READ_LINE = re.compile(r"last runs: (\d+) read, (\d+) unchanged since read")


def as_projects(cfg: Path, n: int) -> None:
    """Rewrite the bench's one-project config as ``n`` projects (the first one's sessions)."""
    doc = json.loads(cfg.read_text("utf-8"))
    first = doc.pop("project")
    roots = {i["name"]: i.pop("roots") for i in doc["instances"]}
    default = {i["name"]: i.pop("default_directory") for i in doc["instances"]}
    doc["projects"] = {"bench": {"exclude_substrings": first["exclude_substrings"],
                                 "roots": roots, "default_directory": default}}
    for p in range(2, n + 1):
        folder = str(cfg.parent / f"other-{p}")
        doc["projects"][f"p{p}"] = {"roots": {name: [folder] for name in roots},
                                    "default_directory": {name: folder for name in roots}}
    cfg.write_text(json.dumps(doc, indent=2), encoding="utf-8")


def measure_rounds(
    k: int, m: int, repeat: int, root: Path, log: Callable[[str], None], settle_cpu: float,
    projects: int = 1,
) -> dict[str, Any]:
    """Start K servers with M project sessions each, time status and both rounds, stop them."""
    from bench.__main__ import BenchFleet, hub_argv, run_child, settle, stats

    fleet = BenchFleet(root, k, m, 0, log)
    result: dict[str, Any] = {"k": k, "m": m, "repeat": repeat, "projects": projects}
    try:
        log(f"[rounds] starting {k} opencode servers ...")
        fleet.start()
        fleet.seed()
        log(f"[rounds] {fleet.seeded} sessions in {fleet.seed_seconds:.1f} s")
        cfg, _spec, env = fleet.write_config()
        if projects > 1:
            as_projects(cfg, projects)
        memory = Path(env["XAF_HUB_HOME"]) / "patrol" / "last-runs.json"
        hub = [*hub_argv(), "--config", str(cfg)]
        items: list[tuple[str, list[str]]] = [
            ("status", [*hub, "status", *(["--project", "bench"] if projects > 1 else [])]),
            ("patrol --once, first round", [*hub, *ROUND]),
            ("patrol --once, second round", [*hub, *ROUND]),
        ]
        out = root / "out"
        out.mkdir(exist_ok=True)
        walls: dict[str, list[float]] = {n: [] for n, _ in items}
        cpus: dict[str, list[float]] = {n: [] for n, _ in items}
        reads: dict[str, list[int]] = {n: [] for n, _ in items}

        def one(name: str, argv: list[str], record: bool) -> None:
            if name.endswith("first round"):
                memory.unlink(missing_ok=True)
            slug = re.sub(r"\W+", "_", name)
            r = run_child(argv, env, root, out / f"{slug}.out", out / f"{slug}.err")
            err = (out / f"{slug}.err").read_text("utf-8", "replace")
            if r.code != 0:
                raise RuntimeError(f"{name} exited {r.code}: {err[-800:]}")
            if record:
                walls[name].append(r.wall)
                cpus[name].append(r.cpu)
                found = _READ_LINE.search(err)
                if found:
                    reads[name].append(int(found.group(1)))

        log("[rounds] warm-up ...")
        for name, argv in items:
            one(name, argv, record=False)
        load = []
        for rnd in range(repeat):
            busy = settle(settle_cpu, log)
            load.append(round(os.getloadavg()[0], 2))
            log(f"[rounds] round {rnd + 1}/{repeat} (CPUs {busy:.0f}% busy, "
                f"load average {load[-1]:.2f}) ...")
            shift = rnd % len(items)
            for name, argv in items[shift:] + items[:shift]:
                one(name, argv, record=True)
        result["project_sessions"] = k * m
        result["loadavg_per_round"] = load
        result["measures"] = {
            name: {"wall": stats(walls[name]), "cpu": stats(cpus[name]),
                   "last_runs_read": reads[name]}
            for name, _ in items
        }
    finally:
        log("[rounds] stopping servers ...")
        fleet.stop()
    return result


def render(result: dict[str, Any]) -> str:
    """One table: each measure's wall and CPU time, and its ratio to `status`."""
    from xaf_hub.core.text import table

    ms = result["measures"]
    base_w, base_c = ms["status"]["wall"]["median"], ms["status"]["cpu"]["median"]
    rows = []
    for name, m in ms.items():
        w, c = m["wall"], m["cpu"]
        read = m["last_runs_read"]
        rows.append([name, f"{w['median']:.3f}", f"{w['min']:.3f}-{w['max']:.3f}",
                     f"{w['median'] / base_w:.2f}x", f"{c['median']:.3f}",
                     f"{c['median'] / base_c:.2f}x",
                     "" if name == "status" else f"{min(read)}-{max(read)}" if read else "?"])
    load = result["loadavg_per_round"]
    head = (f"patrol rounds, K={result['k']} M={result['m']} ({result['project_sessions']} "
            f"project sessions), {result.get('projects', 1)} project(s); 1-min load average "
            f"{min(load):.1f}-{max(load):.1f}")
    return (f"{head}\n\n" + table(rows, ["measure", "median s", "min-max s", "vs status",
                                        "cpu s", "cpu vs status", "last runs read"]) + "\n")

