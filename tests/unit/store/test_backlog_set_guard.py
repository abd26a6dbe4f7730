"""`backlog set ID --status pending` asks the task's instance first; --force skips that."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

from xaf_hub.cli.main import main
from xaf_hub.store.backlog import Backlog
from xaf_hub.store.tasks import Task

NOW = datetime(2026, 11, 30, 9, 30, tzinfo=UTC)


def _setup(tmp_path: Path) -> tuple[Path, dict[str, str], Backlog]:
    home = tmp_path / "home"
    config = tmp_path / "config.json"
    doc = {
        "project": {"name": "demo"},
        "timeouts": {"connect_seconds": 1, "read_seconds": 2},
        # Port 9 on loopback: nothing listens, the connection is refused at once.
        "instances": [{"name": "down", "url": "http://127.0.0.1:9", "roots": ["/srv/demo"]}],
    }
    config.write_text(json.dumps(doc), "utf-8")
    env = {"XAF_HUB_HOME": str(home), "XAF_HUB_PW_DOWN": "secret-password-1"}
    pool = Backlog(home / "tasks_backlog.json")
    pool.add(Task(id="T1", title="t"), now=NOW)
    pool.mark_dispatched("T1", "ses_1", "down", None, NOW)
    return config, env, pool


def _run(config: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--config", str(config), "backlog", "set", *args], stdout=out, stderr=err, env=env)
    return code, out.getvalue(), err.getvalue()


def test_an_instance_that_cannot_say_refuses_unless_forced(tmp_path: Path) -> None:
    config, env, pool = _setup(tmp_path)
    code, _, err = _run(config, env, "T1", "--status", "pending")
    assert code == 2, err
    assert "cannot tell whether task T1's session down/ses_1 still runs" in err
    assert "--force" in err and "secret-password-1" not in err
    assert pool.load().require("T1").status == "dispatched"
    code, out, err = _run(config, env, "T1", "--status", "pending", "--force")
    assert code == 0, err
    task = pool.load().require("T1")
    assert (task.status, task.session_id) == ("pending", None)


def test_setting_pending_unparks_the_task(tmp_path: Path) -> None:
    config, env, pool = _setup(tmp_path)
    pool.set_status("T1", "pending", session_id=None, dispatched_to=None, parked="why")
    pool.set_status("T1", "pending", infra_failures=3, avoid_models=("p/a",))
    code, _, err = _run(config, env, "T1", "--status", "pending")  # no session: nothing to ask
    assert code == 0, err
    task = pool.load().require("T1")
    assert (task.parked, task.infra_failures, task.avoid_models) == (None, 0, ())


def test_a_persons_status_drops_what_the_hub_verified_and_checked(tmp_path: Path) -> None:
    """A failed check's output, the base and the rule that judged belong to the old status: a
    person who marks the task done (or sends it back) does not keep showing them."""
    config, env, pool = _setup(tmp_path)
    pool.set_status("T1", "pending", session_id=None, dispatched_to=None)
    row = pool.claim(pool.load().require("T1"), "ses_1", "down", None, NOW, base="a" * 40)
    assert row.base == "a" * 40
    pool.note_check(row, judged="needs a person: check failed", check="failed",
                    check_commit="b" * 40, check_output="FAILED test_x", check_retries=1)
    code, _, err = _run(config, env, "T1", "--status", "done")
    assert code == 0, err
    task = pool.load().require("T1")
    assert task.status == "done"
    assert (task.base, task.judged, task.check, task.check_commit, task.check_output,
            task.check_retries) == (None,) * 6
