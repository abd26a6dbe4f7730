"""What dispatch gives the matcher (ops/dispatch.py): each session's pool task texts, and the
candidates with what they share with the task."""

from __future__ import annotations

from tests.unit.ops.planner_support import A, B, sess
from xaf_hub.fleet.scan import InstanceScan
from xaf_hub.ops.dispatch import match_candidates, session_tasks
from xaf_hub.store.tasks import Task


def task(tid: str, session: str | None, instance: str, *prompts: str) -> Task:
    return Task(
        id=tid,
        title=prompts[0] if prompts else tid,
        status="dispatched" if session else "pending",
        prompt=prompts[0] if prompts else "",
        prompts=prompts,
        session_id=session,
        dispatched_to=instance if session else None,
    )


def test_session_tasks_gathers_the_texts_sent_into_each_session() -> None:
    tasks = [
        task("T-1", "ses_1", "lan-a", "Add CSV export of orders", "also the amount column"),
        task("T-2", "ses_1", "lan-b", "same id on another instance"),
        task("T-3", None, "lan-a", "not sent yet"),
        task("T-4", "ses_1", "lan-a", "a second row for the same session"),
    ]
    assert session_tasks(tasks) == {
        ("lan-a", "ses_1"): (
            "Add CSV export of orders",
            "also the amount column",
            "a second row for the same session",
        ),
        ("lan-b", "ses_1"): ("same id on another instance",),
    }


def test_candidates_match_on_pool_texts_and_say_which_words() -> None:
    export = sess("lan-a", "ses_1", "Orders list", directory="/srv/demo/web")
    other = sess("lan-a", "ses_2", "Orders list", directory="/srv/demo/web")
    outside = sess("lan-b", "ses_9", "CSV export amount", directory="/tmp/x", project=False)
    scans = [
        InstanceScan(A, reachable=True, sessions=[export, other]),
        InstanceScan(B, reachable=True, sessions=[outside]),
    ]
    sent = {("lan-a", "ses_1"): ("Export the filtered orders as CSV with the amount",)}
    scores, evidence = match_candidates(scans, "the CSV export drops the amount", sent)
    # Equal titles and folders: only the pool text tells them apart. A non-project session
    # is never a candidate.
    assert [s.id for s, _ in scores] == ["ses_1", "ses_2"]
    assert scores[0][1] > 0.3 and scores[1][1] < 0.05
    assert {"csv", "amount"} <= set(evidence[0].shared) and evidence[0].tasks == 1
    assert evidence[1].tasks == 0
