"""What judging done work adds to a patrol round (issue 37), at N tasks with a check of S s.

    python -m bench.done_checks            # N=10, S=3
    python -m bench.done_checks --tasks 10 --check-seconds 3 --repeat 3
    python -m bench.done_checks --check-seconds 0 --files 2000   # what a check costs itself

Not a test. A bare origin on disk gets N task commits, each task with its own base (main's tip
when it was sent) and one commit touching ``tests/``. It times, on the hub's own mirror:
``tips`` (the fetch a round that sends tasks now makes), ``check_all`` as before issue 37
(reachable from the branch only) and with bases and ``locked_paths`` (new work, diff from the
base), and N runs of ``run_check`` with ``sleep S`` (an exported copy in the sandbox each;
``--files`` puts that many more files in the tree). Prints one JSON object: the medians, and
the checks' overhead beyond the sleeps themselves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.gitrepo import git, make_origin
from xaf_hub.store.repository import Mirror


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def run(tasks: int, check_seconds: float, repeat: int, files: int = 0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="xaf-hub-bench-done-") as tmp:
        root = Path(tmp)
        origin = make_origin(root / "remote")
        for i in range(200):  # some history, as a real repository has
            origin.commit(f"history {i}")
        if files:
            for i in range(files):
                folder = origin.work / "src" / f"m{i % 50}"
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"f{i}.py").write_text(f"VALUE = {i}\n" * 40)
            git(origin.work, "add", "src")
            origin.commit("the sources")
        origin.push()
        wanted, bases = [], []
        for i in range(tasks):
            base = git(origin.work, "rev-parse", "HEAD")
            if i == 0:
                (origin.work / "tests").mkdir()
                (origin.work / "tests" / "test_x.py").write_text("assert True\n")
                git(origin.work, "add", "tests")
            sha = origin.commit(f"task {i}")
            wanted.append(((sha,), ("main",)))
            bases.append(base)
        origin.push()
        mirror = Mirror(str(origin.bare), root / "state")
        figures: dict[str, list[float]] = {
            "tips": [],
            "check_all_before": [],
            "check_all_new_work": [],
            "checks": [],
        }
        states: list[str] = []
        for _ in range(repeat):
            figures["tips"].append(_timed(mirror.tips)[0])
            figures["check_all_before"].append(_timed(lambda: mirror.check_all(wanted))[0])
            took, checks = _timed(lambda: mirror.check_all(wanted, bases, ("tests/**",)))
            figures["check_all_new_work"].append(took)
            states = [c.state for c in checks]
            commits = [c.commit for c in checks if c.state == "verified"]
            started = time.perf_counter()
            for commit in commits:
                mirror.run_check(commit, f"sleep {check_seconds:g}", 60)
            figures["checks"].append(time.perf_counter() - started)
        checked = sum(1 for s in states if s == "verified")
        med = {k: round(statistics.median(v), 3) for k, v in figures.items()}
        return {
            "tasks": tasks,
            "files": files,
            "check_seconds": check_seconds,
            "repeat": repeat,
            "verdicts": {s: states.count(s) for s in sorted(set(states))},
            "median_seconds": med,
            "checks_overhead_seconds": round(med["checks"] - checked * check_seconds, 3),
            "added_per_round_seconds": round(
                med["tips"] + med["check_all_new_work"] - med["check_all_before"] + med["checks"],
                3,
            ),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--check-seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--files", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(run(args.tasks, args.check_seconds, args.repeat, args.files), indent=2))


if __name__ == "__main__":
    main()
