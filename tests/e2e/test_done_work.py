"""Done means new, green work of the task's own (issue 37): real opencode agents commit and push
through their bash tool (the fake model scripted to call it) and the patrol judges each claim.

One hub, one remote, five tasks in a row (each task's base is main's tip when it is sent):
a new commit whose check passes is done; a commit another task was credited with is refused;
the base itself claimed is not new work; a commit touching tests/ waits for a person; a commit
whose check fails goes back to its session with the failure, and the fix is judged again.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from tests.e2e.verified_checks import page, patrol, pool, settling_round
from tests.fleet import Hub
from tests.gitrepo import git, make_origin

CHECK = "test ! -e broken.txt || { echo 'FAILED: broken.txt must not be there' >&2; exit 1; }"
COMMIT = "git -c user.name=Agent -c user.email=agent@example.invalid commit -q -m"


def bash(*steps: str) -> list[Any]:
    """One bash tool call running ``steps`` in order (stopping at the first failure)."""
    command = " && ".join(steps)
    return ["bash", {"command": command, "description": "do the task", "timeout": 300000}]


def send(hub: Hub, task_id: str, title: str, call: list[Any]) -> str:
    """Add a task pinned to local-a and let one patrol round send it; its session."""
    hub.llm.set_mode("fake-model", "tools", calls=[call], text="Done. The commit:")
    code, _, err = hub.cli(
        "backlog", "add", "--title", title, "--id", task_id, "--instance", "local-a"
    )
    assert code == 0, err
    doc = patrol(hub)
    sent = [(a["task"], a["instance"]) for a in doc["dispatched"]]
    assert sent == [(task_id, "local-a")], doc["dispatched"]
    return str(pool(hub)[task_id]["session_id"])


def agent_calls(hub: Hub) -> int:
    return sum(1 for r in hub.llm.requests() if r["model"] == "fake-model" and not r["title_call"])


def finished(hub: Hub, sid: str, tool_results: int, since: int) -> None:
    """Wait until the session answered after its ``tool_results``-th tool result: a model
    request after the first ``since`` ones (an earlier task's answer would not do: the
    session may not show busy yet, and a round would judge the run before it ran)."""

    def done() -> bool:
        return any(
            r["model"] == "fake-model" and len(r["tool_results"]) >= tool_results
            for r in hub.llm.requests()[since:]
        ) and sid not in hub.busy_ids("local-a")

    hub.wait_for(done, timeout=180, step=0.5)


def person(doc: dict[str, Any], task_id: str) -> str:
    rows = [p for p in doc["needs_person"] if p.get("task") == task_id]
    assert len(rows) == 1, doc["needs_person"]
    return str(rows[0]["detail"])


def test_done_means_new_green_work_of_its_own(hub: Hub, tmp_path: Path) -> None:
    origin = make_origin(tmp_path / "remote")
    bare = shlex.quote(str(origin.bare))
    project = {
        **hub.doc["project"],
        "repository": str(origin.bare),
        "check_command": CHECK,
        "check_retries": 1,
        "locked_paths": ["tests/**"],
    }
    # A pool row younger than patrol.just_dispatched_seconds (10 by default) is not judged
    # yet; each task below is judged only after its session finished.
    hub.write_config(project=project, patrol={"just_dispatched_seconds": 2})
    # A finished run's slot stays reserved for slot_grace_seconds (5 s here) after its prompt
    # was accepted; with the default limit of 2 the next task pinned to local-a would go to
    # another instance (a pin is a preference) and be judged by that instance's branch rule.
    hub.set_instance("local-a", concurrency_limit=6)
    first_base = git(origin.bare, "rev-parse", "refs/heads/main")
    go = tmp_path / "go"

    # T5 is sent first (its base: the first commit) and waits; it will claim T1's commit.
    before = agent_calls(hub)
    t5 = send(hub, "T5", "claim the same work", bash(
        f"git clone -q {bare} w5", "cd w5",
        f"until test -e {shlex.quote(str(go))}; do sleep 0.5; done",
        "git fetch -q origin", "git rev-parse origin/main",
    ))
    hub.wait_for(lambda: agent_calls(hub) > before, timeout=60)  # its bash call is under way
    assert pool(hub)["T5"]["base"] == first_base

    # T1: a new commit on main whose check passes -> done, and the rule is said.
    since = len(hub.llm.requests())
    t1 = send(hub, "T1", "fix the login form", bash(
        f"git clone -q {bare} w1", "cd w1", "echo fix >> login.txt", "git add login.txt",
        f"{COMMIT} 'fix the login form'", "git push -q origin HEAD:main", "git rev-parse HEAD",
    ))
    finished(hub, t1, 1, since)
    pushed = git(origin.bare, "rev-parse", "refs/heads/main")
    doc = settling_round(hub, "T1")
    done = [a for a in doc["tasks_done"] if a["task"] == "T1"]
    assert len(done) == 1 and "new work: 1 commit on origin/main" in done[0]["detail"], doc
    assert "check: passed" in done[0]["detail"]
    row = pool(hub)["T1"]
    assert (row["status"], row["commit"], row["verified"], row["check"]) == (
        "done", pushed, True, "passed",
    )
    assert row["base"] == first_base and "check: passed" in row["judged"]
    code, shown = hub.cli_json("backlog", "show", "T1")
    assert code == 0 and shown["judged"] == row["judged"]
    assert row["judged"] in page(hub)

    # T5 claims T1's commit (new since T5's own base): already credited -> a person's.
    since = len(hub.llm.requests())
    go.touch()
    finished(hub, t5, 1, since)
    doc = settling_round(hub, "T5")
    assert f"commit {pushed[:7]} is already credited to T1" in person(doc, "T5")
    assert pool(hub)["T5"]["status"] == "dispatched"
    assert pool(hub)["T5"]["judged"] == "already credited"

    # T2 claims main's tip as it was when T2 was sent: not new work.
    since = len(hub.llm.requests())
    t2 = send(hub, "T2", "claim the base", bash(
        f"git clone -q {bare} w2", "cd w2", "git rev-parse HEAD",
    ))
    assert pool(hub)["T2"]["base"] == pushed
    finished(hub, t2, 1, since)
    doc = settling_round(hub, "T2")
    said = person(doc, "T2")
    assert f"claimed commit {pushed[:7]} was already on origin/main" in said, said
    assert "not new work" in said

    # T4 changes the tests: never done automatically, the paths listed.
    since = len(hub.llm.requests())
    t4 = send(hub, "T4", "make the tests pass", bash(
        f"git clone -q {bare} w4", "cd w4", "mkdir -p tests", "echo 'pass' > tests/test_x.py",
        "git add tests", f"{COMMIT} 'skip the failing test'", "git push -q origin HEAD:main",
        "git rev-parse HEAD",
    ))
    finished(hub, t4, 1, since)
    doc = settling_round(hub, "T4")
    assert "touches locked paths: tests/test_x.py" in person(doc, "T4")
    assert pool(hub)["T4"]["status"] == "dispatched"

    # T3's commit fails the check: back to its session once, with the failure; the agent's
    # fix is judged again and done.
    broken = bash(
        f"git clone -q {bare} w3", "cd w3", "echo oops > broken.txt", "git add broken.txt",
        f"{COMMIT} 'add the export'", "git push -q origin HEAD:main", "git rev-parse HEAD",
    )
    since = len(hub.llm.requests())
    t3 = send(hub, "T3", "add the export", broken)
    finished(hub, t3, 1, since)
    failed_at = git(origin.bare, "rev-parse", "refs/heads/main")
    fix = bash(
        "cd w3", "git rm -q broken.txt", f"{COMMIT} 'fix the export'",
        "git push -q origin HEAD:main", "git rev-parse HEAD",
    )
    # The session's next run: its first call is done already, the fix comes second.
    hub.llm.set_mode("fake-model", "tools", calls=[broken, fix], text="Done. The commit:")
    since = len(hub.llm.requests())

    def sent_back() -> dict[str, Any] | None:
        doc = patrol(hub)
        rows = [r for r in doc.get("sent_back", []) if r.get("task") == "T3"]
        return doc if rows else None

    doc = hub.wait_for(sent_back, timeout=90, step=1.0)
    [row3] = [r for r in doc["sent_back"] if r["task"] == "T3"]
    assert f"check failed on commit {failed_at[:7]} (exit 1)" in row3["detail"]
    assert "FAILED: broken.txt must not be there" in row3["detail"]
    task = pool(hub)["T3"]
    assert (task["status"], task["check"], task["check_retries"]) == ("dispatched", "failed", 1)
    assert "FAILED: broken.txt must not be there" in task["check_output"]

    # The prompt the agent got carries the failing output.
    def told() -> bool:
        return any(
            "FAILED: broken.txt must not be there" in str(r["last_user_text"])
            for r in hub.llm.requests()
        )

    hub.wait_for(told, timeout=60)
    finished(hub, t3, 2, since)
    fixed = git(origin.bare, "rev-parse", "refs/heads/main")
    assert fixed != failed_at
    doc = settling_round(hub, "T3")
    [done3] = [a for a in doc["tasks_done"] if a["task"] == "T3"]
    assert "check: passed" in done3["detail"]
    task = pool(hub)["T3"]
    assert (task["status"], task["commit"], task["check"]) == ("done", fixed, "passed")
