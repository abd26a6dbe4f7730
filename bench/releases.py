"""Measure, on real opencode releases, every call xaf-hub relies on (docs/opencode-releases.md).

    python -m bench.releases 1.2.27 1.14.41 1.18.33      # each must be installed:
    scripts/opencode-releases.sh 1.2.27 1.14.41          # (.opencode-releases/<version>/)

For each release: one server (isolated HOME, offline flags, fake model on 127.0.0.1) run under
``strace -f -e connect`` when strace is installed, a git project G (one commit, so its own
opencode project) and a plain folder N. Then: health, create, list (with cursor), get,
prompt_async with and without ``?directory=``, run state read per directory and without one,
messages, abort and delete with and without the directory, and the two event streams. Prints
one result line per check and, at the end, every address the server tried to connect to.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from sandbox.fake_llm import FakeLLM
from sandbox.fleet import OpencodeServer, auth_headers, fake_provider_config
from sandbox.releases import release_binary

PASSWORD = "probe-password-1"
SLOW = 12.0  # seconds the slow model takes: long enough to read the run state while it runs
_CONNECT_RE = re.compile(r"connect\(\d+, \{sa_family=(AF_INET6?|AF_UNIX)(.*?)\}")


def _strace_wrapper(binary: Path, folder: Path) -> tuple[Path, Path | None]:
    """A wrapper that runs ``binary`` under strace (connect calls only), if strace exists."""
    strace = shutil.which("strace")
    if strace is None:
        return binary, None
    log = folder / "connect.trace"
    wrapper = folder / "opencode-traced"
    wrapper.write_text(
        f'#!/bin/sh\nexec {strace} -f -qq -e trace=connect -o {log} {binary} "$@"\n', "utf-8"
    )
    wrapper.chmod(0o755)
    return wrapper, log


def connect_targets(trace: str) -> list[str]:
    """Distinct ``connect()`` targets in an strace log: ``inet 127.0.0.1:PORT``, ``unix PATH``."""
    seen: dict[str, None] = {}
    for m in _CONNECT_RE.finditer(trace):
        family, rest = m.group(1), m.group(2)
        if family == "AF_UNIX":
            path = re.search(r'sun_path=(?:@)?"([^"]*)"', rest)
            seen[f"unix {path.group(1) if path else '?'}"] = None
            continue
        addr = re.search(r'inet(?:6)?_(?:addr|pton)\((?:AF_INET6, )?"([^"]+)"', rest)
        port = re.search(r"htons\((\d+)\)", rest)
        seen[f"inet {addr.group(1) if addr else '?'}:{port.group(1) if port else '?'}"] = None
    return list(seen)


def non_loopback(targets: list[str]) -> list[str]:
    """The targets that leave the machine (anything but 127.0.0.0/8, ::1 and unix sockets)."""
    out = []
    for t in targets:
        if t.startswith("unix "):
            continue
        host = t.split(" ", 1)[1].rsplit(":", 1)[0]
        if host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1"):
            continue
        out.append(t)
    return out


class Probe:
    """One release's server and the checks, each printed as ``check: result``."""

    def __init__(self, http: httpx.Client, llm: FakeLLM, git_dir: Path, plain_dir: Path) -> None:
        self.http = http
        self.llm = llm
        self.g = str(git_dir)
        self.n = str(plain_dir)
        self.results: dict[str, str] = {}

    def note(self, check: str, result: str) -> None:
        self.results[check] = result
        print(f"  {check}: {result}", flush=True)

    def call(self, method: str, path: str, directory: str | None = None, **kw: Any) -> Any:
        params = dict(kw.pop("params", {}))
        if directory is not None:
            params["directory"] = directory
        return self.http.request(method, path, params=params, **kw)

    def status(self, directory: str | None) -> dict[str, Any]:
        r = self.call("GET", "/session/status", directory)
        data = r.json() if r.status_code == 200 else {}
        return {k: v.get("type") for k, v in data.items()} if isinstance(data, dict) else {}

    def create(self, directory: str, title: str) -> dict[str, Any]:
        r = self.call("POST", "/session", directory, json={"title": title})
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def wait(self, predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.25)
        return False

    def prompt(self, sid: str, directory: str | None, model: str = "fake/slow-model") -> int:
        provider, _, name = model.partition("/")
        body = {
            "parts": [{"type": "text", "text": "probe"}],
            "model": {"providerID": provider, "modelID": name},
        }
        return int(
            self.call("POST", f"/session/{sid}/prompt_async", directory, json=body).status_code
        )

    def agent_calls(self) -> int:
        return sum(1 for r in self.llm.requests() if not r.get("title_call"))

    def run_state_of(self, sid: str) -> str:
        """Where a running session shows: per directory (G), without directory, both, none."""
        where = []
        if sid in self.status(self.g):
            where.append("?directory=G")
        if sid in self.status(None):
            where.append("no directory")
        return " and ".join(where) or "nowhere"

    def run(self) -> None:
        h = self.call("GET", "/global/health").json()
        self.note("GET /global/health", f"{h}")
        sg = self.create(self.g, "probe git")
        sn = self.create(self.n, "probe plain")
        self.note(
            "POST /session?directory=D",
            f"directory kept: {sg.get('directory') == self.g}; fields: {sorted(sg)}",
        )
        self.note("project ids (git / plain)", f"{sg.get('projectID')} / {sn.get('projectID')}")
        page = self.call("GET", "/experimental/session", params={"limit": 1}).json()
        both = self.call("GET", "/experimental/session", params={"limit": 50}).json()
        cursor = min(s["time"]["updated"] for s in page) if page else 0
        after = self.call(
            "GET", "/experimental/session", params={"limit": 50, "cursor": cursor}
        ).json()
        self.note(
            "GET /experimental/session",
            f"limit=1 -> {len(page)}; limit=50 -> {len(both)} (dirs "
            f"{sorted({s.get('directory') == self.g for s in both})}); cursor -> {len(after)}",
        )
        plain = self.call("GET", "/session").json()
        self.note("GET /session (no directory)", f"{len(plain)} session(s)")
        for d in (None, self.g):
            r = self.call("GET", f"/session/{sg['id']}", d)
            self.note(
                f"GET /session/ID {'?directory=G' if d else 'no directory'}", f"{r.status_code}"
            )
        r = self.call("GET", "/session/ses_nope", None)
        self.note("GET /session/unknown", f"{r.status_code}")

        for label, d in (("no directory", None), ("?directory=G", self.g)):
            s = self.create(self.g, f"run {label}")
            calls = self.agent_calls()
            code = self.prompt(s["id"], d)
            seen = self.wait(lambda sid=s["id"]: self.run_state_of(sid) != "nowhere", 20)
            where = self.run_state_of(s["id"]) if seen else "nowhere within 20 s"
            # Abort only once the model is answering (an abort while the instance boots is
            # another case).
            called = self.wait(lambda n=calls: self.agent_calls() > n, 60)
            self.note(
                f"prompt_async {label}",
                f"HTTP {code}; running shows {where}; model called: {called}",
            )
            # The other way first: does an abort that does not match where the run lives work?
            ways = (("?directory=G", self.g), ("no directory", None))
            for abort_label, ad in ways if d is None else ways[::-1]:
                r = self.call("POST", f"/session/{s['id']}/abort", ad)
                stopped = self.wait(lambda sid=s["id"]: self.run_state_of(sid) == "nowhere", 8)
                self.note(
                    f"  abort {abort_label} (run started with {label})",
                    f"HTTP {r.status_code} {r.text[:20]!r}; stopped: {stopped}",
                )
                if stopped:
                    break
            self.wait(lambda sid=s["id"]: self.run_state_of(sid) == "nowhere", 20)
            for md in (None, self.g):
                r = self.call("GET", f"/session/{s['id']}/message", md, params={"limit": 5})
                msgs = r.json() if r.status_code == 200 else []
                roles = (
                    [m.get("info", {}).get("role") for m in msgs] if isinstance(msgs, list) else []
                )
                errs = [
                    (m.get("info", {}).get("error") or {}).get("name")
                    for m in msgs
                    if isinstance(m, dict) and m.get("info", {}).get("role") == "assistant"
                ]
                self.note(
                    f"  messages {'?directory=G' if md else 'no directory'}",
                    f"HTTP {r.status_code}; roles {roles}; assistant errors {errs}",
                )

        # Steering with the directory a run another client started without one: queued behind
        # it (the steer's text reaches the model only after the first run), or a second run?
        s = self.create(self.g, "steer")
        self.prompt(s["id"], None)
        calls = self.agent_calls()
        self.wait(lambda: self.agent_calls() > calls, 60)
        code = int(
            self.call(
                "POST",
                f"/session/{s['id']}/prompt_async",
                self.g,
                json={"parts": [{"type": "text", "text": "steer text"}]},
            ).status_code
        )
        time.sleep(4)
        early = any("steer text" in r["last_user_text"] for r in self.llm.requests())
        self.note(
            "prompt_async ?directory=G to a run started without one",
            f"HTTP {code}; running shows {self.run_state_of(s['id'])}; steer reached the model "
            f"while the first still ran: {early} ({'second run' if early else 'queued'})",
        )
        for ad in (None, self.g):
            self.call("POST", f"/session/{s['id']}/abort", ad)
        self.wait(lambda: self.run_state_of(s["id"]) == "nowhere", 20)

        # A quick run to the end: is an idle session's last message readable, cwd attached?
        s = self.create(self.g, "quick")
        self.prompt(s["id"], self.g, "fake/fake-model")
        self.wait(lambda: self.run_state_of(s["id"]) == "nowhere", 20)
        time.sleep(1)
        msgs = self.call("GET", f"/session/{s['id']}/message", self.g).json()
        cwd = [
            m["info"].get("path", {}).get("cwd") for m in msgs if m["info"]["role"] == "assistant"
        ]
        self.note("assistant path.cwd (prompt with ?directory=G)", f"G: {cwd == [self.g]} {cwd}")
        s2 = self.create(self.g, "quick2")
        self.prompt(s2["id"], None, "fake/fake-model")
        self.wait(lambda: self.run_state_of(s2["id"]) == "nowhere", 20)
        time.sleep(1)
        msgs = self.call("GET", f"/session/{s2['id']}/message").json()
        cwd = [
            m["info"].get("path", {}).get("cwd") for m in msgs if m["info"]["role"] == "assistant"
        ]
        self.note("assistant path.cwd (prompt without directory)", f"G: {cwd == [self.g]} {cwd}")

        for label, d in (("no directory", None), ("?directory=G", self.g)):
            s = self.create(self.g, f"delete {label}")
            r = self.call("DELETE", f"/session/{s['id']}", d)
            gone = self.call("GET", f"/session/{s['id']}", self.g).status_code
            self.note(
                f"DELETE /session/ID {label}",
                f"HTTP {r.status_code} {r.text[:20]!r}; then GET -> {gone}",
            )
        r = self.call("DELETE", "/session/ses_nope")
        self.note("DELETE /session/unknown", f"{r.status_code}")
        for path, d in (("/event", self.g), ("/global/event", None)):
            self.note(f"GET {path}", self.first_frame(path, d))

    def first_frame(self, path: str, directory: str | None) -> str:
        params = {"directory": directory} if directory else {}
        try:
            with self.http.stream("GET", path, params=params, timeout=httpx.Timeout(3.0)) as r:
                ctype = r.headers.get("content-type", "")
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        return f"HTTP {r.status_code} {ctype}; first frame {line[5:].strip()[:120]}"
                return f"HTTP {r.status_code} {ctype}; no frame"
        except httpx.TimeoutException:
            return "no answer within 3 s"


@contextlib.contextmanager
def _server(
    version: str, folder: Path, llm: FakeLLM
) -> Iterator[tuple[OpencodeServer, Path | None]]:
    binary, trace = _strace_wrapper(release_binary(version), folder)
    cfg = fake_provider_config(llm.url, ("fake/fake-model", "fake/slow-model"))
    server = OpencodeServer(
        binary,
        home=folder / "home",
        cwd=folder / "cwd",
        password=PASSWORD,
        config=cfg,
        start_timeout=60,
    )
    server.start()
    try:
        yield server, trace
    finally:
        server.stop()


def probe(version: str) -> dict[str, str]:
    """Run every check on one release; return check -> result."""
    print(f"== opencode {version}", flush=True)
    with tempfile.TemporaryDirectory(prefix=f"xaf-probe-{version}-") as tmp, FakeLLM() as llm:
        folder = Path(tmp)
        g, n = folder / "proj-git", folder / "plain"
        g.mkdir()
        n.mkdir()
        git = ["git", "-c", "user.email=p@example.invalid", "-c", "user.name=p"]
        subprocess.run([*git, "init", "-q", str(g)], check=True)
        subprocess.run([*git, "-C", str(g), "commit", "-q", "--allow-empty", "-m", "x"], check=True)
        llm.set_mode("slow-model", "slow", delay=SLOW)
        with (
            _server(version, folder, llm) as (server, trace),
            httpx.Client(
                base_url=server.url, headers=auth_headers(PASSWORD), timeout=20, trust_env=False
            ) as http,
        ):
            p = Probe(http, llm, g, n)
            p.run()
        if trace is not None and trace.exists():
            targets = connect_targets(trace.read_text("utf-8", "replace"))
            outside = non_loopback(targets)
            p.note("connect() targets", ", ".join(targets) or "none")
            p.note("non-loopback connects", ", ".join(outside) or "none")
        else:
            p.note("connect() targets", "not measured (strace missing)")
    return p.results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.releases", description=__doc__.split("\n")[0]
    )
    ap.add_argument("versions", nargs="+", metavar="VERSION")
    args = ap.parse_args(argv)
    failed = 0
    for v in args.versions:
        try:
            probe(v)
        except Exception as exc:  # report and go on with the next release
            failed += 1
            print(f"  FAILED: {type(exc).__name__}: {exc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
