"""What a round writes on a dispatched task is what every view then says of it: a task whose
session finished without ``project.repository`` is done in the pool (its dependants may start)
but "finished, not verified" everywhere; one whose run ended on a refused request waits for a
person, and says so on its row while it does."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.unit.patrol.run_support import NOW, NOW_MS, FakeFleet, assistant, round_at
from xaf_hub.config.load import Config, load_config
from xaf_hub.patrol.settle import NOT_VERIFIED
from xaf_hub.store.backlog import Backlog
from xaf_hub.store.pick import state_of
from xaf_hub.store.tasks import Task, format_instant


def make_cfg(tmp_path: Path) -> Config:
    doc = {
        "instances": [{"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}],
        "models": {"default_dispatch_model": "fake/fake-model"},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    return load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)


def denied(mid: str, created: int) -> dict[str, Any]:
    """A run's last step as opencode 1.18.33 leaves it when a permission was denied."""
    msg = assistant(mid, created)
    msg["info"]["finish"] = "tool-calls"
    msg["parts"] = [{"type": "tool", "tool": "bash", "state": {
        "status": "error", "error": "The user rejected permission to use this specific tool call.",
    }}]
    return msg


def test_a_round_records_unverified_and_person_states_on_the_rows(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    fleet = FakeFleet(0)
    updated = NOW_MS - 60_000
    fleet.add("lan-a", "ses_a0", updated, assistant("msg_0", updated))
    fleet.add("lan-a", "ses_a1", updated, denied("msg_1", updated))
    pool = Backlog(cfg.backlog_path)
    sent = format_instant(NOW - timedelta(minutes=5))
    for tid, sid in (("T-done", "ses_a0"), ("T-denied", "ses_a1")):
        pool.add(Task(id=tid, title=tid, status="dispatched", session_id=sid,
                      dispatched_to="lan-a", dispatched_at=sent))
    pool.add(Task(id="T-next", title="after", depends_on=("T-done",)))

    result, _ = round_at(cfg, fleet, NOW)
    assert result.code == 0 and result.cycle is not None
    rows = {t.id: t for t in pool.load().tasks}
    done, kept = rows["T-done"], rows["T-denied"]
    assert (done.status, done.verified, done.judged) == ("done", None, NOT_VERIFIED)
    assert state_of(done, list(rows.values()), NOW, 3)[0] == "unverified"
    assert (kept.status, state_of(kept, list(rows.values()), NOW, 3)[0]) == (
        "dispatched", "person"
    )
    assert kept.person is not None and "refused request" in kept.person
    kinds = {a.task: a.kind for a in result.cycle.log.actions if a.task}
    assert (kinds["T-done"], kinds["T-denied"]) == ("finished", "person")
    # Done in the pool: the task that waited for it may start.
    assert state_of(rows["T-next"], list(rows.values()), NOW, 3) == ("waiting", "ready")
    report = json.loads((cfg.state_dir / "patrol" / "report-latest.json").read_text("utf-8"))
    assert [a["task"] for a in report["tasks_finished"]] == ["T-done"]
    assert report["tasks_done"] == []
    assert (report["tasks"]["unverified"], report["tasks"]["person"]) == (1, 1)

    # The person's reason goes once the patrol no longer leaves the task to a person.
    fleet.sessions["lan-a"]["ses_a1"].updated = NOW_MS + 60_000
    fleet.sessions["lan-a"]["ses_a1"].last = assistant("msg_2", NOW_MS + 50_000, completed=False)
    round_at(cfg, fleet, NOW + timedelta(minutes=10))
    again = pool.load().require("T-denied")
    assert again.person is None and state_of(again, [again], NOW, 3)[0] == "in_progress"
