"""The bundled demo: three real opencode servers on 127.0.0.1, a fake model, example sessions,
then the hub's main commands against them using the bundled config.example.json.

Run from the repository root after `bash scripts/setup.sh`:

    .venv/bin/python -m xaf_hub.sandbox.demo          # run the tour, then stop everything
    .venv/bin/python -m xaf_hub.sandbox.demo --keep   # leave the fleet running until Ctrl+C

From an installed wheel it needs `opencode` on PATH (or $XAF_HUB_OPENCODE_BIN) and says so.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from xaf_hub.errors import SandboxError
from xaf_hub.sandbox import fleet as sandbox
from xaf_hub.sandbox.fake_llm import FakeLLM
from xaf_hub.store.repository import git_safe

DEMO_ROOT = Path("/tmp/xaf-hub-demo")
# Below the usual ephemeral range (32768+), so an outgoing connection never holds one.
PORTS = {"local-main": 24101, "lan-build": 24102, "prod-edge": 24103}
MODELS = ("fake/fake-model", "fake/slow-model", "opencode/free-model", "backup/good-model")


def _git_repo(path: Path, message: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if not (path / ".git").exists():
        hooks = DEMO_ROOT / "no-hooks"  # empty: no hook runs in the demo's repositories
        hooks.mkdir(parents=True, exist_ok=True)
        subprocess.run([*git_safe(hooks), "init", "-q", str(path)], check=True)
        subprocess.run(
            [
                *git_safe(hooks),
                "-C",
                str(path),
                "-c",
                "user.name=demo",
                "-c",
                "user.email=demo@example.invalid",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                message,
            ],
            check=True,
        )


EXAMPLE_CONFIG = Path(__file__).resolve().parents[1] / "config.example.json"


def _hub(cwd: Path, env: dict[str, str], *args: str) -> int:
    cmd = [sys.executable, "-m", "xaf_hub", "--config", str(EXAMPLE_CONFIG), *args]
    print(f"\n$ xaf-hub {' '.join(args)}", flush=True)
    return subprocess.run(cmd, env=env, cwd=cwd).returncode


def _find_opencode(repo: Path) -> Path | None:
    """The opencode binary, or None after one line saying how to get it."""
    checkout = (repo / "scripts" / "setup.sh").is_file()
    try:
        return sandbox.find_opencode_binary(repo if checkout else Path.cwd())
    except SandboxError as exc:
        how = (
            f"run `bash {repo / 'scripts' / 'setup.sh'}`"
            if checkout
            else f"install it with `npm install -g opencode-ai@{sandbox.OPENCODE_VERSION}` "
            "(needs Node.js 18+) or set XAF_HUB_OPENCODE_BIN"
        )
        detail = str(exc) if "XAF_HUB_OPENCODE_BIN=" in str(exc) else "opencode not found"
        print(f"demo: {detail}: {how}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    """Start the demo fleet, seed sessions, run the tour."""
    parser = argparse.ArgumentParser(
        prog="python -m xaf_hub.sandbox.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--keep", action="store_true", help="keep the fleet running until Ctrl+C")
    parser.add_argument("--out", default="demo-out", help="folder for the page and exports")
    args = parser.parse_args(argv)

    repo = Path(__file__).resolve().parents[2]
    binary = _find_opencode(repo)
    if binary is None:
        return 1
    here = Path.cwd()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    servers_root = DEMO_ROOT / "servers"
    shutil.rmtree(servers_root, ignore_errors=True)  # a fresh database every run
    shop = DEMO_ROOT / "shop"
    _git_repo(shop, "demo shop")
    for sub in ("web", "api", "docs"):
        (shop / sub).mkdir(exist_ok=True)
    scratch = DEMO_ROOT / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)

    password = secrets.token_urlsafe(18)  # never printed; handed to the hub through the env
    env = {**os.environ, "XAF_HUB_DEMO_PASSWORD": password, "XAF_HUB_HOME": str(out / "home")}
    llm = FakeLLM()
    llm.start()
    servers: list[sandbox.OpencodeServer] = []
    stop_now = False

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        config = sandbox.fake_provider_config(llm.url, MODELS)
        print(
            f"starting 3 opencode servers ({binary.name} {sandbox.OPENCODE_VERSION}) "
            "on 127.0.0.1 ...",
            flush=True,
        )
        for name, port in PORTS.items():
            server = sandbox.OpencodeServer(
                binary,
                home=servers_root / name / "home",
                cwd=servers_root / name / "cwd",
                password=password,
                config=config,
                port=port,
            )
            servers.append(server)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(3) as pool:
            for fut in [pool.submit(s.start) for s in servers]:
                fut.result()
        urls = {name: s.url for name, s in zip(PORTS, servers, strict=True)}
        print("  " + ", ".join(f"{n} {u}" for n, u in urls.items()), flush=True)

        def make(name: str, title: str, directory: Path) -> str:
            return str(sandbox.create_session(urls[name], password, str(directory), title)["id"])

        make("local-main", "修复登录页样式", shop / "web")
        busy = make("local-main", "补充单元测试", shop / "api")
        make("local-main", "Order export CSV shows garbled Chinese", shop / "api")
        make("lan-build", "首页性能优化", shop / "web")
        make("lan-build", "Refactor the payment callback", shop / "api")
        make("lan-build", "scratch experiment (excluded)", scratch)
        make("lan-build", "someone else's project", DEMO_ROOT / "elsewhere")
        make("prod-edge", "Review the production hotfix", shop / "docs")
        llm.set_mode("slow-model", "slow", delay=120)
        sandbox.prompt_async(
            urls["local-main"], password, busy, "Write the missing unit tests", "fake/slow-model"
        )
        deadline = time.monotonic() + 30
        while busy not in sandbox.status(urls["local-main"], password, str(shop / "api")):
            if time.monotonic() > deadline:
                break
            time.sleep(0.3)

        codes = [
            _hub(here, env, "instances"),
            _hub(here, env, "status"),
            _hub(here, env, "sessions"),
            _hub(here, env, "dispatch", "--dry-run", "--text", "登录页样式再调整一下"),
            _hub(
                here,
                env,
                "sessions",
                "--html",
                str(out / "overview.html"),
                "--out",
                str(out / "sessions.csv"),
            ),
        ]
        print(f"\nthe overview page for colleagues: {out / 'overview.html'}")
        if args.keep:
            env_file = out / "demo.env"
            fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(
                    f"export XAF_HUB_DEMO_PASSWORD='{password}'\n"
                    f"export XAF_HUB_HOME='{out / 'home'}'\n"
                )
            print(
                f"fleet left running; in another shell: source {env_file} && "
                f"xaf-hub --config {EXAMPLE_CONFIG} status   (Ctrl+C here stops it)"
            )
            while not stop_now:
                time.sleep(1)
        return 0 if all(c == 0 for c in codes) else 1
    except KeyboardInterrupt:
        return 0
    finally:
        for s in servers:
            s.stop()
        llm.stop()


if __name__ == "__main__":
    sys.exit(main())
