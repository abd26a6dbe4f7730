"""Landing a task's verified work (ops.land), attacked: against a real git origin in tmp_path,
with tasks whose rows say they are verified and ready (no server: the rows have no worktree)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.gitrepo import Origin, git, make_origin
from tests.unit.patrol.runner_support import NOW
from xaf_hub.config.load import load_config
from xaf_hub.core import aio
from xaf_hub.notify.record import RoundLog
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.land import land
from xaf_hub.patrol.context import Cycle, every_project
from xaf_hub.patrol.jobs.land import land_ready
from xaf_hub.store.repository import Mirror
from xaf_hub.store.tasks import Task


def hub(
    tmp_path: Path, patrol: dict[str, object] | None = None, **project: object
) -> tuple[OpsContext, Origin]:
    origin = make_origin(tmp_path / "remote")
    doc = {
        "patrol": patrol or {},
        "project": {"name": "p", "repository": str(origin.bare), "isolation": "worktree",
                    "integrate": "auto", **project},
        "instances": [{"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"]}],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    cfg = load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    return OpsContext(cfg, env={}), origin


def branch_work(origin: Origin, branch: str, name: str, text: str) -> tuple[str, str]:
    """(the fork, the top): one commit adding ``name`` on ``branch`` from main, pushed."""
    fork = git(origin.bare, "rev-parse", "main")
    git(origin.work, "checkout", "-q", "-B", branch, fork)
    (origin.work / name).write_text(text)
    git(origin.work, "add", name)
    git(origin.work, "commit", "-q", "-m", f"{branch}: {name}")
    git(origin.work, "push", "-q", "-f", "origin", f"HEAD:refs/heads/{branch}")
    return fork, git(origin.work, "rev-parse", "HEAD")


def ready(pctx: OpsContext, task_id: str, branch: str, fork: str, top: str) -> Task:
    """A row as the patrol leaves verified work: dispatched, ready to land."""
    return pctx.backlog().add(Task(
        id=task_id, title=task_id, status="dispatched", dispatched_to="lan-a",
        session_id=f"ses_{task_id}", base=fork, branch=branch, commit=top, commits=(top,),
        verified=True, landing="ready", project=pctx.cfg.project_name,
    ))


def on_main(origin: Origin, name: str) -> bool:
    return name in git(origin.bare, "ls-tree", "--name-only", "main").split()


def test_a_remote_that_fails_while_landing_is_the_tasks_trouble_not_the_rounds(
    tmp_path: Path,
) -> None:
    """The remote answered the verification, then fails the landing's fetch (down, moved, a
    token that stopped working): the patrol's land step notes it for the task and the round
    goes on to dispatch, instead of ending the step in an internal error every round."""
    pctx, origin = hub(tmp_path)
    fork, top = branch_work(origin, "opencode/t1", "one.txt", "1\n")
    ready(pctx, "T1", "opencode/t1", fork, top)
    origin.bare.rename(tmp_path / "gone.git")
    cycle = Cycle(RoundLog(started=NOW))
    aio.run(land_ready(pctx, cycle))
    [error] = cycle.log.errors
    assert "T1" in error and "git fetch" in error, error
    assert pctx.backlog().load().require("T1").landing == "ready"  # tried again next round


def test_work_pushed_to_the_branch_after_it_was_verified_survives_the_landing(
    tmp_path: Path,
) -> None:
    """A follow-up (a person's, while the task waited to be landed) made the agent push more
    to its branch: the verified commit lands, and the branch that holds the newer, unjudged
    work is kept on the remote (with its worktree), not deleted with it."""
    pctx, origin = hub(tmp_path)
    fork, top = branch_work(origin, "opencode/t1", "one.txt", "1\n")
    ready(pctx, "T1", "opencode/t1", fork, top)
    git(origin.work, "checkout", "-q", "opencode/t1")
    (origin.work / "later.txt").write_text("the follow-up\n")
    git(origin.work, "add", "later.txt")
    git(origin.work, "commit", "-q", "-m", "follow-up")
    git(origin.work, "push", "-q", "origin", "HEAD:refs/heads/opencode/t1")
    later = git(origin.work, "rev-parse", "HEAD")
    done = aio.run(land(pctx, "T1"))
    assert done.result == "landed" and on_main(origin, "one.txt")
    assert not on_main(origin, "later.txt")  # never judged: not landed
    assert git(origin.bare, "rev-parse", "refs/heads/opencode/t1") == later
    assert "opencode/t1" in done.detail and "kept" in done.detail, done.detail


def test_a_room_whose_branch_is_the_base_branch_never_deletes_it(tmp_path: Path) -> None:
    """A server answered the base branch ("develop", not the remote's default branch, which git
    itself would refuse to delete) as a new worktree's branch, a hostile or broken server, so
    the agent's pushes went there: once the task counts as landed, the hub's tidying must not
    delete the base branch from the remote."""
    pctx, origin = hub(tmp_path, patrol={"base_branch": "develop"})
    git(origin.work, "push", "-q", "origin", "main:refs/heads/develop")
    fork, top = branch_work(origin, "develop", "one.txt", "1\n")
    ready(pctx, "T1", "develop", fork, top)
    done = aio.run(land(pctx, "T1"))
    assert done.result == "landed"
    assert git(origin.bare, "for-each-ref", "--format=%(objectname)", "refs/heads/develop") == top


def test_each_project_lands_on_its_own_base_branch(tmp_path: Path) -> None:
    """Two projects on one remote, blog's base branch develop: one patrol step lands shop's
    verified work on main and blog's on develop."""
    origin = make_origin(tmp_path / "remote")
    git(origin.work, "push", "-q", "origin", "main:refs/heads/develop")
    repo = {"repository": str(origin.bare), "isolation": "worktree", "integrate": "auto"}
    doc = {
        "projects": {p: {**repo, "roots": {"lan-a": [f"/srv/{p}"]}} for p in ("shop", "blog")},
        "instances": [{"name": "lan-a", "url": "http://127.0.0.1:9"}],
    }
    doc["projects"]["blog"]["base_branch"] = "develop"
    (tmp_path / "config.json").write_text(json.dumps(doc), "utf-8")
    pctx = OpsContext(load_config(str(tmp_path / "config.json"), env={
        "XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path), env={})
    for name in ("shop", "blog"):
        fork, top = branch_work(origin, f"opencode/{name}", f"{name}.txt", "1\n")
        ready(pctx.but(cfg=pctx.cfg.choose(name)), name, f"opencode/{name}", fork, top)
    cycle = Cycle(RoundLog(started=NOW))
    aio.run(every_project(land_ready)(pctx, cycle))
    assert [t.landing for t in pctx.backlog().load().tasks] == ["landed", "landed"]
    assert on_main(origin, "shop.txt") and not on_main(origin, "blog.txt")
    develop = git(origin.bare, "ls-tree", "--name-only", "develop").split()
    assert "blog.txt" in develop and "shop.txt" not in develop


def test_a_conflict_a_person_resolved_on_the_branch_lands_when_they_say_so(
    tmp_path: Path,
) -> None:
    """docs/worktrees.md: with its retries spent a conflicting task waits for a person, who
    resolves it on the task's branch and runs `xaf-hub land ID`: the resolution lands."""
    pctx, origin = hub(tmp_path)
    fork, top = branch_work(origin, "opencode/t1", "shared.txt", "mine\n")
    git(origin.work, "checkout", "-q", "-B", "main", fork)
    (origin.work / "shared.txt").write_text("theirs\n")
    git(origin.work, "add", "shared.txt")
    git(origin.work, "commit", "-q", "-m", "another task landed")
    git(origin.work, "push", "-q", "origin", "main")
    task = ready(pctx, "T1", "opencode/t1", fork, top)
    pctx.backlog().revise(task, landing="person", conflicts=1)
    Mirror.of(pctx.cfg).fetch()  # as the verification left it
    # The person rebases the branch onto main, keeping both, and pushes it.
    git(origin.work, "checkout", "-q", "-B", "opencode/t1", "main")
    (origin.work / "shared.txt").write_text("theirs\nmine\n")
    git(origin.work, "commit", "-q", "-am", "T1, rebased by a person")
    git(origin.work, "push", "-q", "-f", "origin", "HEAD:refs/heads/opencode/t1")
    done = aio.run(land(pctx, "T1", person=True))
    assert done.result == "landed", done.detail
    assert git(origin.bare, "show", "main:shared.txt") == "theirs\nmine"


def test_a_verified_commit_this_hub_never_fetched_waits_for_a_person(tmp_path: Path) -> None:
    """The branch was force-pushed after the verification, and the hub that lands never saw
    the verified commit (another hub verified it, or the mirror was rebuilt since): nothing
    else is landed in its place, and the task waits for a person with the reason, instead of
    failing in git every round."""
    pctx, origin = hub(tmp_path)
    fork, top = branch_work(origin, "opencode/t1", "one.txt", "1\n")
    ready(pctx, "T1", "opencode/t1", fork, top)
    branch_work(origin, "opencode/t1", "other.txt", "not what was verified\n")
    done = aio.run(land(pctx, "T1"))
    assert done.result == "person", done.detail
    assert f"{top[:7]} is not on the remote" in done.detail, done.detail
    assert not on_main(origin, "one.txt") and not on_main(origin, "other.txt")
    assert pctx.backlog().load().require("T1").landing == "person"


def test_an_agent_that_force_pushed_main_does_not_count_as_landed(tmp_path: Path) -> None:
    """T0 landed. T1's agent, told never to push the base branch, force-pushed main to its own
    commit (from before T0 landed) and its branch too. Its work is "already on main", yet T0's
    landed work is gone from main: the hub must not record T1 as landed with nothing said."""
    pctx, origin = hub(tmp_path)
    fork, t0 = branch_work(origin, "opencode/t0", "zero.txt", "0\n")
    ready(pctx, "T0", "opencode/t0", fork, t0)
    assert aio.run(land(pctx, "T0")).result == "landed" and on_main(origin, "zero.txt")
    git(origin.work, "checkout", "-q", "-B", "opencode/t1", fork)
    (origin.work / "one.txt").write_text("1\n")
    git(origin.work, "add", "one.txt")
    git(origin.work, "commit", "-q", "-m", "T1")
    git(origin.work, "push", "-q", "-f", "origin", "HEAD:refs/heads/opencode/t1", "HEAD:main")
    ready(pctx, "T1", "opencode/t1", fork, git(origin.work, "rev-parse", "HEAD"))
    done = aio.run(land(pctx, "T1"))
    assert on_main(origin, "zero.txt") or done.result != "landed", done.detail


def test_work_a_person_dropped_does_not_land_through_another_tasks_branch(
    tmp_path: Path,
) -> None:
    """T2's agent merged T1's branch into its own before a person dropped T1. T2's own work is
    verified; landing it must not put T1's dropped commit on main."""
    pctx, origin = hub(tmp_path)
    fork, t1 = branch_work(origin, "opencode/t1", "one.txt", "dropped work\n")
    pctx.backlog().add(Task(
        id="T1", title="T1", status="pending", base=fork, branch="opencode/t1", commit=t1,
        commits=(t1,), landing="dropped", parked="dropped by a person",
    ))
    git(origin.work, "checkout", "-q", "-B", "opencode/t2", t1)
    (origin.work / "two.txt").write_text("2\n")
    git(origin.work, "add", "two.txt")
    git(origin.work, "commit", "-q", "-m", "T2")
    git(origin.work, "push", "-q", "origin", "HEAD:refs/heads/opencode/t2")
    ready(pctx, "T2", "opencode/t2", fork, git(origin.work, "rev-parse", "HEAD"))
    aio.run(land(pctx, "T2"))
    assert not on_main(origin, "one.txt")
