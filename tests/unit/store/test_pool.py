"""The task pool's interface (``TaskPool``) against both backends: the file and real Redis.

Every rule is written once on top of ``load``/``update``, so the same table runs on each:
writes only when something changed, a failed mutation leaves the pool alone, a claim made by
several processes at once succeeds once, an import is all or nothing. Then what only one
backend does: the config's choice, corrupt Redis content, Redis away, and the CLI's
``backlog export`` / ``backlog import``.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.redis_fixture import RedisServer, pool_keys
from xaf_hub.cli.main import main
from xaf_hub.config.load import Config, LockConfig, PoolConfig, parse_config
from xaf_hub.errors import ConfigError, StateFileError, TaskChanged, UnreachableError, UsageError
from xaf_hub.store.backends import Stores
from xaf_hub.store.backlog import Backlog, BacklogData, Task, TaskPool

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def file_config(tmp_path: Path) -> Config:
    return Config(path=None, home=tmp_path, state_dir=tmp_path)


def redis_config(tmp_path: Path, server: RedisServer, prefix: str, **lock: Any) -> Config:
    return Config(
        path=None,
        home=tmp_path,
        state_dir=tmp_path,
        lock=LockConfig(
            backend="redis",
            redis_url=server.url,
            redis_prefix=prefix,
            redis_password=server.password,
            **lock,
        ),
        pool=PoolConfig(backend="redis"),
    )


@pytest.fixture(params=["file", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Config:
    """A config whose pool is the file, or a fresh prefix on the test Redis."""
    if request.param == "file":
        return file_config(tmp_path)
    server: RedisServer = request.getfixturevalue("redis_server")
    return redis_config(tmp_path, server, RedisServer.prefix())


def stored(cfg: Config) -> str | None:
    """The pool's raw stored text (file or key), None while it does not exist."""
    if cfg.pool.backend == "file":
        path = cfg.backlog_path
        return path.read_text(encoding="utf-8") if path.exists() else None
    import redis

    client = redis.Redis.from_url(
        cfg.lock.redis_url, password=cfg.lock.redis_password, decode_responses=True
    )
    try:
        keys = pool_keys(client, cfg.lock.redis_prefix)
    finally:
        client.close()
    return json.dumps(keys) if keys else None


# -- the interface, on both backends -------------------------------------------------------


def test_make_pool_follows_pool_backend(backend: Config) -> None:
    pool = Stores(backend).pool()
    assert isinstance(pool, TaskPool)
    if backend.pool.backend == "file":
        assert type(pool) is Backlog and pool.where == str(backend.backlog_path)
    else:
        assert type(pool).__name__ == "RedisBacklog"
        assert pool.where.startswith("redis 127.0.0.1:") and pool.where.endswith(":pool")
        assert backend.lock.redis_password not in pool.where  # type: ignore[operator]


def test_empty_pool_reads_empty(backend: Config) -> None:
    pool = Stores(backend).pool()
    assert pool.load().tasks == []
    assert pool.update(lambda data: len(data.tasks)) == 0
    if backend.pool.backend == "redis":
        assert stored(backend) is None  # no key made by a look
    assert pool.load() == BacklogData()


def test_same_rules_on_every_backend(backend: Config) -> None:
    pool = Stores(backend).pool(clock=lambda: NOW)
    added = pool.add(Task(id="", title="写迁移脚本", priority="P1"))
    assert added.id.startswith("T-20261202-") and added.created_at == "2026-12-02T12:00:00+00:00"
    with pytest.raises(UsageError, match="already exists"):
        pool.add(Task(id=added.id, title="again"))
    before = stored(backend)
    pool.update(lambda data: data.replace(data.require(added.id)))
    assert stored(backend) == before  # unchanged pool, untouched store
    claimed = pool.claim(added, "ses_1", "lan-a", "m/a", NOW)
    assert (claimed.status, claimed.session_id, claimed.dispatched_to) == (
        "dispatched",
        "ses_1",
        "lan-a",
    )
    with pytest.raises(TaskChanged):
        pool.claim(added, "ses_2", "lan-b", None, NOW)
    back = pool.requeue(added.id, reason="tests failed", infrastructure=False, now=NOW)
    assert (back.status, back.attempts, back.session_id) == ("pending", 1, None)
    rec = pool.record_manual_dispatch("fix the login page", "ses_9", "lan-b", None, NOW)
    assert rec.created and pool.load().require(rec.task.id).session_id == "ses_9"
    assert pool.take_back(rec)
    assert [t.id for t in pool.load().tasks] == [added.id]
    assert pool.load().tasks == Stores(backend).pool().load().tasks  # a second reader agrees


def test_the_stamp_moves_with_every_write_from_any_writer_and_only_then(backend: Config) -> None:
    """What a daemon polls to hear that work arrived: another store object (another process,
    another host) writing the pool moves it; reads and writes that change nothing do not."""
    pool, other = Stores(backend).pool(), Stores(backend).pool()
    empty = pool.stamp()
    pool.load()
    assert pool.stamp() == empty  # a look writes nothing
    other.add(Task(id="T1", title="one"), now=NOW)
    first = pool.stamp()
    assert first != empty
    pool.update(lambda data: data.replace(data.require("T1")))
    pool.load()
    assert pool.stamp() == first  # unchanged pool, same stamp
    other.set_status("T1", "done")
    assert pool.stamp() not in (empty, first)


def test_failed_mutation_leaves_the_pool_alone(backend: Config) -> None:
    pool = Stores(backend).pool()
    pool.add(Task(id="T1", title="one"), now=NOW)
    before = stored(backend)

    def boom(data: BacklogData) -> None:
        data.tasks.clear()
        raise RuntimeError("mutator failed half-way")

    with pytest.raises(RuntimeError):
        pool.update(boom)
    assert stored(backend) == before


def test_done_is_written_only_over_the_row_that_was_judged(backend: Config) -> None:
    """The patrol judges a row, verifies its commit (up to the fetch's whole time), then marks
    it done: a person's change in between (set back to pending, cancelled) stands."""
    pool = Stores(backend).pool()
    pool.add(Task(id="T1", title="one"), now=NOW)
    judged = pool.mark_dispatched("T1", "ses_1", "lan-a", None, NOW)
    person = pool.set_status("T1", "pending", session_id=None, dispatched_to=None)
    before = stored(backend)
    with pytest.raises(TaskChanged, match="T1 changed meanwhile"):
        pool.mark_done("T1", NOW, commit="a" * 40, verified=True, expected=judged)
    assert stored(backend) == before and pool.load().require("T1") == person
    # The row still as judged: marked, with its proof.
    judged = pool.mark_dispatched("T1", "ses_2", "lan-a", None, NOW)
    done = pool.mark_done("T1", NOW, commit="b" * 40, verified=True, expected=judged)
    assert (done.status, done.commit, done.verified) == ("done", "b" * 40, True)


_VERIFIED = ("base", "judged", "check", "check_commit", "check_output", "check_retries")


def _verification(task: Task) -> tuple[Any, ...]:
    return tuple(getattr(task, key) for key in _VERIFIED)


def _stored_row(cfg: Config, task_id: str) -> dict[str, Any]:
    """The row as stored: its object in the file, or its own key in Redis."""
    raw = stored(cfg)
    assert raw is not None
    if cfg.pool.backend == "file":
        rows = json.loads(raw)["tasks"]
        return next(r for r in rows if r["id"] == task_id)
    key = f"{cfg.lock.redis_prefix}:pool:task:{task_id}"
    row: dict[str, Any] = json.loads(json.loads(raw)[key])
    return row


def test_verification_fields_survive_every_backend(backend: Config) -> None:
    """Issue 37's fields (the base a task was sent from, the rule that judged it, the
    project's check of its claimed commit) are written and read back by each store, through a
    row's edit and a whole-pool update alike, and a requeue clears them."""
    pool = Stores(backend).pool()
    planned = pool.add(Task(id="T1", title="one"), now=NOW)
    claimed = pool.claim(planned, "ses_1", "lan-a", None, NOW, base="c" * 40)
    assert Stores(backend).pool().load().require("T1").base == "c" * 40
    assert _stored_row(backend, "T1")["base"] == "c" * 40
    assert "commits" not in _stored_row(backend, "T1")  # unset: the row stays as it was
    noted = pool.note_check(
        claimed,
        judged="a new commit on the branch",
        check="failed",
        check_commit="d" * 40,
        check_output="1 failed",
        check_retries=1,
        dispatched_at="2026-12-02T12:05:00+00:00",
    )
    expected = ("c" * 40, "a new commit on the branch", "failed", "d" * 40, "1 failed", 1)
    assert _verification(noted) == expected
    assert _verification(Stores(backend).pool().load().require("T1")) == expected
    row = _stored_row(backend, "T1")
    assert tuple(row[k] for k in _VERIFIED) == expected
    done = pool.mark_done(
        "T1",
        NOW,
        commit="e" * 40,
        commits=("d" * 40, "e" * 40),
        verified=True,
        expected=noted,
        judged="its check passed",
        check={"check": "passed", "check_commit": "e" * 40, "check_output": "ok"},
    )
    again = Stores(backend).pool().load().require("T1")
    assert again == done and again.commits == ("d" * 40, "e" * 40)
    assert _stored_row(backend, "T1")["commits"] == ["d" * 40, "e" * 40]
    assert _verification(again) == ("c" * 40, "its check passed", "passed", "e" * 40, "ok", 1)
    back = pool.requeue("T1", reason="reopened", infrastructure=False, now=NOW)
    assert _verification(back) == (None,) * len(_VERIFIED)
    assert _verification(Stores(backend).pool().load().require("T1")) == (None,) * len(_VERIFIED)
    assert not set(_VERIFIED) & set(_stored_row(backend, "T1"))  # unset: left out
    # A whole-pool change (a manual dispatch's record) writes its base as well.
    rec = pool.record_manual_dispatch("fix it", "ses_2", "lan-b", None, NOW, base="f" * 40)
    assert Stores(backend).pool().load().require(rec.task.id).base == "f" * 40
    assert _stored_row(backend, rec.task.id)["base"] == "f" * 40


def test_import_is_all_or_nothing(backend: Config) -> None:
    pool = Stores(backend).pool()
    pool.add(Task(id="T1", title="one"), now=NOW)
    before = stored(backend)
    incoming = BacklogData(tasks=[Task(id="T2", title="two"), Task(id="T1", title="clash")])
    with pytest.raises(UsageError, match=r"tasks\[1\]\.id: task 'T1' is already in the task pool"):
        pool.import_data(incoming)
    assert stored(backend) == before  # T2 was not added either
    fresh = BacklogData(
        tasks=[Task(id="T2", title="two"), Task(id="T3", title="three")], discipline="only main"
    )
    assert [t.id for t in pool.import_data(fresh)] == ["T2", "T3"]
    assert [t.id for t in pool.load().tasks] == ["T1", "T2", "T3"]
    replaced = pool.import_data(BacklogData(tasks=[Task(id="T1", title="new")]), replace=True)
    assert [t.title for t in replaced] == ["new"]
    data = pool.load()
    assert [t.title for t in data.tasks] == ["new"] and data.discipline is None


def _claim_all(
    kind: str, where: str, password: str, prefix: str, ids: list[str], start: Any, results: Any
) -> None:
    """One 'hub': try to claim every task; report the ids it won."""
    start.wait(30)
    if kind == "file":
        cfg = file_config(Path(where))
    else:
        cfg = Config(
            path=None,
            home=Path("/nonexistent"),
            state_dir=Path("/nonexistent"),
            lock=LockConfig(
                backend="redis",
                redis_url=where,
                redis_prefix=prefix,
                redis_password=password,
                lock_timeout_seconds=60,
            ),
            pool=PoolConfig(backend="redis"),
        )
    pool = Stores(cfg).pool()
    won = []
    for task_id in ids:
        planned = pool.load().require(task_id)
        if planned.status != "pending":
            continue
        try:
            pool.claim(planned, f"ses-{os.getpid()}-{task_id}", f"hub-{os.getpid()}", None, NOW)
        except TaskChanged:
            continue
        won.append(task_id)
    results.put((os.getpid(), won))


def test_concurrent_claims_send_each_task_once(backend: Config) -> None:
    """Five processes claim the same 30 tasks at once: every task is won exactly once."""
    pool = Stores(backend).pool()
    ids = [f"T{n:02d}" for n in range(30)]
    pool.import_data(BacklogData(tasks=[Task(id=i, title=i) for i in ids]))
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    if backend.pool.backend == "file":
        args: tuple[str, str, str] = (str(backend.state_dir), "", "")
    else:
        args = (
            backend.lock.redis_url,
            backend.lock.redis_password or "",
            backend.lock.redis_prefix,
        )
    procs = [
        ctx.Process(
            target=_claim_all,
            args=(backend.pool.backend, *args, ids[::1] if w % 2 else ids[::-1], start, results),
        )
        for w in range(5)
    ]
    for proc in procs:
        proc.start()
    start.set()
    won = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(60)
    assert [p.exitcode for p in procs] == [0] * 5
    claims = sorted(t for _, ids_won in won for t in ids_won)
    assert claims == ids  # each once, none lost
    rows = pool.load().tasks
    assert all(t.status == "dispatched" for t in rows)
    for pid, ids_won in won:
        assert {t.id for t in rows if t.dispatched_to == f"hub-{pid}"} == set(ids_won)


# -- Redis only ------------------------------------------------------------------------------


def test_corrupt_redis_pool_is_named_and_never_reset(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    prefix = RedisServer.prefix()
    client = redis_server.client()
    cfg = redis_config(tmp_path, redis_server, prefix)
    try:
        client.set(f"{prefix}:pool", '{"tasks": [')
        with pytest.raises(StateFileError, match=rf"task pool redis .* key {prefix}:pool: line 1"):
            Stores(cfg).pool().load()
        client.set(f"{prefix}:pool", json.dumps({"tasks": [{"id": "T1", "title": 5}]}))
        with pytest.raises(StateFileError, match=r"tasks\[0\]"):
            Stores(cfg).pool().add(Task(id="T2", title="x"), now=NOW)
        assert client.get(f"{prefix}:pool") == json.dumps({"tasks": [{"id": "T1", "title": 5}]})
    finally:
        client.close()


def test_corrupt_row_is_named_and_never_reset(tmp_path: Path, redis_server: RedisServer) -> None:
    prefix = RedisServer.prefix()
    cfg = redis_config(tmp_path, redis_server, prefix)
    pool = Stores(cfg).pool()
    pool.import_data(BacklogData(tasks=[Task(id="T1", title="one"), Task(id="T2", title="two")]))
    client = redis_server.client()
    try:
        client.set(f"{prefix}:pool:task:T2", '{"id": "T2", "title": ')
        with pytest.raises(StateFileError, match=rf"key {prefix}:pool:task:T2: line 1"):
            pool.load()
        with pytest.raises(StateFileError, match=rf"key {prefix}:pool:task:T2"):
            pool.set_status("T2", "done")
        assert pool.set_status("T1", "done").status == "done"  # the other rows still work
        client.set(f"{prefix}:pool:task:T2", json.dumps({"id": "T9", "title": "moved"}))
        with pytest.raises(StateFileError, match="holds task 'T9', not 'T2'"):
            pool.load()
        client.delete(f"{prefix}:pool:task:T2")
        with pytest.raises(StateFileError, match=r"lists task 'T2', whose key .* is missing"):
            pool.load()
        assert client.zrange(f"{prefix}:pool:order", 0, -1) == ["T1", "T2"]
    finally:
        client.close()


LEGACY = {
    "schema_version": 1,
    "discipline": "only on main",
    "team_note": {"kept": True},  # a key the hub does not know, kept verbatim
    "tasks": [
        {"id": "L-3", "title": "third in file order", "priority": "P3", "note": "hand-added"},
        {"id": "L-1", "title": "写迁移脚本", "status": "dispatched", "session_id": "ses_1",
         "dispatched_to": "lan-a", "dispatched_at": "2026-12-01T10:00:00+00:00"},
        {"id": "L-2", "title": "done", "status": "done", "commit": "a" * 40, "verified": True},
    ],
}


def test_an_old_one_document_pool_is_migrated_on_first_use(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The pool of earlier releases (one JSON document under P:pool) moves to a key per task
    the first time a hub of this release touches it, whatever it does first; a second hub
    finds it done; the document is kept under P:pool:v1; export gives back the same pool."""
    prefix = RedisServer.prefix()
    cfg = redis_config(tmp_path, redis_server, prefix)
    client = redis_server.client()
    try:
        client.set(f"{prefix}:pool", json.dumps(LEGACY))
        expected = BacklogData.from_json(LEGACY)
        planned = expected.require("L-3")
        # The first thing done is a claim, as a patrol would: it must see the old rows.
        Stores(cfg).pool().claim(planned, "ses_9", "lan-b", None, NOW)
        keys = pool_keys(client, prefix)
        assert f"{prefix}:pool" not in keys
        assert json.loads(keys[f"{prefix}:pool:v1"]) == LEGACY
        assert [m for m, _ in keys[f"{prefix}:pool:order"]] == ["L-3", "L-1", "L-2"]
        data = Stores(cfg).pool().load()
        assert data.discipline == "only on main" and data.extra == {"team_note": {"kept": True}}
        assert [t.id for t in data.tasks] == ["L-3", "L-1", "L-2"]
        assert data.tasks[1:] == expected.tasks[1:]
        claimed = data.tasks[0]
        assert claimed.status == "dispatched" and claimed.extra == {"note": "hand-added"}
        # Idempotent: opening again moves nothing, writes nothing.
        again = pool_keys(client, prefix)
        Stores(cfg).pool().load()
        assert pool_keys(client, prefix) == again
        # An old hub writing its document again later: its rows are folded in, a row already
        # in the new layout stands, and no row is lost or doubled.
        stale = {**LEGACY, "tasks": [*LEGACY["tasks"], {"id": "L-4", "title": "added late"}]}
        client.set(f"{prefix}:pool", json.dumps(stale))
        rows = Stores(cfg).pool().load().tasks
        assert [t.id for t in rows] == ["L-3", "L-1", "L-2", "L-4"]
        assert rows[0].session_id == "ses_9"
    finally:
        client.close()


def test_hubs_racing_to_migrate_move_each_row_once(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    import threading

    prefix = RedisServer.prefix()
    cfg = redis_config(tmp_path, redis_server, prefix)
    rows = [{"id": f"M-{n:03d}", "title": f"row {n}"} for n in range(300)]
    client = redis_server.client()
    try:
        client.set(f"{prefix}:pool", json.dumps({"tasks": rows}))
        start = threading.Barrier(6)
        seen: list[list[str]] = []
        errors: list[BaseException] = []

        def hub(n: int) -> None:
            pool = Stores(cfg).pool()
            start.wait()
            try:
                if n % 2:
                    seen.append([t.id for t in pool.load().tasks])
                else:
                    pool.add(Task(id=f"N-{n}", title="new"), now=NOW)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=hub, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        old = [r["id"] for r in rows]
        for ids in seen:  # a reader saw the whole old pool, in order, never half of it
            assert ids[:300] == old
        final = [t.id for t in Stores(cfg).pool().load().tasks]
        assert final[:300] == old and sorted(final[300:]) == ["N-0", "N-2", "N-4"]
        assert client.zcard(f"{prefix}:pool:order") == 303
    finally:
        client.close()


def _claim_cost(pool: Any, planned: Task, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """Claim ``planned``; return the Redis commands sent (sorted) and the rows parsed."""
    from xaf_hub.store import tasks as tasks_module

    parsed: list[str] = []
    sent: list[str] = []
    real_parse = tasks_module.Task.from_json.__func__  # type: ignore[attr-defined]

    def counting(cls: type, raw: Any, **kw: Any) -> Task:
        parsed.append(raw["id"])
        return real_parse(cls, raw, **kw)  # type: ignore[no-any-return]

    client = pool.client
    real_command = client.execute_command

    def command(*args: Any, **kw: Any) -> Any:
        sent.append(args[0])
        return real_command(*args, **kw)

    pipe_class = type(client.pipeline())
    real_execute = pipe_class.execute

    def execute(self: Any, *args: Any, **kw: Any) -> Any:
        sent.extend(c[0][0] for c in self.command_stack)
        return real_execute(self, *args, **kw)

    monkeypatch.setattr(tasks_module.Task, "from_json", classmethod(counting))
    monkeypatch.setattr(client, "execute_command", command)
    monkeypatch.setattr(pipe_class, "execute", execute)
    try:
        pool.claim(planned, "ses_1", "lan-a", None, NOW)
    finally:
        monkeypatch.undo()
    return sorted(sent), parsed


def test_a_claim_reads_and_writes_its_row_alone(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a claim costs does not grow with the pool: the same commands, one row parsed,
    whether the pool holds 10 tasks or 3,000."""
    costs = []
    for size in (10, 3000):
        pool = Stores(redis_config(tmp_path, redis_server, RedisServer.prefix())).pool()
        pool.import_data(BacklogData(tasks=[Task(id=f"C-{n}", title="c") for n in range(size)]))
        first, planned = pool.load().tasks[0], pool.load().tasks[size // 2]
        pool.claim(first, "ses_0", "lan-a", None, NOW)  # the script known to the server
        costs.append(_claim_cost(pool, planned, monkeypatch))
        assert pool.load().require(planned.id).status == "dispatched"
    assert costs[0][0] == costs[1][0] and len(costs[0][0]) <= 4
    assert costs[0][1] == ["C-5"] and costs[1][1] == ["C-1500"]  # the claimed row alone


def test_a_whole_pool_change_is_reapplied_over_a_claim_made_meanwhile(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    cfg = redis_config(tmp_path, redis_server, RedisServer.prefix())
    pool, other = Stores(cfg).pool(), Stores(cfg).pool()
    pool.import_data(BacklogData(tasks=[Task(id="T1", title="one"), Task(id="T2", title="two")]))
    runs = []

    def mutate(data: BacklogData) -> None:
        runs.append([t.status for t in data.tasks])
        if len(runs) == 1:  # another hub claims T1 between this read and this write
            other.claim(other.load().require("T1"), "ses_1", "lan-a", None, NOW)
        data.tasks.append(Task(id="T3", title="three"))
        data.discipline = "tests first"

    pool.update(mutate)
    assert runs == [["pending", "pending"], ["dispatched", "pending"]]
    data = pool.load()
    assert [(t.id, t.status) for t in data.tasks] == [
        ("T1", "dispatched"), ("T2", "pending"), ("T3", "pending")
    ]
    assert data.discipline == "tests first"
    # A change that reorders the pool keeps its order.
    pool.update(lambda d: d.tasks.reverse())
    assert [t.id for t in Stores(cfg).pool().load().tasks] == ["T3", "T2", "T1"]


def _claim_share(url: str, password: str, prefix: str, worker: int, start: Any, out: Any) -> None:
    """One of five hubs: claim the tasks of two of the five classes (every task has two
    claimers racing for it, in the same order); report what it won."""
    cfg = Config(
        path=None,
        home=Path("/nonexistent"),
        state_dir=Path("/nonexistent"),
        lock=LockConfig(
            backend="redis", redis_url=url, redis_prefix=prefix, redis_password=password,
            lock_timeout_seconds=60,
        ),
        pool=PoolConfig(backend="redis"),
    )
    pool = Stores(cfg).pool()
    mine = {worker, (worker + 1) % 5}
    plan = [t for i, t in enumerate(pool.load().tasks) if i % 5 in mine]
    start.wait(60)
    won = []
    for task in plan:
        try:
            pool.claim(task, f"ses-{task.id}", f"hub-{worker}", None, NOW)
        except TaskChanged:
            continue
        won.append(task.id)
    out.put((worker, won))


@pytest.mark.stress
def test_five_processes_claim_10000_tasks_each_once(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    prefix = RedisServer.prefix()
    cfg = redis_config(tmp_path, redis_server, prefix)
    pool = Stores(cfg).pool()
    ids = [f"K-{n:05d}" for n in range(10_000)]
    pool.import_data(BacklogData(tasks=[Task(id=i, title="k") for i in ids]))
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_claim_share,
            args=(redis_server.url, redis_server.password, prefix, w, start, out),
        )
        for w in range(5)
    ]
    for proc in procs:
        proc.start()
    start.set()
    won = dict(out.get(timeout=300) for _ in procs)
    for proc in procs:
        proc.join(60)
    assert [p.exitcode for p in procs] == [0] * 5
    claims = sorted(t for w in won.values() for t in w)
    assert claims == ids  # each once, none lost
    rows = pool.load().tasks
    assert [t.id for t in rows] == ids and all(t.status == "dispatched" for t in rows)
    for worker, got in won.items():
        assert {t.id for t in rows if t.dispatched_to == f"hub-{worker}"} == set(got)
    assert len({w for w, got in won.items() if got}) > 1  # they really raced


def test_redis_away_is_unreachable(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = Config(
        path=None,
        home=tmp_path,
        state_dir=tmp_path,
        lock=LockConfig(backend="redis", redis_url=f"redis://127.0.0.1:{port}/0"),
        pool=PoolConfig(backend="redis"),
    )
    pytest.importorskip("redis")
    with pytest.raises(UnreachableError, match=f"127.0.0.1:{port}/0: connection refused"):
        Stores(cfg).pool().load()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"pool": {"backend": "redis"}}, "'pool.backend': 'redis' needs lock.redis_url"),
        ({"pool": {"backend": "sql"}}, "'pool.backend': must be file or redis"),
        ({"pool": {"backed": "redis"}}, "'pool.backed': unknown key"),
    ],
)
def test_bad_pool_settings_are_config_errors(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_config(doc, path=Path("/cfg/config.json"), env={})


def test_pool_backend_defaults_to_the_file() -> None:
    cfg = parse_config({}, path=Path("/cfg/config.json"), env={})
    assert cfg.pool.backend == "file" and type(Stores(cfg).pool()) is Backlog


# -- backlog export / import -----------------------------------------------------------------


@pytest.fixture
def hub(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """Run `xaf-hub backlog ...` against a config whose pool is a file, or Redis if asked."""

    def setup(kind: str) -> Callable[..., tuple[int, str, str]]:
        doc: dict[str, Any] = {"project": {"name": "demo"}, "instances": []}
        env = {"XAF_HUB_HOME": str(tmp_path / "home")}
        if kind == "redis":
            server: RedisServer = request.getfixturevalue("redis_server")
            doc["lock"] = {"redis_url": server.url, "redis_prefix": RedisServer.prefix()}
            doc["pool"] = {"backend": "redis"}
            env.update(server.env())
        config = tmp_path / "config.json"
        config.write_text(json.dumps(doc), "utf-8")

        def run(*args: str) -> tuple[int, str, str]:
            out, err = io.StringIO(), io.StringIO()
            code = main(
                ["--config", str(config), "backlog", *args], stdout=out, stderr=err, env=env
            )
            return code, out.getvalue(), err.getvalue()

        return run

    yield setup


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_export_then_import_moves_the_pool(
    tmp_path: Path, hub: Callable[..., Any], kind: str
) -> None:
    source = Backlog(tmp_path / "from.json")
    source.add(Task(id="F-8", title="清理旧 CF 值", priority="P1"), now=NOW)
    source.add(Task(id="F-9", title="Fix login", depends_on=("F-8",)), now=NOW)
    run = hub(kind)
    code, out, err = run("import", str(tmp_path / "from.json"), "--json")
    assert code == 0, err
    assert json.loads(out)["tasks"] == ["F-8", "F-9"]
    code, out, err = run("list", "--json")
    assert [t["id"] for t in json.loads(out)["tasks"]] == ["F-8", "F-9"]
    target = tmp_path / "out" / "pool.json"
    target.parent.mkdir()
    target.write_text("old content", "utf-8")
    code, out, err = run("export", str(target))
    assert code == 0, err and "exported 2 task(s)" in out
    assert Backlog(target).load().tasks == source.load().tasks
    assert sorted(p.name for p in target.parent.iterdir()) == ["pool.json"]  # no temp left
    code, out, err = run("export")
    assert code == 0 and BacklogData.from_json(json.loads(out)).tasks == source.load().tasks


@pytest.mark.parametrize("kind", ["file", "redis"])
@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [{"id": "A", "title": "a"}, {"id": "A", "title": "b"}],
            r"tasks\[1\]\.id: duplicate id 'A'",
        ),
        (
            [{"id": "A", "title": "a"}, {"id": "B", "title": "b", "status": "running"}],
            r"tasks\[1\]\.status",
        ),
        ([{"id": "A", "title": "a"}, {"id": "B"}], r"tasks\[1\]"),
        (
            [{"id": "A", "title": "a"}, {"id": "OLD", "title": "taken"}],
            r"tasks\[1\]\.id: task 'OLD' is already in the task pool",
        ),
    ],
)
def test_a_bad_import_is_refused_whole_with_the_row_named(
    tmp_path: Path, hub: Callable[..., Any], kind: str, rows: list[Any], message: str
) -> None:
    import re

    run = hub(kind)
    seed = tmp_path / "seed.json"
    seed.write_text(json.dumps({"tasks": [{"id": "OLD", "title": "there before"}]}), "utf-8")
    assert run("import", str(seed))[0] == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": 1, "tasks": rows}), "utf-8")
    code, out, err = run("import", str(bad))
    assert code == 4, err
    assert re.search(message, err), err
    assert str(bad) in err or "already in the task pool" in err
    assert len(err.strip().splitlines()) == 1
    code, out, _ = run("list", "--json")
    assert [t["id"] for t in json.loads(out)["tasks"]] == ["OLD"]  # nothing half-imported


def test_import_of_a_missing_or_broken_file(tmp_path: Path, hub: Callable[..., Any]) -> None:
    run = hub("file")
    code, _, err = run("import", str(tmp_path / "nope.json"))
    assert code == 4 and "no such file" in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"tasks": [', "utf-8")
    code, _, err = run("import", str(broken))
    assert code == 4 and "invalid JSON at line 1" in err and "nothing imported" in err


def test_backlog_with_redis_away_says_so_in_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "lock": {"redis_url": f"redis://127.0.0.1:{port}/0"},
                "pool": {"backend": "redis"},
                "instances": [],
            }
        ),
        "utf-8",
    )
    seed = tmp_path / "seed.json"
    seed.write_text(json.dumps({"tasks": [{"id": "A", "title": "a"}]}), "utf-8")
    for args in (["list"], ["import", str(seed)], ["export"]):
        out, err = io.StringIO(), io.StringIO()
        code = main(
            ["--config", str(config), "backlog", *args],
            stdout=out,
            stderr=err,
            env={"XAF_HUB_HOME": str(tmp_path / "home")},
        )
        assert code == 2, (args, err.getvalue())
        assert len(err.getvalue().strip().splitlines()) == 1
        assert "connection refused" in err.getvalue()
