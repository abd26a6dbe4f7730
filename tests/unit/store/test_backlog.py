"""Task pool store: strict records, locked updates, corrupt files, back-off and task selection."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.config.load import parse_config
from xaf_hub.errors import ConfigError, StateFileError, TaskChanged, UsageError
from xaf_hub.store.backlog import Backlog
from xaf_hub.store.pick import pick_tasks, readiness
from xaf_hub.store.pool import InfraPolicy, backoff_delay
from xaf_hub.store.tasks import BacklogData, Task, format_instant, is_generated_id, parse_instant

NOW = datetime(2026, 10, 25, 12, 0, 0, tzinfo=UTC)
REPO_ROOT = Path(__file__).resolve().parents[3]


def write_pool(path: Path, tasks: list[dict[str, Any]], **top: Any) -> None:
    doc = {"schema_version": 1, "discipline": None, "tasks": tasks, **top}
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=2), encoding="utf-8")


def snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


def age_file(path: Path) -> None:
    """Push the mtime into the past so a rewrite would be visible even on coarse clocks."""
    old = 1_600_000_000
    os.utime(path, (old, old))


# --------------------------------------------------------------------------- records


def test_task_round_trip_keeps_unknown_keys() -> None:
    raw = {
        "id": "F-8",
        "title": "F-8 清理旧 CF 值",
        "priority": "P1",
        "status": "dispatched",
        "session_id": "ses_1",
        "not_before": 1_761_390_000_000,
        "depends_on": ["F-7"],
        "note": {"owner": "王五"},
    }
    task = Task.from_json(raw, path="pool.json", index=0)
    assert task.depends_on == ("F-7",)
    assert task.extra == {"note": {"owner": "王五"}}
    out = task.to_json()
    assert out["note"] == {"owner": "王五"}
    assert Task.from_json(out) == task
    assert out["depends_on"] == ["F-7"]


@pytest.mark.parametrize(
    ("patch", "key", "fragment"),
    [
        ({"title": 5}, "title", "expected a string, got a number"),
        ({"title": "  "}, "title", "must not be empty"),
        ({"id": ""}, "id", "must not be empty"),
        ({"id": None}, "id", "expected a string, got null"),
        ({"status": "running"}, "status", "must be pending, dispatched or done"),
        ({"priority": "P9"}, "priority", "must be P0, P1, P2 or P3"),
        ({"priority": 1}, "priority", "expected a string"),
        ({"attempts": True}, "attempts", "expected a whole number, got a boolean"),
        ({"attempts": -1}, "attempts", "0 or more"),
        ({"attempts": "2"}, "attempts", "expected a whole number"),
        ({"depends_on": "T1"}, "depends_on", "expected a list, got a string"),
        ({"depends_on": ["T1", 3]}, "depends_on[1]", "expected a task id"),
        ({"not_before": "tomorrow"}, "not_before", "not an ISO 8601 time"),
        ({"not_before": 1.5}, "not_before", "expected a string or a whole number, got a number"),
        ({"created_at": "2026-13-01"}, "created_at", "not an ISO 8601 time"),
        ({"instance": None}, "instance", "expected a string, got null"),
        ({"model": ["a"]}, "model", "expected a string, got a list"),
    ],
)
def test_task_from_json_rejects_bad_values(
    tmp_path: Path, patch: dict[str, Any], key: str, fragment: str
) -> None:
    pool = tmp_path / "tasks_backlog.json"
    good = {"id": "T1", "title": "first"}
    write_pool(pool, [good, {**good, "id": "T2", **patch}])
    before = snapshot(pool)
    with pytest.raises(StateFileError) as err:
        Backlog(pool).load()
    message = str(err.value)
    assert str(pool) in message
    assert f"tasks[1].{key}:" in message
    assert fragment.replace("epoch ms", "epoch milliseconds") in message
    with pytest.raises(StateFileError):
        Backlog(pool).add(Task(id="", title="never written"))
    assert snapshot(pool) == before


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"priority": "P5"}, "priority"),
        ({"status": "queued"}, "status"),
        ({"attempts": -2}, "attempts"),
        ({"title": ""}, "title"),
        ({"extra": {"status": "x"}}, "extra repeats"),
    ],
)
def test_task_constructor_refuses_invalid_records(kwargs: dict[str, Any], fragment: str) -> None:
    base: dict[str, Any] = {"id": "T1", "title": "t"}
    with pytest.raises(ValueError, match=fragment):
        Task(**{**base, **kwargs})


def test_missing_required_key_and_non_object_task(tmp_path: Path) -> None:
    pool = tmp_path / "p.json"
    write_pool(pool, [{"id": "T1", "title": "ok"}, {"title": "no id"}])
    with pytest.raises(StateFileError, match=r"tasks\[1\]: missing required key 'id'"):
        Backlog(pool).load()
    pool.write_text('{"tasks": [["not", "an", "object"]]}', encoding="utf-8")
    with pytest.raises(StateFileError, match=r"tasks\[0\]: expected an object, got a list"):
        Backlog(pool).load()



@pytest.mark.parametrize(
    ("config_key", "task_key", "value"),
    [
        ("concurrency_limit", "attempts", "2"),
        ("concurrency_limit", "attempts", 1.5),
        ("username", "title", 5),
        ("danger", "verified", 1),
    ],
)
def test_a_wrong_typed_task_key_is_told_as_the_config_tells_one(
    tmp_path: Path, config_key: str, task_key: str, value: object
) -> None:
    """One typed-JSON check for the config and the pool: a value of the wrong type in a key of
    the same type reads the same in both, after the file and the key."""
    doc = {"instances": [{"name": "a", "url": "http://127.0.0.1:9", "roots": ["/srv/demo"],
                          config_key: value}]}
    with pytest.raises(ConfigError) as config_error:
        parse_config(doc, path=tmp_path / "config.json", env={})
    pool = tmp_path / "tasks_backlog.json"
    write_pool(pool, [{"id": "T1", "title": "first", task_key: value}])
    with pytest.raises(StateFileError) as pool_error:
        Backlog(pool).load()
    said = str(config_error.value).split(f"{config_key}': ", 1)[1]
    assert str(pool_error.value) == f"task pool {pool}: tasks[0].{task_key}: {said}"


# --------------------------------------------------------------------------- corrupt files


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"schema_version": 1, "tasks": [\n  {"id": "T1",', "line 2 column"),
        (
            b'{"schema_version": 1, "tasks": [{"id": "T1", "title": "\xff\xfe"}]}',
            "bad byte at offset 55",
        ),
        (b'{"schema_version": 1,\x00 "tasks": []}', "NUL byte at offset 21"),
        (b"[]", "expected a JSON object at the top, got a list"),
        (b'{"schema_version": 1, "tasks": {}}', "tasks: expected a list"),
        (b'{"schema_version": 2, "tasks": []}', "schema_version 2 is not supported"),
        (b'{"schema_version": "1", "tasks": []}', "schema_version: expected a whole number"),
        (b'{"discipline": 3, "tasks": []}', "discipline: expected a string"),
        (
            b'{"tasks": [{"id": "A", "title": "a"}, {"id": "A", "title": "b"}]}',
            "tasks[1].id: duplicate id 'A' (also tasks[0])",
        ),
    ],
)
def test_corrupt_pool_is_reported_and_never_reset(
    tmp_path: Path, content: bytes, fragment: str
) -> None:
    pool = tmp_path / "tasks_backlog.json"
    pool.write_bytes(content)
    age_file(pool)
    before = snapshot(pool)
    backlog = Backlog(pool, lock_timeout=2)
    with pytest.raises(StateFileError) as err:
        backlog.load()
    assert str(pool) in str(err.value)
    assert fragment in str(err.value)
    for attempt in (
        lambda: backlog.add(Task(id="T9", title="x"), now=NOW),
        lambda: backlog.update(lambda data: data.tasks.clear()),
        lambda: backlog.record_manual_dispatch("p", "ses", "a", None, NOW),
    ):
        with pytest.raises(StateFileError):
            attempt()
    assert snapshot(pool) == before


def test_bom_prefixed_pool_is_accepted(tmp_path: Path) -> None:
    pool = tmp_path / "tasks_backlog.json"
    doc = {"schema_version": 1, "tasks": [{"id": "T1", "title": "带 BOM 的任务"}]}
    pool.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc, ensure_ascii=False).encode("utf-8"))
    backlog = Backlog(pool)
    assert [t.title for t in backlog.load().tasks] == ["带 BOM 的任务"]
    backlog.mark_done("T1", NOW)
    assert backlog.load().tasks[0].status == "done"


def test_missing_pool_is_empty(tmp_path: Path) -> None:
    data = Backlog(tmp_path / "absent.json").load()
    assert data == BacklogData()
    assert not (tmp_path / "absent.json").exists()


def test_example_backlog_at_repo_root_is_valid() -> None:
    example = REPO_ROOT / "tasks_backlog.json"
    data = Backlog(example).load()
    assert 4 <= len(data.tasks) <= 6
    assert {t.status for t in data.tasks} == {"pending", "dispatched", "done"}
    titles = " ".join(t.title for t in data.tasks)
    assert re.search(r"[\u4e00-\u9fff]", titles) and re.search(r"[A-Za-z]{4}", titles)
    assert data.to_json() == json.loads(example.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- writing


def test_update_writes_only_when_something_changed(tmp_path: Path) -> None:
    pool = tmp_path / "tasks_backlog.json"
    # Hand-written: no optional keys, odd spacing. A no-op must not normalise it.
    pool.write_text('{"tasks": [ {"id": "T1", "title": "one"} ]}', encoding="utf-8")
    age_file(pool)
    before = snapshot(pool)
    backlog = Backlog(pool)
    assert backlog.update(lambda data: len(data.tasks)) == 1
    assert backlog.update(lambda data: data.replace(data.require("T1"))).id == "T1"
    assert snapshot(pool) == before
    backlog.set_status("T1", "done", done_at="2026-10-25T12:00:00+00:00")
    assert snapshot(pool) != before
    assert json.loads(pool.read_text(encoding="utf-8"))["schema_version"] == 1


def test_failed_mutation_leaves_file_alone(tmp_path: Path) -> None:
    pool = tmp_path / "tasks_backlog.json"
    write_pool(pool, [{"id": "T1", "title": "one"}])
    age_file(pool)
    before = snapshot(pool)

    def boom(data: BacklogData) -> None:
        data.tasks.clear()
        raise RuntimeError("mutator failed half-way")

    with pytest.raises(RuntimeError):
        Backlog(pool).update(boom)
    assert snapshot(pool) == before


def test_add_generates_id_and_created_at(tmp_path: Path) -> None:
    backlog = Backlog(tmp_path / "pool.json", clock=lambda: NOW)
    task = backlog.add(Task(id="", title="写迁移脚本", priority="P1"))
    assert re.fullmatch(r"T-20261025-[0-9a-f]{4}", task.id)
    assert is_generated_id(task.id)
    assert task.created_at == "2026-10-25T12:00:00+00:00"
    explicit = backlog.add(Task(id="F-8", title="F-8 清理", created_at="2026-01-01T00:00:00"))
    assert explicit.created_at == "2026-01-01T00:00:00"
    assert [t.id for t in backlog.load().tasks] == [task.id, "F-8"]
    with pytest.raises(UsageError, match="'F-8' already exists"):
        backlog.add(Task(id="F-8", title="again"))
    assert len(backlog.load().tasks) == 2


def test_unknown_top_level_keys_and_discipline_survive_rewrites(tmp_path: Path) -> None:
    pool = tmp_path / "pool.json"
    write_pool(pool, [], discipline="只在 cfclub 上提交", owner="lead")
    backlog = Backlog(pool)
    backlog.add(Task(id="T1", title="x"), now=NOW)
    doc = json.loads(pool.read_text(encoding="utf-8"))
    assert doc["discipline"] == "只在 cfclub 上提交"
    assert doc["owner"] == "lead"


def test_set_status_checks_id_status_and_fields(tmp_path: Path) -> None:
    backlog = Backlog(tmp_path / "pool.json")
    backlog.add(Task(id="T1", title="x"), now=NOW)
    with pytest.raises(UsageError, match="no task 'T9'"):
        backlog.set_status("T9", "done")
    with pytest.raises(UsageError, match="unknown status"):
        backlog.set_status("T1", "finished")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="colour"):
        backlog.set_status("T1", "done", colour="red")
    with pytest.raises(UsageError, match="id"):
        backlog.set_status("T1", "done", id="T2")
    with pytest.raises(UsageError, match="attempts"):
        backlog.set_status("T1", "pending", attempts=-1)
    assert backlog.set_status("T1", "pending", priority="P0").priority == "P0"


def test_dispatch_done_cycle(tmp_path: Path) -> None:
    backlog = Backlog(tmp_path / "pool.json")
    backlog.add(Task(id="T1", title="x"), now=NOW)
    sent = backlog.mark_dispatched("T1", "ses_9", "lan-189", "anthropic/claude", NOW)
    assert (sent.status, sent.session_id, sent.dispatched_to, sent.model) == (
        "dispatched",
        "ses_9",
        "lan-189",
        "anthropic/claude",
    )
    assert sent.dispatched_at == "2026-10-25T12:00:00+00:00"
    done = backlog.mark_done("T1", NOW + timedelta(hours=1))
    assert (done.status, done.done_at) == ("done", "2026-10-25T13:00:00+00:00")
    assert done.session_id == "ses_9"
    assert backlog.load().tasks == [done]


@pytest.mark.parametrize(
    ("attempts_before", "infrastructure", "attempts_after", "delay"),
    [
        (0, False, 1, timedelta(minutes=10)),
        (1, False, 2, timedelta(minutes=20)),
        (2, False, 3, timedelta(minutes=40)),
        (8, False, 9, timedelta(hours=24)),  # 600·2^8 s = 42.7 h, capped
        (500, False, 501, timedelta(hours=24)),
        (0, True, 0, None),
        (3, True, 3, None),
    ],
)
def test_requeue_task_vs_infrastructure_failure(
    tmp_path: Path,
    attempts_before: int,
    infrastructure: bool,
    attempts_after: int,
    delay: timedelta | None,
) -> None:
    backlog = Backlog(tmp_path / "pool.json")
    backlog.add(Task(id="T1", title="x", attempts=attempts_before), now=NOW)
    backlog.mark_dispatched("T1", "ses_1", "lan-1", "m/x", NOW)
    task = backlog.requeue("T1", reason="tests failed", infrastructure=infrastructure, now=NOW)
    assert task.status == "pending"
    assert task.attempts == attempts_after
    assert task.last_error == "tests failed"
    assert (task.session_id, task.dispatched_at, task.dispatched_to) == (None, None, None)
    expected = None if delay is None else (NOW + delay).isoformat(timespec="seconds")
    assert task.not_before == expected
    assert backlog.load().tasks == [task]
    # The back-off really holds the task back, and only until it ends.
    assert bool(pick_tasks([task], "lan-1", 1, NOW)) == (delay is None)
    if delay is not None:
        assert pick_tasks([task], "lan-1", 1, NOW + delay) == [task]


def test_backoff_delay_custom_base() -> None:
    assert backoff_delay(0, 60) == timedelta(0)
    assert backoff_delay(1, 60) == timedelta(minutes=1)
    assert backoff_delay(3, 60) == timedelta(minutes=4)


def test_record_manual_dispatch(tmp_path: Path) -> None:
    backlog = Backlog(tmp_path / "pool.json")
    rec = backlog.record_manual_dispatch("修复登录页的重定向问题", "ses_42", "lan-248", "", NOW)
    task = rec.task
    assert rec.created and rec.before is None
    assert is_generated_id(task.id)
    assert (task.status, task.session_id, task.dispatched_to, task.model) == (
        "dispatched",
        "ses_42",
        "lan-248",
        None,
    )
    assert task.title == "修复登录页的重定向问题" and task.prompts == ("修复登录页的重定向问题",)
    assert task.created_at == task.dispatched_at == "2026-10-25T12:00:00+00:00"
    assert task.steered_at is None
    # The title is the task's first line, never a session title.
    untitled = backlog.record_manual_dispatch("\nfirst line\nsecond", "s2", "a", "m/x", NOW).task
    assert untitled.title == "first line"
    assert [t.id for t in backlog.load().tasks] == [task.id, untitled.id]


def test_steers_of_one_session_add_to_its_row(tmp_path: Path) -> None:
    backlog = Backlog(tmp_path / "pool.json")
    first = backlog.record_manual_dispatch("build the export", "ses_1", "lan-b", "m/a", NOW).task
    later = NOW + timedelta(minutes=3)
    steer = backlog.record_manual_dispatch("also add retries", "ses_1", "lan-b", None, later)
    assert not steer.created and steer.before == first
    again = backlog.record_manual_dispatch("and a progress bar", "ses_1", "lan-b", None, later)
    [row] = backlog.load().tasks
    assert row == again.task and row.id == first.id
    assert row.prompts == ("build the export", "also add retries", "and a progress bar")
    assert row.title == "build the export" and row.model == "m/a"
    assert row.steered_at == format_instant(later)
    assert row.work_text() == "build the export\n\nalso add retries\n\nand a progress bar"
    # The same session id on another instance is another piece of work.
    other = backlog.record_manual_dispatch("x", "ses_1", "lan-c", None, later)
    assert other.created
    # Taking back a steer whose prompt never arrived restores the row as it was.
    assert backlog.take_back(again)
    assert backlog.load().require(first.id) == steer.task
    assert backlog.take_back(other) and len(backlog.load().tasks) == 1
    # A row changed since (here: by the steer taken back) is left alone.
    assert not backlog.take_back(again)


def test_a_patrol_row_steered_by_hand_keeps_its_text_first(tmp_path: Path) -> None:
    backlog = Backlog(tmp_path / "pool.json")
    backlog.add(Task(id="F-8", title="F-8 clean up", prompt="remove the old values"), now=NOW)
    backlog.mark_dispatched("F-8", "ses_9", "lan-b", "m/a", NOW)
    row = backlog.record_manual_dispatch("also the tests", "ses_9", "lan-b", None, NOW).task
    assert row.id == "F-8"
    assert row.prompts == ("remove the old values", "also the tests")


def test_old_rows_load_with_defaults_for_new_keys(tmp_path: Path) -> None:
    pool = tmp_path / "pool.json"
    write_pool(pool, [{"id": "T1", "title": "old", "status": "pending"}])
    [task] = Backlog(pool).load().tasks
    assert (task.prompts, task.steered_at, task.infra_failures, task.parked) == ((), None, 0, None)
    assert task.avoid_models == () and task.texts() == ("old",)


def test_claim_sends_only_the_row_it_planned_from(tmp_path: Path) -> None:
    backlog = Backlog(tmp_path / "pool.json")
    planned = backlog.add(Task(id="T1", title="x"), now=NOW)
    backlog.set_status("T1", "done", done_at=format_instant(NOW))
    with pytest.raises(TaskChanged, match="now done"):
        backlog.claim(planned, "ses_1", "lan-b", None, NOW)
    assert backlog.load().require("T1").status == "done"
    backlog.set_status("T1", "pending", done_at=None, priority="P0")
    with pytest.raises(TaskChanged):  # changed, even if pending again
        backlog.claim(planned, "ses_1", "lan-b", None, NOW)
    fresh = backlog.load().require("T1")
    claimed = backlog.claim(fresh, "ses_1", "lan-b", "m/a", NOW)
    assert (claimed.status, claimed.session_id, claimed.model) == ("dispatched", "ses_1", "m/a")
    backlog.discard("T1")
    with pytest.raises(TaskChanged, match="gone"):
        backlog.claim(fresh, "ses_1", "lan-b", None, NOW)


def test_infrastructure_failures_back_off_then_park(tmp_path: Path) -> None:
    backlog = Backlog(tmp_path / "pool.json")
    backlog.add(Task(id="T1", title="x", attempts=1), now=NOW)
    policy = InfraPolicy(max_failures=4)
    waits = []
    for _ in range(3):
        backlog.mark_dispatched("T1", "ses_1", "lan-b", None, NOW)
        task = backlog.requeue("T1", reason="HTTP 500", infrastructure=True, now=NOW, policy=policy)
        assert task.attempts == 1 and not task.parked
        waits.append(parse_instant(task.not_before) - NOW)  # type: ignore[operator]
        assert readiness(task, [task], NOW).startswith("backing off")
    assert waits == [timedelta(minutes=5), timedelta(minutes=15), timedelta(hours=1)]
    backlog.mark_dispatched("T1", "ses_1", "lan-b", None, NOW)
    task = backlog.requeue("T1", reason="HTTP 500", infrastructure=True, now=NOW, policy=policy)
    assert task.parked == "4 infrastructure failures in a row; last: HTTP 500"
    assert task.not_before is None and task.infra_failures == 4
    assert readiness(task, [task], NOW + timedelta(days=9)) == f"parked: {task.parked}"
    assert pick_tasks([task], "lan-b", 1, NOW + timedelta(days=9)) == []
    # A task failure or a success ends the run of infrastructure failures.
    backlog.set_status("T1", "dispatched", parked=None, session_id="s", dispatched_to="lan-b")
    assert backlog.requeue("T1", reason="t", infrastructure=False, now=NOW).infra_failures == 0


def test_move_model_avoids_the_failed_model_without_cost(tmp_path: Path) -> None:
    backlog = Backlog(tmp_path / "pool.json")
    backlog.add(Task(id="T1", title="x"), now=NOW)
    backlog.mark_dispatched("T1", "ses_1", "lan-b", "p/a", NOW)
    task = backlog.move_model("T1", reason="Incorrect API key", failed_model="p/a", now=NOW)
    assert (task.status, task.attempts, task.infra_failures, task.not_before) == (
        "pending",
        0,
        0,
        None,
    )
    assert task.avoid_models == ("p/a",) and "p/a" in (task.last_error or "")


# --------------------------------------------------------------------------- concurrency


def _add_many(path: str, worker: int, start: Any) -> None:
    start.wait(30)
    backlog = Backlog(Path(path), lock_timeout=60)
    for n in range(10):
        backlog.add(Task(id="", title=f"worker {worker} task {n}"), now=NOW)


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    pool = tmp_path / "tasks_backlog.json"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_add_many, args=(str(pool), w, start)) for w in range(5)]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(120)
    assert [p.exitcode for p in procs] == [0] * 5
    tasks = Backlog(pool).load().tasks
    assert len(tasks) == 50
    assert len({t.id for t in tasks}) == 50
    assert {t.title for t in tasks} == {f"worker {w} task {n}" for w in range(5) for n in range(10)}


# --------------------------------------------------------------------------- selection


def t(
    task_id: str,
    p: str = "P2",
    pin: str = "",
    st: str = "pending",
    at: str | int | None = None,
    nb: str | int | None = None,
    dep: tuple[str, ...] = (),
) -> Task:
    """A compact task for the selection table: priority, pin, status, created, not_before."""
    return Task(
        id=task_id,
        title=f"task {task_id}",
        priority=p,  # type: ignore[arg-type]  # the table passes valid literals as plain str
        instance=pin,
        status=st,  # type: ignore[arg-type]
        created_at=at,
        not_before=nb,
        depends_on=dep,
    )


LATER = "2026-10-25T13:00:00+00:00"
EARLIER = "2026-10-25T11:00:00+00:00"
OLD = "2026-10-20T10:00:00+00:00"
MS_LATER = int(datetime(2026, 10, 25, 13, tzinfo=UTC).timestamp() * 1000)

PICK_CASES: list[tuple[str, list[Task], str, int, list[str]]] = [
    ("priority first", [t("a"), t("b", "P0"), t("c", "P3")], "x", 3, ["b", "a", "c"]),
    ("all four", [t(p, p) for p in ("P3", "P1", "P2", "P0")], "x", 4, ["P0", "P1", "P2", "P3"]),
    ("age breaks ties", [t("new", at=EARLIER), t("old", at=OLD)], "x", 2, ["old", "new"]),
    ("epoch ms ages", [t("new", at=1_761_400_000_000), t("old", at=1_761_300_000)], "x", 2,
     ["old", "new"]),
    ("no created_at = oldest", [t("dated", at=EARLIER), t("undated")], "x", 2,
     ["undated", "dated"]),
    ("file order last", [t("first"), t("second")], "x", 2, ["first", "second"]),
    ("limited by free", [t("a"), t("b"), t("c")], "x", 2, ["a", "b"]),
    ("no free slot", [t("a")], "x", 0, []),
    ("negative free", [t("a")], "x", -1, []),
    ("own pin beats priority", [t("any", "P0"), t("mine", "P3", pin="x")], "x", 1, ["mine"]),
    ("pins, unpinned, borrowed", [t("other", "P0", pin="y"), t("any", "P1"),
     t("mine", "P2", pin="x")], "x", 3, ["mine", "any", "other"]),
    ("borrowed by priority", [t("y3", "P3", pin="y"), t("z1", "P1", pin="z")], "x", 2,
     ["z1", "y3"]),
    ("only pending", [t("d", st="dispatched"), t("done", st="done"), t("p")], "x", 3, ["p"]),
    ("back-off not over", [t("wait", nb=LATER), t("go")], "x", 2, ["go"]),
    ("back-off over", [t("waited", nb=EARLIER)], "x", 1, ["waited"]),
    ("back-off ends at now", [t("now", nb="2026-10-25T12:00:00+00:00")], "x", 1, ["now"]),
    ("back-off as epoch ms", [t("ms", nb=MS_LATER)], "x", 1, []),
    ("dependency done", [t("base", st="done"), t("next", dep=("base",))], "x", 1, ["next"]),
    ("dependency pending", [t("base"), t("next", "P0", dep=("base",))], "x", 2, ["base"]),
    ("dependency dispatched", [t("base", st="dispatched"), t("next", dep=("base",))], "x", 1,
     []),
    ("dependency missing blocks", [t("next", dep=("ghost",))], "x", 1, []),
    ("all dependencies needed", [t("a", st="done"), t("b"), t("c", dep=("a", "b"))], "x", 3,
     ["b"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tasks", "instance", "free", "expected"),
    [case[1:] for case in PICK_CASES],
    ids=[case[0] for case in PICK_CASES],
)
def test_pick_tasks(tasks: list[Task], instance: str, free: int, expected: list[str]) -> None:
    assert [task.id for task in pick_tasks(tasks, instance, free, NOW)] == expected


def test_pick_tasks_is_linear_in_the_pool() -> None:
    """A patrol plans from the whole pool: 6,000 tasks (a third waiting on a dependency) are
    picked from in well under a second of CPU, not the half minute that a look-up table of the
    pool made per task took."""
    import time

    tasks = [t(f"d{n}", st="done") for n in range(1_000)]
    tasks += [t(f"w{n}", dep=(f"d{n}", f"p{n}")) for n in range(2_000)]
    tasks += [t(f"p{n}", ("P0", "P1", "P2", "P3")[n % 4]) for n in range(3_000)]
    started = time.process_time()
    picked = pick_tasks(tasks, "x", 3, NOW)
    assert time.process_time() - started < 3
    assert [task.id for task in picked] == ["p0", "p4", "p8"]


@pytest.mark.parametrize(
    ("task", "pool", "reason"),
    [
        (t("a"), [], ""),
        (t("a", st="done"), [], "status is done"),
        (t("a", nb=LATER), [], "backing off until 2026-10-25T13:00:00+00:00"),
        (t("a", dep=("b", "c")), [t("b", st="done")], "waiting for c"),
    ],
)
def test_readiness_reasons(task: Task, pool: list[Task], reason: str) -> None:
    assert readiness(task, [*pool, task], NOW) == reason


def test_a_base_is_recorded_at_dispatch_and_forgotten_when_the_work_starts_afresh(
    tmp_path: Path,
) -> None:
    """Issue 37: a dispatch records the base; a steer keeps it; a requeue drops it with the
    verification of the old run; the next claim records its own."""
    backlog = Backlog(tmp_path / "pool.json")
    base, later = "b" * 40, "c" * 40
    rec = backlog.record_manual_dispatch("build it", "ses_1", "a", None, NOW, base=base)
    assert rec.task.base == base
    steered = backlog.record_manual_dispatch("more", "ses_1", "a", None, NOW).task
    assert steered.base == base  # the same work goes on from the same base
    backlog.note_check(steered, judged="check: failed", check="failed", check_retries=1)
    back = backlog.requeue(steered.id, reason="x", infrastructure=True, now=NOW)
    assert (back.base, back.judged, back.check, back.check_retries) == (None, None, None, None)
    sent = backlog.claim(back, "ses_2", "a", None, NOW, base=later)
    assert sent.base == later and sent.status == "dispatched"
    with pytest.raises(TaskChanged):
        backlog.note_check(back, judged="stale row")  # a changed row is not written over
    with pytest.raises(ValueError, match="not a verification field"):
        backlog.note_check(sent, status="done")
