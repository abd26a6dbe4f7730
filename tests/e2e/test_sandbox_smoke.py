"""Smoke test of the offline sandbox: a FakeLLM and two real opencode servers."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import pytest

from sandbox import fleet as fl
from sandbox.fake_llm import (
    DEFAULT_TITLE,
    Behaviour,
    FakeLLM,
    error_response,
    make_behaviour,
    split_text,
)
from sandbox.fleet import SandboxError

pytestmark = pytest.mark.e2e

MODELS = ("fake-model", "opencode/free-model", "opencode/free-limited", "backup/good-model")
PASSWORDS = ("alpha-secret", "beta-secret")
T = TypeVar("T")


def wait_until(fn: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``fn`` every 0.1 s until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last={last!r}")


def git_repo(path: Path) -> Path:
    """Create a git repository with one commit (so opencode gives it a project id)."""
    path.mkdir(parents=True)
    git = ["git", "-C", str(path), "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    # The message differs per repo: opencode's project id is the root commit hash.
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", f"init {path.name}"], check=True)
    return path.resolve()


def assistant(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the last assistant message."""
    found = [m for m in msgs if m["info"]["role"] == "assistant"]
    assert found, f"no assistant message in {msgs!r}"
    return found[-1]


def text_of(msg: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in msg["parts"] if p["type"] == "text")


def agent_calls(llm: FakeLLM, provider: str, model: str) -> list[dict[str, Any]]:
    return [
        r
        for r in llm.requests()
        if r["provider"] == provider and r["model"] == model and not r["title_call"]
    ]


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as fake:
        yield fake


@pytest.fixture(autouse=True)
def _reset_llm(llm: FakeLLM) -> None:
    llm.reset()


@pytest.fixture(scope="module")
def fleet(llm: FakeLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[fl.Fleet]:
    f = fl.Fleet(
        tmp_path_factory.mktemp("fleet"), n=2, llm=llm, models=MODELS, passwords=list(PASSWORDS)
    )
    f.start()  # stops whatever it started if it fails
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("repos")
    return git_repo(root / "repo one"), git_repo(root / "repo-two")


# -- fake LLM on its own (fast) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "opts", "error"),
    [
        ("ok", {}, None),
        ("slow", {"delay": 2, "interval": 0.1}, None),
        ("429", {"retry_after": 1, "error_type": "FreeUsageLimitError"}, None),
        ("hang", {}, None),
        ("bogus", {}, "unknown mode"),
        ("ok", {"colour": "red"}, "unknown option"),
        ("slow", {"delay": -1}, "delay must be"),
        ("slow", {"interval": 0}, "interval > 0"),
        ("ok", {"text": 3}, "text must be"),
    ],
)
def test_make_behaviour_validates(mode: str, opts: dict[str, Any], error: str | None) -> None:
    if error is None:
        b = make_behaviour(mode, opts)
        assert b.mode == mode
    else:
        with pytest.raises(ValueError, match=error):
            make_behaviour(mode, opts)


@pytest.mark.parametrize(
    ("mode", "retry_after", "status", "code", "header"),
    [
        ("429", None, 429, "rate_limit_exceeded", None),
        ("429", 1.0, 429, "rate_limit_exceeded", "1"),
        ("500", 2.5, 500, None, "2.5"),
        ("404", 1.0, 404, "model_not_found", None),
        ("401", None, 401, "invalid_api_key", None),
    ],
)
def test_error_response_shapes(
    mode: str, retry_after: float | None, status: int, code: str | None, header: str | None
) -> None:
    got_status, headers, body = error_response(Behaviour(mode=mode, retry_after=retry_after), "m")
    assert got_status == status
    assert body["error"]["code"] == code
    assert headers.get("Retry-After") == header


@pytest.mark.parametrize("text", ["Hello from fake LLM.", "", "  two  spaces ", "one"])
def test_split_text_round_trips(text: str) -> None:
    assert "".join(split_text(text)) == text


def test_modes_are_per_model_with_provider_override(llm: FakeLLM) -> None:
    llm.set_mode(None, "500")
    llm.set_mode("m1", "429")
    llm.set_mode("p/m1", "slow")
    assert llm.behaviour_for(None, "other").mode == "500"
    assert llm.behaviour_for(None, "m1").mode == "429"
    assert llm.behaviour_for("q", "m1").mode == "429"
    assert llm.behaviour_for("p", "m1").mode == "slow"


def test_control_and_log_endpoints(llm: FakeLLM) -> None:
    with httpx.Client(base_url=llm.base_url, timeout=5, trust_env=False) as c:
        assert c.post("/_control", json={"model": "x", "mode": "429", "retry_after": 7}).is_success
        assert c.post("/_control", json={"mode": "nope"}).status_code == 400
        agent = c.post(
            "/p/prov/v1/chat/completions",
            json={
                "model": "x",
                "tools": [{}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "do it"}]}],
            },
        )
        assert (agent.status_code, agent.headers["retry-after"]) == (429, "7")
        # A call without tools is a title call: always answered, whatever the mode.
        title = c.post("/v1/chat/completions", json={"model": "x", "messages": []})
        assert title.json()["choices"][0]["message"]["content"] == DEFAULT_TITLE
        log = c.get("/_log").json()
        assert [(r["provider"], r["n_tools"], r["mode"]) for r in log] == [
            ("prov", 1, "429"),
            (None, 0, "ok"),
        ]
        assert log[0]["last_user_text"] == "do it"
        assert c.post("/_log/clear").is_success
        assert c.get("/_log").json() == []
        assert "fake-model" in [m["id"] for m in c.get("/v1/models").json()["data"]]


def test_stop_does_not_block_on_slow_or_hanging_responses() -> None:
    fake = FakeLLM()
    fake.start()
    name = f"fake-llm:{fake.port}"
    fake.set_mode("hang-model", "hang")
    fake.set_mode("slow-model", "slow", delay=60)
    outcomes: list[str] = []

    def call(model: str) -> None:
        try:
            httpx.post(
                f"{fake.url}/chat/completions",
                timeout=30,
                trust_env=False,
                json={"model": model, "stream": True, "tools": [{}]},
            )
            outcomes.append("answered")
        except httpx.HTTPError:
            outcomes.append("cut")

    threads = [threading.Thread(target=call, args=(m,)) for m in ("hang-model", "slow-model")]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: len(fake.requests()) == 2, 5, "both requests to arrive")
        time.sleep(0.3)  # let the slow stream send a few keep-alive frames
    finally:
        t0 = time.monotonic()
        fake.stop()
    assert time.monotonic() - t0 < 3
    for t in threads:
        t.join(timeout=5)
        assert not t.is_alive()
    assert len(outcomes) == 2
    assert not [t for t in threading.enumerate() if t.name == name]


# -- config and binary ---------------------------------------------------------------------------


def test_fake_provider_config_points_every_provider_at_the_fake() -> None:
    cfg = fl.fake_provider_config(
        "http://127.0.0.1:5/v1", MODELS, extra_providers={"dead": "http://127.0.0.1:9/v1"}
    )
    prov = cfg["provider"]
    assert cfg["enabled_providers"] == ["fake", "opencode", "backup", "dead"]
    assert cfg["model"] == cfg["small_model"] == "fake/fake-model"
    assert prov["opencode"]["options"]["baseURL"] == "http://127.0.0.1:5/p/opencode/v1"
    assert list(prov["opencode"]["models"]) == ["free-model", "free-limited"]
    assert prov["dead"]["options"]["baseURL"] == "http://127.0.0.1:9/v1"
    assert list(prov["dead"]["models"]) == ["fake-model"]
    assert all(p["npm"] == "@ai-sdk/openai-compatible" for p in prov.values())


def test_find_binary_errors_name_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XAF_HUB_OPENCODE_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxError, match="npm install --prefix .opencode opencode-ai@1.18.33"):
        fl.find_opencode_binary(tmp_path)
    monkeypatch.setenv("XAF_HUB_OPENCODE_BIN", str(tmp_path / "missing"))
    with pytest.raises(SandboxError, match="XAF_HUB_OPENCODE_BIN"):
        fl.find_opencode_binary(tmp_path)


@pytest.mark.parametrize(
    ("system", "machine", "package"),
    [
        ("linux", "x86_64", "opencode-linux-x64"),
        ("linux", "aarch64", "opencode-linux-arm64"),
        ("darwin", "arm64", "opencode-darwin-arm64"),
        ("win32", "AMD64", "opencode-windows-x64"),
    ],
)
def test_platform_package(system: str, machine: str, package: str) -> None:
    assert fl.platform_package(system, machine) == package


def test_find_binary_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XAF_HUB_OPENCODE_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    cands = fl.binary_candidates(tmp_path)
    for c in reversed(cands):  # create worst first; each new one must win
        c.parent.mkdir(parents=True, exist_ok=True)
        c.write_text("#!/bin/sh\n")
        c.chmod(0o755)
        assert fl.find_opencode_binary(tmp_path) == c
    monkeypatch.setenv("XAF_HUB_OPENCODE_BIN", str(cands[-1]))
    assert fl.find_opencode_binary(tmp_path) == cands[-1]


def test_fake_llm_runs_as_a_module() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox.fake_llm", "--port", "0", "--mode", "429"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],  # the harness is the checkout's
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.fullmatch(r"fake llm listening on (http://127\.0\.0\.1:\d+/v1)\n", line)
        assert m, line
        r = httpx.post(
            f"{m.group(1)}/chat/completions",
            trust_env=False,
            timeout=5,
            json={"model": "x", "tools": [{}]},
        )
        assert r.status_code == 429
    finally:
        proc.terminate()
        code = proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0


def test_start_failure_reports_log_tail(tmp_path: Path) -> None:
    fake_bin = tmp_path / "opencode"
    fake_bin.write_text("#!/bin/sh\necho 'boom: no config' >&2\nexit 3\n")
    fake_bin.chmod(0o755)
    server = fl.OpencodeServer(fake_bin, tmp_path / "home", tmp_path / "cwd")
    with pytest.raises(SandboxError, match=r"(?s)exited with code 3.*boom: no config"):
        server.start()
    assert not server.running()


# -- real opencode servers -----------------------------------------------------------------------


def test_health_and_auth(fleet: fl.Fleet) -> None:
    a, b = fleet.servers
    assert a.port != b.port
    for server, pw in zip(fleet.servers, PASSWORDS, strict=True):
        assert fl.health(server.url, pw) == {"healthy": True, "version": "1.18.33"}
        with httpx.Client(timeout=5, trust_env=False) as c:
            assert c.get(f"{server.url}/global/health").status_code == 401
    with pytest.raises(SandboxError, match="401"):
        fl.health(b.url, PASSWORDS[0])  # passwords differ per server


def test_sessions_live_in_their_git_repos(fleet: fl.Fleet, repos: tuple[Path, Path]) -> None:
    (a, b), (r1, r2) = fleet.servers, repos
    s1 = fl.create_session(a.url, a.password, r1, "in repo one")
    s2 = fl.create_session(b.url, b.password, r2, "in repo two")
    assert (s1["directory"], s2["directory"]) == (str(r1), str(r2))
    assert s1["projectID"] != "global" and s1["projectID"] != s2["projectID"]
    assert fl.status(a.url, a.password, r1) == {}


def test_slow_prompt_is_busy_then_idle_with_the_fake_text(
    fleet: fl.Fleet, llm: FakeLLM, repos: tuple[Path, Path]
) -> None:
    server, repo = fleet.servers[0], repos[0]
    llm.set_mode("fake-model", "slow", delay=2.5, text="Slow but done.")
    sid = fl.create_session(server.url, server.password, repo, "slow one")["id"]
    t0 = time.monotonic()
    fl.prompt_async(server.url, server.password, sid, "take your time")
    busy = wait_until(lambda: fl.status(server.url, server.password, repo).get(sid), 15, "busy")
    assert busy == {"type": "busy"}
    wait_until(lambda: sid not in fl.status(server.url, server.password, repo), 60, "idle")
    assert time.monotonic() - t0 >= 2.5
    msg = assistant(fl.messages(server.url, server.password, sid))
    assert "error" not in msg["info"]
    assert text_of(msg) == "Slow but done."
    calls = agent_calls(llm, "fake", "fake-model")
    assert [c["last_user_text"] for c in calls] == ["take your time"]


def test_per_model_modes_at_the_same_time(
    fleet: fl.Fleet, llm: FakeLLM, repos: tuple[Path, Path]
) -> None:
    a, b = fleet.servers
    r1, r2 = repos
    llm.set_mode("opencode/free-model", "429", retry_after=1)
    # A longer Retry-After keeps this one in `retry` long enough to observe it.
    llm.set_mode(
        "opencode/free-limited",
        "429",
        retry_after=3,
        error_type="FreeUsageLimitError",
        error_message="Free usage exceeded",
    )
    llm.set_mode("backup/good-model", "ok", text="Backup model answered.")
    limited = fl.create_session(b.url, b.password, r2, "rate limited")["id"]
    free = fl.create_session(a.url, a.password, r2, "free tier")["id"]
    good = fl.create_session(b.url, b.password, r1, "good model")["id"]
    fl.prompt_async(b.url, b.password, limited, "hit the limit", "opencode/free-model")
    fl.prompt_async(a.url, a.password, free, "hit the free limit", "opencode/free-limited")
    fl.prompt_async(b.url, b.password, good, "use the backup", "backup/good-model")

    def retrying() -> dict[str, Any] | None:
        st: dict[str, Any] = fl.status(b.url, b.password, r2).get(limited, {})
        return st if st.get("type") == "retry" else None

    retry = wait_until(retrying, 30, "retry status")
    assert retry["attempt"] >= 1 and "free usage limit" in retry["message"]

    # opencode recognises the free-tier body and attaches an action; then abort it.
    action = wait_until(
        lambda: fl.status(a.url, a.password, r2).get(free, {}).get("action"), 30, "action"
    )
    assert action["reason"] == "free_tier_limit"
    fl.abort(a.url, a.password, free)
    wait_until(lambda: free not in fl.status(a.url, a.password, r2), 10, "abort")
    assert "error" not in assistant(fl.messages(a.url, a.password, free))["info"]

    # The other model of the same fake answers normally meanwhile.
    wait_until(
        lambda: (
            good not in fl.status(b.url, b.password, r1)
            and agent_calls(llm, "backup", "good-model")
        ),
        60,
        "backup model done",
    )
    assert text_of(assistant(fl.messages(b.url, b.password, good))) == "Backup model answered."

    # Retry-After: 1 -> 6 requests about 1 s apart, then APIError 429.
    wait_until(lambda: limited not in fl.status(b.url, b.password, r2), 60, "429 run to end")
    done = time.time()
    err = assistant(fl.messages(b.url, b.password, limited))["info"]["error"]
    assert err["name"] == "APIError"
    assert err["data"]["statusCode"] == 429
    times = [c["time"] for c in agent_calls(llm, "opencode", "free-model")]
    assert len(times) == 6
    gaps = [t2 - t1 for t1, t2 in zip(times, times[1:], strict=False)]
    assert all(0.9 <= g <= 5.0 for g in gaps), gaps  # Retry-After honoured, no backoff
    assert done - times[0] <= 20.0


def test_servers_stay_on_loopback(fleet: fl.Fleet) -> None:
    forbidden = ("registry.npmjs.org", "models.dev", "background dependency install")
    for server in fleet.servers:
        proc = psutil.Process(server.pid)
        remote = {c.raddr.ip for c in proc.net_connections(kind="inet") if c.raddr}
        assert remote <= {"127.0.0.1"}, remote
        log = server.log_text()
        assert not [w for w in forbidden if w in log]
        plugin_dir = server.home / ".config" / "opencode" / "node_modules"
        assert list(plugin_dir.iterdir()) == []  # the plugin install never ran
        assert server.start_seconds is not None and server.start_seconds < 30
        assert proc.memory_info().rss < 2 * 1024**3


def test_servers_run_without_the_file_watcher(fleet: fl.Fleet) -> None:
    # Runs happened in both repos above. opencode's file watcher takes an inotify instance per
    # directory for good and, once the user's limit is used up, hangs the server (OFFLINE_ENV):
    # it must not have started ("watcher backend" is its start-up line).
    for server in fleet.servers:
        log = server.log_text()
        assert "loop session.id=" in log  # the server did run work
        assert "watcher backend" not in log
