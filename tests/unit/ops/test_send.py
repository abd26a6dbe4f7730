"""The one send path (ops.send.send_work) step by step, with a fake client and a spying gate.

Order that keeps the limit: lock -> fresh read -> re-count -> reserve -> create -> attach ->
record -> prompt -> unlock; every failure after the reservation releases it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from xaf_hub.client import ApiError, RawStatus, ServerSession
from xaf_hub.config import Config, parse_config
from xaf_hub.errors import BusyError, UnreachableError
from xaf_hub.gate import Gate, Reservation
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.send import SendResult, send_work
from xaf_hub.planner import Plan, plan_create, plan_reuse
from xaf_hub.records import SessionRecord

ROOT = "/srv/demo"


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    doc = {
        "project": {"name": "demo"},
        "state_dir": str(tmp_path / "state"),
        "instances": [
            {"name": "a", "url": "http://127.0.0.1:9", "roots": [ROOT], "concurrency_limit": 2}
        ],
    }
    return parse_config(doc, path=tmp_path / "config.json", env={})


class FakeClient:
    """Answers like an opencode server holding ``sessions`` with ``busy`` ones running."""

    dialect = "classic"
    version = "1.18.33"

    def __init__(self, log: list[str], sessions: list[str], busy: set[str]) -> None:
        self.log = log
        self.sessions = {sid: ServerSession(sid, sid, ROOT, 1, 1, 0.0, "", "") for sid in sessions}
        self.busy = busy
        self.fail_prompt: Exception | None = None
        self.fail_create: Exception | None = None

    async def detect(self) -> str:
        return "classic"

    async def list_sessions(self) -> list[ServerSession]:
        self.log.append("read")
        return list(self.sessions.values())

    async def status(self, directory: str) -> dict[str, RawStatus]:
        here = [sid for sid in self.busy if self.sessions[sid].directory == directory]
        return {sid: {"type": "busy"} for sid in here}

    async def get_session(self, session_id: str) -> ServerSession:
        return self.sessions[session_id]

    async def create_session(self, directory: str, title: str) -> ServerSession:
        if self.fail_create is not None:
            raise self.fail_create
        sid = f"ses_new{len(self.sessions)}"
        self.sessions[sid] = ServerSession(sid, title, directory, 2, 2, 0.0, "", "")
        self.log.append(f"create {sid}")
        return self.sessions[sid]

    async def prompt_async(self, session_id: str, text: str, model: str | None) -> None:
        if self.fail_prompt is not None:
            self.log.append(f"prompt {session_id} failed")
            raise self.fail_prompt
        self.log.append(f"prompt {session_id}")
        self.busy.add(session_id)


class SpyGate(Gate):
    """The file gate, logging each step into the shared log."""

    def __init__(self, root: Path, cfg: Config, log: list[str]) -> None:
        super().__init__(root, cfg.lock, host="h1")
        self.log = log

    @contextlib.contextmanager
    def lock(self, instance: str) -> Iterator[None]:
        with super().lock(instance):
            self.log.append("lock")
            try:
                yield
            finally:
                self.log.append("unlock")

    def reserve(self, instance: str) -> Reservation:
        self.log.append("reserve")
        return super().reserve(instance)

    def attach(self, res: Reservation, session_id: str) -> Reservation:
        self.log.append(f"attach {session_id}")
        return super().attach(res, session_id)

    def release(self, res: Reservation) -> None:
        self.log.append("release")
        super().release(res)


def record(sid: str, state: str = "idle") -> SessionRecord:
    return SessionRecord(
        "a", sid, sid, ROOT, 1, 1, 0.0, running=state != "idle", run_state=state, project=True  # type: ignore[arg-type]
    )


def send(
    cfg: Config, plan: Plan, client: FakeClient, gate: SpyGate, log: list[str]
) -> SendResult:
    ops = OpsContext(cfg)
    return asyncio.run(
        send_work(
            ops,
            plan,
            "do it",
            "p/m",
            client,  # type: ignore[arg-type]
            gate,
            before_prompt=lambda sid: log.append(f"record {sid}"),
        )
    )


def slot_files(cfg: Config) -> list[Path]:
    return sorted((cfg.state_dir / "slots").glob("*.slot"))


def audit_results(cfg: Config) -> list[str]:
    path = cfg.state_dir / "audit.log"
    return [json.loads(line)["result"] for line in path.read_text().splitlines()]


def test_new_session_goes_through_every_step_in_order(cfg: Config, tmp_path: Path) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1"], {"s1"}), SpyGate(cfg.state_dir, cfg, log)
    result = send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    new = result.session_id
    assert log == ["lock", "read", "reserve", f"create {new}", f"attach {new}",
                   f"record {new}", f"prompt {new}", "unlock"]
    assert (result.action, result.instance, result.model) == ("create", "a", "p/m")
    # The reservation keeps counting after the send until the server shows the run.
    assert len(slot_files(cfg)) == 1
    assert audit_results(cfg) == ["create"]


def test_at_the_limit_nothing_is_reserved_created_or_sent(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1", "s2"], {"s1", "s2"}), SpyGate(cfg.state_dir, cfg, log)
    with pytest.raises(BusyError, match="2 running \\+ 0 reserved of 2"):
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert log == ["lock", "read", "unlock"]
    assert slot_files(cfg) == []
    assert audit_results(cfg) == ["failed"]


def test_a_live_reservation_counts_against_the_limit(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1"], {"s1"}), SpyGate(cfg.state_dir, cfg, log)
    gate.reserve("a")  # another dispatch between its decision and its prompt
    log.clear()
    with pytest.raises(BusyError, match="1 running \\+ 1 reserved of 2"):
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert "create" not in " ".join(log)


def test_idle_session_that_started_meanwhile_is_steered_without_a_slot(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1", "s2"], {"s1", "s2"}), SpyGate(cfg.state_dir, cfg, log)
    plan = plan_reuse(cfg.instances[0], record("s1"), via="test")  # planned while idle
    result = send(cfg, plan, client, gate, log)
    assert (result.action, result.steered_instead) == ("steer", True)
    assert log == ["lock", "read", "record s1", "prompt s1", "unlock"]
    assert slot_files(cfg) == []


def test_steer_of_a_running_session_takes_no_lock_and_no_slot(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, ["s1"], {"s1"}), SpyGate(cfg.state_dir, cfg, log)
    plan = Plan("steer", cfg.instances[0], record("s1", "busy"), ROOT, "s1", via="test")
    result = send(cfg, plan, client, gate, log)
    assert result.action == "steer" and log == ["record s1", "prompt s1"]


@pytest.mark.parametrize(
    "failure",
    [ApiError("a", 400, "bad request"), UnreachableError("a", "connection refused")],
)
def test_a_failed_prompt_releases_the_reservation(cfg: Config, failure: Exception) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    client.fail_prompt = failure
    with pytest.raises(type(failure)):
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert log[-2:] == ["release", "unlock"]
    assert slot_files(cfg) == []
    assert audit_results(cfg) == ["failed"]


def test_a_failed_create_sends_nothing_and_releases(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    client.fail_create = UnreachableError("a", "no answer within 3s")
    with pytest.raises(UnreachableError):
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert not any(step.startswith(("prompt", "record")) for step in log)
    assert log[-2:] == ["release", "unlock"]


def test_gate_warnings_come_back_with_the_result(cfg: Config) -> None:
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    gate.warnings.append("the dispatch lock for a lapsed before it was released")
    result = send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate, log)
    assert result.warnings == ("the dispatch lock for a lapsed before it was released",)
    assert gate.warnings == []  # handed over, not left for the next caller


def test_only_the_send_module_calls_prompt_async() -> None:
    package = Path(__file__).resolve().parents[3] / "xaf_hub"
    callers = sorted(
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if "prompt_async(" in p.read_text(encoding="utf-8")
        and p.parts[-2] != "sandbox"
        and p.name != "client.py"
    )
    assert callers == ["ops/send.py"]


def test_commands_import_no_other_command_and_not_the_patrol() -> None:
    import ast

    commands = Path(__file__).resolve().parents[3] / "xaf_hub" / "commands"
    bad: list[str] = []
    for path in commands.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                other = name.startswith("xaf_hub.commands.") and not name.startswith(
                    "xaf_hub.commands._common"
                )
                patrol = name == "xaf_hub.patrol" or name.startswith("xaf_hub.patrol.")
                if (patrol and path.name != "patrol.py") or (other and name.count(".") >= 2
                                                             and path.name != "__init__.py"):
                    bad.append(f"{path.name}: {name}")
    assert bad == []


def test_no_module_is_over_600_lines() -> None:
    package = Path(__file__).resolve().parents[3] / "xaf_hub"
    long = {
        str(p.relative_to(package)): n
        for p in package.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert long == {}


