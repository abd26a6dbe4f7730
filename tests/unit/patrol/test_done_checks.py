"""The project's check in a patrol round (``settle_tasks._run_check``), against a real git origin:
run on the verified commit, not run again for a commit whose check failed with no retry left,
no more checks started in a round once they add up to ``check_timeout_seconds``, none run
uncontained without the config's consent; a planted mirror rebuilt and said once."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.contained import needs_sandbox
from tests.gitrepo import make_origin
from tests.unit.patrol.runner_support import NOW
from xaf_hub.config.load import UNCONTAINED, load_config
from xaf_hub.core import aio
from xaf_hub.core.records import SessionRecord
from xaf_hub.errors import BusyError
from xaf_hub.notify.record import RoundLog
from xaf_hub.ops.context import OpsContext
from xaf_hub.patrol.context import Cycle
from xaf_hub.patrol.jobs.fill_slots import _tips
from xaf_hub.patrol.jobs.settle_tasks import _run_check
from xaf_hub.patrol.settle import Settlement
from xaf_hub.store import contain
from xaf_hub.store.repository import CheckRun, Mirror
from xaf_hub.store.tasks import Task


def ops(
    tmp_path: Path, check: str, timeout: float = 30, retries: int = 1, **project: object
) -> OpsContext:
    origin = make_origin(tmp_path / "remote")
    doc = {
        "project": {
            "name": "p",
            "repository": str(origin.bare),
            "check_command": check,
            "check_timeout_seconds": timeout,
            "check_retries": retries,
            **project,
        },
        "instances": [{"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    cfg = load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    Mirror(str(origin.bare), cfg.state_dir).fetch()
    return OpsContext(cfg, env={})


def verified(pctx: OpsContext) -> Settlement:
    head = Mirror(pctx.cfg.repository.url, pctx.cfg.state_dir).tips()["main"]
    return Settlement("done", commit=head, verified=True, judged="new work: 1 commit")


@needs_sandbox
def test_checks_stop_starting_once_the_round_spent_their_bound(tmp_path: Path) -> None:
    pctx = ops(tmp_path, "sleep 1.2", timeout=2)
    task = Task(id="T1", title="t", status="dispatched")
    checked = [0.0]
    for _ in range(2):  # 1.2 s spent after the first: still under the bound, the second runs
        ran = aio.run(_run_check(pctx, task, verified(pctx), checked))
        assert ran.action == "done" and ran.judged.endswith("check: passed")
    assert checked[0] >= 2.4
    third = aio.run(_run_check(pctx, task, verified(pctx), checked))
    assert third.action == "keep" and not third.person
    took = f"this round's checks took {checked[0]:.0f}s; it runs next round"
    assert third.reason == f"waiting for the check: {took}"


@needs_sandbox
def test_a_check_that_failed_with_no_retry_left_is_not_run_again(tmp_path: Path) -> None:
    pctx = ops(tmp_path, "echo the check ran; exit 1", retries=1)
    verdict = verified(pctx)
    task = Task(
        id="T1",
        title="t",
        status="dispatched",
        check="failed",
        check_commit=verdict.commit,
        check_output="1 failed",
        check_retries=1,
    )
    out = aio.run(_run_check(pctx, task, verdict, [0.0]))
    assert (out.action, out.person, out.judged) == ("keep", True, "check: failed")
    assert out.reason.endswith(": 1 failed") and out.check is None  # not run again
    # A new commit (the agent pushed again): its check runs, fails, no retry left.
    fresh = Task(id="T1", title="t", status="dispatched", check_retries=1)
    out = aio.run(_run_check(pctx, fresh, verdict, [0.0]))
    assert (out.action, out.person) == ("keep", True) and out.reason.endswith(": the check ran")


def test_a_manual_dispatch_records_its_base_from_the_mirror_as_it_stands(tmp_path: Path) -> None:
    from xaf_hub.ops.dispatch import _base
    from xaf_hub.ops.planner import DispatchRequest, plan_create, plan_reuse

    pctx = ops(tmp_path, "true")  # fetched once: the mirror knows main's first commit
    inst = pctx.cfg.instances[0]
    head = Mirror(pctx.cfg.repository.url, pctx.cfg.state_dir).known_tips()["main"]
    req = DispatchRequest(text="add the export")
    plan = plan_create(inst, "/srv/p/app", "add the export", via="test")
    assert _base(pctx, plan, req, None) == head  # branch mode: feature/... starts at main
    # A steer or reuse of a session keeps its row's base: none is read for it.
    reuse = plan_reuse(inst, _record(), via="test")
    assert _base(pctx, reuse, req, None) is None


def test_no_sandbox_keeps_the_task_for_a_person_unless_the_config_consents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(contain, "BWRAP", "no-such-bwrap")  # no bwrap here
    pctx = ops(tmp_path / "a", "echo the check ran")
    task = Task(id="T1", title="t", status="dispatched")
    out = aio.run(_run_check(pctx, task, verified(pctx), [0.0]))
    assert (out.action, out.person, out.judged) == ("keep", True, "check: not contained")
    assert out.reason == (
        "not verified: check not contained: "
        "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    )
    assert out.check is None  # nothing ran: no failure is written on the row
    pctx = ops(tmp_path / "b", "echo the check ran", check_uncontained=UNCONTAINED)
    out = aio.run(_run_check(pctx, task, verified(pctx), [0.0]))
    assert out.action == "done" and out.judged.endswith("; check: passed (not contained)")
    assert out.check is not None and out.check.tail == "the check ran"


def test_a_planted_mirror_is_rebuilt_and_said_once_in_the_rounds_notes(tmp_path: Path) -> None:
    pctx = ops(tmp_path, "true")
    mirror = Mirror(pctx.cfg.repository.url, pctx.cfg.state_dir)
    (mirror.path / "hooks").mkdir()
    (mirror.path / "hooks" / "reference-transaction").write_text("#!/bin/sh\n")
    first, second = Cycle(RoundLog(started=NOW)), Cycle(RoundLog(started=NOW))
    tips = aio.run(_tips(pctx, first))
    assert tips is not None and "main" in tips
    [note] = first.log.notes
    assert note.startswith("fill_slots: repository mirror rebuilt: it was not as the hub wrote")
    assert aio.run(_tips(pctx, second)) == tips and second.log.notes == []


def _record() -> SessionRecord:
    return SessionRecord(
        instance="lan-a", id="ses_1", title="t", directory="/srv/p/app", project=True
    )


def test_a_failed_check_sends_the_session_back_to_its_own_branch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xaf_hub.ops import land
    from xaf_hub.patrol.jobs import settle_tasks

    pctx = ops(tmp_path, "exit 1")
    inst = pctx.cfg.instance("lan-a")
    assert inst.branch_policy == "branch"
    sent: list[str] = []

    async def send_work(_: Any, __: Any, prompt: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(prompt)
        raise BusyError("lan-a: full")  # what was sent is all this test reads

    @contextlib.asynccontextmanager
    async def client(*_: Any) -> AsyncIterator[None]:
        yield None

    monkeypatch.setattr(land, "send_work", send_work)
    monkeypatch.setattr(OpsContext, "client", client)
    verdict = replace(verified(pctx), check=CheckRun(False, 1, "1 failed", 0.1))
    rec = SessionRecord("lan-a", "ses_1", "Add the export", "/srv/p")
    task = Task(id="T1", title="Add the export", status="dispatched", session_id="ses_1",
                dispatched_to="lan-a")
    cycle = Cycle(RoundLog(started=datetime.now(UTC)))
    aio.run(settle_tasks._send_back(pctx, cycle, inst, rec, task, verdict))
    [prompt] = sent
    assert "exited with 1" in prompt and "1 failed" in prompt
    # Its branch holds the failed commit: continue there, never create it anew.
    assert "Continue on `feature/add-the-export`: it exists already" in prompt
    assert "create `feature/" not in prompt and "新建" not in prompt
    assert "git push -u origin feature/add-the-export" in prompt
