"""Two hubs filling from one task pool in Redis (``pool.backend: "redis"``), at the same time.

Two simulated hosts as in test_redis_fleet.py (own XAF_HUB_HOME, own XAF_HUB_HOSTNAME), one
real redis-server, the real opencode fleet: both run ``patrol --once`` together over one pool.
Every task must reach the model exactly once, no instance may run more than its limit, and
each hub's audit names what it sent. Then the faults: Redis away means exit 2, nothing sent.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.two_hosts import Host, abort_all, on_both
from tests.fleet import NAMES

pytestmark = pytest.mark.e2e

TASKS = 9  # three instances at limit 2 take six; three must wait


def redis_pool(doc: dict[str, Any]) -> None:
    doc["pool"] = {"backend": "redis"}
    # No HA lease: both hubs really fill at once, so the pool alone must keep each task once.
    doc.setdefault("patrol", {})["lease_seconds"] = 0


def audit(host: Host) -> list[dict[str, Any]]:
    path = host.home / "audit.log"
    return [json.loads(ln) for ln in path.read_text("utf-8").splitlines()] if path.exists() else []


def sent_texts(host: Host) -> list[str]:
    """The work texts the fake model received (title calls aside)."""
    return [r["last_user_text"] for r in host.hub.llm.requests() if not r["title_call"]]


def load_pool(host: Host) -> dict[str, dict[str, Any]]:
    code, out, err = host.run("backlog", "list", "--json")
    assert code == 0, err
    return {t["id"]: t for t in json.loads(out)["tasks"]}


@pytest.mark.parametrize("attempt", range(3))
def test_two_hubs_fill_from_one_pool_each_task_once(
    hosts: tuple[Host, Host], rds: Any, tmp_path: Path, attempt: int
) -> None:
    a, b = hosts
    on_both(hosts, redis_pool)
    a.hub.llm.set_mode("fake-model", "slow", delay=60)  # every sent task keeps its slot
    seed = {
        "schema_version": 1,
        "tasks": [
            {"id": f"R{attempt}-{n}", "title": f"pool task {attempt}.{n}", "priority": "P2"}
            for n in range(TASKS)
        ],
    }
    prefix = a.hub.doc["lock"]["redis_prefix"]
    if attempt == 0:
        # A pool left by an earlier release, one JSON document: the first hub that reads it
        # moves it to a key per task, and both fill from it as from any other.
        rds.set(f"{prefix}:pool", json.dumps(seed))
    else:
        (tmp_path / "seed.json").write_text(json.dumps(seed), "utf-8")
        code, _, err = a.run("backlog", "import", str(tmp_path / "seed.json"))
        assert code == 0, err
    # The other host sees the same pool at once: one store, nothing copied.
    assert sorted(load_pool(b)) == sorted(t["id"] for t in seed["tasks"])

    procs = [h.popen("patrol", "--once", "--no-design", "--no-live") for h in (a, b)]
    try:
        for h, p in zip((a, b), procs, strict=True):
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, (h.name, out, err)

        # A hub that lost a claim to the other skips that task (its empty session dropped,
        # nothing sent), so the race may leave a slot for the next round: one more round fills.
        first = {tid for tid, t in load_pool(a).items() if t["status"] == "dispatched"}
        assert 1 <= len(first) <= 2 * len(NAMES)
        code, out, err = b.run("patrol", "--once", "--no-design", "--no-live")
        assert code == 0, (out, err)
        pool = load_pool(a)
        sent = {tid: t for tid, t in pool.items() if t["status"] == "dispatched"}
        assert first <= set(sent)
        assert len(sent) == 2 * len(NAMES)  # every free slot filled, no more
        assert sum(t["status"] == "pending" for t in pool.values()) == TASKS - len(sent)

        # The limit held on every instance, and each dispatched row is a running session.
        for name in NAMES:
            busy = a.hub.busy_ids(name)
            assert len(busy) <= 2, (name, busy)
        assert {t["session_id"] for t in sent.values()} == set().union(
            *(a.hub.busy_ids(n) for n in NAMES)
        )

        # Each task reached the model exactly once, whichever hub sent it.
        def arrived() -> list[str] | None:
            texts = sent_texts(a)
            hit = [t for t in sent.values() if any(t["title"] in x for x in texts)]
            return texts if len(hit) == len(sent) else None

        texts = a.hub.wait_for(arrived, timeout=60)
        for tid, task in pool.items():
            hits = [x for x in texts if task["title"] in x]
            assert len(hits) == (1 if tid in sent else 0), (tid, hits)

        # Each hub's own audit names what it sent; together, every task once.
        by_host = {
            h.name: [e["task"] for e in audit(h) if e["command"] == "patrol.backlog"]
            for h in (a, b)
        }
        assert sorted(by_host["host-a"] + by_host["host-b"]) == sorted(sent)
        # Nothing went to a pool file on either host.
        assert not any((h.home / "tasks_backlog.json").exists() for h in (a, b))
        # A key per task, in the seed's order; the old document only as the migration's copy.
        assert rds.zrange(f"{prefix}:pool:order", 0, -1) == [t["id"] for t in seed["tasks"]]
        first = json.loads(rds.get(f"{prefix}:pool:task:R{attempt}-0"))
        assert first["status"] in ("pending", "dispatched") and rds.get(f"{prefix}:pool") is None
        assert (rds.get(f"{prefix}:pool:v1") is not None) == (attempt == 0)
    finally:
        for name in NAMES:
            abort_all(a.hub, name)


def test_redis_away_means_exit_2_and_nothing_sent(hosts: tuple[Host, Host], tmp_path: Path) -> None:
    """Only the pool is on Redis here (gate and model state on files): its absence alone stops
    the fill, a manual dispatch (which records into the pool) and the backlog commands."""
    a, _ = hosts
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def away(doc: dict[str, Any]) -> None:
        redis_pool(doc)
        doc["lock"].update(backend="file", redis_url=f"redis://127.0.0.1:{port}/0")
        doc["models"]["state_backend"] = "file"

    a.write(away)
    seed = tmp_path / "seed.json"
    seed.write_text(json.dumps({"tasks": [{"id": "AWAY", "title": "never sent"}]}), "utf-8")
    a.hub.llm.clear_log()
    code, out, err = a.run("patrol", "--once", "--no-design", "--no-live")
    assert code == 2, (out, err)
    assert "fill_slots: failed (exit 2)" in out + err
    assert f"127.0.0.1:{port}/0: connection refused" in out + err
    for args in (
        ("backlog", "list"),
        ("backlog", "import", str(seed)),
        ("dispatch", "--new", "--instance", "local-a", "--text", "manual while redis is away"),
        ("dispatch", "--text", "queued while redis is away", "--queue"),
    ):
        code, out, err = a.run(*args)
        assert code == 2, (args, out, err)
        assert len(err.strip().splitlines()) == 1, (args, err)
        assert f"127.0.0.1:{port}/0: connection refused" in err, (args, err)
    assert [r for r in a.hub.llm.requests() if not r["title_call"]] == []
    for name in NAMES:
        assert a.hub.busy_ids(name) == set()
