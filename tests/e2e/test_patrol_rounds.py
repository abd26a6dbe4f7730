"""Rounds that cost what changed, against a real opencode server: between two `patrol --once`
rounds one session fails with a rate limit and a pool task's session finishes; the next round
heals and settles them exactly as a round that reads everything would, and a session that did
not change is not read again. Message reads are counted by a loopback proxy in front of the
instance."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections import Counter
from datetime import UTC, datetime

import pytest

from sandbox import fleet as sandbox
from tests.e2e.daemon import start_again
from tests.e2e.patrol_checks import (
    CONTINUE_HEAD,
    agent_requests,
    answered_by,
    audit_lines,
    home,
    patrol,
    settled,
    use_models,
)
from tests.e2e.proxy import StallProxy
from tests.fleet import Hub
from xaf_hub.patrol.settle import JUST_DISPATCHED

pytestmark = pytest.mark.e2e

_MESSAGES = re.compile(r"^/session/(ses_\w+)/message(\?|$)")


class Reads:
    """GET /session/<id>/message requests seen by the proxy, per session."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: Counter[str] = Counter()

    def see(self, method: str, path: str) -> bool:
        m = _MESSAGES.match(path)
        if method == "GET" and m is not None:
            with self.lock:
                self.count[m.group(1)] += 1
        return False  # never hold a request back: only count

    def of(self, sid: str) -> int:
        with self.lock:
            return self.count[sid]


def test_a_changed_session_is_healed_and_an_unchanged_one_not_read_again(hub: Hub) -> None:
    use_models(hub, chain=["opencode/free-model", "backup/good-model"])
    done = hub.session("lan-b", "finished long ago")
    hub.prompt("lan-b", done, "finish this", "fake/fake-model")
    hub.wait_for(lambda: settled(hub, "lan-b", done), timeout=60)
    changed = hub.session("lan-b", "will hit a rate limit")
    hub.prompt("lan-b", changed, "first part", "fake/fake-model")
    hub.wait_for(lambda: settled(hub, "lan-b", changed), timeout=60)
    # Pinned to lan-b: the task's session is behind the proxy too.
    add = ("backlog", "add", "--title", "pool work", "--id", "pw", "--instance", "lan-b")
    code, out, err = hub.cli(*add)
    assert code == 0, err

    reads = Reads()
    with StallProxy(hub.server("lan-b").url, reads.see) as proxy:
        hub.set_instance("lan-b", url=proxy.url)
        first = patrol(hub, "--no-design")
        assert reads.of(done) == 1 and reads.of(changed) == 1
        assert [a["task"] for a in first["dispatched"]] == ["pw"]
        pool = json.loads((home(hub) / "tasks_backlog.json").read_text("utf-8"))["tasks"]
        task = next(t for t in pool if t["id"] == "pw")
        task_sid = task["session_id"]
        hub.wait_for(lambda: settled(hub, "lan-b", task_sid), timeout=90)

        # Between the rounds: the session's next run ends with a rate limit.
        hub.llm.set_mode("free-model", "429", retry_after=1)
        hub.prompt("lan-b", changed, "second part", "opencode/free-model")
        failed = hub.wait_for(lambda: settled(hub, "lan-b", changed), timeout=90)
        assert failed["info"]["error"]["data"]["statusCode"] == 429

        # A task dispatched under JUST_DISPATCHED ago is left for its prompt to show: on a quick
        # machine the second round would come too soon to settle it (a time decision).
        sent = datetime.fromisoformat(task["dispatched_at"])
        time.sleep(max(0.0, (sent + JUST_DISPATCHED - datetime.now(UTC)).total_seconds() + 0.5))
        second = patrol(hub, "--no-design")
        assert reads.of(done) == 1  # unchanged: not read again
        assert reads.of(task_sid) == 1  # read once (new to the rounds), by all three jobs
        # Read again (and once more after the heal prompted it, by check_agents, as before).
        after_heal = reads.of(changed)
        assert after_heal >= 2
        healed = [a for a in second["healed"] if a["session"] == changed]
        assert [(a["result"], a["from_model"], a["model"]) for a in healed] == [
            ("ok", "opencode/free-model", "backup/good-model")
        ]
        assert [a["task"] for a in second["tasks_finished"]] == ["pw"]  # no repository
        hub.wait_for(answered_by(hub, "lan-b", changed, "backup/good-model"), timeout=60)
        assert len(agent_requests(hub, "good-model", CONTINUE_HEAD)) == 1

        # The healed session was prompted: it is read again; the others are not.
        third = patrol(hub, "--no-design")
        assert reads.of(done) == 1 and reads.of(task_sid) == 1
        assert reads.of(changed) == after_heal + 1
        assert third["healed"] == [] and third["tasks_finished"] == []
        assert sum(1 for e in audit_lines(hub) if e["command"] == "patrol.heal") == 1
        classes = {s["session"]: k for k, rows in third["sessions"].items() for s in rows}
        assert classes[done] == "finished" and classes[task_sid] == "finished"


@pytest.mark.core  # the release matrix: `updated` must move when a run begins, on every release
def test_a_run_killed_with_its_server_after_a_round_read_it_is_seen_interrupted(
    hub: Hub, own_server: sandbox.OpencodeServer
) -> None:
    # The round remembers a finished session; then a new run starts in it and its server is
    # SIGKILLed mid-run and started again. The session is idle once more, as when it was
    # read, and its run stopped without finishing: the next round must read it again (its
    # `updated` moved when the run began), class it interrupted and never call it finished.
    url, pw = own_server.url, own_server.password
    hub.llm.set_mode("slow-model", "slow", delay=120)
    d = str(hub.root / "app")
    sid = str(sandbox.create_session(url, pw, d, "killed mid-run")["id"])
    sandbox.prompt_async(url, pw, sid, "short work", "fake/fake-model")
    hub.wait_for(lambda: _idle_answered(url, pw, sid, d), timeout=90)
    first = patrol(hub, "--no-design", "--no-fill")
    assert sid in {s["session"] for s in first["sessions"]["finished"]}

    sandbox.prompt_async(url, pw, sid, "long work", "fake/slow-model")
    hub.wait_for(lambda: agent_requests(hub, "slow-model", "long work"), timeout=60)
    port = own_server.port
    os.kill(own_server.pid, signal.SIGKILL)
    own_server.stop(grace=2.0)
    start_again(own_server, port)
    assert sid not in sandbox.status(own_server.url, pw, d)

    second = patrol(hub, "--no-design", "--no-fill")
    classes = {s["session"]: k for k, rows in second["sessions"].items() for s in rows}
    assert classes[sid] == "interrupted", classes


def _idle_answered(url: str, pw: str | None, sid: str, directory: str) -> bool:
    msgs = sandbox.messages(url, pw, sid)
    info = msgs[-1]["info"] if msgs else {}
    done = info.get("role") == "assistant" and bool(info.get("time", {}).get("completed"))
    return done and sid not in sandbox.status(url, pw, directory)
