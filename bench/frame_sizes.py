"""The largest frames a real opencode server sends on /global/event, by event type.

    python -m bench.frame_sizes

One real ``opencode serve`` (the sandbox's, fake model) runs three prompts whose frames are
as large as the server makes them: a bash tool call that prints ~1.6 MB, a write tool call
of a 1 MB file, and a 1 MB prompt. Prints the largest ``data:`` line of each event type seen
(the follower's line cap, ``fleet.stream.MAX_FRAME_BYTES``, is set above the largest).
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import httpx

from sandbox import fleet as sandbox


def main() -> int:
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        fl = sandbox.Fleet(Path(tmp), 1)
        fl.start()
        try:
            server = fl.servers[0]
            work = Path(tmp) / "work"
            work.mkdir()
            stop = threading.Event()

            def listen() -> None:
                try:
                    read()
                except httpx.HTTPError:
                    return  # the server stopped at the end

            def read() -> None:
                headers = sandbox.auth_headers(fl.passwords[0])
                with httpx.Client(base_url=server.url, headers=headers, trust_env=False,
                                  timeout=httpx.Timeout(None, connect=5)) as c, \
                        c.stream("GET", "/global/event") as resp:
                    for line in resp.iter_lines():
                        if stop.is_set():
                            return
                        if not line.startswith("data:"):
                            continue
                        kind = line.split('"type":"', 2)[1].split('"', 1)[0] \
                            if '"type":"' in line else "?"
                        sizes[kind] = max(sizes.get(kind, 0), len(line.encode()))

            threading.Thread(target=listen, daemon=True).start()
            time.sleep(1)
            big = "x" * 1_000_000
            cases = [
                ("bash", {"command": "seq 1 250000", "description": "print a lot"}),
                ("write", {"filePath": str(work / "big.txt"), "content": big}),
            ]
            for name, args in cases:
                fl.llm.set_mode(None, "tools", calls=[[name, args]])
                ses = sandbox.create_session(server.url, fl.passwords[0], work)
                sandbox.prompt_async(server.url, fl.passwords[0], ses["id"], "go")
                _idle(server.url, fl.passwords[0], work, ses["id"])
            fl.llm.set_mode(None, "ok")
            ses = sandbox.create_session(server.url, fl.passwords[0], work)
            sandbox.prompt_async(server.url, fl.passwords[0], ses["id"], big)
            _idle(server.url, fl.passwords[0], work, ses["id"])
            time.sleep(1)
            stop.set()
        finally:
            fl.stop()
    for kind, n in sorted(sizes.items(), key=lambda kv: -kv[1]):
        print(f"{kind:<28} {n:>10,} bytes")
    return 0


def _idle(url: str, password: str | None, directory: Path, sid: str) -> None:
    time.sleep(1)
    for _ in range(120):
        if sid not in sandbox.status(url, password, directory):
            return
        time.sleep(0.5)


if __name__ == "__main__":
    raise SystemExit(main())
