"""Dispatch planning (SPEC §6 steps 1-3), pure: views + request + scores -> plan."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.ops.planner_support import CFG, A, B, P, config, inst, sess, view
from xaf_hub.errors import (
    BudgetReached,
    BusyError,
    NotProjectSession,
    ProductionRefused,
    UnreachableError,
    UsageError,
)
from xaf_hub.ops.planner import DispatchRequest, InstanceView, check_write, plan_dispatch


def test_running_related_session_is_steered_even_on_full_instance() -> None:
    run1 = sess("lan-a", "ses_1", "补充单元测试", running=True)
    run2 = sess("lan-a", "ses_2", "other", running=True)
    views = [view(A, run1, run2), view(B)]
    plan = plan_dispatch(CFG, views, DispatchRequest(text="单元测试"), [(run1, 0.5)])
    assert (plan.action, plan.session, plan.gated) == ("steer", run1, False)


def test_idle_match_on_full_instance_is_skipped_for_next_candidate() -> None:
    idle_a = sess("lan-a", "ses_1", "修复登录页样式")
    idle_b = sess("lan-b", "ses_9", "登录页")
    busy = [sess("lan-a", f"ses_r{i}", "x", running=True) for i in range(2)]
    views = [view(A, idle_a, *busy), view(B, idle_b)]
    plan = plan_dispatch(
        CFG, views, DispatchRequest(text="登录页样式"), [(idle_a, 0.6), (idle_b, 0.3)]
    )
    assert (plan.action, plan.session) == ("reuse", idle_b)
    assert plan.candidates[0].verdict == "instance full"
    assert plan.candidates[1].verdict.startswith("chosen: idle, free slot")


def test_reservations_count_toward_full() -> None:
    idle_a = sess("lan-a", "ses_1", "t")
    views = [view(A, idle_a, reserved=2), view(B)]
    plan = plan_dispatch(CFG, views, DispatchRequest(text="t"), [(idle_a, 0.9)])
    assert plan.action == "create" and plan.instance.name == "lan-b"


def test_below_threshold_falls_back_to_least_loaded() -> None:
    s = sess("lan-a", "ses_1", "t")
    views = [
        view(A, s, sess("lan-a", "ses_2", "u", running=True)),
        view(B, sess("lan-b", "ses_3", "v")),
    ]
    plan = plan_dispatch(CFG, views, DispatchRequest(text="t"), [(s, 0.05)])
    assert plan.action == "create" and plan.instance.name == "lan-b"
    assert plan.candidates[0].verdict.startswith("below threshold")
    assert plan.directory == "/srv/demo"


def test_least_loaded_order_running_then_count_then_name() -> None:
    c = inst("lan-c")
    views = [view(B, sess("lan-b", "s1", "x")), view(A, sess("lan-a", "s2", "x")), view(c)]
    assert (
        plan_dispatch(config(A, B, c), views, DispatchRequest(text="t", new=True)).instance.name
        == "lan-c"
    )
    views = [view(B), view(A)]
    assert plan_dispatch(CFG, views, DispatchRequest(text="t", new=True)).instance.name == "lan-a"


def test_production_never_auto_chosen_and_refused_when_named() -> None:
    views = [view(P)]
    with pytest.raises(UsageError, match="production"):
        plan_dispatch(CFG, views, DispatchRequest(text="t", new=True))
    with pytest.raises(ProductionRefused):
        plan_dispatch(CFG, [view(P)], DispatchRequest(text="t", instance="prod-p"))
    plan = plan_dispatch(
        CFG, [view(P)], DispatchRequest(text="t", instance="prod-p", allow_prod=True)
    )
    assert plan.instance.name == "prod-p"


def test_all_full_is_busy_and_all_down_is_unreachable() -> None:
    busy = [sess("lan-a", f"r{i}", "x", running=True) for i in range(2)]
    with pytest.raises(BusyError):
        plan_dispatch(CFG, [view(A, *busy)], DispatchRequest(text="t", new=True))
    with pytest.raises(UnreachableError):
        plan_dispatch(CFG, [view(A, reachable=False)], DispatchRequest(text="t", new=True))


def test_session_flag_and_non_project_guard() -> None:
    other = sess("lan-b", "ses_x", "elsewhere", project=False, directory="/home/x")
    views = [view(A), view(B, other)]
    with pytest.raises(NotProjectSession):
        plan_dispatch(CFG, views, DispatchRequest(text="t", session="ses_x"))
    plan = plan_dispatch(CFG, views, DispatchRequest(text="t", session="ses_x", force=True))
    assert (plan.action, plan.instance.name) == ("reuse", "lan-b")
    with pytest.raises(UsageError, match="not found"):
        plan_dispatch(CFG, views, DispatchRequest(text="t", session="ses_nope"))


def test_title_reuses_newest_and_warns_about_dir() -> None:
    old = sess("lan-a", "ses_old", "打卡页改造", updated=1)
    new = sess("lan-a", "ses_new", "打卡页改造 二期", updated=5)
    plan = plan_dispatch(
        CFG,
        [view(A, old, new)],
        DispatchRequest(text="t", instance="lan-a", title="打卡", directory="/srv/demo/other"),
    )
    assert plan.session == new and plan.warnings and "--new" in plan.warnings[0]
    plan = plan_dispatch(
        CFG,
        [view(A, old, new)],
        DispatchRequest(
            text="t", instance="lan-a", title="打卡", new=True, directory="/srv/demo/other"
        ),
    )
    assert (plan.action, plan.directory, plan.title) == ("create", "/srv/demo/other", "打卡")


def test_dir_must_be_under_roots_after_aliases() -> None:
    a = inst("lan-a", aliases=(("/posix/demo", "/srv/demo"),))
    cfg = config(a)
    plan = plan_dispatch(
        cfg, [view(a)], DispatchRequest(text="t", new=True, directory="/posix/demo/x")
    )
    assert plan.directory == "/srv/demo/x"
    with pytest.raises(NotProjectSession, match="not under"):
        plan_dispatch(cfg, [view(a)], DispatchRequest(text="t", new=True, directory="/elsewhere"))


@pytest.mark.parametrize(
    ("written", "planned"),
    [
        ("/srv/demo/./app//", "/srv/demo/app"),
        ("/srv/demo/web/../app", "/srv/demo/app"),
        ("/posix/demo/x/../y", "/srv/demo/y"),  # made plain before dir_aliases
        ("/srv/demo/../outside", None),
        ("/srv/demo/app/../../outside", None),
        ("/srv/demo/..", None),
        ("/posix/demo/../x", None),
    ],
)
def test_dir_is_made_plain_before_the_roots_check(written: str, planned: str | None) -> None:
    a = inst("lan-a", aliases=(("/posix/demo", "/srv/demo"),))
    cfg = config(a)
    req = DispatchRequest(text="t", new=True, directory=written)
    if planned is None:
        with pytest.raises(NotProjectSession, match="not under lan-a's project roots"):
            plan_dispatch(cfg, [view(a)], req)
        forced = plan_dispatch(cfg, [view(a)], DispatchRequest(**{**req.__dict__, "force": True}))
        assert forced.forced and ".." not in forced.directory
    else:
        plan = plan_dispatch(cfg, [view(a)], req)
        assert (plan.directory, plan.forced) == (planned, False)


def test_a_dir_climbing_above_its_start_is_a_bad_argument_even_with_force() -> None:
    for written in ("/../srv/demo", "C:\\..\\srv", "../srv/demo"):
        with pytest.raises(UsageError, match="climbs above the start"):
            plan_dispatch(
                CFG, [view(A)], DispatchRequest(text="t", new=True, directory=written, force=True)
            )


def test_a_default_directory_outside_the_roots_is_refused_unless_forced() -> None:
    a = dataclasses.replace(inst("lan-a"), default_directory="/srv/elsewhere")
    with pytest.raises(NotProjectSession, match="default_directory '/srv/elsewhere'"):
        plan_dispatch(config(a), [view(a)], DispatchRequest(text="t", new=True))
    plan = plan_dispatch(config(a), [view(a)], DispatchRequest(text="t", new=True, force=True))
    assert (plan.directory, plan.forced) == ("/srv/elsewhere", True)


def test_empty_text_and_unknown_instance() -> None:
    with pytest.raises(UsageError, match="empty"):
        plan_dispatch(CFG, [view(A)], DispatchRequest(text="   "))
    with pytest.raises(UsageError, match="unknown instance"):
        plan_dispatch(CFG, [view(A)], DispatchRequest(text="t", instance="nope"))


def test_no_match_and_new_skip_smart_matching() -> None:
    s = sess("lan-a", "ses_1", "t")
    for req in (DispatchRequest(text="t", no_match=True), DispatchRequest(text="t", new=True)):
        plan = plan_dispatch(CFG, [view(A, s)], req, [(s, 0.99)])
        assert plan.action == "create" and not plan.candidates


def test_run_state_unknown_counts_full_and_never_steers() -> None:
    # Fail closed: the scan marked the project sessions running only as a guess.
    guess = sess("lan-a", "ses_1", "补充单元测试", running=True)
    unknown = InstanceView(A, True, "", (guess,), 0, "version 'local' is not a release number")
    req = DispatchRequest(text="补充单元测试 再来", session="ses_1")
    plan = plan_dispatch(CFG, [unknown, view(B)], req)
    assert (plan.action, plan.gated) == ("reuse", True)  # passes the gate, which refuses it
    plan = plan_dispatch(CFG, [unknown, view(B)], DispatchRequest(text="x"), [(guess, 0.9)])
    assert plan.action == "create" and plan.instance.name == "lan-b"
    assert [c.verdict for c in plan.candidates] == ["instance full"]


def test_an_instance_over_its_budget_takes_no_new_work_but_a_steer() -> None:
    over = "lan-a: daily budget $1.00 reached ($1.20 spent today)"
    idle_a = sess("lan-a", "ses_1", "登录页样式")
    run_a = sess("lan-a", "ses_2", "单元测试", running=True)
    views = [InstanceView(A, True, "", (idle_a, run_a), over_budget=over), view(B)]
    plan = plan_dispatch(CFG, views, DispatchRequest(text="登录页样式"), [(idle_a, 0.6)])
    assert (plan.action, plan.instance.name) == ("create", "lan-b")
    assert [c.verdict for c in plan.candidates] == ["daily budget reached"]
    plan = plan_dispatch(CFG, views, DispatchRequest(text="单元测试"), [(run_a, 0.6)])
    assert (plan.action, plan.session) == ("steer", run_a)  # the same run: passes
    plan = plan_dispatch(CFG, views, DispatchRequest(text="t", new=True))
    assert plan.instance.name == "lan-b"


def test_every_instance_over_budget_is_the_budget_refusal() -> None:
    project = "daily budget $3.00 reached ($3.10 spent today)"
    views = [InstanceView(A, True, "", (), over_budget=project),
             InstanceView(B, True, "", (), over_budget=project)]
    one_line = r"^daily budget \$3\.00 reached \(\$3\.10 spent today\)$"  # said once
    with pytest.raises(BudgetReached, match=one_line):
        plan_dispatch(CFG, views, DispatchRequest(text="t", new=True))
    busy = [sess("lan-b", f"r{i}", "x", running=True) for i in range(2)]
    views = [InstanceView(A, True, "", (), over_budget="lan-a: daily budget $1.00 reached"),
             view(B, *busy)]
    with pytest.raises(BusyError, match="lan-a: daily budget .* lan-b 2\\+0/2") as caught:
        plan_dispatch(CFG, views, DispatchRequest(text="t", new=True))
    assert not isinstance(caught.value, BudgetReached)


# --- the cost of being wrong (issue 36): steering needs more than reusing --------------------


def test_running_session_needs_the_steer_threshold_idle_one_the_reuse_threshold() -> None:
    run1 = sess("lan-a", "ses_1", "checkout", running=True)
    idle = sess("lan-a", "ses_2", "checkout")
    views = [view(A, run1, idle), view(B)]
    req = DispatchRequest(text="checkout")
    assert plan_dispatch(CFG, views, req, [(run1, 0.33)]).action == "create"  # < steer 0.35
    assert plan_dispatch(CFG, views, req, [(idle, 0.31)]).action == "reuse"  # >= reuse 0.30
    assert plan_dispatch(CFG, views, req, [(idle, 0.29)]).action == "create"
    assert plan_dispatch(CFG, views, req, [(run1, 0.36)]).action == "steer"


def test_a_close_runner_up_means_a_new_session() -> None:
    idle1, idle2 = sess("lan-a", "ses_1", "x"), sess("lan-b", "ses_2", "y")
    views = [view(A, idle1), view(B, idle2)]
    req = DispatchRequest(text="x")
    plan = plan_dispatch(CFG, views, req, [(idle1, 0.5), (idle2, 0.45)])
    assert plan.action == "create"
    assert plan.candidates[0].verdict.startswith("too close to the next candidate")
    # The weaker one is never taken where the stronger was in doubt, though it leads the rest.
    assert plan.candidates[1].verdict == "weaker than a candidate in doubt"
    assert round(plan.candidates[0].margin, 3) == 0.05
    plan = plan_dispatch(CFG, views, req, [(idle1, 0.5), (idle2, 0.35)])
    assert (plan.action, plan.session) == ("reuse", idle1)


def test_running_session_needs_the_steer_margin() -> None:
    run1 = sess("lan-a", "ses_1", "x", running=True)
    other = sess("lan-b", "ses_2", "y")
    views = [view(A, run1), view(B, other)]
    req = DispatchRequest(text="x")
    # A lead of 0.12 would do for an idle session (0.10), not for a running one (0.15).
    assert plan_dispatch(CFG, views, req, [(run1, 0.5), (other, 0.38)]).action == "create"
    assert plan_dispatch(CFG, views, req, [(run1, 0.5), (other, 0.3)]).action == "steer"


def test_candidates_carry_their_evidence_as_plain_data() -> None:
    from xaf_hub.ops.planner import MatchEvidence

    idle = sess("lan-a", "ses_1", "订单导出CSV")
    found = MatchEvidence(("csv", "导出"), tasks=2, todos=("导出 CSV 加 BOM",))
    plan = plan_dispatch(CFG, [view(A, idle)], DispatchRequest(text="CSV 导出"), [(idle, 0.6)],
                         [found])
    doc = plan.candidates[0].to_json()
    assert doc["evidence"] == {
        "shared_terms": ["csv", "导出"], "files": [], "tasks": 2, "named_files": [],
        "refers_back": "", "todos": ["导出 CSV 加 BOM"],
    }
    assert (doc["similarity"], doc["margin"], doc["session_id"]) == (0.6, 0.6, "ses_1")


# --- what people write when they continue (issue 36, core.cues) ------------------------------


def test_the_one_candidate_whose_file_the_task_names_is_taken_whatever_its_rank() -> None:
    from xaf_hub.ops.planner import MatchEvidence

    cart, queue = sess("lan-a", "ses_1", "Cart reducer"), sess("lan-b", "ses_2", "Offline cart")
    views = [view(A, cart), view(B, queue)]
    req = DispatchRequest(text="offline replays add item twice, queue.ts needs an op id")
    scores = [(cart, 0.27), (queue, 0.12)]
    named = [MatchEvidence(), MatchEvidence(named=("src/cart/queue.ts",))]
    plan = plan_dispatch(CFG, views, req, scores, named)
    assert (plan.action, plan.session) == ("reuse", queue)
    said = plan.candidates[0].verdict
    assert said == "chosen: idle, free slot (the task names its file queue.ts)"
    # Without the name: the best candidate is below the threshold, a new session.
    assert plan_dispatch(CFG, views, req, scores).action == "create"
    # A file both candidates changed tells them apart no more than a shared word.
    both = [MatchEvidence(named=("web/queue.ts",)), MatchEvidence(named=("src/cart/queue.ts",))]
    assert plan_dispatch(CFG, views, req, scores, both).action == "create"


def test_a_task_that_refers_back_needs_only_the_cue_threshold_and_margin() -> None:
    from xaf_hub.ops.planner import MatchEvidence

    idle, other = sess("lan-a", "ses_1", "Deep links"), sess("lan-b", "ses_2", "Push")
    views = [view(A, idle), view(B, other)]
    req = DispatchRequest(text="also do Android App Links")
    back = [MatchEvidence(refers_back="also"), MatchEvidence(refers_back="also")]
    plan = plan_dispatch(CFG, views, req, [(idle, 0.16), (other, 0.05)], back)
    assert (plan.action, plan.session) == ("reuse", idle)
    assert "refers back ('also'): 0.160 >= 0.10, lead 0.110 >= 0.05" in plan.candidates[0].verdict
    # Below the cue's threshold, or too close to the next: a new session all the same.
    assert plan_dispatch(CFG, views, req, [(idle, 0.09), (other, 0.0)], back).action == "create"
    assert plan_dispatch(CFG, views, req, [(idle, 0.16), (other, 0.12)], back).action == "create"
    # The same scores without a word that refers back: below the reuse threshold.
    assert plan_dispatch(CFG, views, req, [(idle, 0.16), (other, 0.05)]).action == "create"


def test_a_named_file_with_nearly_nothing_else_shared_is_a_coincidence() -> None:
    from xaf_hub.ops.planner import NAMED_FLOOR, MatchEvidence

    idle = sess("lan-a", "ses_1", "Offline cart")
    req = DispatchRequest(text="Add a CSV export of payouts; put the helper in queue.ts")
    named = [MatchEvidence(named=("src/cart/queue.ts",))]
    below = plan_dispatch(CFG, [view(A, idle), view(B)], req, [(idle, NAMED_FLOOR - 0.01)], named)
    assert below.action == "create"
    above = plan_dispatch(CFG, [view(A, idle), view(B)], req, [(idle, NAMED_FLOOR)], named)
    assert (above.action, above.session) == ("reuse", idle)


def test_a_named_candidate_below_the_floor_does_not_stand_before_a_strong_one() -> None:
    from xaf_hub.ops.planner import NAMED_FLOOR, MatchEvidence, named_first

    best, other = sess("lan-a", "ses_1", "CSV export of orders"), sess("lan-b", "ses_2", "Cart")
    views = [view(A, best), view(B, other)]
    req = DispatchRequest(text="the CSV export drops the amount; the helper is in queue.ts")
    named = [MatchEvidence(), MatchEvidence(named=("src/cart/queue.ts",))]
    # Was: the named one judged first at 0.03, found below threshold, and the 0.6 candidate
    # behind it "weaker than a candidate in doubt": a new session.
    plan = plan_dispatch(CFG, views, req, [(best, 0.6), (other, NAMED_FLOOR - 0.02)], named)
    assert (plan.action, plan.session) == ("reuse", best)
    assert named_first(named, [0.6, NAMED_FLOOR - 0.02]) is None
    assert named_first(named, [0.6, NAMED_FLOOR]) == 1


def test_the_lead_is_over_the_next_candidate_in_the_matchers_order() -> None:
    from xaf_hub.ops.planner import MatchEvidence

    best, named = sess("lan-a", "ses_1", "Cart totals"), sess("lan-b", "ses_2", "Offline cart")
    busy = [sess("lan-b", f"ses_r{i}", "x", running=True) for i in range(2)]  # lan-b is full
    views = [view(A, best), view(B, named, *busy)]
    req = DispatchRequest(text="offline replays add item twice, queue.ts needs an op id")
    scores = [(best, 0.40), (named, 0.35)]
    evidence = [MatchEvidence(), MatchEvidence(named=("src/cart/queue.ts",))]
    plan = plan_dispatch(CFG, views, req, scores, evidence)
    # The named one is judged first and its instance is full. Was: the best then led "the
    # rest" (nobody: lead 0.400) and took the work the task named another session's file
    # for, and the named one showed a lead of -0.050.
    assert [(c.session.id, round(c.margin, 3)) for c in plan.candidates] == [
        ("ses_2", 0.35), ("ses_1", 0.05)
    ]
    assert plan.candidates[0].verdict == "instance full"
    assert plan.candidates[1].verdict.startswith("too close to the next candidate (lead 0.050")
    assert plan.action == "create"


def test_one_write_guard_asks_allow_prod_before_force() -> None:
    outside = sess("prod-p", "ses_x", "t", directory="/tmp/x", project=False)
    with pytest.raises(ProductionRefused, match="prod-p is a production instance"):
        check_write(P, outside, allow_prod=False, force=True)
    with pytest.raises(NotProjectSession, match=r"ses_x on prod-p .*\(/tmp/x\); --force"):
        check_write(P, outside, allow_prod=True, force=False)
    check_write(P, outside, allow_prod=True, force=True)
    check_write(A, None, allow_prod=False, force=False)
