"""The budget check inside the one send path: new work refused under the lock, a steer passes.

Same fake client and spying gate as test_send.py: the log shows that a refused send took the
lock, read the server, and left before reserving or creating anything.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.unit.ops.send_support import ROOT, FakeClient, SpyGate, audit_results, record, slot_files
from xaf_hub.config.load import Config, parse_config
from xaf_hub.core.clock import to_ms
from xaf_hub.errors import BudgetReached
from xaf_hub.fleet.client import ServerSession
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.planner import Plan, plan_create, plan_reuse
from xaf_hub.ops.send import SendResult, send_work

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def config(tmp_path: Path, *, daily: float | None = None, cap: float | None = None) -> Config:
    inst: dict[str, object] = {"name": "a", "url": "http://127.0.0.1:9", "roots": [ROOT]}
    if cap is not None:
        inst["budget_daily_usd"] = cap
    doc: dict[str, object] = {
        "project": {"name": "demo"},
        "state_dir": str(tmp_path / "state"),
        "models": {"timezone": "UTC"},
        "instances": [inst],
    }
    if daily is not None:
        doc["budget"] = {"daily_usd": daily}
    return parse_config(doc, path=tmp_path / "config.json", env={})


def spent(client: FakeClient, sid: str, cost: float | None, when: datetime = NOW) -> None:
    """Give the server a session that cost ``cost`` and was last active at ``when``."""
    stamp = to_ms(when - timedelta(minutes=5))
    client.sessions[sid] = ServerSession(sid, sid, ROOT, stamp, stamp, cost, "", "")


def send(cfg: Config, plan: Plan, client: FakeClient, gate: SpyGate) -> SendResult:
    ops = OpsContext(cfg, clock=lambda: NOW)
    return asyncio.run(send_work(ops, plan, "do it", "p/m", client, gate))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("daily", "cap", "message"),
    [
        (3.0, None, r"^daily budget \$3\.00 reached \(\$3\.00 spent today\)$"),
        (None, 1.0, r"^a: daily budget \$1\.00 reached \(\$3\.00 spent today\)$"),
    ],
)
def test_over_budget_a_new_session_is_refused_before_anything_is_reserved(
    tmp_path: Path, daily: float | None, cap: float | None, message: str
) -> None:
    cfg = config(tmp_path, daily=daily, cap=cap)
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    spent(client, "s1", 1.0)
    spent(client, "s2", 2.0)
    with pytest.raises(BudgetReached, match=message) as caught:
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate)
    assert caught.value.exit_code == 3
    assert log == ["lock", "read", "owned", "unlock"]
    assert slot_files(cfg) == [] and audit_results(cfg) == ["failed"]


def test_yesterdays_spend_and_unknown_costs_leave_room(tmp_path: Path) -> None:
    cfg = config(tmp_path, daily=1.0)
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    spent(client, "old", 50.0, NOW - timedelta(hours=10, minutes=1))  # 23:54 yesterday
    spent(client, "s1", 0.99)
    spent(client, "s2", None)  # unknown: shown by status and the page, does not block
    result = send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate)
    assert result.action == "create" and f"prompt {result.session_id}" in log


def test_a_steer_of_a_running_session_passes_over_budget(tmp_path: Path) -> None:
    cfg = config(tmp_path, daily=1.0)
    log: list[str] = []
    client, gate = FakeClient(log, [], {"s1"}), SpyGate(cfg.state_dir, cfg, log)
    spent(client, "s1", 5.0)
    result = send(cfg, plan_reuse(cfg.instances[0], record("s1", "busy"), via="t"), client, gate)
    assert result.action == "steer" and "prompt s1" in log


@pytest.mark.parametrize("state", ["idle", "busy"])  # busy: planned as a steer, found stopped
def test_an_idle_session_started_again_is_new_work(tmp_path: Path, state: str) -> None:
    cfg = config(tmp_path, daily=1.0)
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    spent(client, "s1", 1.5)
    with pytest.raises(BudgetReached, match=r"\$1\.50 spent today"):
        send(cfg, plan_reuse(cfg.instances[0], record("s1", state), via="t"), client, gate)
    assert not any(line.startswith("prompt") for line in log)


def two_projects(tmp_path: Path, daily: float | None, blog: float | None) -> Config:
    """Projects shop and blog on one instance, seen as blog (the one dispatching)."""
    doc: dict[str, object] = {
        "projects": {
            "shop": {"roots": {"a": ["/srv/shop"]}},
            "blog": {"roots": {"a": [ROOT]}},
        },
        "state_dir": str(tmp_path / "state"),
        "models": {"timezone": "UTC"},
        "instances": [{"name": "a", "url": "http://127.0.0.1:9"}],
    }
    if daily is not None:
        doc["budget"] = {"daily_usd": daily}
    if blog is not None:
        doc["projects"]["blog"]["budget_daily_usd"] = blog  # type: ignore[index]
    return parse_config(doc, path=tmp_path / "config.json", env={}).choose("blog")


@pytest.mark.parametrize(
    ("daily", "blog", "message"),
    [
        # The two projects together reach the overall budget while blog alone is under it.
        (1.0, None, r"^all projects: daily budget \$1\.00 reached \(\$1\.10 spent today\)$"),
        # Blog's own budget holds blog's spend, the overall one has room.
        (5.0, 0.4, r"^project blog: daily budget \$0\.40 reached \(\$0\.50 spent today\)$"),
    ],
)
def test_with_several_projects_the_overall_and_the_projects_budgets_refuse(
    tmp_path: Path, daily: float | None, blog: float | None, message: str
) -> None:
    cfg = two_projects(tmp_path, daily, blog)
    log: list[str] = []
    client, gate = FakeClient(log, [], set()), SpyGate(cfg.state_dir, cfg, log)
    stamp = to_ms(NOW - timedelta(minutes=5))
    client.sessions["shop1"] = ServerSession("shop1", "s", "/srv/shop", stamp, stamp, 0.6, "", "")
    spent(client, "blog1", 0.5)
    with pytest.raises(BudgetReached, match=message):
        send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate)
    assert slot_files(cfg) == []
    # Under both budgets, blog's work goes out.
    cfg = two_projects(tmp_path, 1.2, 0.6)
    result = send(cfg, plan_create(cfg.instances[0], ROOT, "t", via="test"), client, gate)
    assert result.action == "create"
