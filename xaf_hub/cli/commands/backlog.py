"""The task pool from a terminal: list, add, show, set a task's status, export and import.

The pool is tasks_backlog.json, or a key per task in Redis shared by every hub (``pool.backend``);
``export`` / ``import`` move it to and from that JSON file, the portable format. An import is
checked whole first: a bad row or an id already taken refuses it (exit 4), nothing written.

The patrol's fill_slots dispatches pending tasks by priority (P0 first, then age): tasks
pinned to an instance go there first, unpinned ones anywhere, pinned ones may be borrowed by
another instance with room. Every change is one locked, atomic write and an audit line.
A task whose attempts reached patrol.max_attempts is "blocked" until `set --reset`; one
parked after infrastructure failures in a row, or left to a person (interrupted, steered by
hand), goes back to the patrol with `set ID --status pending`. That refuses (exit 4) while the
task's session still runs, unless --force: the patrol would run the work a second time.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from xaf_hub.cli.commands._common import FORCE, INSTANCE, SESSION
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import MAX_TEXT, Answers, Tables, add_record, common_parser, flag, opt
from xaf_hub.cli.termfit import tone_painter
from xaf_hub.core import aio
from xaf_hub.core.outcomes import TASK_STATES, task_words, tone
from xaf_hub.core.text import dumps, shorten
from xaf_hub.errors import ExitCode, StateFileError, UnreachableError, UsageError
from xaf_hub.ops.decisions import session_still_runs
from xaf_hub.store.pick import state_of
from xaf_hub.store.pool import undispatched, unjudged
from xaf_hub.store.statefile import read_json, write_json_atomic
from xaf_hub.store.tasks import (
    PRIORITIES,
    BacklogData,
    Task,
    format_instant,
    of_project,
    project_of,
)

EXAMPLES = """\
examples:
  xaf-hub backlog list
  xaf-hub backlog list --status pending --json
  xaf-hub backlog add --title "清理旧 CF 值" --priority P1 --prompt "Remove the old CF values"
  xaf-hub backlog add --title "Fix login" --instance lan-189 --spec docs/plans/login.md
  xaf-hub backlog show T-20261130-ab12
  xaf-hub backlog set T-20261130-ab12 --status done
  xaf-hub backlog set F-8 --status pending --reset     # unblock: attempts and back-off cleared
  xaf-hub backlog set F-8 --status pending --force     # even though its session still runs
  xaf-hub backlog export pool.json                     # the pool as the portable JSON file
  xaf-hub backlog import pool.json                     # add its tasks (e.g. into Redis)
"""

Priority = Literal["P0", "P1", "P2", "P3"]
Status = Literal["pending", "dispatched", "done"]


@dataclass(frozen=True)
class Choice:
    """Which action of `backlog` runs."""

    backlog_command: Literal["list", "add", "show", "set", "export", "import"]


@dataclass(frozen=True, kw_only=True)
class ListOptions(Tables):
    """The options of `backlog list`."""

    status: Status | None = opt("--status", help="only tasks with this status")


@dataclass(frozen=True, kw_only=True)
class AddOptions(Answers):
    """The options of `backlog add`."""

    title: str = opt("--title", help="short title (also the session title)", required=True)
    id: str = opt("--id", help="task id (default: T-<yyyymmdd>-<hex>)", default="")
    priority: Priority = opt("--priority", help="P0 first (default P2)", default="P2")
    instance: str = INSTANCE.field(default="", help="pin to this instance (others may still "
                                   "borrow it)")
    module: str = opt("--module", help="free-form module name", default="")
    spec: str = opt("--spec", help="design document, relative to the repo root", default="")
    prompt: str = opt("--prompt", help="the work text (default: the title)", default="",
                      max_length=MAX_TEXT, group="text")
    prompt_file: str | None = opt("--prompt-file", help="read the work text from FILE",
                                  metavar="FILE", group="text")
    depends_on: tuple[str, ...] = opt("--depends-on", help="dispatch only after these tasks are "
                                      "done", default=(), metavar="ID", max_items=100)


@dataclass(frozen=True, kw_only=True)
class ShowOptions(Answers):
    """The options of `backlog show`."""

    task_id: str = opt(help="the task id (T-...)", required=True, metavar="ID")


@dataclass(frozen=True, kw_only=True)
class SetOptions(Answers):
    """The options of `backlog set`."""

    task_id: str = opt(required=True, metavar="ID")
    status: Status = opt("--status", required=True)
    reset: bool = flag("--reset", help="clear attempts, back-off and last error (unblocks a task)")
    priority: Priority | None = opt("--priority", help="also change the priority")
    session: str | None = SESSION.field(help="with --status dispatched: the session")
    to: str | None = opt("--to", metavar="NAME", help="with --status dispatched: its instance")
    force: bool = FORCE.field(help="with --status pending: even if the task's session still runs")


@dataclass(frozen=True, kw_only=True)
class ExportOptions(Answers):
    """The options of `backlog export`."""

    file: str | None = opt(metavar="FILE", help="replaced atomically; default stdout")


@dataclass(frozen=True, kw_only=True)
class ImportOptions(Answers):
    """The options of `backlog import`."""

    file: str = opt(required=True, metavar="FILE", help="a tasks_backlog.json-format file")
    replace: bool = flag("--replace", help="replace the whole pool by the file instead of adding "
                         "to it")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The actions of `backlog`, each with its record's options."""
    sub = p.add_subparsers(dest="backlog_command", metavar="ACTION", required=True)
    for name, (record, words, _) in ACTIONS.items():
        # The common options are accepted after the action too, like every other command's.
        action = sub.add_parser(name, help=words, parents=[common_parser(suppress=True)])
        add_record(action, record)


def run(ctx: Context) -> int:
    """Dispatch to the chosen action."""
    record, _, action = ACTIONS[ctx.options(Choice).backlog_command]
    return action(ctx, ctx.options(record))


def _state(ctx: Context, task: Task, tasks: list[Task]) -> dict[str, str]:
    """A task's state as ``backlog`` prints it: the value, its words and why."""

    state, why = state_of(task, tasks, datetime.now(UTC), ctx.whole.patrol.max_attempts)
    return {"state": state, "state_words": task_words(state), "state_detail": why}


def listing(ctx: Context, opts: ListOptions) -> dict[str, Any]:
    """What `backlog list --json` prints (and the MCP tool answers): the tasks in order."""

    cfg = ctx.whole  # several projects and no --project: every project's tasks
    names = [p.name for p in cfg.projects]
    store = ctx.stores.pool()
    data = store.load()
    mine = of_project(data.tasks, cfg.project_name, names) if cfg.chosen else data.tasks
    tasks = [t for t in mine if not opts.status or t.status == opts.status]
    order = {"pending": 0, "dispatched": 1, "done": 2}
    tasks.sort(key=lambda t: (order[t.status], PRIORITIES.index(t.priority)))
    return {"path": store.where,
            "tasks": [show_document(t, _state(ctx, t, data.tasks), project=project_of(t, names))
                      for t in tasks]}


def _list(ctx: Context, opts: ListOptions) -> int:

    doc = listing(ctx, opts)
    tasks = doc["tasks"]
    if ctx.json or not tasks:
        return ctx.answer(doc, f"no tasks ({doc['path']})")
    ctx.columns(tasks, {
        **({"project": lambda t: t["project"]} if not ctx.whole.chosen else {}),
        "id": lambda t: t["id"],
        "priority": lambda t: t["priority"],
        # its words, and why it waits where that is what a person asks
        "state": lambda t: f"{t['state_words']} ({t['state_detail']})" if t["state_detail"]
        and t["state"] in ("waiting", "blocked", "person") else t["state_words"],
        "instance": lambda t: t["instance"] or "any",
        "attempts": lambda t: t["attempts"],
        "session": lambda t: f"{t['dispatched_to']}/{t['session_id']}" if t["session_id"] else "-",
        "title": lambda t: shorten(t["title"], 50),
    }, flexible=[("title", 12), ("session", 16), ("instance", 8)], keep_end=["session"],
        colors={"state": tone_painter({task_words(s): tone(s) for s in TASK_STATES})})
    return int(ExitCode.OK)


def _add(ctx: Context, opts: AddOptions) -> int:
    added = add_task(ctx, opts)
    return ctx.answer(added.to_json(), f"added task {added.id} ({added.priority}): {added.title}")


def add_task(ctx: Context, opts: AddOptions) -> Task:
    """Add the task to the pool (one locked write) and audit it; the task as added."""


    cfg = ctx.config
    if not opts.title.strip():
        raise UsageError("--title is empty")
    if opts.instance:
        cfg.instance(opts.instance)  # an unknown name is a UsageError listing the known ones
    prompt = opts.prompt
    if opts.prompt_file:
        try:
            prompt = Path(opts.prompt_file).read_text(encoding="utf-8-sig")
        except OSError as exc:
            raise UsageError(f"--prompt-file {opts.prompt_file}: {exc.strerror or exc}") from None
    try:
        task = Task(id=opts.id.strip(), title=opts.title.strip(), priority=opts.priority,
                    module=opts.module, instance=opts.instance, spec=opts.spec, prompt=prompt,
                    depends_on=opts.depends_on, project=cfg.project_name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    added = ctx.stores.pool().add(task)
    ctx.audit("backlog.add", result="added", reason=added.id, extra={"task": added.id})
    return added


def shown(ctx: Context, opts: ShowOptions) -> tuple[Task, dict[str, str]]:
    """One task of the pool and its state (UsageError when there is none by that id)."""
    data = ctx.stores.pool().load()
    task = data.require(opts.task_id)
    return task, _state(ctx, task, data.tasks)


def show_document(task: Task, state: dict[str, str], **more: str) -> dict[str, Any]:
    """What `backlog show --json` prints (and the MCP tool answers); ``more`` (a listing's
    project) follows the task's own fields."""
    return {**task.to_json(), **more, "commit": task.commit, "commits": list(task.commits),
            "verified": task.verified, **state}


def _show(ctx: Context, opts: ShowOptions) -> int:
    task, state = shown(ctx, opts)
    why = f" ({state['state_detail']})" if state["state_detail"] else ""
    lines = [f"{key + ':':<15}{value if value not in (None, '', []) else '-'}"
             for key, value in task.to_json().items() if key not in ("prompt", "check_output")]
    lines += [f"{'state:':<15}{state['state_words']}{why}", "prompt:",
              *(f"  | {line}" for line in (task.prompt or "(the title)").splitlines())]
    if task.check_output:
        lines += ["check output (its end):", *(f"  | {x}" for x in task.check_output.splitlines())]
    return ctx.answer(show_document(task, state), *lines)


def _set(ctx: Context, opts: SetOptions) -> int:

    cfg = ctx.config
    now = datetime.now(UTC)
    fields: dict[str, Any] = {}
    if opts.priority:
        fields["priority"] = opts.priority
    if opts.reset:
        fields.update(attempts=0, not_before=None, last_error=None)
    if opts.status == "dispatched":
        if not (opts.session and opts.to):
            raise UsageError("--status dispatched needs --session ID and --to INSTANCE")
        cfg.instance(opts.to)
        fields.update(session_id=opts.session, dispatched_to=opts.to,
                      dispatched_at=format_instant(now), done_at=None)
    elif opts.session or opts.to:
        raise UsageError("--session/--to go with --status dispatched only")
    elif opts.status == "done":
        fields.update(done_at=format_instant(now), not_before=None)
    elif opts.status == "pending":
        # A person acts: whatever parked the task or left it to a person is over.
        fields.update(parked=None, infra_failures=0, avoid_models=(), steered_at=None)
        if not opts.force:
            _refuse_if_running(ctx, ctx.stores.pool().load().require(opts.task_id))

    def edited(current: Task | None) -> tuple[Task, Task]:
        if current is None:
            raise UsageError(f"no task {opts.task_id!r} in the task pool")
        change = dict(fields)
        if opts.status != current.status:
            # What the patrol verified (and the check it ran) belongs to the old status; a
            # person's "done" is theirs (verified stays null: the hub did not look).
            change.update(commit=None, commits=(), verified=None, **unjudged())
        if opts.status == "pending" and current.status != "pending":
            # Back to the pool: the old session no longer stands for this task.
            change.update(undispatched())
        try:
            new = dataclasses.replace(current, status=opts.status, **change)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return new, new

    task = ctx.stores.pool().edit(opts.task_id, edited)
    ctx.audit("backlog.set", session=task.session_id or "", instance=task.dispatched_to or "",
              result=opts.status, reason=task.id, extra={"task": task.id, "reset": opts.reset})
    extra = " (attempts and back-off cleared)" if opts.reset else ""
    return ctx.answer(task.to_json(), f"task {task.id} is now {task.status}{extra}")


def _refuse_if_running(ctx: Context, task: Task) -> None:
    """Refuse to put a task back in the pool while its session still runs (one scan)."""

    if task.status == "pending" or not task.session_id or not task.dispatched_to:
        return
    where = f"{task.dispatched_to}/{task.session_id}"
    try:
        runs = aio.run(session_still_runs(ctx.ops(), task.dispatched_to, task.session_id))
    except UnreachableError as exc:
        raise UnreachableError(task.dispatched_to, f"cannot tell whether task {task.id}'s "
                               f"session {where} still runs ({exc.reason}); --force sets it "
                               "pending anyway") from None
    if runs:
        raise UsageError(
            f"task {task.id}'s session {where} is still running: back in the pool, the patrol "
            f"would run the work a second time. Stop it first (xaf-hub interrupt --session "
            f"{task.session_id}) or pass --force"
        )


def _export(ctx: Context, opts: ExportOptions) -> int:


    store = ctx.stores.pool()
    data = store.load()
    if opts.file is None:
        ctx.out(dumps(data.to_json()))
        return int(ExitCode.OK)
    target = Path(opts.file)
    try:
        write_json_atomic(target, data.to_json(), private=False)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from None
    return ctx.answer({"file": str(target), "from": store.where, "tasks": len(data.tasks)},
                      f"exported {len(data.tasks)} task(s) from {store.where} to {target}")


def _import(ctx: Context, opts: ImportOptions) -> int:


    source = Path(opts.file)
    try:
        incoming = BacklogData.from_json(read_json(source, what="import file"), path=source)
    except FileNotFoundError:
        raise UsageError(f"import file {source}: no such file") from None
    except StateFileError as exc:
        # The file is the user's input here, not the hub's state: exit 4, nothing imported.
        raise UsageError(f"{exc}; nothing imported") from None
    store = ctx.stores.pool()
    added = store.import_data(incoming, replace=opts.replace)
    ctx.audit("backlog.import", result="replaced" if opts.replace else "added",
              reason=str(source), extra={"tasks": len(added), "pool": store.where})
    verb = "replaced the pool with" if opts.replace else "imported"
    return ctx.answer({"file": str(source), "into": store.where, "tasks": [t.id for t in added]},
                      f"{verb} {len(added)} task(s) from {source} into {store.where}")


# Each action: its options record, its help and what runs it.
ACTIONS: dict[str, tuple[type[Any], str, Callable[[Context, Any], int]]] = {
    "list": (ListOptions, "list the tasks (pending first, by priority)", _list),
    "add": (AddOptions, "add a pending task", _add),
    "show": (ShowOptions, "show one task in full", _show),
    "set": (SetOptions, "change a task's status (and optionally unblock it)", _set),
    "export": (ExportOptions, "write the pool as the portable JSON file (stdout without FILE)",
               _export),
    "import": (ImportOptions, "add the tasks of a pool JSON file to the pool (all or none)",
               _import),
}
