"""What a worktree of its own adds to a dispatch, and how long verified work takes to land.

    python -m bench.rooms                       # 5 dispatches each way, 10 tasks landing
    python -m bench.rooms --dispatches 3 --tasks 10 --check "sleep 1"

Not a test. One real opencode server (offline, the fake model) over a checkout of a bare origin
on disk. Part one times ``xaf-hub dispatch --new`` as a user runs it (a whole process), with
``project.isolation`` "shared" and "worktree", in alternation. Part two pushes N task branches
that all start at the same tip of main (as N agents that finished together would), writes them
into the task pool as verified and ready to land, and times the one ``patrol --once`` round that
lands them all (each after the first replays onto the main its predecessor moved), against a
round with nothing to land. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sandbox.fake_llm import FakeLLM
from sandbox.fleet import OpencodeServer, fake_provider_config, find_opencode_binary
from tests.gitrepo import git, make_origin
from xaf_hub.config.load import load_config
from xaf_hub.fleet.scan import make_client
from xaf_hub.ops.rooms import close_room, open_room, start_room

PASSWORD = "bench-rooms"


def _hub(config: Path, env: dict[str, str], *args: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "xaf_hub", "--config", str(config), *args],
        env=env, capture_output=True, text=True, check=False,
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"xaf-hub {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    return took, done.stdout


def _config(path: Path, url: str, root: Path, checkout: Path, origin: Path, **project: Any) -> None:
    doc = {
        "project": {"name": "bench", "repository": str(origin), **project},
        "models": {"default_dispatch_model": "fake/fake-model"},
        "instances": [{"name": "one", "url": url, "roots": [str(root)],
                       "default_directory": str(checkout), "concurrency_limit": 100}],
    }
    path.write_text(json.dumps(doc), "utf-8")


def _ready_tasks(origin_work: Path, n: int, pool: Path) -> None:
    """N branches from main's tip, each a file of its own and a line of a shared file, and the
    pool rows of N verified tasks ready to land."""
    base = git(origin_work, "rev-parse", "HEAD")
    rows = []
    for i in range(n):
        branch = f"opencode/t{i}"
        git(origin_work, "checkout", "-q", "-B", branch, base)
        (origin_work / f"t{i}.txt").write_text(f"{i}\n")
        lines = (origin_work / "shared.txt").read_text().splitlines(keepends=True)
        lines[3 * i + 1] = f"line {3 * i + 1} by task {i}\n"
        (origin_work / "shared.txt").write_text("".join(lines))
        git(origin_work, "add", "-A")
        git(origin_work, "commit", "-q", "-m", f"task {i}")
        git(origin_work, "push", "-q", "origin", f"HEAD:refs/heads/{branch}")
        top = git(origin_work, "rev-parse", "HEAD")
        rows.append({
            "id": f"T{i}", "title": f"task {i}", "status": "dispatched", "landing": "ready",
            "commit": top, "commits": [top], "verified": True, "base": base, "branch": branch,
            "dispatched_to": "one", "session_id": None,
        })
    git(origin_work, "checkout", "-q", "main")
    pool.write_text(json.dumps({"schema_version": 1, "discipline": None, "tasks": rows}))


async def _room_steps(cfg_path: Path, env: dict[str, str], n: int) -> dict[str, float]:
    """The room's own steps, timed in one process: making the worktree, creating the session
    (as any dispatch does), starting it from origin (the shell), and removing it."""
    cfg = load_config(str(cfg_path), env=env, cwd=cfg_path.parent)
    inst = cfg.instances[0]
    times: dict[str, list[float]] = {"worktree": [], "session": [], "start": [], "remove": []}
    async with make_client(cfg, inst) as client:
        for i in range(n):
            t0 = time.perf_counter()
            room = await open_room(client, inst.default_directory, f"bench-{i}")
            t1 = time.perf_counter()
            made = await client.create_session(room.directory, "bench")
            t2 = time.perf_counter()
            await start_room(client, room, made.id, "main")
            t3 = time.perf_counter()
            await close_room(client, room)
            t4 = time.perf_counter()
            for key, took in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                times[key].append(took)
    return {key: round(statistics.median(v), 3) for key, v in times.items()}


def run(dispatches: int, tasks: int, check: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="xaf-hub-bench-rooms-") as tmp, FakeLLM() as llm:
        root = Path(tmp)
        origin = make_origin(root / "remote")
        # Three lines a task: changes to lines next to each other conflict, as git merges.
        (origin.work / "shared.txt").write_text("".join(f"line {i}\n" for i in range(3 * tasks)))
        git(origin.work, "add", "shared.txt")
        git(origin.work, "commit", "-q", "-m", "shared")
        origin.push()
        proj = root / "proj"
        proj.mkdir()
        checkout = proj / "checkout"
        git(root, "clone", "-q", str(origin.bare), str(checkout))
        server = OpencodeServer(
            find_opencode_binary(), home=root / "server", cwd=root / "cwd", password=PASSWORD,
            config=fake_provider_config(llm.url, ("fake-model",), {}, {}),
        )
        server.start()
        try:
            env = {**os.environ, "XAF_HUB_HOME": str(root / "hub"),
                   "XAF_HUB_PW_ONE": PASSWORD}
            cfg = root / "config.json"
            times: dict[str, list[float]] = {"shared": [], "worktree": []}
            for i in range(dispatches + 1):  # the first of each way warms up, not counted
                # Each way first in turn: whatever warms up between them favours neither.
                for way in ("shared", "worktree")[:: 1 if i % 2 else -1]:
                    _config(cfg, server.url, proj, checkout, origin.bare, isolation=way)
                    took, out = _hub(
                        cfg, env, "dispatch", "--new", "--json", "--text", f"{way} {i}"
                    )
                    if bool(json.loads(out)["branch"]) != (way == "worktree"):
                        raise SystemExit(f"dispatch {way} {i}: not what was asked: {out}")
                    if i:
                        times[way].append(took)
            steps = asyncio.run(_room_steps(cfg, env, dispatches))
            _config(cfg, server.url, proj, checkout, origin.bare, isolation="worktree",
                    check_command=check)
            quiet = statistics.median(
                _hub(cfg, env, "patrol", "--once", "--no-design")[0] for _ in range(3)
            )
            _ready_tasks(origin.work, tasks, root / "hub" / "tasks_backlog.json")
            landing, _ = _hub(cfg, env, "patrol", "--once", "--no-design")
            _, listed = _hub(cfg, env, "backlog", "list", "--json")
            states = [t.get("landing") for t in json.loads(listed)["tasks"]]
            shared = statistics.median(times["shared"])
            own = statistics.median(times["worktree"])
            return {
                "dispatch_seconds": {"shared": round(shared, 3), "worktree": round(own, 3),
                                     "added_by_the_worktree": round(own - shared, 3)},
                "room_steps_seconds": steps,
                "landing": {
                    "tasks": tasks, "check": check or None,
                    "landed": states.count("landed"),
                    "round_seconds": round(landing, 3),
                    "quiet_round_seconds": round(quiet, 3),
                    "per_task_seconds": round((landing - quiet) / tasks, 3),
                },
            }
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dispatches", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--check", default="", help="project.check_command (default: none)")
    args = parser.parse_args()
    print(json.dumps(run(args.dispatches, args.tasks, args.check), indent=2))


if __name__ == "__main__":
    main()
