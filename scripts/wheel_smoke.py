"""Drive an installed xaf-hub as a new user would (scripts/wheel-check.sh runs this).

Run with the installed tool's own python in isolated mode (`python -I wheel_smoke.py BIN_DIR`)
from an empty folder: nothing of the checkout is importable, so every import below comes from
the wheel. It starts one real opencode server (XAF_HUB_OPENCODE_BIN) with the wheel's fake
model, then runs the installed `xaf-hub` entry point: --help, --version, init, doctor, status,
sessions --json, a real dispatch (the session and its prompt looked up on the server), and serve
answering /health. Prints one line per step; exits 1 at the first step that fails.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

import xaf_hub
from xaf_hub.sandbox import fleet as sandbox
from xaf_hub.sandbox.fake_llm import FakeLLM


class Failed(Exception):
    """A step did not do what a user expects."""


def step(name: str, ok: bool, detail: str = "") -> None:
    if not ok:
        raise Failed(f"{name}: {detail}")
    print(f"  ok    {name}", flush=True)


def hub(bin_dir: Path, env: dict[str, str], *args: str, timeout: float = 120) -> tuple[int, str]:
    proc = subprocess.run(
        [str(bin_dir / "xaf-hub"), *args], capture_output=True, text=True, env=env,
        timeout=timeout, cwd=os.getcwd(),
    )
    if "Traceback" in proc.stderr:
        raise Failed(f"xaf-hub {' '.join(args)} crashed:\n{proc.stderr[-2000:]}")
    return proc.returncode, proc.stdout + proc.stderr


def hub_json(bin_dir: Path, env: dict[str, str], *args: str) -> tuple[int, dict[str, object], str]:
    """Run the hub with --json: (exit, the document on stdout or {}, everything it printed)."""
    proc = subprocess.run(
        [str(bin_dir / "xaf-hub"), *args, "--json"], capture_output=True, text=True, env=env,
        timeout=120, cwd=os.getcwd(),
    )
    if "Traceback" in proc.stderr:
        raise Failed(f"xaf-hub {' '.join(args)} crashed:\n{proc.stderr[-2000:]}")
    doc = json.loads(proc.stdout) if proc.returncode == 0 else {}
    return proc.returncode, doc, proc.stdout + proc.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(bin_dir: Path) -> int:
    here = Path.cwd()
    where = Path(xaf_hub.__file__).resolve()
    step("the package comes from the install, not a checkout",
         "site-packages" in where.parts and not (where.parents[1] / "pyproject.toml").exists(),
         str(where))
    env = {k: v for k, v in os.environ.items() if not k.startswith("XAF_HUB_") or
           k == "XAF_HUB_OPENCODE_BIN"}
    env["XAF_HUB_HOME"] = str(here / "home")
    env.pop("PYTHONPATH", None)

    code, out = hub(bin_dir, env, "--help")
    step("--help", code == 0 and "dispatch" in out and "usage:" in out, out[-500:])
    code, out = hub(bin_dir, env, "--version")
    step("--version", code == 0 and out.strip() == f"xaf-hub {xaf_hub.__version__}", out)

    root = here / "shop"
    (root / "web").mkdir(parents=True)
    password = secrets.token_urlsafe(12)
    llm = FakeLLM()
    llm.start()
    server = sandbox.OpencodeServer(
        sandbox.find_opencode_binary(here), home=here / "server" / "home",
        cwd=here / "server" / "cwd", password=password,
        config=sandbox.fake_provider_config(llm.url),
    )
    serve: subprocess.Popen[str] | None = None
    try:
        server.start()
        code, out = hub(bin_dir, env, "init", "-i", f"dev={server.url}", "--root", str(root))
        step("init -i dev=URL --root DIR", code == 0 and (here / "config.json").is_file(), out)
        env["XAF_HUB_PW_DEV"] = password
        code, out = hub(bin_dir, env, "doctor")
        step("doctor", code == 0 and xaf_hub.__version__ in out and password not in out, out)
        code, out = hub(bin_dir, env, "mcp")
        one_line = len(out.strip().splitlines()) == 1
        step("mcp without the [mcp] extra says how to get it",
             code == 4 and "pipx inject xaf-hub 'mcp>=" in out and one_line, out)
        code, out = hub(bin_dir, env, "status")
        step("status", code == 0 and "dev" in out, out)
        code, doc, out = hub_json(bin_dir, env, "sessions")
        step("sessions --json", code == 0 and doc.get("xaf_hub_version") == xaf_hub.__version__
             and doc.get("sessions") == [], out[-800:])

        text = f"wheel check {secrets.token_hex(4)}: add a README to web/"
        code, result, out = hub_json(bin_dir, env, "dispatch", "--new", "--dir",
                                     str(root / "web"), "--text", text)
        sid = str(result.get("session_id") or "")
        step("dispatch (exit 0, a session named)", code == 0 and sid.startswith("ses"), out[-800:])
        seen = sandbox.messages(server.url, password, sid)
        sent = [p.get("text", "") for m in seen if m.get("info", {}).get("role") == "user"
                for p in m.get("parts", [])]
        step("dispatch reached the server (its prompt in the session)",
             any(text in t for t in sent), json.dumps(seen)[:800])

        port = free_port()
        serve = subprocess.Popen(
            [str(bin_dir / "xaf-hub"), "serve", "--port", str(port)], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        health: httpx.Response | None = None
        while time.monotonic() < deadline and serve.poll() is None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.3)
        step("serve answers /health", health is not None and health.status_code == 200,
             f"exit {serve.poll()}" if health is None else health.text)
    finally:
        if serve is not None and serve.poll() is None:
            serve.send_signal(signal.SIGINT)
            try:
                serve.wait(20)
            except subprocess.TimeoutExpired:
                serve.kill()
        server.stop()
        llm.stop()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(Path(sys.argv[1])))
    except Failed as exc:
        print(f"  FAIL  {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
