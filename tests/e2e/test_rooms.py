"""A room for every task: each new session for a task works in a worktree and branch of its own,
made through its real opencode server, started from the base branch as origin has it now.

The server's checkout of the project is a clone of a bare origin in tmp_path that is one commit
behind origin and holds a commit never pushed: neither may reach a task's branch. The agent
(the fake model calling the real bash tool) commits and pushes its branch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import fleet as sandbox
from tests.contained import needs_sandbox
from tests.e2e.daemon import _audit, _beat, _daemon
from tests.fleet import Hub
from tests.gitrepo import Origin, git, make_origin

pytestmark = pytest.mark.e2e

INSTANCE = "local-a"


def server_checkout(hub: Hub, tmp_path: Path) -> tuple[Origin, Path]:
    """An origin, and the server's checkout of it under the project's root: behind origin by a
    commit and ahead of it by one never pushed."""
    origin = make_origin(tmp_path / "remote")
    # A root commit of its own: opencode names a project after its repository's first commit.
    origin.commit(f"first of {tmp_path.name}")
    origin.push()
    checkout = hub.root / "shop"
    git(hub.root, "clone", "-q", str(origin.bare), str(checkout))
    origin.commit("on origin only")
    origin.push()
    (checkout / "local.txt").write_text("never pushed\n", "utf-8")
    git(checkout, "add", "local.txt")
    git(checkout, "-c", "user.name=Local", "-c", "user.email=l@example.invalid", "commit",
        "-q", "-m", "local, never pushed")
    hub.write_config(
        project={**hub.doc["project"], "repository": str(origin.bare), "isolation": "worktree"}
    )
    hub.set_instance(INSTANCE, default_directory=str(checkout), concurrency_limit=3)
    return origin, checkout


def commit_and_push() -> list[Any]:
    """One bash call: a file named after the branch, committed and pushed as the branch."""
    steps = [
        'b=$(git rev-parse --abbrev-ref HEAD | tr / -)',
        'echo "$b" > "$b.txt"',
        'git add "$b.txt"',
        "git -c user.name=Agent -c user.email=agent@example.invalid commit -q -m work",
        "git push -q -u origin HEAD",
        "git rev-parse HEAD",
    ]
    return [["bash", {"command": " && ".join(steps), "description": "commit and push"}]]


def test_a_new_task_works_in_its_own_worktree_started_from_origin(
    hub: Hub, tmp_path: Path
) -> None:
    origin, checkout = server_checkout(hub, tmp_path)
    tip = git(origin.bare, "rev-parse", "main")
    hub.llm.set_mode("fake-model", "tools", calls=commit_and_push(), text="Done. The commit:")

    code, sent = hub.cli_json(
        "dispatch", "--text", "Add the health endpoint", "--instance", INSTANCE, "--new"
    )
    assert code == 0, sent
    branch = sent["branch"]
    assert branch and branch.startswith("opencode/"), sent
    code, row = hub.cli_json("backlog", "show", sent["task_id"])
    assert code == 0, row
    worktree = row["worktree"]
    assert row["branch"] == branch and row["checkout"] == str(checkout), row
    assert row["base"] == tip, "the worktree starts from origin/main as it is now"
    assert sent["directory"] == worktree and not worktree.startswith(str(hub.root))

    def pushed() -> str:
        return git(origin.bare, "for-each-ref", "--format=%(objectname)", f"refs/heads/{branch}")

    hub.wait_for(pushed, timeout=90, step=0.5)
    work = pushed()
    # The branch holds origin's main and the task's commit: not the checkout's own commit.
    assert git(origin.bare, "rev-parse", f"{work}^") == tip
    files = git(origin.bare, "ls-tree", "--name-only", work).split()
    assert "local.txt" not in files and f"{branch.replace('/', '-')}.txt" in files
    # origin's main is untouched: the agent pushed its branch only.
    assert git(origin.bare, "rev-parse", "main") == tip
    # The checkout on the server was never switched or changed.
    assert git(checkout, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert not (checkout / f"{branch.replace('/', '-')}.txt").exists()

    # The session in the worktree is the project's on every view.
    code, listed = hub.cli_json("sessions", "--instance", INSTANCE, "--fresh")
    assert code == 0, listed
    mine = [s for s in listed["sessions"] if s["id"] == sent["session_id"]]
    assert mine and mine[0]["branch"] == branch, listed["sessions"]
    code, shown = hub.cli_json("show", sent["session_id"])
    assert code == 0 and shown["branch"] == branch, shown
    assert shown["project"] == hub.doc["project"]["name"], shown
    code, table, _ = hub.cli("sessions", "--instance", INSTANCE, "--wide")
    assert code == 0 and branch in table
    page = tmp_path / "page.html"
    assert hub.cli("sessions", "--html", str(page))[0] == 0
    assert branch in page.read_text("utf-8")
    # The prompt told the agent to push its own branch, never main.
    prompts = [r for r in hub.llm.requests() if r["model"] == "fake-model"]
    first = json.dumps(prompts[0])
    assert "git push -u origin HEAD" in first and "worktree" in first


def test_runs_in_worktrees_count_toward_the_limit(hub: Hub, tmp_path: Path) -> None:
    """Four dispatches at once against a limit of 2: two rooms run, two are refused (exit 3),
    and the server itself never shows more than two running."""
    server_checkout(hub, tmp_path)
    hub.set_instance(INSTANCE, concurrency_limit=2)
    hub.write_config(lock={**hub.doc["lock"], "slot_grace_seconds": 1})
    hub.llm.set_mode("slow-model", "slow", delay=30)
    procs = [
        hub.popen("dispatch", "--text", f"job {i}", "--instance", INSTANCE, "--new",
                  "--model", "fake/slow-model", "--json")
        for i in range(4)
    ]
    results = [(p.wait(timeout=120), p.communicate()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 0, 3, 3], results
    made = [json.loads(out) for code, (out, _) in results if code == 0]
    assert all(d["branch"] for d in made) and len({d["directory"] for d in made}) == 2
    code, status = hub.cli_json("status", "--fresh")
    assert code == 0
    row = next(i for i in status["instances"] if i["instance"] == INSTANCE)
    assert row["running_project"] == 2, row
    # Past the grace of the reservations, only the server's count holds the limit.
    time.sleep(2)
    code, _, err = hub.cli("dispatch", "--text", "one more", "--instance", INSTANCE, "--new")
    assert code == 3, err
    # The refused ones left no worktree behind on the server.
    code, listed = hub.cli_json("sessions", "--instance", INSTANCE, "--fresh")
    assert sorted(s["directory"] for s in listed["sessions"]) == sorted(
        d["directory"] for d in made
    )
    for d in made:
        hub.cli("interrupt", "--instance", INSTANCE, "--session", d["session_id"])


def test_each_server_says_whether_it_gives_tasks_worktrees(hub: Hub, tmp_path: Path) -> None:
    """local-a's folder is a clone with commits; lan-b's is a repository with no commit yet:
    `instances` and `doctor` say so, and a task sent to lan-b shares its checkout, said."""
    server_checkout(hub, tmp_path)
    code, rows = hub.cli_json("instances")
    assert code == 0, rows
    by = {r["name"]: r for r in rows}
    assert by[INSTANCE]["worktrees"] is True and by[INSTANCE]["worktrees_note"] is None
    assert by["lan-b"]["worktrees"] is False and "no commit yet" in by["lan-b"]["worktrees_note"]
    code, doc = hub.cli_json("doctor")
    said = {(f["area"], f["subject"]): f for f in doc["findings"]}
    assert said[("worktrees", INSTANCE)]["level"] == "ok"
    assert said[("worktrees", "lan-b")]["level"] == "warn", said[("worktrees", "lan-b")]
    code, out, err = hub.cli("dispatch", "--text", "shared work", "--instance", "lan-b", "--new")
    assert code == 0, err
    assert "shares the checkout" in err and "no commit yet" in err


def line_task() -> list[Any]:
    """One bash call that any number of tasks run side by side: from origin's main as it is
    now, mark the line its worktree's name gives (``...-line-N-...``) and add a file of its own,
    commit, push its branch. Run again (a follow-up), it redoes the change on the new main."""
    steps = [
        'b=$(git rev-parse --abbrev-ref HEAD | tr / -)',
        'n=$(basename "$PWD" | sed -E "s/.*-line-([0-9]+).*/\\1/")',
        "git fetch -q origin main",
        "git reset -q --hard origin/main",
        'sed -i "${n}s/\\$/ +$b/" shared.txt',
        'echo "$b" > "$b.txt"',
        'git add shared.txt "$b.txt"',
        "git -c user.name=Agent -c user.email=agent@example.invalid commit -q -m \"$b\"",
        "git push -q -f -u origin HEAD",
        "git rev-parse HEAD",
    ]
    return [["bash", {"command": " && ".join(steps), "description": "the task"}]]


def shared_origin(hub: Hub, tmp_path: Path, **project: Any) -> tuple[Origin, Path]:
    """server_checkout, with a ten-line shared.txt on main from the start."""
    origin, checkout = server_checkout(hub, tmp_path)
    git(checkout, "fetch", "-q", "origin")
    (origin.work / "shared.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    git(origin.work, "checkout", "-q", "main")
    git(origin.work, "pull", "-q", "--rebase", "origin", "main")
    git(origin.work, "add", "shared.txt")
    git(origin.work, "commit", "-q", "-m", "shared")
    origin.push()
    hub.write_config(project={**hub.doc["project"], **project})
    hub.llm.set_mode("fake-model", "tools", calls=line_task(), text="Done. The commit:")
    return origin, checkout


def patrol_until(hub: Hub, done: Any, timeout: float = 150) -> None:
    def round_then_check() -> bool:
        code, _, err = hub.cli("patrol", "--once", "--no-design")
        assert code in (0, 3), err  # 3: another round held the cycle lock
        return bool(done())

    hub.wait_for(round_then_check, timeout=timeout, step=1.0)


def rows(hub: Hub) -> dict[str, dict[str, Any]]:
    code, listed = hub.cli_json("backlog", "list")
    assert code == 0, listed
    return {t["id"]: t for t in listed["tasks"]}


@pytest.mark.core
def test_three_tasks_at_once_each_land_once_and_nothing_is_lost(
    hub: Hub, tmp_path: Path
) -> None:
    origin, checkout = shared_origin(hub, tmp_path)
    for n in (3, 5, 7):
        code, _, err = hub.cli("backlog", "add", "--id", f"T{n}", "--title", f"line {n} fix",
                               "--instance", INSTANCE)
        assert code == 0, err

    def landed() -> bool:
        return all(t.get("landing") == "landed" for t in rows(hub).values())

    patrol_until(hub, landed)
    tasks = rows(hub)
    main = git(origin.bare, "rev-parse", "main")
    text = git(origin.bare, "show", "main:shared.txt").splitlines()
    for n in (3, 5, 7):
        task = tasks[f"T{n}"]
        mark = task["branch"].replace("/", "-")
        assert task["status"] == "done" and task["verified"] is True, task
        # Its change is on main once: its line, and its own file; no other line holds it.
        assert text[n - 1] == f"line {n} +{mark}", text
        assert sum(mark in line for line in text) == 1
        assert git(origin.bare, "show", f"main:{mark}.txt") == mark
        assert git(origin.bare, "merge-base", "--is-ancestor", task["landed"], main) == ""
        # Its own branch held only its own change (checked before it was deleted: its
        # commit's files), and it is gone from the remote now.
        files = git(origin.bare, "show", "--name-only", "--format=", task["commit"]).split()
        assert sorted(files) == sorted(["shared.txt", f"{mark}.txt"]), files
    assert git(origin.bare, "for-each-ref", "refs/heads/opencode") == ""
    assert "local.txt" not in git(origin.bare, "ls-tree", "--name-only", "main").split()
    log = git(origin.bare, "log", "--format=%s", "main").splitlines()
    assert len([s for s in log if s.startswith("opencode-")]) == 3, log
    # The worktrees are gone from the server; its checkout was never touched.
    assert git(checkout, "worktree", "list").count("\n") == 0
    assert git(checkout, "status", "--short") == ""


def test_a_conflict_goes_back_to_its_agent_then_to_a_person(hub: Hub, tmp_path: Path) -> None:
    """Two tasks mark the same line: the second to land conflicts, its agent rebases when asked
    and it lands; with no retry left (a third on that line), it waits for a person, who lands
    it or drops it."""
    origin, _ = shared_origin(hub, tmp_path)
    for task in ("A", "B"):
        code, _, err = hub.cli("backlog", "add", "--id", task, "--title", "line 4 " + task,
                               "--instance", INSTANCE)
        assert code == 0, err
    patrol_until(hub, lambda: all(t.get("landing") == "landed" for t in rows(hub).values()))
    tasks = rows(hub)
    # One of them conflicted and went back once; both changes are on the line now.
    assert sorted(t.get("conflicts") or 0 for t in tasks.values()) == [0, 1], tasks
    line = git(origin.bare, "show", "main:shared.txt").splitlines()[3]
    assert all(t["branch"].replace("/", "-") in line for t in tasks.values()), line

    # A third on that line, landed by a person (integrate "review") after a person's own
    # commit rewrote the line: with no retry left it conflicts and waits for that person.
    hub.write_config(
        project={**hub.doc["project"], "conflict_retries": 0, "integrate": "review"}
    )
    code, _, err = hub.cli("backlog", "add", "--id", "C", "--title", "line 4 C",
                           "--instance", INSTANCE)
    assert code == 0, err
    patrol_until(hub, lambda: rows(hub)["C"].get("landing") == "ready")
    assert rows(hub)["C"]["state"] == "ready_to_land"
    git(origin.work, "checkout", "-q", "main")
    git(origin.work, "pull", "-q", "--rebase", "origin", "main")
    lines = (origin.work / "shared.txt").read_text().splitlines(keepends=True)
    lines[3] = "line 4 rewritten by a person\n"
    (origin.work / "shared.txt").write_text("".join(lines))
    git(origin.work, "commit", "-q", "-am", "a person")
    origin.push()
    code, doc = hub.cli_json("land", "C")
    assert code == 3 and doc["result"] == "person" and "shared.txt" in doc["detail"], doc
    task = rows(hub)["C"]
    assert task["state"] == "land_by_person" and "shared.txt" in task["judged"]
    patrol_until(hub, lambda: True)  # a round leaves it to the person
    assert rows(hub)["C"].get("landing") == "person"
    code, doc = hub.cli_json("land", "C", "--drop")
    assert code == 0 and doc["result"] == "dropped", doc
    task = rows(hub)["C"]
    assert (task["status"], task["landing"], task["parked"]) == (
        "pending", "dropped", "dropped by a person"
    )
    assert git(origin.bare, "for-each-ref", "refs/heads/opencode") == ""


def test_a_hub_killed_after_its_push_lands_the_task_once(hub: Hub, tmp_path: Path) -> None:
    """The remote accepts the landing push, then the hub is SIGKILLed before it writes it
    down (a hook on the remote kills it): the next round finds the work on main by content,
    records it, and pushes nothing twice."""
    origin, _ = shared_origin(hub, tmp_path, integrate="review")
    pid_file = tmp_path / "hub.pid"
    hook = origin.bare / "hooks" / "post-receive"
    hook.write_text(
        "#!/bin/sh\n"
        f'grep -q " refs/heads/main$" && [ -s {pid_file} ] && kill -9 "$(cat {pid_file})"\n'
        "exit 0\n"
    )
    hook.chmod(0o755)
    code, _, err = hub.cli("backlog", "add", "--id", "K", "--title", "line 2 K",
                           "--instance", INSTANCE)
    assert code == 0, err
    patrol_until(hub, lambda: rows(hub)["K"].get("landing") == "ready")
    hub.write_config(project={**hub.doc["project"], "integrate": "auto"})
    before = git(origin.bare, "rev-parse", "main")
    proc = hub.popen("patrol", "--once", "--no-design")
    pid_file.write_text(str(proc.pid))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -9, (out, err)
    pid_file.write_text("")
    landed = git(origin.bare, "rev-parse", "main")
    assert landed != before and rows(hub)["K"].get("landing") == "ready"  # pushed, not written
    patrol_until(hub, lambda: rows(hub)["K"].get("landing") == "landed")
    assert git(origin.bare, "rev-parse", "main") == landed  # nothing pushed a second time
    assert rows(hub)["K"]["landed"] == landed


def test_cleanup_removes_only_worktrees_that_hold_nothing_unpushed(
    hub: Hub, tmp_path: Path
) -> None:
    """Two worktrees no task has (made on the server by someone else): cleanup lists both,
    and --execute removes the clean one and keeps the one with a commit no remote holds."""
    _, checkout = server_checkout(hub, tmp_path)
    server = hub.server(INSTANCE)
    made = []
    for name in ("stray-clean", "stray-work"):
        r = httpx.post(f"{server.url}/experimental/worktree", params={"directory": str(checkout)},
                       json={"name": name}, auth=("opencode", hub.password(INSTANCE)), timeout=30)
        assert r.status_code == 200, r.text
        made.append(Path(r.json()["directory"]))
    clean, work = made
    hub.wait_for(lambda: (work / "local.txt").exists(), timeout=30)  # filled by the server
    (work / "mine.txt").write_text("only here\n")
    git(work, "add", "mine.txt")
    git(work, "commit", "-q", "-m", "only in this worktree")
    code, doc = hub.cli_json("cleanup", "--instance", INSTANCE)
    assert code == 0, doc
    listed = {w["directory"]: w for w in doc["instances"][0]["worktrees"]}
    assert {Path(d) for d in listed} == {clean, work}
    assert all(w["why"] == "abandoned" and w["action"] == "would remove" for w in listed.values())
    code, doc = hub.cli_json("cleanup", "--instance", INSTANCE, "--execute")
    assert code == 0, doc
    acted = {Path(w["directory"]): w["action"] for w in doc["instances"][0]["worktrees"]}
    assert acted[clean] == "removed" and not clean.exists()
    assert acted[work] == "kept: 1 commit(s) on no remote branch" and work.exists()


@needs_sandbox
def test_work_that_fails_the_check_on_a_moved_base_goes_back(hub: Hub, tmp_path: Path) -> None:
    """Each task passes the project's check on its own commit, but the second to land fails it
    rebuilt on the main the first moved (the check refuses both files together): nothing of it
    is pushed, it goes back to its session, and with the retry spent it waits for a person."""
    origin, _ = shared_origin(
        hub, tmp_path, check_command='test "$(ls opencode-*.txt | wc -l)" -le 1',
        check_retries=1,
    )
    for task in ("P", "Q"):
        line = 7 if task == "Q" else 3
        code, _, err = hub.cli("backlog", "add", "--id", task, "--title", f"line {line} {task}",
                               "--instance", INSTANCE)
        assert code == 0, err

    def sent_back() -> bool:
        return any(r.get("check_retries") == 1 for r in rows(hub).values())

    patrol_until(hub, sent_back, timeout=200)
    tasks = rows(hub)
    first = next(t for t in tasks.values() if t.get("landing") == "landed")
    second = next(t for t in tasks.values() if t is not first)
    assert second["status"] == "dispatched" and second["check"] == "failed", second
    assert second["judged"].startswith("check: failed on origin/main"), second["judged"]
    # Its agent redid the work on the new main: its own commit now fails the check, and with
    # the retry spent it waits for a person, still not on main.
    patrol_until(hub, lambda: rows(hub)[second["id"]].get("judged") == "check: failed")
    second = rows(hub)[second["id"]]
    assert second["status"] == "dispatched" and second["state"] == "person"
    files = git(origin.bare, "ls-tree", "--name-only", "main").split()
    mark = second["branch"].replace("/", "-")
    assert f"{mark}.txt" not in files and first["branch"].replace("/", "-") + ".txt" in files


def test_a_run_in_a_room_is_stopped_at_its_ceiling_by_the_live_watch(
    hub: Hub, tmp_path: Path
) -> None:
    """A priced run in a task's worktree (outside the project's roots) passes its $0.05 ceiling at
    its third step: the daemon's live watch stops it there, as it stops one in the checkout, not
    at the next round (an hour away). The daemon serves two projects, as a team's does: the
    worktrees of every project's checkout are followed, not only a chosen one's."""
    _, checkout = server_checkout(hub, tmp_path)
    shop = {k: v for k, v in hub.doc.pop("project").items() if k != "name"}
    for inst in hub.doc["instances"]:
        inst.pop("roots"), inst.pop("default_directory", None)
    blog = hub.project_dir("blog", "app")
    hub.write_config(budget={"run_usd": 0.05}, projects={
        "shop": {**shop, "roots": {INSTANCE: [str(checkout)]},
                 "default_directory": {INSTANCE: str(checkout)}},
        "blog": {"roots": {INSTANCE: [str(blog.parent)]},
                 "default_directory": {INSTANCE: str(blog)}},
    })
    hub.llm.set_mode("priced-model", "tools", text="done",
                     calls=[["bash", {"command": "sleep 1", "description": "a step"}]] * 30)
    lines = _daemon(hub, "--no-fill")
    url, pw = hub.server(INSTANCE).url, hub.password(INSTANCE)
    try:
        code, sent = hub.cli_json("--project", "shop", "dispatch", "--text", "Costly work",
                                  "--instance", INSTANCE, "--new", "--model", "fake/priced-model")
        assert code == 0, sent
        sid = sent["session_id"]

        def stopped() -> bool:
            msgs = [m for m in sandbox.messages(url, pw, sid) if m["info"]["role"] == "assistant"]
            info = msgs[-1]["info"] if msgs else {}
            return (info.get("error") or {}).get("name") == "MessageAbortedError"

        hub.wait_for(stopped, timeout=120)
        spent = sum(float(m["info"].get("cost") or 0) for m in sandbox.messages(url, pw, sid)
                    if m["info"]["role"] == "assistant")
        print(f"room run stopped at ${spent:.2f} of $0.05")
        assert spent <= 0.08 + 1e-9  # the step that passed it and at most one more
        rows = [r for r in _audit(hub, "patrol.live.run_ceiling") if r["session"] == sid]
        assert [r["result"] for r in rows] == ["stopping", "aborted"], rows
        assert _beat(hub)["ticks"] == 1  # the live watch, not a round
    finally:
        lines.stop()
        for s in hub.busy_ids(INSTANCE):
            hub.cli("interrupt", "--session", s)


def test_a_rate_limited_run_in_a_room_is_healed_by_the_live_reaction(
    hub: Hub, tmp_path: Path
) -> None:
    """A task's session in its worktree hits a rate limit: the daemon heals it along the chain
    at once, as it heals one in the checkout, not at the next round (an hour away)."""
    server_checkout(hub, tmp_path)
    hub.doc["models"] = {"default_dispatch_model": "fake/fake-model",
                         "chain": ["opencode/free-model", "backup/good-model"]}
    hub.write_config()
    hub.llm.set_mode("free-model", "429", retry_after=1)
    lines = _daemon(hub, "--no-fill")
    url, pw = hub.server(INSTANCE).url, hub.password(INSTANCE)
    try:
        code, sent = hub.cli_json("dispatch", "--text", "Rate limited work", "--instance",
                                  INSTANCE, "--new", "--model", "opencode/free-model")
        assert code == 0, sent
        sid = sent["session_id"]

        def healed() -> bool:
            msgs = [m for m in sandbox.messages(url, pw, sid) if m["info"]["role"] == "assistant"]
            info = msgs[-1]["info"] if msgs else {}
            done = bool(info.get("time", {}).get("completed"))
            return info.get("modelID") == "good-model" and done

        hub.wait_for(healed, timeout=120)
        assert _beat(hub)["ticks"] == 1  # the live reaction, not a round
    finally:
        lines.stop()
