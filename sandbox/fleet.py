"""Start real ``opencode serve`` processes on 127.0.0.1, fully offline.

Used by the e2e tests and the bundled demo. Each server gets its own HOME (so its
own SQLite DB, logs and config dir), listens on a random loopback port and talks
only to a :class:`~sandbox.fake_llm.FakeLLM`.

Offline measures (see the opencode API doc, section 2):

* the ``OPENCODE_DISABLE_*`` flags stop the models.dev fetch, autoupdate, LSP
  downloads, sharing, default plugins, Claude-Code and external skills, and the file
  watcher (whose inotify instances a long run would use up, see ``OFFLINE_ENV``);
* opencode runs a detached npm install of ``@opencode-ai/plugin`` into every
  config dir it loads. ``--pure`` / ``OPENCODE_PURE`` do *not* stop it (they
  only skip external plugins). Its guard skips the install when the dir has a
  ``node_modules`` folder and ``package-lock.json`` already lists every
  dependency, so :func:`preseed_config_dir` writes exactly that;
* a ``.opencode`` folder inside a session's project triggers the same install,
  so ``OPENCODE_DISABLE_PROJECT_CONFIG=1`` is set too;
* as a second fence ``npm_config_registry`` and every proxy variable point at a
  closed loopback port, so a missed install, or the ripgrep download from github.com
  that releases 1.2-1.14 try, fails locally before any DNS lookup.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from sandbox.fake_llm import FakeLLM, Running
from xaf_hub.fleet.releases import OPENCODE_VERSION as OPENCODE_VERSION

INSTALL_HINT = f"npm install --prefix .opencode opencode-ai@{OPENCODE_VERSION}"
LISTEN_RE = re.compile(r"opencode server listening on (http://127\.0\.0\.1:(\d+))")
# Discard port on loopback: nothing listens, so any npm fetch fails at once, locally.
DEAD_REGISTRY = "http://127.0.0.1:9/"

OFFLINE_ENV: Mapping[str, str] = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
    # A `.opencode` dir inside a session's project is a config dir too and gets the
    # same npm install (measured); the sandbox never needs project config.
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    # Each directory a server runs work in costs it one inotify instance, never given back;
    # once the user's limit (fs.inotify.max_user_instances, 128 by default) is used up, the
    # next directory's instance hangs at start-up and with it every request to that server
    # (measured on 1.18.33: the log stops at "project copy refresh started", no CPU). A long
    # test run reaches the limit; the sandbox needs no file watching. Without this watcher a
    # server still takes one instance per directory for something else, but does not hang
    # when none is left (the smoke tests pass with the limit set to 1).
    "OPENCODE_EXPERIMENTAL_DISABLE_FILEWATCHER": "1",
    "npm_config_registry": DEAD_REGISTRY,
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
    # Measured (strace): without it 1.2.27 and 1.14.41 resolve github.com for ripgrep.
    **{k: DEAD_REGISTRY for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")},
}
_DROP_ENV = ("http_proxy", "https_proxy", "all_proxy", "ftp_proxy")

# Bounded so the startup hang (API doc §8.1) cannot stall a caller, yet roomy enough
# for the first prompt of an instance on a busy 2-core box (seen: > 5 s).
HTTP_TIMEOUT = httpx.Timeout(15.0, connect=3.0)


class SandboxError(RuntimeError):
    """The local opencode sandbox (the demo's or the tests') could not be set up or did not
    answer."""


# -- locating the binary ---------------------------------------------------------------------


def platform_package(system: str, machine: str) -> str:
    """Return opencode's npm platform package name, e.g. ``opencode-linux-x64``."""
    os_name = {"win32": "windows", "cygwin": "windows"}.get(system, system)
    if os_name.startswith("linux"):
        os_name = "linux"
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64"}.get(
        machine.lower(), machine.lower()
    )
    return f"opencode-{os_name}-{arch}"


def binary_candidates(
    repo_root: Path, system: str | None = None, machine: str | None = None
) -> list[Path]:
    """Return the install locations to try under ``repo_root``, best first."""
    system = system or sys.platform
    machine = machine or platform.machine()
    nm = repo_root / ".opencode" / "node_modules"
    win = system == "win32"
    exe = "opencode.exe" if win else "opencode"
    pkg = platform_package(system, machine)
    # The platform binary first: .bin/opencode is a stub if npm skipped the postinstall.
    return [
        nm / pkg / "bin" / exe,
        nm / f"{pkg}-baseline" / "bin" / exe,
        nm / ".bin" / ("opencode.cmd" if win else "opencode"),
    ]


def _default_repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def find_opencode_binary(repo_root: Path | None = None) -> Path:
    """Return the opencode executable: $XAF_HUB_OPENCODE_BIN, the repo install, then PATH."""
    env_bin = os.environ.get("XAF_HUB_OPENCODE_BIN")
    if env_bin:
        p = Path(env_bin)
        if p.is_file():
            return p
        raise SandboxError(f"XAF_HUB_OPENCODE_BIN={env_bin} is not a file")
    root = repo_root if repo_root is not None else _default_repo_root()
    for cand in binary_candidates(root):
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    on_path = shutil.which("opencode")
    if on_path:
        return Path(on_path)
    raise SandboxError(
        f"opencode binary not found (looked at $XAF_HUB_OPENCODE_BIN, {root / '.opencode'} and "
        f"PATH); install it with: cd {root} && {INSTALL_HINT}"
    )


# -- config ----------------------------------------------------------------------------------


def _split_model(ref: str, default_provider: str) -> tuple[str, str]:
    provider, sep, model = ref.partition("/")
    return (provider, model) if sep else (default_provider, ref)


def provider_base_url(llm_url: str, provider: str) -> str:
    """Return the fake's per-provider base URL, so it can tell providers apart."""
    root = llm_url.rstrip("/")
    if root.endswith("/v1"):
        return f"{root[:-3]}/p/{provider}/v1"
    return root


def _price(prices: Mapping[str, tuple[float, float]] | None, ref: str) -> dict[str, Any]:
    if prices is None or ref not in prices:
        return {}
    per_input, per_output = prices[ref]
    return {"cost": {"input": per_input, "output": per_output}}


def fake_provider_config(
    llm_url: str,
    models: Sequence[str] = ("fake-model",),
    extra_providers: Mapping[str, str] | None = None,
    prices: Mapping[str, tuple[float, float]] | None = None,
    agents: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Build an opencode config whose providers all point at the fake LLM.

    ``models`` entries are ``"model"`` (provider ``fake``) or ``"provider/model"``
    (e.g. ``"opencode/free-model"``, ``"backup/good-model"``); each provider is
    served by the same fake under ``/p/<provider>/v1``. ``extra_providers`` maps a
    provider id to a different base URL (e.g. a closed port); a provider there
    with no entry in ``models`` gets ``fake-model``. The first model is the default.
    ``prices`` maps a model reference to its (input, output) price in USD per million tokens,
    opencode's ``cost`` field: the server then reports what each run cost; other models are free.
    ``agents`` maps a sub-agent's name to the model it runs on: a ``task`` tool call naming it
    (``subagent_type``) starts a child session on that model, whatever its parent's.
    """
    if not models:
        raise ValueError("need at least one model")
    by_provider: dict[str, list[str]] = {}
    for ref in models:
        provider, model = _split_model(ref, "fake")
        if not provider or not model:
            raise ValueError(f"bad model reference {ref!r}")
        by_provider.setdefault(provider, [])
        if model not in by_provider[provider]:
            by_provider[provider].append(model)
    for provider in extra_providers or {}:
        by_provider.setdefault(provider, ["fake-model"])
    providers: dict[str, Any] = {}
    for provider, names in by_provider.items():
        base = (extra_providers or {}).get(provider) or provider_base_url(llm_url, provider)
        providers[provider] = {
            "npm": "@ai-sdk/openai-compatible",
            "name": f"Fake {provider}",
            "options": {"baseURL": base, "apiKey": "fake-key"},
            "models": {
                name: {
                    "name": f"Fake {name}",
                    "tool_call": True,
                    "limit": {"context": 128000, "output": 4096},
                    **_price(prices, f"{provider}/{name}"),
                }
                for name in names
            },
        }
    first_provider, first_model = _split_model(models[0], "fake")
    default = f"{first_provider}/{first_model}"
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "provider": providers,
        "enabled_providers": list(providers),
        "model": default,
        "small_model": default,
        "autoupdate": False,
        "share": "disabled",
        "snapshot": False,
        "lsp": False,
        "formatter": False,
    }
    if agents:
        config["agent"] = {
            name: {"mode": "subagent", "model": model, "description": f"Works on {model}."}
            for name, model in agents.items()
        }
    return config


def preseed_config_dir(config_dir: Path) -> None:
    """Make opencode believe ``@opencode-ai/plugin`` is installed in ``config_dir``."""
    # Mirrors opencode's Npm.install guard: node_modules exists and the lock file's
    # root package already lists every dependency of package.json -> no install.
    deps = {"@opencode-ai/plugin": OPENCODE_VERSION}
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "node_modules").mkdir(exist_ok=True)
    pkg = config_dir / "package.json"
    if not pkg.exists():
        pkg.write_text(json.dumps({"dependencies": deps}, indent=2) + "\n", encoding="utf-8")
    lock = config_dir / "package-lock.json"
    if not lock.exists():
        lock.write_text(
            json.dumps(
                {
                    "name": "opencode-config",
                    "lockfileVersion": 3,
                    "requires": True,
                    "packages": {"": {"dependencies": deps}},
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )


# -- one server ------------------------------------------------------------------------------


class OpencodeServer(Running):
    """One real ``opencode serve`` process on 127.0.0.1 with an isolated HOME."""

    def __init__(
        self,
        binary: Path,
        home: Path,
        cwd: Path,
        password: str | None = None,
        username: str = "opencode",
        config: Mapping[str, Any] | None = None,
        db: str | None = None,
        *,
        log_level: str = "INFO",
        start_timeout: float = 30.0,
        extra_env: Mapping[str, str] | None = None,
        preseed: bool = True,
        port: int = 0,
    ) -> None:
        self.binary = binary
        self.requested_port = port
        self.home = home
        self.cwd = cwd
        self.password = password
        self.username = username
        self.config = dict(config) if config is not None else None
        self.db = db
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.extra_env = dict(extra_env or {})
        self.preseed = preseed
        self.log_path = home / "opencode-serve.log"
        self.start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._url: str | None = None

    def environment(self) -> dict[str, str]:
        """Return the child's environment: isolated HOME/XDG, offline flags, auth, config."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("OPENCODE_")
            and k.lower() not in _DROP_ENV
            and not k.lower().startswith("npm_config_")
        }
        home = str(self.home)
        env.update(
            {
                "HOME": home,
                "USERPROFILE": home,
                "XDG_CONFIG_HOME": str(self.home / ".config"),
                "XDG_DATA_HOME": str(self.home / ".local" / "share"),
                "XDG_CACHE_HOME": str(self.home / ".cache"),
                "XDG_STATE_HOME": str(self.home / ".local" / "state"),
            }
        )
        env.update(OFFLINE_ENV)
        if self.password:
            env["OPENCODE_SERVER_PASSWORD"] = self.password
            env["OPENCODE_SERVER_USERNAME"] = self.username
        if self.config is not None:
            env["OPENCODE_CONFIG_CONTENT"] = json.dumps(self.config)
        if self.db is not None:
            env["OPENCODE_DB"] = self.db
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        """Spawn the server and wait for its "listening" line."""
        if self._proc is not None:
            raise SandboxError("server already started")
        self.home.mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(parents=True, exist_ok=True)
        if self.preseed:
            preseed_config_dir(self.home / ".config" / "opencode")
        args = [
            str(self.binary),
            "serve",
            "--hostname",
            "127.0.0.1",
            "--port",
            str(self.requested_port),
            "--print-logs",
            "--log-level",
            self.log_level,
        ]
        kwargs: dict[str, Any] = {}
        if sys.platform == "win32":
            kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP
        else:
            kwargs["start_new_session"] = True
        t0 = time.monotonic()
        # stdout and stderr both go to the log file; polling the file for the
        # listening line needs no reader thread and cannot fill a pipe.
        with open(self.log_path, "ab") as log:
            try:
                self._proc = subprocess.Popen(
                    args,
                    cwd=self.cwd,
                    env=self.environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    **kwargs,
                )
            except OSError as exc:
                raise SandboxError(
                    f"cannot run {self.binary}: {exc}; install it with: {INSTALL_HINT}"
                ) from exc
        try:
            self._url = self._wait_listening(t0)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0

    def _wait_listening(self, t0: float) -> str:
        assert self._proc is not None
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        offset = max(0, offset - 4096)  # the line may already be there
        deadline = t0 + self.start_timeout
        while True:
            m = LISTEN_RE.search(self._read_log(offset))
            if m:
                return m.group(1)
            code = self._proc.poll()
            if code is not None:
                raise SandboxError(
                    f"opencode serve exited with code {code} before listening; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"opencode serve did not print its listening line within "
                    f"{self.start_timeout:.0f} s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _read_log(self, offset: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_text(self) -> str:
        """Return the whole server log."""
        return self._read_log()

    def log_tail(self, lines: int = 30) -> str:
        """Return the last ``lines`` lines of the server log."""
        return "\n".join(self._read_log().splitlines()[-lines:])

    @property
    def url(self) -> str:
        """Return ``http://127.0.0.1:PORT``."""
        if self._url is None:
            raise SandboxError("server is not running")
        return self._url

    @property
    def port(self) -> int:
        """Return the listening port."""
        return int(self.url.rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        """Return the server's process id."""
        if self._proc is None:
            raise SandboxError("server is not running")
        return self._proc.pid

    def running(self) -> bool:
        """Return True while the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the server, wait up to ``grace`` seconds, then kill it."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                # A killed process is reaped late on a loaded machine; SIGKILL is not refused.
                proc.wait(timeout=max(grace, 60.0))
        if sys.platform != "win32":
            # Sweep anything the server left in its own session (normally nothing).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._proc = None
        self._url = None


# -- a fleet ---------------------------------------------------------------------------------


class Fleet(Running):
    """N opencode servers (own HOME, DB and password each) sharing one FakeLLM."""

    def __init__(
        self,
        root: Path,
        n: int = 2,
        *,
        binary: Path | None = None,
        llm: FakeLLM | None = None,
        models: Sequence[str] = ("fake-model",),
        extra_providers: Mapping[str, str] | None = None,
        prices: Mapping[str, tuple[float, float]] | None = None,
        agents: Mapping[str, str] | None = None,
        passwords: Sequence[str | None] | None = None,
        start_timeout: float = 30.0,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        if n < 1:
            raise ValueError("a fleet needs at least one server")
        if passwords is not None and len(passwords) != n:
            raise ValueError(f"got {len(passwords)} passwords for {n} servers")
        self.root = root
        self.n = n
        self.binary = binary
        self.models = tuple(models)
        self.extra_providers = dict(extra_providers or {})
        self.prices = dict(prices or {})
        self.agents = dict(agents or {})
        self.extra_env = dict(extra_env or {})
        self.passwords: list[str | None] = (
            list(passwords)
            if passwords is not None
            else [f"pw{i}-{secrets.token_hex(6)}" for i in range(n)]
        )
        self.start_timeout = start_timeout
        self._own_llm = llm is None
        self.llm = llm if llm is not None else FakeLLM()
        self.servers: list[OpencodeServer] = []

    def start(self) -> None:
        """Start the fake LLM (if owned) and all servers concurrently."""
        binary = self.binary or find_opencode_binary()
        if self._own_llm:
            self.llm.start()
        try:
            config = fake_provider_config(
                self.llm.url, self.models, self.extra_providers, self.prices, self.agents
            )
            self.servers = [
                OpencodeServer(
                    binary,
                    home=self.root / f"server{i}" / "home",
                    cwd=self.root / f"server{i}" / "cwd",
                    password=self.passwords[i],
                    config=config,
                    start_timeout=self.start_timeout,
                    extra_env=self.extra_env,
                )
                for i in range(self.n)
            ]
            with ThreadPoolExecutor(max_workers=self.n) as pool:
                futures = [pool.submit(s.start) for s in self.servers]
                errors = [f.exception() for f in futures]
            first = next((e for e in errors if e is not None), None)
            if first is not None:
                raise first
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every server, then the fake LLM if this fleet started it."""
        for s in self.servers:
            s.stop()
        if self._own_llm:
            self.llm.stop()


# -- HTTP helpers for tests and demo setup ---------------------------------------------------


def auth_headers(password: str | None, username: str = "opencode") -> dict[str, str]:
    """Return the Basic auth header for a server (empty without a password)."""
    if not password:
        return {}
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _client(url: str, password: str | None, username: str = "opencode") -> httpx.Client:
    # trust_env=False: a proxy from the environment must never see loopback calls.
    return httpx.Client(
        base_url=url,
        headers=auth_headers(password, username),
        timeout=HTTP_TIMEOUT,
        trust_env=False,
    )


def _json(resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        raise SandboxError(
            f"{resp.request.method} {resp.request.url.path} -> "
            f"{resp.status_code}: {resp.text[:300]}"
        )
    return resp.json()


def health(url: str, password: str | None) -> dict[str, Any]:
    """Return ``GET /global/health``."""
    with _client(url, password) as c:
        result: dict[str, Any] = _json(c.get("/global/health"))
        return result


def create_session(
    url: str,
    password: str | None,
    directory: str | Path,
    title: str | None = None,
    permission: Sequence[Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """Create a session in ``directory`` and return it. ``permission``: the session's own
    rules (``[{"permission": "bash", "pattern": "*", "action": "ask"}]``): the sandbox's
    servers read no project config, and a session's rules are the one way to make it ask."""
    body: dict[str, Any] = {"title": title} if title is not None else {}
    if permission is not None:
        body["permission"] = [dict(rule) for rule in permission]
    with _client(url, password) as c:
        result: dict[str, Any] = _json(
            c.post("/session", params={"directory": str(directory)}, json=body)
        )
        return result


def prompt_async(
    url: str,
    password: str | None,
    session_id: str,
    text: str,
    model: str | None = None,
    directory: str | Path | None = None,
) -> None:
    """Send a prompt without waiting; ``model`` is ``"provider/model"`` or None; ``directory``
    the session's folder (where its run and its pending requests live)."""
    body: dict[str, Any] = {"parts": [{"type": "text", "text": text}]}
    if model is not None:
        provider, sep, model_id = model.partition("/")
        if not sep:
            raise ValueError(f"model must be 'provider/model', got {model!r}")
        body["model"] = {"providerID": provider, "modelID": model_id}
    with _client(url, password) as c:
        params = {"directory": str(directory)} if directory is not None else None
        resp = c.post(f"/session/{session_id}/prompt_async", params=params, json=body)
        if resp.status_code != 204:
            raise SandboxError(
                f"prompt_async {session_id} -> {resp.status_code}: {resp.text[:300]}"
            )


def status(url: str, password: str | None, directory: str | Path) -> dict[str, Any]:
    """Return ``GET /session/status`` for one directory (busy/retry sessions only)."""
    with _client(url, password) as c:
        result: dict[str, Any] = _json(
            c.get("/session/status", params={"directory": str(directory)})
        )
        return result


def messages(url: str, password: str | None, session_id: str) -> list[dict[str, Any]]:
    """Return every message of a session, oldest first."""
    with _client(url, password) as c:
        result: list[dict[str, Any]] = _json(c.get(f"/session/{session_id}/message"))
        return result


def abort(url: str, password: str | None, session_id: str) -> None:
    """Abort a session's run."""
    with _client(url, password) as c:
        _json(c.post(f"/session/{session_id}/abort"))


def let_children_see_ctrl_c() -> None:
    """Give SIGINT its default meaning again in this process, hence in the ones it starts.

    A shell without job control starts a background command (``pytest &``, a CI step run in
    the background) with SIGINT ignored, and an ignored signal stays ignored across exec:
    Ctrl+C (SIGINT) sent to a `watch` or `serve` started from there would do nothing. The
    tests and the benchmark stop those processes with SIGINT, as a person does.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
