"""A soak: the hub under real faults at random, with its invariants checked the whole time.

    python -m bench --soak                      # 3 minutes, seed 53
    python -m bench --soak --minutes 60 --seed 7

Three real opencode servers (the offline fake model), one redis-server, two hosts' patrol
daemons on it (one holds the lease), and clients that dispatch, queue pool tasks, steer,
interrupt, approve or deny what runs wait on, and read `status` and `sessions`, each a whole
hub process. Every task works in a room of its own (a worktree of a clone of a bare origin on
disk): its agent commits and pushes its branch, the project's check runs, and the daemon lands
it on main. Faults come from a schedule ``random.Random(seed)`` fixes (kinds in ``KINDS``),
run one after another by real means: processes stopped, killed and started again, signals,
a delaying proxy, a full tmpfs, Redis restarted or flushed, the fake model's modes. The
fault waits a moment for the operation it aims at (a send, a fill, a check, a landing: seen
from outside, in the processes and the origin's hook) and the report counts what was in
flight when each struck. The invariants (``Checks``) are checked while it runs; the first
broken one stops the run and prints the seed, the schedule so far and the evidence (exit 1),
so ``--seed S`` replays it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import psutil

from sandbox import fleet as sandbox
from sandbox.fake_llm import FakeLLM
from tests.e2e.daemon import Lines, _beat, start_again
from tests.e2e.ha_checks import ha
from tests.e2e.leaks import leaks
from tests.e2e.proxy import DelayProxy
from tests.e2e.two_hosts import Host, two_hosts
from tests.fleet import NAMES, PRICES, make_hub
from tests.gitrepo import Origin, git
from tests.redis_fixture import _stop, start_redis

LIMIT = 2
PROJECTS = {"soak": None, "side": 1}  # each project's share of a server (None: the limit)
MODELS = ("fake/fake-model", "fake/slow-model", "backup/good-model", "fake/priced-model",
          "fake/ask-model")
STEP_USD = 0.02  # a priced model call: 10 + 5 tokens at $1000 / $2000 per million
RUN_USD = 0.05  # the run ceiling: passed at its third step, one more may be under way
# (docs/budget.md: the step that passes the ceiling, then at most one more per session)
KINDS = ("server_kill", "server_pause", "storm_retry_after", "storm_bare", "hang", "permission",
         "ceiling", "redis_restart", "redis_flush", "cli_kill", "daemon_kill", "slow_link",
         "disk_full", "landing_kill", "worktree_gone")
OPS = ("send", "fill", "check", "landing")  # what a fault may land in the middle of
SENDS = ("dispatch", "steer", "killed")  # client commands that send a prompt
# The agent's one bash call: a file named after its branch (".bad" for a task titled "bad",
# which the check refuses), committed and pushed as the branch.
WORK = [["bash", {"description": "commit and push", "command": (
    'b=$(git rev-parse --abbrev-ref HEAD | tr / -); f="$b.txt"; '
    'case "$b" in *-bad-*) f="$b.bad";; esac; echo "$b" > "$f" && git add "$f" && '
    'git -c user.name=Agent -c user.email=agent@example.invalid commit -q -m "$b" && '
    'git push -q -u origin HEAD && git rev-parse HEAD')}]]
# The project's check: 2.1 s, leaving a process behind that the hub must end with it.
CHECK = "sleep 907 & sleep 2.1; ! ls ./*.bad >/dev/null 2>&1"
CHECK_LEFT, CHECK_LEFT_S = "sleep 907", 30.0
# The origin's hook on a push to main (a landing): marks it in flight for a second, and when
# the soak armed it, SIGKILLs the landing process (refusing the push, or after accepting it).
HOOK = """#!/bin/sh
grep -q " refs/heads/main$" || exit 0
touch {d}/landing; sleep 1; rm -f {d}/landing
p=$(cat {d}/arm 2>/dev/null) || exit 0
rm -f {d}/arm; kill -9 "$p"; [ -e {d}/refuse ] && exit 1
exit 0
"""
FILL_GIT = ("worktree", "fetch", "reset", "ls-files", "ls-tree", "checkout", "base64")
# Bash commands starting "echo ask" wait for a person's answer; every other tool runs (the
# last pattern that matches decides).
PERMISSION = {"bash": {"*": "allow", "echo ask*": "ask"}}
ASK = [["bash", {"command": "echo ask-soak", "description": "asks"}]]
SAMPLE_S = 0.2
HOSTS = ("host-a", "host-b")
CLI_TIMEOUT_S = 120.0
# A request pending this long before a `waiting --json` call starts must be in its answer; an
# answer is judged once the servers were sampled well after it ended.
WAIT_GRACE_S, WAIT_SETTLE_S = 2.0, 10.0


@dataclass
class Fault:
    at: float  # seconds from the start
    kind: str
    target: str  # a server, a host, or ""
    seconds: float  # how long it lasts (pause, storm, full disk, slow link)
    aim: str = ""  # the operation it waits a moment for (one of OPS)
    landed: str = ""  # the operations in flight when it struck
    done: bool = False

    def line(self) -> str:
        mid = f" mid {self.landed}" if self.landed else ""
        return (f"t+{self.at:6.1f}s {self.kind:<17} {self.target:<8} {self.seconds:4.1f}s "
                f"aim {self.aim:<7}{mid}")


@dataclass
class Pending:
    """A request the soak saw pending on its server: first seen (after a listing returned)
    and last seen (when the last listing naming it was asked), in seconds from the start."""

    id: str
    session: str
    server: str
    first: float
    last: float
    ended: bool = False  # listed since with its session idle: this stretch is over


def note_listing(pending: dict[tuple[str, int], Pending], server: str,
                 listed: Iterable[Mapping[str, Any]], waits: set[str], asked: float,
                 seen: float) -> None:
    """Record one folder's listing, asked at ``asked`` and returned at ``seen``, in ``pending``:
    one entry per request and stretch of a run waiting on it (``waits``: the requests whose
    session is busy with the request's tool call still running). opencode keeps listing a
    request after its run ended; a later run of that session does not wait on it, so a stretch
    ends at the first listing where it is not waited on, and a view may rightly leave it out
    from then on."""
    for q in listed:
        rid = str(q["id"])
        stretch = max((k for r, k in pending if r == rid), default=0)
        current = pending.get((rid, stretch))
        if rid not in waits:
            if current is not None:
                current.ended = True
            continue
        if current is None or current.ended:
            stretch += current is not None
            current = pending[(rid, stretch)] = Pending(rid, q["sessionID"], server, seen, asked)
        current.last = max(current.last, asked)


def call_runs(messages: list[dict[str, Any]], request: Mapping[str, Any]) -> bool:
    """Whether the tool call a request was asked from still runs in a session's newest
    messages (a request with no call id: assumed so)."""
    call = (request.get("tool") or {}).get("callID")
    states = [p.get("state", {}).get("status") for m in messages for p in m.get("parts", ())
              if call and p.get("callID") == call]
    return not call or bool(states) and states[-1] in ("pending", "running")


@dataclass(frozen=True)
class Answer:
    """One `waiting --json` answer: when its call started and ended, the request and session
    ids it listed, and the servers it said it could not read."""

    start: float
    end: float
    listed: frozenset[str]
    unknown: frozenset[str]


def unseen_waits(pending: Iterable[Pending], answers: Sequence[Answer],
                 troubled: Sequence[tuple[str, float, float]], grace: float = WAIT_GRACE_S
                 ) -> list[tuple[Pending, Answer, bool]]:
    """Each (request, answer) pair that can be judged, and whether the answer listed the
    request (by its id or its session's): the answer started ``grace`` after the request was
    first seen, the request was still pending after the call ended, and its server was
    neither troubled (down, paused, behind a slow link: ``(server, from, to)``) during the
    call nor said by the answer to be unreadable."""
    return [(r, a, bool({r.id, r.session} & a.listed)) for r in pending for a in answers
            if a.start >= r.first + grace and r.last >= a.end and r.server not in a.unknown
            and not any(s == r.server and lo < a.end and hi > a.start
                        for s, lo, hi in troubled)]


def run_costs(messages: list[dict[str, Any]]) -> list[float]:
    """What each run of a session cost, in the order its prompts came: a prompt (a client's
    steer is one) starts a run, and every assistant step answers the prompt it names as its
    parent (docs/budget.md: a ceiling holds per run, not per session)."""
    runs: dict[str, float] = {}
    for m in messages:
        info = m["info"]
        if info.get("role") == "user":
            runs.setdefault(str(info.get("id")), 0.0)
        elif info.get("role") == "assistant":
            key = str(info.get("parentID"))
            runs[key] = runs.get(key, 0.0) + float(info.get("cost") or 0)
    return list(runs.values())


def schedule(seed: int, seconds: float, kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """The faults of a run: which, when, where and how long, all from ``seed``; the kinds take
    turns, so each comes as often as the others."""
    rnd = random.Random(seed)
    out, t, bag = [], 20.0, list[str]()
    while t < seconds - 15:
        if not bag:  # every kind once, in a shuffled order, then again
            bag = rnd.sample(kinds, len(kinds))
        kind = bag.pop()
        target = {"server_kill": rnd.choice(NAMES), "server_pause": rnd.choice(NAMES),
                  "daemon_kill": "active", "cli_kill": rnd.choice(HOSTS),
                  "slow_link": "lan-c", "landing_kill": rnd.choice(("refused", "accepted")),
                  "worktree_gone": rnd.choice(("rm", "git"))}.get(kind, "")
        aim = "landing" if kind == "landing_kill" else rnd.choice(OPS)
        out.append(Fault(round(t, 1), kind, target, round(rnd.uniform(2.0, 8.0), 1), aim))
        t += rnd.uniform(4.0, 9.0)
    return out


@dataclass
class Checks:
    """Each invariant's count of checks, and the run's figures."""

    counts: Counter[str] = field(default_factory=Counter)
    slowest: dict[str, float] = field(default_factory=dict)
    peaks: Counter[str] = field(default_factory=Counter)
    figures: Counter[str] = field(default_factory=Counter)
    broken: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, name: str, ok: bool, evidence: str) -> None:
        with self.lock:
            self.counts[name] += 1
            if not ok and not self.broken:
                self.broken.append(f"{name}: {evidence}")

    def time(self, name: str, seconds: float) -> None:
        with self.lock:
            self.slowest[name] = max(self.slowest.get(name, 0.0), seconds)


class Soak:
    """The fleet, the hosts, the clients, the faults and the checks of one run."""

    def __init__(self, root: Path, seed: int, seconds: float, log: Callable[[str], None]):
        self.root, self.seed, self.seconds, self.log = root, seed, seconds, log
        self.checks = Checks()
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.inflight: Counter[str] = Counter()
        self.paused: set[str] = set()
        self.slow_until = 0.0
        # (instance, session, project) a client was told; priced: runs made to pass the ceiling
        self.dispatched: list[tuple[str, str, str]] = []
        self.priced: list[tuple[str, str, str]] = []
        self.tasks: dict[str, float] = {}  # pool task id -> when it was added
        self.redis_lost_at = 0.0
        self.daemons: dict[str, Lines] = {}
        self.rss: dict[int, list[float]] = {}
        self.outputs: list[str] = []
        self.lock = threading.Lock()
        self.skipped: dict[str, str] = {}
        self.folders: dict[str, set[str]] = {n: set() for n in NAMES}  # where sessions are
        # (request id, stretch) -> when seen pending with its session busy (note_listing)
        self.pending: dict[tuple[str, int], Pending] = {}
        self.answers: list[Answer] = []  # `waiting --json` answers not judged yet
        self.troubled: list[tuple[str, float, float]] = []  # (server, from, to): down, slow

    # -- set-up ---------------------------------------------------------------------------

    def start(self) -> None:
        r = self.root
        self.llm = FakeLLM().__enter__()
        self.llm.set_mode("slow-model", "slow", delay=6)
        self.llm.set_mode("priced-model", "tools", calls=[
            ["bash", {"command": "sleep 1", "description": "a step"}]] * 30)
        self.llm.set_mode("ask-model", "tools", calls=ASK * 2)  # the answer act's own work
        self.fleet = sandbox.Fleet(r / "fleet", n=3, llm=self.llm, models=MODELS,
                                   prices=PRICES,
                                   start_timeout=180.0,
                                   extra_env={"OPENCODE_PERMISSION": json.dumps(PERMISSION)})
        self.fleet.start()
        self.ports = [s.port for s in self.fleet.servers]
        (r / "redis").mkdir()
        self.redis, self.redis_proc = start_redis(r / "redis")
        home = r / "home"
        home.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(home)],
                          capture_output=True).returncode != 0:
            self.skipped["disk_full"] = "mount of a tmpfs refused (not root?)"
        self.tmpfs = home if "disk_full" not in self.skipped else None
        hub = make_hub(self.fleet, self.llm, r, home, {"name": "soak"},
                       concurrency_limit=LIMIT,
                       timeouts={"connect_seconds": 2, "read_seconds": 10},
                       lock={"slot_ttl_seconds": 60, "lock_timeout_seconds": 20,
                             "slot_grace_seconds": 5},
                       budget={"run_usd": RUN_USD})
        hub.doc["models"] = {"default_dispatch_model": "fake/fake-model",
                             "chain": ["fake/fake-model", "backup/good-model"]}
        # Two projects, each its own origin and, on each server, its own clone to make rooms in.
        hub.doc.pop("project")
        for inst in hub.doc["instances"]:
            inst.pop("roots"), inst.pop("default_directory")
        self.origins, hub.doc["projects"] = {}, {}
        for p, share in PROJECTS.items():
            (r / p).mkdir()  # a first commit of its own: opencode tells projects by theirs
            git(r / p, "init", "-q", "--bare", "-b", "main", "origin.git")
            git(r / p, "clone", "-q", "origin.git", "work")
            origin = self.origins[p] = Origin(r / p / "origin.git", r / p / "work")
            origin.commit(f"first of {p}")
            origin.push()
            (origin.bare / "hooks" / "pre-receive").write_text(HOOK.format(d=r))
            (origin.bare / "hooks" / "pre-receive").chmod(0o755)
            for name in NAMES:
                git(r, "clone", "-q", str(origin.bare), str(hub.root / p / name))
            hub.doc["projects"][p] = {
                "repository": str(origin.bare), "isolation": "worktree", "integrate": "auto",
                "check_command": CHECK, "roots": {n: [str(hub.root / p)] for n in NAMES},
                "default_directory": {n: str(hub.root / p / n) for n in NAMES},
                **({"share": share} if share else {})}
        hub.write_config()
        self.work()
        self.hub = hub
        self.hosts = two_hosts(hub, self.redis, r)
        for h in self.hosts:
            h.write(ha)
        # The clients reach lan-c through a proxy that delays each request while a slow link
        # lasts (the daemons follow the servers' event streams, which it would hold back).
        self.proxy = DelayProxy(self.fleet.servers[2].url, self._link_delay).__enter__()
        self.clients = tuple(
            Host(h.name, replace(h.hub, config_path=r / f"client-{h.name}.json",
                                 doc=copy.deepcopy(h.hub.doc))) for h in self.hosts)
        for h in self.clients:
            h.hub.set_instance("lan-c", url=self.proxy.url)
        self.secrets = [*hub.secrets(), self.redis.password]
        for h in self.hosts:
            self._start_daemon(h)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.page = f"http://127.0.0.1:{probe.getsockname()[1]}"
        self.serve = Lines(self.hosts[0].popen("serve", "--port", self.page.rsplit(":", 1)[1]))
        for _ in range(600):  # the page first answers once serve listens
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.page + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)

    def work(self) -> None:
        """The fake model's usual answer: the task's work, committed and pushed."""
        self.llm.set_mode("fake-model", "tools", calls=WORK, text="Done. The commit:")

    def _link_delay(self, method: str, path: str) -> float:
        return 1.5 if time.monotonic() < self.slow_until else 0.0

    def _start_daemon(self, host: Host) -> None:
        self.daemons[host.name] = Lines(
            host.popen("patrol", "--interval-seconds", "2", "--no-design"))

    def close(self) -> None:
        self.stop.set()
        for pid in self.paused_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for lines in [*self.daemons.values(), self.serve]:
            lines.proc.kill()
            lines.stop()
        with contextlib.suppress(Exception):
            self.proxy.__exit__()
        with contextlib.suppress(Exception):
            self.fleet.stop()
        with contextlib.suppress(Exception):
            self.llm.stop()
        with contextlib.suppress(Exception):
            _stop(self.redis_proc)
        if self.tmpfs is not None:
            subprocess.run(["umount", "-l", str(self.tmpfs)], capture_output=True)

    def paused_pids(self) -> list[int]:
        return [self.server(n).pid for n in self.paused if self.server(n).running()]

    def server(self, name: str) -> sandbox.OpencodeServer:
        return self.fleet.servers[NAMES.index(name)]

    def now(self) -> float:
        return time.monotonic() - self.t0

    @contextlib.contextmanager
    def trouble(self, server: str) -> Iterator[None]:
        """Mark ``server`` down, paused or slow to reach while the block runs."""
        with self.lock:
            self.troubled.append((server, self.now(), float("inf")))
            i = len(self.troubled) - 1
        try:
            yield
        finally:
            with self.lock:
                self.troubled[i] = (server, self.troubled[i][1], self.now())

    # -- hub processes --------------------------------------------------------------------

    def cli(self, host: Host, what: str, *args: str, kill_after: float | None = None
            ) -> tuple[int, str, str]:
        """Run one hub command as its own process; check its output; (code, out, err)."""
        with self.lock:
            self.inflight[what] += 1
        t = time.monotonic()
        proc = host.popen(*args)
        try:
            out, err = proc.communicate(timeout=kill_after or CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            if kill_after is None:
                self.checks.check("answers", False, f"{args} no answer in "
                                  f"{CLI_TIMEOUT_S}s")
        finally:
            with self.lock:
                self.inflight[what] -= 1
        self.checks.time(what, time.monotonic() - t)
        self.read_text(f"{' '.join(args[:2])}", out + err)
        return proc.returncode, out, err

    def read_text(self, where: str, text: str) -> None:
        self.checks.check("no traceback", "Traceback (most recent call last)" not in text,
                          f"{where}: {text[-2000:]}")
        found = leaks(text, self.secrets)
        self.checks.check("no secret", not found, f"{where}: a password form")

    # -- clients --------------------------------------------------------------------------

    def client(self, i: int) -> None:
        rnd = random.Random(self.seed * 1000 + i)
        n = 0
        while not self.stop.is_set():
            n += 1
            act = rnd.choice(("dispatch", "dispatch", "dispatch", "queue", "mcp", "steer",
                              "interrupt", "answer", "answer", "status", "sessions"))
            try:
                self.act(act, rnd, self.clients[rnd.randrange(2)], f"c{i}-{n}")
            except Exception:  # the harness's own failure: stop the run, loudly
                self.checks.check("clients ran", False, traceback.format_exc())
            self.stop.wait(rnd.uniform(0.5, 2.5))

    def act(self, act: str, rnd: random.Random, host: Host, tag: str) -> None:
        """One client's action."""
        p = rnd.choice((*PROJECTS, *PROJECTS)[:3])  # titles name it: rooms map to projects
        if act == "dispatch":
            model = rnd.choice((*MODELS[:2], MODELS[0], MODELS[4]))  # the priced: the ceiling's
            self.send(host, p, f"{p} work {tag}", model)
        elif act == "queue":
            title = f"{p} {'bad ' if rnd.random() < 0.2 else ''}task {tag}"
            code, _, _ = self.cli(host, "queue", "--project", p, "backlog", "add", "--id",
                                  f"SOAK-{tag}", "--title", title)
            if code == 0:
                self.tasks[f"SOAK-{tag}"] = self.now()
        elif act == "mcp":
            tid = self.mcp_add(host, p, f"{p} task {tag} (mcp)")
            if tid:
                self.tasks[tid] = self.now()
        elif act in ("steer", "interrupt") and self.dispatched:
            inst, sid, p = rnd.choice(self.dispatched[-10:])
            if act == "steer":
                self.cli(host, act, "--project", p, "dispatch", "--session", sid, "--text",
                         f"also {tag}")
            else:
                self.cli(host, act, "--project", p, "interrupt", "--session", sid,
                         "--allow-prod")
        elif act == "answer":  # a request to approve or deny, or else a run that will ask
            code, out, _ = self.waiting(host)
            reqs = json.loads(out).get("waiting", []) if code == 0 and out.strip() else []
            if reqs:
                verb = rnd.choice(("approve", "deny"))
                where = ("--project", str(reqs[0]["project"])) if reqs[0].get("project") else ()
                self.cli(host, verb, *where, verb, str(reqs[0].get("id")), "--allow-prod")
            elif code == 0:
                self.send(host, p, f"{p} asks {tag}", "fake/ask-model")
        elif act in ("status", "sessions"):
            code, out, err = self.cli(host, act, act, "--json")
            self.checks.check("answers", code in (0, 2) and bool(out.strip()),
                              f"{act} exit {code}: {err[-500:]}")

    def waiting(self, host: Host) -> tuple[int, str, str]:
        """`waiting --json` on ``host``; an answer that lists requests is kept for judging."""
        start = self.now()
        code, out, err = self.cli(host, "waiting", "waiting", "--json")
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            doc = json.loads(out)
            listed = {str(q.get(k)) for q in doc["waiting"] for k in ("id", "session_id")}
            unknown = {str(u.get("instance")) for u in doc.get("unknown", ())}
            with self.lock:
                self.answers.append(Answer(start, self.now(), frozenset(listed),
                                           frozenset(unknown)))
        return code, out, err

    def send(self, host: Host, p: str, text: str, model: str, *into: list[tuple[str, str, str]]
             ) -> None:
        """`dispatch --new` of project ``p``; what it was told goes in ``into`` (dispatched)."""
        code, out, _ = self.cli(host, "dispatch", "--project", p, "dispatch", "--new", "--json",
                                "--text", text, "--model", model)
        if code == 0:
            doc = json.loads(out)
            for seen in into or (self.dispatched,):
                seen.append((str(doc["instance"]), str(doc["session_id"]), p))

    def mcp_add(self, host: Host, p: str, title: str) -> str:
        """Add a pool task through `xaf-hub mcp` (stdio, JSON-RPC lines); its id, or ""."""
        calls = [("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "soak", "version": "1"}}),
                 ("notifications/initialized", None),
                 ("tools/call", {"name": "backlog_add", "arguments": {"title": title}})]
        proc = host.hub.popen("--project", p, "mcp", extra_env={"XAF_HUB_HOSTNAME": host.name},
                              stdin=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None
        with self.lock:
            self.inflight["mcp"] += 1
        try:
            answer: dict[str, object] = {}
            for n, (method, params) in enumerate(calls):
                msg = {"jsonrpc": "2.0", "method": method,
                       **({"id": n, "params": params} if params is not None else {})}
                proc.stdin.write(json.dumps(msg) + "\n")
                proc.stdin.flush()
                if params is not None:
                    answer = json.loads(proc.stdout.readline() or "{}")
            _, err = proc.communicate(timeout=60)
        except (subprocess.TimeoutExpired, ValueError):
            err = ""
        finally:
            proc.kill()
            proc.wait()
            with self.lock:
                self.inflight["mcp"] -= 1
        self.read_text("mcp backlog_add", json.dumps(answer) + err)
        result = answer.get("result")
        doc = result.get("structuredContent") if isinstance(result, dict) else None
        return str(doc.get("id", "")) if isinstance(doc, dict) else ""

    # -- samplers -------------------------------------------------------------------------

    def ops_now(self) -> set[str]:
        """The operations in flight now, seen from outside: a client's send, a fill's room
        being made (git on a pool task's worktree), the check's process, a landing (git in a
        hub's scratch worktree, or its push in the origin's hook)."""
        with self.lock:
            ops = {"send"} if any(self.inflight[k] > 0 for k in SENDS) else set()
        if (self.root / "landing").exists():
            ops.add("landing")
        left = []
        for proc in psutil.process_iter(["cmdline", "cwd", "create_time"]):
            cmd = " ".join(proc.info["cmdline"] or ())
            where = f"{cmd} {proc.info['cwd'] or ''}"
            if cmd.startswith("sleep 2.1"):
                ops.add("check")
            elif cmd.startswith(CHECK_LEFT):
                if (age := time.time() - proc.info["create_time"]) > CHECK_LEFT_S:
                    left.append(f"pid {proc.pid} `{cmd}` {age:.0f}s old")
            elif not cmd.startswith("git"):
                continue
            elif "/checks/" in where and "/work" in where:
                ops.add("landing")
            elif "-task-" in where and any(w in cmd for w in FILL_GIT):
                ops.add("fill")
        self.checks.check("no check process outlives its check", not left, str(left))
        return ops

    def sample_limits(self) -> None:
        """Every 200 ms: each server's busy top-level sessions (a sub-agent counted with its
        parent), from the server itself, against the limit."""
        parents: dict[str, dict[str, str | None]] = {n: {} for n in NAMES}
        where: dict[str, str] = {}  # session -> its folder
        k = 0
        with httpx.Client(timeout=1.0) as c:
            while not self.stop.wait(SAMPLE_S):
                for i, name in enumerate(NAMES):
                    if name in self.paused:
                        continue
                    url = f"http://127.0.0.1:{self.ports[i]}"
                    auth = sandbox.auth_headers(self.fleet.passwords[i])
                    try:
                        if k % 10 == 0:
                            for s in c.get(f"{url}/experimental/session",
                                           params={"limit": 2000}, headers=auth).json():
                                parents[name][s["id"]] = s.get("parentID")
                                where[s["id"]] = s["directory"]
                                self.folders[name].add(s["directory"])
                        busy: set[str] = set()
                        for d in list(self.folders[name]):
                            r = c.get(f"{url}/session/status", params={"directory": d},
                                      headers=auth)
                            busy |= {sid for sid, st in r.json().items()
                                     if st.get("type") in ("busy", "retry")}
                    except (httpx.HTTPError, ValueError):
                        continue
                    runs = {self._root_of(parents[name], sid) for sid in busy}
                    self.checks.peaks[name] = max(self.checks.peaks[name], len(runs))
                    self.checks.check("server limit", len(runs) <= LIMIT,
                                      f"{name} runs {sorted(runs)}")
                    for p, share in PROJECTS.items():
                        mine = sorted(r for r in runs if self.project_of(where.get(r, "")) == p)
                        self.checks.peaks[f"{name} {p}"] = max(
                            self.checks.peaks[f"{name} {p}"], len(mine))
                        self.checks.check("project within its share",
                                          len(mine) <= (share or LIMIT),
                                          f"{name} runs of {p}: {mine}, share {share}")
                k += 1

    def sample_waits(self) -> None:
        """Every second: each live server's pending permission requests and questions of busy
        sessions, asked of every folder it has sessions in; then each `waiting --json` answer
        that is due is judged: a request pending before it started must be in it."""
        judged: set[str] = set()
        self.checks.counts["no waiting run unseen"] += 0  # reported even when nothing is judged
        with httpx.Client(timeout=2.0) as c:
            while not self.stop.wait(1.0):
                for i, name in enumerate(NAMES):
                    url = f"http://127.0.0.1:{self.ports[i]}"
                    auth = sandbox.auth_headers(self.fleet.passwords[i])
                    for d in sorted(self.folders[name]):
                        if name in self.paused:
                            break
                        asked = self.now()
                        try:
                            listed = [q for route in ("/permission", "/question") for q in c.get(
                                url + route, params={"directory": d}, headers=auth).json()]
                            status = c.get(url + "/session/status", params={"directory": d},
                                           headers=auth).json() if listed else {}
                            busy = {k for k, v in status.items() if v["type"] in ("busy", "retry")}
                            # A run waits, and holds its slot, while its session is busy and
                            # the request's tool call runs.
                            waits = {str(q["id"]) for q in listed if q["sessionID"] in busy
                                     and call_runs(c.get(
                                         f"{url}/session/{q['sessionID']}/message", headers=auth,
                                         params={"directory": d, "limit": 3}).json(), q)}
                            note_listing(self.pending, name, listed, waits, asked, self.now())
                        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
                            continue
                with self.lock:
                    due = [a for a in self.answers if a.end < self.now() - WAIT_SETTLE_S]
                    self.answers = [a for a in self.answers if a not in due]
                    troubled = list(self.troubled)
                for r, a, seen_ in unseen_waits(list(self.pending.values()), due, troubled):
                    judged.add(r.id)
                    self.checks.check(
                        "no waiting run unseen", seen_,
                        f"{r.id} of session {r.session} on {r.server}, pending from "
                        f"t+{r.first:.1f}s to t+{r.last:.1f}s, not in the `waiting --json` "
                        f"answer asked t+{a.start:.1f}s, answered t+{a.end:.1f}s")
                self.checks.figures["waiting answers"] += len(due)
                self.checks.figures["requests pending seen"] = len({r for r, _ in self.pending})
                self.checks.figures["requests judged"] = len(judged)

    def poll_views(self) -> None:
        """Every 3 s: `status`, `sessions` or `waiting` (in turn, host A's client) and the
        served page and its JSON, each answering, with no traceback or secret in it."""
        k = 0
        with httpx.Client(timeout=60.0) as c:
            while not self.stop.wait(3.0):
                k += 1
                what = ("status", "sessions", "waiting")[k % 3]
                code, out, err = (self.waiting(self.clients[0]) if what == "waiting" else
                                  self.cli(self.clients[0], what, what, "--json"))
                self.checks.check("answers", code in (0, 2) and bool(out.strip()),
                                  f"{what} exit {code}: {err[-500:]}")
                for path in ("/", "/api/snapshot"):
                    t = time.monotonic()
                    try:
                        r = c.get(self.page + path)
                        ok, body = r.status_code == 200, r.text
                    except httpx.HTTPError as exc:
                        ok, body = False, repr(exc)
                    self.checks.time(f"page {path}", time.monotonic() - t)
                    self.checks.check("answers", ok, f"page {path}: {body[-500:]}")
                    self.read_text(f"page {path}", body)

    def project_of(self, folder: str) -> str:
        """The project a session's folder is of: its room's name (a task's title, which names
        the project) or the project's clone."""
        return next((p for p in PROJECTS if f"-{p}-" in Path(folder).name
                     or Path(folder).is_relative_to(self.hub.root / p)), "")

    @staticmethod
    def _root_of(parents: dict[str, str | None], sid: str) -> str:
        seen = 0
        while parents.get(sid) and seen < 20:
            sid, seen = str(parents[sid]), seen + 1
        return sid

    def sample_each_second(self) -> None:
        """Every second: the daemons' memory, and each reservation in Redis against its TTL."""
        lock = self.hosts[0].hub.doc["lock"]
        client = self.redis.client()
        while not self.stop.wait(1.0):
            self.ops_now()
            bad = [f for o in self.origins.values() for f in git(
                o.bare, "log", "main", "--name-only", "--format=").split() if f.endswith(".bad")]
            self.checks.check("no push carries a failed check", not bad, f"on main: {bad}")
            with contextlib.suppress(Exception):  # Redis may be down or restarting
                for key in client.scan_iter(f"{lock['redis_prefix']}:slot:*", count=1000):
                    raw = client.get(key) if client.type(key) == "string" else None
                    if raw:
                        age = time.time() - float(json.loads(raw)["created"])
                        self.checks.check("reservation within its TTL",
                                          age <= lock["slot_ttl_seconds"] + 2,
                                          f"{key} is {age:.0f}s old: {raw}")
            for lines in list(self.daemons.values()):
                with contextlib.suppress(OSError, ValueError, IndexError, StopIteration):
                    text = Path(f"/proc/{lines.proc.pid}/status").read_text()
                    kb = next(ln for ln in text.splitlines() if ln.startswith("VmRSS"))
                    self.rss.setdefault(lines.proc.pid, []).append(int(kb.split()[1]) / 1024)

    # -- faults ---------------------------------------------------------------------------

    def run_fault(self, f: Fault) -> None:
        until = time.monotonic() + 10.0
        while (f.aim not in (ops := self.ops_now()) and time.monotonic() < until
               and f.kind != "landing_kill"):
            time.sleep(0.05)
        f.landed = ",".join(o for o in OPS if o in ops)
        if f.kind == "server_kill":
            s = self.server(f.target)
            port = s.port
            with self.trouble(f.target):
                s.stop(grace=0.5)  # SIGTERM, then SIGKILL
                self.stop.wait(f.seconds)
                for attempt in range(10):  # the old port may not be free again at once
                    try:
                        start_again(s, port)
                        break
                    except sandbox.SandboxError:
                        s.stop()
                        if attempt == 9:
                            raise
                        time.sleep(2)
        elif f.kind == "server_pause":
            pid = self.server(f.target).pid
            with self.trouble(f.target):
                self.paused.add(f.target)
                os.kill(pid, signal.SIGSTOP)
                self.stop.wait(f.seconds)
                os.kill(pid, signal.SIGCONT)
                self.paused.discard(f.target)
        elif f.kind in ("storm_retry_after", "storm_bare"):
            ra = {"retry_after": 2} if f.kind == "storm_retry_after" else {}
            self.llm.set_mode("fake-model", "429", **ra)
            self.stop.wait(f.seconds)
            self.work()
        elif f.kind == "permission":  # the runs started meanwhile ask before a command
            self.llm.set_mode("fake-model", "tools", calls=ASK)
            self.stop.wait(f.seconds)
            self.work()
        elif f.kind == "ceiling":
            self.send(self.clients[0], "soak", "soak priced", "fake/priced-model",
                      self.dispatched, self.priced)
        elif f.kind == "hang":
            self.llm.set_mode("slow-model", "hang")
            self.stop.wait(f.seconds)
            self.llm.set_mode("slow-model", "slow", delay=6)
        elif f.kind == "redis_restart":
            _stop(self.redis_proc)
            self.redis_lost_at = self.now()
            self.stop.wait(f.seconds)
            _, self.redis_proc = start_redis(self.root / "redis", self.redis.port,
                                             self.redis.password)
        elif f.kind == "redis_flush":
            client = self.redis.client()
            client.flushall()
            client.close()
            self.redis_lost_at = self.now()
        elif f.kind == "cli_kill":
            host = self.clients[HOSTS.index(f.target)]
            self.cli(host, "killed", "--project", "soak", "dispatch", "--new", "--text",
                     "soak killed",
                     kill_after=f.seconds / 2)
        elif f.kind == "daemon_kill":
            host = next((h for h in self.hosts if _beat(h.hub).get("role") == "active"),
                        self.hosts[0])  # the lease holder: the one running rounds
            f.target = host.name
            old = self.daemons[host.name]
            old.proc.kill()
            old.stop()
            self.read_text(f"daemon {host.name}", "\n".join(old.lines + old.err))
            self.stop.wait(f.seconds / 4)
            self._start_daemon(host)
        elif f.kind == "landing_kill":  # the origin's hook kills the landing daemon
            host = next((h for h in self.hosts if _beat(h.hub).get("role") == "active"),
                        self.hosts[0])
            lines = self.daemons[host.name]
            (self.root / "refuse").unlink(missing_ok=True)
            if f.target == "refused":
                (self.root / "refuse").touch()
            (self.root / "arm").write_text(str(lines.proc.pid))
            with contextlib.suppress(subprocess.TimeoutExpired):
                lines.proc.wait(timeout=90)
            (self.root / "arm").unlink(missing_ok=True)
            if lines.proc.poll() is None:
                f.landed = ""  # no landing in 90 s: it did not happen
                return
            f.landed = ",".join(sorted({*f.landed.split(","), "landing"} - {""}))
            lines.stop()
            self.read_text(f"daemon {host.name}", "\n".join(lines.lines + lines.err))
            self._start_daemon(host)
        elif f.kind == "worktree_gone":  # a task's room removed on its server's disk
            code, out, _ = self.cli(self.hosts[0], "backlog", "backlog", "list", "--json")
            rooms = [t for t in json.loads(out)["tasks"] if t.get("worktree") and
                     t.get("status") == "dispatched" and Path(t["worktree"]).exists()
                     ] if code == 0 else []
            if not rooms:
                f.landed = ""
                return
            t = random.Random(f.at).choice(sorted(rooms, key=lambda t: str(t["id"])))
            if f.target == "rm":
                shutil.rmtree(t["worktree"], ignore_errors=True)
            else:
                subprocess.run(["git", "-C", t["checkout"], "worktree", "remove", "--force",
                                t["worktree"]], capture_output=True)
        elif f.kind == "slow_link":
            with self.trouble(f.target):
                self.slow_until = time.monotonic() + f.seconds
                self.stop.wait(f.seconds)
        elif f.kind == "disk_full" and self.tmpfs is not None:
            filler = self.tmpfs / "filler"
            with contextlib.suppress(OSError), open(filler, "wb") as fh:
                while True:
                    fh.write(b"\0" * (1 << 20))
            self.stop.wait(f.seconds)
            filler.unlink(missing_ok=True)
        f.done = True
        self.log(f.line())

    # -- the run --------------------------------------------------------------------------

    def run(self) -> list[Fault]:
        kinds = tuple(k for k in KINDS if k not in self.skipped)
        plan = schedule(self.seed, self.seconds, kinds)
        threads = [threading.Thread(target=fn, daemon=True) for fn in
                   (self.sample_limits, self.sample_waits, self.sample_each_second,
                    self.poll_views,
                    lambda: self.client(0), lambda: self.client(1))]
        self.t0 = time.monotonic()
        for t in threads:
            t.start()
        for f in plan:
            while self.now() < f.at and not self.checks.broken:
                time.sleep(0.2)
            if self.checks.broken or self.now() >= self.seconds - 10:
                break  # faults run one after another: a slow one pushes the rest back
            self.run_fault(f)
        while self.now() < self.seconds and not self.checks.broken:
            time.sleep(0.5)
        if not self.checks.broken:
            self.final_checks()
        self.stop.set()
        for t in threads:
            t.join(CLI_TIMEOUT_S)
        return [f for f in plan if f.done or f.landed]

    def final_checks(self) -> None:
        """What a client was told: each dispatch on its server, each task since the last Redis
        loss in the pool with a state; the daemons' memory flat; their logs clean."""
        for inst, sid, p in self.dispatched:
            i = NAMES.index(inst)
            try:
                msgs = sandbox.messages(f"http://127.0.0.1:{self.ports[i]}",
                                        self.fleet.passwords[i], sid)
            except (httpx.HTTPError, sandbox.SandboxError):
                msgs = None
            self.checks.check("dispatch on its server", msgs is not None, f"{sid} on {inst}")
            if (inst, sid, p) in self.priced and msgs is not None:
                runs = run_costs(msgs)
                self.checks.figures["priced runs"] += len(runs)
                self.checks.check("run cost within ceiling + a step",
                                  max(runs, default=0) <= RUN_USD + 2 * STEP_USD + 1e-9,
                                  f"{sid}: runs cost {', '.join(f'${c:.2f}' for c in runs)}")
        code, out, err = self.cli(self.hosts[0], "backlog", "backlog", "list", "--json")
        listed = {t["id"]: t for t in json.loads(out)["tasks"]} if code == 0 else {}
        on_main = Counter(s for o in self.origins.values()
                          for s in git(o.bare, "log", "--format=%s", "main").splitlines())
        self.checks.check("each landed change on main once", max(on_main.values()) <= 1,
                          f"twice on main: {[s for s, n in on_main.items() if n > 1]}")
        landed = [t for t in listed.values() if t.get("landing") == "landed"]
        for t in landed:
            mark = str(t.get("branch")).replace("/", "-")
            self.checks.check("each landed change on main once", on_main[mark] == 1,
                              f"{t['id']} {mark} on main {on_main[mark]} times")
        credited = Counter(t.get("commit") for t in landed)
        self.checks.check("no commit credited twice", max(credited.values(), default=0) <= 1,
                          f"{[c for c, n in credited.items() if n > 1]}")
        self.checks.figures.update({"tasks landed": len(landed),
                                    "commits on main": sum(on_main.values()) - len(self.origins)})
        for tid, added in self.tasks.items():
            if added > self.redis_lost_at + 1:
                t = listed.get(tid, {})
                self.checks.check("task kept with a state", bool(t.get("status")),
                                  f"{tid} not in the pool: {sorted(listed)}")
        for pid, series in self.rss.items():
            if len(series) >= 60:
                q = len(series) // 4
                first, last = max(series[:q]), max(series[-q:])
                self.checks.check("daemon memory flat", last <= first * 1.2,
                                  f"pid {pid}: {first:.0f} -> {last:.0f} MB")
        rows = []
        for h in self.hosts:
            audit = h.home / "audit.log"
            for ln in audit.read_text("utf-8").splitlines() if audit.exists() else ():
                try:
                    rows.append(json.loads(ln))
                except ValueError:
                    self.checks.check("audit lines whole", False, f"{audit}: {ln[:400]}")
            self.checks.check("audit lines whole", True, "")
        sent = Counter(r.get("task") for r in rows if r["command"] == "patrol.backlog"
                       and r["result"] == "dispatched")
        again = Counter(r.get("task") for r in rows if r["command"] == "patrol.backlog"
                        and r["result"] == "requeued")
        for tid, n in sent.items():
            self.checks.check("no task started twice", n <= 1 + again[tid],
                              f"{tid} sent {n} times, requeued {again[tid]}")
        for name, lines in [*self.daemons.items(), ("serve", self.serve)]:
            self.read_text(name, "\n".join(lines.lines + lines.err))
        for h in self.hosts:
            audit = h.home / "audit.log"
            if audit.exists():
                self.read_text(f"{h.name} audit.log", audit.read_text("utf-8", "replace"))


def render(seed: int, seconds: float, faults: list[Fault], checks: Checks,
           skipped: dict[str, str]) -> str:
    kinds = Counter(f.kind for f in faults)
    mid = Counter(f.kind for f in faults if f.landed)
    per = Counter((f.kind, op) for f in faults for op in f.landed.split(",") if op)
    lines = [f"soak: seed {seed}, {seconds / 60:.1f} min, {len(faults)} faults "
             f"({sum(mid.values())} while a send, fill, check or landing was in flight)"]
    lines += [f"  fault {k:<18} {kinds[k]:4d}  mid-operation {mid[k]:4d} (" +
              ", ".join(f"{op} {per[k, op]}" for op in OPS) + ")" for k in KINDS
              if k not in skipped]
    lines += [f"  fault {k:<18} skipped: {why}" for k, why in skipped.items()]
    for name, n in sorted(checks.counts.items()):
        lines.append(f"  invariant {name:<24} checked {n:6d}")
    lines.append("  peak runs per server (and project): " + ", ".join(
        f"{k} {v}/{PROJECTS.get(k.partition(' ')[2]) or LIMIT}"
        for k, v in sorted(checks.peaks.items())))
    lines.append("  slowest answer: " + ", ".join(f"{k} {v:.1f}s" for k, v in
                                                  sorted(checks.slowest.items())))
    lines.append("  counts: " + ", ".join(f"{k} {v}" for k, v in sorted(checks.figures.items())))
    if checks.broken:
        lines.append(f"BROKEN {checks.broken[0]}")
        lines.append(f"replay: python -m bench --soak --seed {seed} --minutes "
                     f"{seconds / 60:g}")
        lines += ["schedule so far:", *(f"  {f.line()}" for f in faults)]
    return "\n".join(lines) + "\n"


def main(minutes: float, seed: int, log: Callable[[str], None], keep: bool = False) -> int:
    """Run a soak; print its report; 0 when every invariant held, 1 when one broke."""
    root = Path(tempfile.mkdtemp(prefix="xaf-soak-"))
    soak = Soak(root, seed, minutes * 60, log)
    try:
        log(f"[soak] starting 3 servers, redis and two daemons in {root} ...")
        soak.start()
        faults = soak.run()
    finally:
        soak.close()
        if keep:
            log(f"[soak] artifacts kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(render(seed, minutes * 60, faults, soak.checks, soak.skipped), end="")
    return 1 if soak.checks.broken else 0


