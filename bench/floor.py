"""The floor: the HTTP requests a hub scan needs, issued in parallel by a minimal httpx script.

Run by path (``python bench/floor.py SPEC.json [--project-only] [--no-waiting]``) so that
nothing but asyncio, json and httpx is imported. SPEC.json is ``{"page_size": N, "fan_out": N,
"roots": [...], "exclude_substrings": [...], "instances": [{"url", "username", "password"}]}``.
Per instance, in the order xaf_hub.fleet.scan needs their answers:

1. ``GET /global/health``;
2. ``GET /experimental/session?limit=page_size``, paged with the same cursor rule as
   ``fleet.dialects.Classic.list_sessions``;
3. ``GET /session/status?directory=D`` for every distinct directory (with --project-only:
   every project directory, as ``dispatch`` asks), at most ``fan_out`` at once;
4. ``GET /permission?directory=D`` and ``GET /question?directory=D`` for the folder of each
   session a status answer shows running (idle ones left out), once per folder, sent as soon as
   that answer arrives and at most ``fan_out`` folders at once, as the hub asks for the runs
   that wait for a person (xaf_hub.fleet.scan, ``_Asks``). ``--no-waiting`` leaves this round
   out: the floor as it was before the hub asked it.

Every instance runs concurrently, each with its own connection pool (as the hub). Prints one
JSON line: the in-process time of the requests (start-up excluded), the request count and the
session count. ``--empty`` imports the same modules and exits: the script's start-up time.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from typing import Any

# The hub skips httpx's own command-line tool (click, rich) at import (xaf_hub/cli/main.py);
# the floor does too, so the comparison stays like for like.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

import httpx  # noqa: E402


def _is_project(directory: str, roots: list[str], excluded: list[str]) -> bool:
    """The bench config's project rule: under a root, no excluded substring."""
    d = directory.replace("\\", "/").rstrip("/").lower()
    return not any(x in d for x in excluded) and any(d == r or d.startswith(r + "/")
                                                     for r in roots)


async def _scan(
    inst: dict[str, Any], spec: dict[str, Any], project_only: bool, waiting: bool
) -> tuple[int, int]:
    """All the requests of one instance; returns (requests, sessions)."""
    page_size, fan_out = int(spec["page_size"]), int(spec["fan_out"])
    roots = [r.rstrip("/").lower() for r in spec["roots"]]
    excluded = [x.lower() for x in spec["exclude_substrings"]]
    headers = {"accept": "application/json"}
    if inst.get("password"):
        token = f"{inst.get('username') or 'opencode'}:{inst['password']}"
        headers["authorization"] = "Basic " + base64.b64encode(token.encode()).decode()
    # Plain http needs no TLS context (building one loads the CA bundle, ~50 ms a client).
    verify = not str(inst["url"]).startswith("http:")
    async with httpx.AsyncClient(base_url=inst["url"], headers=headers, trust_env=False,
                                 verify=verify, timeout=60.0) as c:
        (await c.get("/global/health")).raise_for_status()
        requests = 1
        seen: dict[str, dict[str, Any]] = {}
        cursor: int | None = None
        while True:
            params: dict[str, Any] = {"limit": page_size}
            if cursor is not None:
                params["cursor"] = cursor
            resp = await c.get("/experimental/session", params=params)
            resp.raise_for_status()
            requests += 1
            page: list[dict[str, Any]] = resp.json()
            new = 0
            for obj in page:
                if obj["id"] not in seen:
                    seen[obj["id"]] = obj
                    new += 1
            if len(page) < page_size or new == 0:
                break
            last = min(int(o["time"]["updated"]) for o in page)
            cursor = last + 1 if cursor is None or last + 1 < cursor else last
        directories = sorted({
            str(o["directory"]) for o in seen.values()
            if o.get("directory")
            and (not project_only or _is_project(str(o["directory"]), roots, excluded))
        })
        sem, ask_sem = asyncio.Semaphore(fan_out), asyncio.Semaphore(fan_out)
        asked: dict[str, asyncio.Future[None]] = {}

        async def ask(d: str) -> None:
            async with ask_sem:
                for r in await asyncio.gather(c.get("/permission", params={"directory": d}),
                                              c.get("/question", params={"directory": d})):
                    r.raise_for_status()
                    r.json()

        async def status(d: str) -> None:
            async with sem:
                r = await c.get("/session/status", params={"directory": d})
                r.raise_for_status()
                part = r.json()
            for sid, st in part.items():
                folder = str(seen.get(sid, {}).get("directory") or "")
                if waiting and folder and st.get("type") != "idle" and folder not in asked:
                    asked[folder] = asyncio.ensure_future(ask(folder))

        await asyncio.gather(*(status(d) for d in directories))
        await asyncio.gather(*asked.values())
        return requests + len(directories) + 2 * len(asked), len(seen)


async def _all(spec: dict[str, Any], project_only: bool, waiting: bool) -> tuple[int, int]:
    results = await asyncio.gather(*(_scan(i, spec, project_only, waiting)
                                     for i in spec["instances"]))
    return sum(r for r, _ in results), sum(s for _, s in results)


def main(argv: list[str]) -> int:
    """Run the floor (or only start up with --empty) and print its JSON line."""
    if argv[:1] == ["--empty"]:
        print(json.dumps({"seconds": 0.0, "requests": 0, "sessions": 0}))
        return 0
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    t0 = time.perf_counter()
    flags = argv[1:]
    requests, sessions = asyncio.run(_all(spec, "--project-only" in flags,
                                          "--no-waiting" not in flags))
    elapsed = time.perf_counter() - t0
    print(json.dumps({"seconds": elapsed, "requests": requests, "sessions": sessions}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
