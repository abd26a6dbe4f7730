"""Crash safety: SIGKILL the hub at every step that writes, then check nothing is half-done.

* dispatch, killed after reserving a slot, after creating the session, after sending the
  prompt (a StepProxy holds the next request so the kill lands exactly there);
* a patrol cycle, killed after creating a task's session and after sending its prompt;
* the task pool and the model-state file, killed at random moments while a process writes
  them in a loop (many times).

Afterwards every state file parses, no completed task update is lost, nothing is dispatched
twice, and no slot is held past its TTL. The killed dispatches run as if from another host,
so only the TTL / grace rules (not the dead-process check) can free their slots.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.e2e.faulty import Match, StepProxy
from tests.fleet import Hub

pytestmark = pytest.mark.e2e

TTL = 10


def home(hub: Hub) -> Path:
    return Path(hub.env["XAF_HUB_HOME"])


def state_files_parse(folder: Path) -> list[Path]:
    """Parse every JSON state file and slot under ``folder``; return them."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix in (".json", ".slot")]
    for p in files:
        json.loads(p.read_text("utf-8"))
    audit = folder / "audit.log"
    if audit.exists():
        for line in audit.read_text("utf-8").splitlines():
            json.loads(line)
    return files


def slots(hub: Hub, name: str) -> list[Path]:
    return sorted((home(hub) / "slots").glob(f"{name}.*.slot"))


def reserved(hub: Hub, name: str) -> int:
    code, data = hub.cli_json("status", "--instance", name)
    assert code == 0
    return int(data["instances"][0]["reserved"])


def pool(hub: Hub) -> list[dict[str, Any]]:
    path = home(hub) / "tasks_backlog.json"
    return json.loads(path.read_text("utf-8"))["tasks"] if path.exists() else []


def abort_busy(hub: Hub, name: str) -> None:
    for sid in hub.busy_ids(name):
        sandbox.abort(hub.server(name).url, hub.password(name), sid)


def _create(m: str, p: str) -> bool:
    return m == "POST" and p.startswith("/session?")


def _prompt(m: str, p: str) -> bool:
    return m == "POST" and p.split("?")[0].endswith("/prompt_async")


STEPS: dict[str, dict[str, Match]] = {
    "after-reserve": {"before": _create},
    "after-create": {"before": _prompt},
    "after-prompt": {"after": _prompt},
}


@pytest.mark.parametrize("step", STEPS)
def test_dispatch_killed_at_each_step(hub: Hub, step: str) -> None:
    hub.llm.set_mode("slow-model", "slow", delay=60)
    hub.doc["models"]["default_dispatch_model"] = "fake/slow-model"
    hub.doc["lock"].update(slot_ttl_seconds=TTL, slot_grace_seconds=1)
    target = hub.server("lan-c").url
    directory = hub.root / "app"
    before = {s for s in hub.status("lan-c", directory)}
    try:
        with StepProxy(target, **STEPS[step]) as proxy:
            hub.set_instance("lan-c", url=proxy.url, concurrency_limit=1)
            proc = hub.popen(
                "dispatch",
                "--new",
                "--instance",
                "lan-c",
                "--text",
                f"crash {step}",
                extra_env={"XAF_HUB_HOSTNAME": "crashed-host"},
            )
            assert proxy.held.wait(60), "the dispatch never reached the step"
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)

            state_files_parse(home(hub))
            [slot] = slots(hub, "lan-c")
            data = json.loads(slot.read_text("utf-8"))
            assert (data["pid"], data["host"]) == (proc.pid, "crashed-host")
            assert bool(data["session_id"]) == (step != "after-reserve")
            # The pool row is written with the session, before the prompt goes out.
            rows = pool(hub)
            if step == "after-reserve":
                assert rows == []
            else:
                [row] = rows
                assert (row["status"], row["session_id"]) == ("dispatched", data["session_id"])
                assert row["title"] == f"crash {step}"
            proxy.release()
        hub.set_instance("lan-c", url=target)

        # The slot stops counting within its TTL (the grace, once its session is known idle).
        # Reading the gate (status) is what removes a dead slot file.
        hub.wait_for(
            lambda: reserved(hub, "lan-c") == 0 and not slots(hub, "lan-c"),
            timeout=TTL + 30,
            step=1,
        )
        code, out, err = hub.cli("dispatch", "--new", "--instance", "lan-c", "--text", "next")
        if step == "after-prompt":
            # The killed dispatch's run did start: it holds the only slot, so the limit holds.
            running = set(hub.status("lan-c", directory)) - before
            assert len(running) == 1
            assert code == 3 and "at its limit" in err
        else:
            assert code == 0, err
            titles = [t["title"] for t in pool(hub)]
            assert titles == (["next"] if step == "after-reserve" else [f"crash {step}", "next"])
        state_files_parse(home(hub))
    finally:
        abort_busy(hub, "lan-c")


def _patrol_crash(hub: Hub, hold: dict[str, Match]) -> StepProxy:
    """Add one task pinned to lan-c and kill a patrol cycle at the held step of its dispatch."""
    code, _, err = hub.cli(
        "backlog",
        "add",
        "--id",
        "CR-1",
        "--title",
        "crash task",
        "--instance",
        "lan-c",
        "--prompt",
        "crash task body",
    )
    assert code == 0, err
    target = hub.server("lan-c").url
    with StepProxy(target, **hold) as proxy:
        hub.set_instance("lan-c", url=proxy.url)
        proc = hub.popen("patrol", "--once", "--no-freelimit", "--no-check", "--no-design")
        assert proxy.held.wait(90), "the patrol never reached the step"
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        state_files_parse(home(hub))
        proxy.release()
    hub.set_instance("lan-c", url=target)
    return proxy


def _sent(hub: Hub, needle: str) -> int:
    return sum(
        1 for r in hub.llm.requests() if not r["title_call"] and needle in r["last_user_text"]
    )


def test_patrol_killed_after_create_sends_the_task_once(hub: Hub) -> None:
    young = 2.0  # patrol.just_dispatched_seconds (10 by default)
    hub.write_config(patrol={"just_dispatched_seconds": young})
    _patrol_crash(hub, {"before": _prompt})
    [task] = pool(hub)  # recorded with its session before the prompt went out
    assert task["status"] == "dispatched" and task["session_id"]
    empty = task["session_id"]
    # A row younger than that is left alone (its prompt may still be on the way).
    time.sleep(young + 1)
    code, _, err = hub.cli("patrol", "--once", "--no-freelimit", "--no-check", "--no-design")
    assert code == 0, err
    [task] = pool(hub)  # the empty session is given up; the work goes out exactly once
    assert task["status"] == "dispatched" and task["dispatched_to"] == "lan-c"
    assert task["session_id"] != empty and task["attempts"] == 0
    hub.wait_for(lambda: _sent(hub, "crash task body") >= 1, timeout=60)
    assert _sent(hub, "crash task body") == 1
    state_files_parse(home(hub))


def test_patrol_killed_after_prompt_does_not_send_the_task_twice(hub: Hub) -> None:
    _patrol_crash(hub, {"after": _prompt})
    hub.wait_for(lambda: _sent(hub, "crash task body") >= 1, timeout=60)
    code, _, err = hub.cli("patrol", "--once", "--no-freelimit", "--no-check", "--no-design")
    assert code == 0, err
    state_files_parse(home(hub))
    # The next cycle found the task recorded with its session: it finished it, never resent it.
    assert [t["status"] for t in pool(hub)] in (["dispatched"], ["done"])
    titles = [s["title"] for s in hub.cli_json("sessions", "--instance", "lan-c")[1]["sessions"]]
    assert sum("CR-1" in t for t in titles) == 1
    assert _sent(hub, "crash task body") == 1


# ---------------------------------------------------------------------------------------------
# Random kills of writers in a loop

BACKLOG_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from xaf_hub.store.backlog import Backlog
    from xaf_hub.store.tasks import Task
    pool = Backlog(Path(sys.argv[1]))
    prefix, pad = sys.argv[2], "x" * 4000  # a big file widens the write window
    for i in range(10_000):
        pool.add(Task(id=f"{prefix}-{i}", title=f"task {i} {pad}"))
        print("add", f"{prefix}-{i}", flush=True)
        if i % 3 == 2:
            pool.set_status(f"{prefix}-{i - 1}", "done", done_at="2026-01-01T00:00:00+00:00")
            print("done", f"{prefix}-{i - 1}", flush=True)
    """
)

MODEL_STATE_WRITER = textwrap.dedent(
    """
    import sys
    from datetime import UTC, datetime
    from pathlib import Path
    from xaf_hub.store.model_state import FileModelState
    families = {f"fam{i}": [f"p{i}/"] for i in range(5)}
    state = FileModelState(Path(sys.argv[1]), 8, UTC, families)
    prefix = sys.argv[2]
    for i in range(10_000):
        now = datetime.now(UTC)
        state.mark_blackout(f"fam{i % 5}", "429 " + "r" * 500, "crash-test", now)
        print("blackout", f"fam{i % 5}", flush=True)
        state.remember_healed(f"{prefix}-{i}", "p1/a", "p2/b", now)
        print("healed", f"{prefix}-{i}", flush=True)
    """
)


def _kill_randomly(script: str, path: Path, rounds: int, seed: int) -> list[list[str]]:
    """Run ``script`` ``rounds`` times, SIGKILL each at a random moment; completed steps."""
    rng = random.Random(seed)
    done: list[list[str]] = []
    for n in range(rounds):
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(path), f"r{n}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        seen = proc.stdout.readline()  # it is writing now
        assert seen, proc.stderr.read() if proc.stderr else ""
        time.sleep(rng.uniform(0.0, 0.3))  # a random moment, most likely inside a write
        os.kill(proc.pid, signal.SIGKILL)
        rest, err = proc.communicate(timeout=30)
        assert "Traceback" not in err, err
        # A line is printed only after its write returned; a cut-off last line is dropped.
        text = seen + rest
        lines = text.splitlines()
        if text and not text.endswith("\n"):
            lines = lines[:-1]
        done.append(lines)
    return done


def test_task_pool_survives_random_kills(tmp_path: Path) -> None:
    path = tmp_path / "state dir" / "tasks_backlog.json"
    rounds = _kill_randomly(BACKLOG_WRITER, path, rounds=10, seed=6)
    doc = json.loads(path.read_text("utf-8"))  # parses after every kill
    from xaf_hub.store.backlog import Backlog

    tasks = {t.id: t for t in Backlog(path).load().tasks}
    assert len(tasks) == len(doc["tasks"])  # no duplicate ids
    for lines in rounds:
        for line in lines:
            verb, task_id = line.split()
            assert task_id in tasks, f"completed add of {task_id} lost"
            if verb == "done":
                assert tasks[task_id].status == "done", f"completed update of {task_id} lost"
    killed_mid_write = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    Backlog(path).update(lambda data: None)  # the next locked write clears dead writers' temps
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    print(f"{sum(map(len, rounds))} completed writes; {len(killed_mid_write)} temp file(s) swept")


def test_locked_write_sweeps_only_its_own_dead_temp_files(tmp_path: Path) -> None:
    from xaf_hub.store.statefile import update_json

    path = tmp_path / "tasks_backlog.json"
    dead = tmp_path / ".tasks_backlog.json.k2j4_x9q.tmp"
    dead.write_text('{"tasks": [', "utf-8")  # what SIGKILL mid-write leaves
    other = tmp_path / ".tasks_backlog.json.x.json.abcdefgh.tmp"  # another file's temp
    other.write_text("{}", "utf-8")
    update_json(path, lambda d: d.update(a=1), default=dict, what="task pool")
    assert not dead.exists() and other.exists()
    assert json.loads(path.read_text("utf-8")) == {"a": 1}


def test_model_state_survives_random_kills(tmp_path: Path) -> None:
    path = tmp_path / "state" / ".model_state.json"
    rounds = _kill_randomly(MODEL_STATE_WRITER, path, rounds=10, seed=7)
    from datetime import UTC

    from xaf_hub.store.model_state import FileModelState

    families = {f"fam{i}": [f"p{i}/"] for i in range(5)}
    state = FileModelState(path, 8, UTC, families)
    doc = json.loads(path.read_text("utf-8"))
    for lines in rounds:
        for line in lines:
            kind, key = line.split()
            if kind == "healed":
                assert state.was_healed(key), f"completed heal record {key} lost"
            else:
                assert key in doc["blackouts"]


def test_atomic_write_syncs_the_file_before_and_the_folder_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stat as st

    from xaf_hub.store import statefile

    if os.name != "posix":
        pytest.skip("directories are fsynced on POSIX only")
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if st.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    statefile.write_json_atomic(tmp_path / "tasks_backlog.json", {"tasks": []})
    assert events == ["fsync file", "replace", "fsync dir"]


@pytest.mark.parametrize("failure", ["refused", "dropped"])
def test_dispatch_whose_prompt_fails(hub: Hub, failure: str) -> None:
    # The row is written before the prompt. A prompt the server refused is taken back (or the
    # patrol would later send work the user saw fail); one whose answer was lost may have
    # arrived, so its row stays for the patrol to settle, and the user is told.
    target = hub.server("lan-c").url
    hold = {"refused": {"refuse": _prompt}, "dropped": {"before": _prompt}}[failure]
    with StepProxy(target, **hold) as proxy:
        proxy.release()  # a dropped prompt is dropped at once
        hub.set_instance("lan-c", url=proxy.url)
        code, _, err = hub.cli("dispatch", "--new", "--instance", "lan-c", "--text", "lost prompt")
        assert any(p.split("?")[0].endswith("/prompt_async") for _, p in proxy.writes())
    hub.set_instance("lan-c", url=target)
    assert code != 0 and "lan-c" in err, err
    rows = pool(hub)
    if failure == "refused":
        assert "HTTP 400" in err
        assert rows == []
        assert reserved(hub, "lan-c") == 0  # certainly not delivered: the slot is given back
    else:
        assert code == 2
        [row] = rows
        assert (row["status"], row["title"]) == ("dispatched", "lost prompt")
        assert f"task {row['id']} stays in the task pool" in err
        # It may still arrive: its slot keeps counting until the run shows or the TTL passes.
        assert "may still arrive" in err
        assert reserved(hub, "lan-c") == 1
    state_files_parse(home(hub))
