"""Done means a commit on the repository: real opencode agents commit and push through their
bash tool (the fake model scripted to call it), and the patrol checks their word.

The remote is a bare repository in tmp_path (``project.repository``); the agent's session
clones it in its own directory, commits, pushes (or does not) and answers with what
``git rev-parse HEAD`` printed. The patrol settles the task from the hub's own mirror.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

from tests.e2e.verified_checks import home, page, patrol, pool, settling_round
from tests.fleet import Hub
from tests.gitrepo import Origin, git, make_origin
from tests.notify_capture import Capture

COMMIT_URL = "https://git.example/shop/commit/{commit}"


def with_repository(hub: Hub, url: str) -> None:
    hub.write_config(project={**hub.doc["project"], "repository": url, "commit_url": COMMIT_URL})


def agent_script(origin: Origin, push_to: str | None) -> list[Any]:
    """One bash tool call: clone, commit, push to ``push_to`` (None: no push), print the hash."""
    steps = [
        f"git clone -q {origin.bare} work",
        "cd work",
        "echo change >> notes.txt",
        "git add notes.txt",
        "git -c user.name=Agent -c user.email=agent@example.invalid commit -q -m 'the task'",
    ]
    if push_to is not None:
        steps.append(f"git push -q origin HEAD:refs/heads/{push_to}")
    steps.append("git rev-parse HEAD")
    return [["bash", {"command": " && ".join(steps), "description": "commit and push the work"}]]


def run_task(hub: Hub, task_id: str, title: str, instance: str, calls: list[Any]) -> str:
    """Add a pinned task, let the patrol send it, wait for its agent to finish; its session."""
    hub.llm.set_mode("fake-model", "tools", calls=calls, text="Done. The commit:")
    # A pin is a preference: room on the instance keeps an earlier run's slot, reserved for
    # the 5 s grace after it finished, from sending this task elsewhere.
    hub.set_instance(instance, concurrency_limit=6)
    code, _, err = hub.cli(
        "backlog", "add", "--title", title, "--id", task_id, "--instance", instance
    )
    assert code == 0, err
    doc = patrol(hub)
    sent = [(a["task"], a["instance"]) for a in doc["dispatched"]]
    assert sent == [(task_id, instance)], doc["dispatched"]
    sid = str(pool(hub)[task_id]["session_id"])

    def answered() -> bool:
        return any(
            r["model"] == "fake-model" and len(r["tool_results"]) >= len(calls)
            for r in hub.llm.requests()
        ) and sid not in hub.busy_ids(instance)

    hub.wait_for(answered, timeout=120, step=0.5)
    return sid


def tool_output(hub: Hub) -> str:
    """What the bash tool gave the model back (the agent's own view of its work)."""
    for r in reversed(hub.llm.requests()):
        if r["model"] == "fake-model" and r["tool_results"]:
            return str(r["tool_results"][0])
    raise AssertionError("the bash tool never answered")


def test_an_agent_that_pushed_its_commit_is_verified_and_done(hub: Hub, tmp_path: Path) -> None:
    origin = make_origin(tmp_path / "remote")
    with_repository(hub, str(origin.bare))
    run_task(hub, "T1", "fix the login form", "local-a", agent_script(origin, "main"))
    pushed = git(origin.bare, "rev-parse", "refs/heads/main")
    assert pushed in tool_output(hub)  # the real bash tool ran git: the remote has it

    doc = settling_round(hub, "T1")
    assert [a["task"] for a in doc["tasks_done"]] == ["T1"], doc
    task = pool(hub)["T1"]
    assert (task["status"], task["commit"], task["verified"]) == ("done", pushed, True)
    assert task["commits"] == [pushed]  # every commit credited to it
    code, shown = hub.cli_json("backlog", "show", "T1")
    assert code == 0 and (shown["commit"], shown["commits"], shown["verified"]) == (
        pushed,
        [pushed],
        True,
    )
    code, listed = hub.cli_json("backlog", "list")
    assert [(t["id"], t["commit"], t["verified"]) for t in listed["tasks"]] == [
        ("T1", pushed, True)
    ]
    html = page(hub)
    link = f'href="https://git.example/shop/commit/{pushed}"'
    assert link in html and pushed[:7] in html


def test_a_claimed_commit_never_pushed_is_not_done_and_needs_a_person(
    hub: Hub, tmp_path: Path
) -> None:
    origin = make_origin(tmp_path / "remote")
    with_repository(hub, str(origin.bare))
    chat = Capture("json")
    chat.start()
    hub.env["HOOK_TEAM"] = chat.url
    hook = {"name": "team", "url_env": "HOOK_TEAM", "format": "json", "events": ["needs_person"]}
    hub.write_config(notify={"webhooks": [hook]})
    run_task(hub, "T2", "tidy the readme", "local-a", agent_script(origin, None))
    claimed = re.findall(r"\b[0-9a-f]{40}\b", tool_output(hub))
    assert len(claimed) == 1 and claimed[0] != git(origin.bare, "rev-parse", "refs/heads/main")

    doc = settling_round(hub, "T2")
    assert doc["tasks_done"] == []
    reason = f"claimed commit {claimed[0][:7]} is not on origin/main"
    people = [p for p in doc["needs_person"] if p.get("task") == "T2"]
    assert len(people) == 1 and reason in people[0]["detail"], doc["needs_person"]
    task = pool(hub)["T2"]
    assert task["status"] == "dispatched" and "verified" not in task
    assert reason in page(hub)  # listed for a person on the page too
    # The team was told once, on the needs-a-person path, with the reason.
    texts = chat.texts()
    assert len(texts) == 1 and reason in texts[0] and "tidy the readme" in texts[0], texts

    # Still not there next round: still not done, and not announced again.
    again = patrol(hub)
    assert again["tasks_done"] == [] and [p["task"] for p in again["needs_person"]] == ["T2"]
    assert len(chat.texts()) == 1
    chat.stop()
    # A person's override stands, unverified.
    code, _, err = hub.cli("backlog", "set", "T2", "--status", "done")
    assert code == 0, err
    code, shown = hub.cli_json("backlog", "show", "T2")
    assert (shown["status"], shown["commit"], shown["verified"]) == ("done", None, None)
    assert "not verified" in page(hub)


def test_branch_mode_verifies_on_the_tasks_feature_branch(hub: Hub, tmp_path: Path) -> None:
    origin = make_origin(tmp_path / "remote")
    with_repository(hub, str(origin.bare))
    # lan-b works on feature branches: the discipline named feature/<slug of the title>.
    run_task(
        hub,
        "T3",
        "Add the export button",
        "lan-b",
        agent_script(origin, "feature/add-the-export-button"),
    )
    pushed = git(origin.bare, "rev-parse", "refs/heads/feature/add-the-export-button")
    assert git(origin.bare, "rev-parse", "refs/heads/main") != pushed

    doc = settling_round(hub, "T3")
    assert [a["task"] for a in doc["tasks_done"]] == ["T3"], doc
    task = pool(hub)["T3"]
    assert (task["status"], task["commit"], task["verified"]) == ("done", pushed, True)


def test_a_silent_remote_keeps_the_task_and_never_shows_its_token(hub: Hub, tmp_path: Path) -> None:
    """The remote does not answer: bounded, the reason shown, the task kept for the next round
    (never done, never failed); the token in the URL appears nowhere."""
    origin = make_origin(tmp_path / "remote")
    token = "ghp_e2eRepoT0kenValue42"
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts (the kernel does), never answers
        url = f"http://agent:{token}@127.0.0.1:{silent.getsockname()[1]}/shop.git"
        hub.write_config(
            project={**hub.doc["project"], "repository": url, "fetch_timeout_seconds": 2}
        )
        run_task(hub, "T4", "bump the version", "local-a", agent_script(origin, "main"))
        doc = settling_round(hub, "T4", kept=True)
        kept = [k for k in doc["tasks_kept"] if k.get("task") == "T4"]
        assert len(kept) == 1, doc["tasks_kept"]
        assert kept[0]["detail"] == (
            "waiting for verification: repository not checked: git fetch gave no answer within 2s"
        )
        assert doc["needs_person"] == [] and doc["tasks_requeued"] == []
        assert pool(hub)["T4"]["status"] == "dispatched"
        seen = [json.dumps(doc), page(hub)]
        for args in (("doctor", "--json"), ("backlog", "show", "T4", "--json"), ("status",)):
            code, out, err = hub.cli(*args)
            seen.append(out + err)
        for path in home(hub).rglob("*"):
            if path.is_file() and path.suffix in (".json", ".jsonl", ".log", ".html"):
                seen.append(path.read_text("utf-8", "replace"))
        assert all(token not in text for text in seen)

    # The remote answers again (here: the team moved it): the next round settles the task.
    with_repository(hub, str(origin.bare))
    doc = patrol(hub)
    assert [a["task"] for a in doc["tasks_done"]] == ["T4"], doc
    assert pool(hub)["T4"]["verified"] is True


def test_hashes_named_in_reverse_order_still_judge_every_commit(hub: Hub, tmp_path: Path) -> None:
    """The agent pushes M (plain), then N (edits the locked tests/test_login.py), and names N
    first, M last: every commit from the base to the top (N) is judged, so the task waits for
    a person, naming N, instead of being done on M."""
    origin = make_origin(tmp_path / "remote")
    hub.write_config(
        project={
            **hub.doc["project"],
            "repository": str(origin.bare),
            "locked_paths": ["tests/**"],
        }
    )
    commit = "git -c user.name=Agent -c user.email=agent@example.invalid commit -q -m"
    steps = [
        f"git clone -q {origin.bare} work",
        "cd work",
        "echo plain >> notes.txt",
        "git add notes.txt",
        f"{commit} 'M: plain work'",
        "mkdir -p tests",
        "echo 'assert True' > tests/test_login.py",
        "git add tests",
        f"{commit} 'N: the login test'",
        "git push -q origin HEAD:refs/heads/main",
        "git rev-parse HEAD HEAD~1",  # N first, M last
    ]
    calls = [["bash", {"command": " && ".join(steps), "description": "commit twice, push"}]]
    run_task(hub, "T6", "tidy the login page", "local-a", calls)
    n_, m_ = git(origin.bare, "rev-list", "-2", "refs/heads/main").split()
    said = tool_output(hub)
    assert said.index(n_) < said.index(m_)  # the answer names N first, M last

    doc = settling_round(hub, "T6")
    assert doc["tasks_done"] == []
    people = [p for p in doc["needs_person"] if p.get("task") == "T6"]
    assert len(people) == 1, doc["needs_person"]
    assert f"commit {n_[:7]} touches locked paths: tests/test_login.py" in people[0]["detail"]
    task = pool(hub)["T6"]
    assert (task["status"], task["judged"]) == ("dispatched", "locked path")
    assert "commit" not in task and "commits" not in task
