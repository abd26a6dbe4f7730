"""Design-document task rows: recognition, ids and titles, the age window, merging into the pool."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xaf_hub.patrol.design_scan import (
    DEFAULT_BATCH_PATTERNS,
    DEFAULT_MARKERS,
    DesignTask,
    has_marker,
    merge_design_tasks,
    scan_dirs,
    scan_markdown,
    slug_of,
)
from xaf_hub.store.backlog import Backlog
from xaf_hub.store.tasks import BacklogData, Task

NOW = datetime(2026, 10, 25, 12, 0, 0, tzinfo=UTC)
SPEC = "docs/superpowers/plans/2026-10-25-cf-value-unification.md"

DESIGN_DOC = """\
# CF 值统一方案

状态说明:⏳ = 待派发,✅ = 已完成。命令示例 `grep F-3 | sort | uniq` 不是表格。
Prose with pipes: run `a | b` then say 待派发 for T9 | it is still prose.

## 批次计划

| 批次 | 内容 | 负责人 | 状态 |
|------|:----:|-------:|------|
| **F-8** | 清理旧 CF 值 | 王五 | ⏳ 待派发收尾 |
| F-7 缓存迁移 | 读写切换 | 李四 | ✅ 已完成 |
| F-6 | 数据回填 | 张三 | 已派发 (ses_123) |
| 步骤 3:补齐迁移脚本的回滚路径 | — | — | 未派发 |
| _任务:更新运维手册_ | — | — | 待派发 |
| 说明 | 这一行没有代号 | — | 待派发 |
| T12 | [API 联调](https://example.invalid/t12) | bob | pending dispatch |
| W0.3 docs cleanup | — | carol | done, was auto dispatch |
| Sprint1 cleanup | no code here | dave | to dispatch |
| T13 | Export CSV with BOM | erin | **To Dispatch** |

Header | without | leading pipe
--- | --- | ---
T20 重写解析器 | 阶段二 | 待派发

```markdown
| F-99 | 代码块里的示例行 | 待派发 |
```

~~~
| T98 | another fenced example | pending dispatch |
~~~

<!--
| T97 | commented out | 待派发 |
-->

| 阶段 | 事项 | 状态 |
|---|---|---|
| 阶段二 | 压测报告 | ⏳ |
| F-8 | 清理旧 CF 值(重复行) | 待派发 |
"""

EXPECTED = [
    ("F-8", "F-8 清理旧 CF 值", 10, False),
    ("AUTO-2026-10-25-cf-value-unification-1", "步骤 3:补齐迁移脚本的回滚路径", 13, True),
    ("AUTO-2026-10-25-cf-value-unification-2", "任务:更新运维手册", 14, True),
    ("T12", "T12 API 联调", 16, False),
    ("T13", "T13 Export CSV with BOM", 19, False),
    ("T20", "T20 重写解析器", 23, False),
    ("AUTO-2026-10-25-cf-value-unification-3", "阶段二", 39, True),
    ("F-8", "F-8 清理旧 CF 值(重复行)", 40, False),
]


def test_realistic_design_doc_yields_exactly_the_pending_rows() -> None:
    found = scan_markdown(DESIGN_DOC, SPEC)
    assert [(d.id, d.title, d.line, d.auto_id) for d in found] == EXPECTED
    assert all(d.spec == SPEC for d in found)
    assert DESIGN_DOC.splitlines()[found[0].line - 1].strip() == found[0].row


def test_scan_is_stable_across_runs() -> None:
    assert scan_markdown(DESIGN_DOC, SPEC) == scan_markdown(DESIGN_DOC, SPEC)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("| F-8 清理 | 待派发 |", ("F-8", "F-8 清理")),
        ("| F8 清理 | 待派发 |", ("F8", "F8 清理")),
        ("| T3 | 接口联调 | ⏳ |", ("T3", "T3 接口联调")),
        ("| W0.2 | 文档 | 未派发 |", ("W0.2", "W0.2 文档")),
        ("| ⏳ | T4 | 重写 |", ("T4", "重写")),
        ("| 任务 T5 收尾 | 待派发 |", ("T5", "任务 T5 收尾")),
        ("| 清理 F-2 与 T1 | 待派发 |", ("F-2", "清理 F-2 与 T1")),
        ("| 批次二 | 收尾 | 待派发 |", ("AUTO-doc-1", "批次二")),
        ("| `F-4` ~~旧~~ 新方案 | 待派发 |", ("F-4", "F-4 旧 新方案")),
        ("|  | F-5 | 清理 | 待派发 |", ("F-5", "F-5 清理")),
        ("| F-6 \\| 备注 | 待派发 |", ("F-6", "F-6 | 备注")),
        ("| Refactor T7 | x | TODO-dispatch |", ("T7", "Refactor T7")),
        ("| Refactor T8 | x | not dispatched yet |", ("T8", "Refactor T8")),
        ("| T9 thing | x | Pending Dispatch |", ("T9", "T9 thing")),
        ("| T10 thing | x | to be dispatched |", ("T10", "T10 thing")),
        ("| F-1清理 | 待派发 |", ("F-1", "F-1清理")),
    ],
)
def test_row_ids_and_titles(row: str, expected: tuple[str, str]) -> None:
    found = scan_markdown(row, "doc.md")
    assert [(d.id, d.title) for d in found] == [expected]


@pytest.mark.parametrize(
    "text",
    [
        "| F-8 清理 | 已派发 |",  # dispatched, not pending
        "| F-8 清理 | ✅ 已完成 |",
        "| 说明 | 待派发 |",  # marker but no batch code
        "F-8 待派发 | 一条竖线",  # a single pipe is not a row
        "说明 F-8 | 待派发 | 但不是表格",  # prose: no leading pipe, not in a table block
        "|---|---|",
        "| HTTP2 upgrade | UTF8 | to dispatch |",  # no code: T/F must stand alone
        "| SPRINT1 | x | to dispatch |",
        "| T1 | auto dispatch |",  # "to dispatch" only inside "auto dispatch"
        "| T1 | undispatchedness |",
        "| T1 | redispatched |",
        "```\n| T1 | 待派发 |\n```",
        "~~~~\n```\n| T1 | 待派发 |\n~~~~~",  # inner ``` does not close a ~~~~ fence
        "<!-- | T1 | 待派发 | -->",
    ],
)
def test_lines_that_are_not_task_rows(text: str) -> None:
    assert scan_markdown(text, "doc.md") == []


def test_fence_closes_and_rows_after_it_count() -> None:
    text = "```\n| T1 | 待派发 |\n```\n| T2 | 待派发 |\n"
    assert [(d.id, d.line) for d in scan_markdown(text, "doc.md")] == [("T2", 4)]


def test_markers_and_patterns_are_configurable() -> None:
    row = "| JIRA-12 | migrate | waiting |"
    assert scan_markdown(row, "doc.md") == []
    found = scan_markdown(row, "doc.md", markers=("waiting",), batch_patterns=(r"JIRA-\d+",))
    assert [(d.id, d.title) for d in found] == [("JIRA-12", "JIRA-12 migrate")]
    # With only Chinese markers, the English ones no longer count.
    assert scan_markdown("| T1 | x | to dispatch |", "doc.md", markers=("待派发",)) == []


@pytest.mark.parametrize(
    ("spec", "slug"),
    [
        ("docs/superpowers/plans/2026-10-25-CF Value.md", "2026-10-25-cf-value"),
        ("docs/specs/统一方案.md", "统一方案"),
        ("a\\b\\Mixed_Case.md", "mixed_case"),
        ("docs/---.md", "doc"),
        ("docs/" + "x" * 60 + ".md", "x" * 40),
    ],
)
def test_slug_of(spec: str, slug: str) -> None:
    assert slug_of(spec) == slug


# --------------------------------------------------------------------------- files


def _touch(path: Path, text: str, age: timedelta) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    stamp = (NOW - age).timestamp()
    os.utime(path, (stamp, stamp))


def test_scan_dirs_window_paths_and_order(tmp_path: Path) -> None:
    plans = tmp_path / "docs" / "superpowers" / "plans"
    specs = tmp_path / "docs" / "superpowers" / "specs"
    _touch(plans / "b-plan.md", "| T2 | second file | 待派发 |\n", timedelta(days=1))
    _touch(plans / "a-plan.md", "| T1 | first file | 待派发 |\n", timedelta(days=29))
    _touch(plans / "old.md", "| T3 | too old | 待派发 |\n", timedelta(days=31))
    _touch(plans / "notes.txt", "| T4 | not markdown | 待派发 |\n", timedelta(days=1))
    _touch(specs / "nested" / "c.md", "| T5 | nested | 待派发 |\n", timedelta(hours=1))
    _touch(specs / "future.md", "| T6 | clock skew | 待派发 |\n", -timedelta(hours=1))
    dirs = [Path("docs/superpowers/plans"), specs, Path("docs/missing")]
    found = scan_dirs(dirs, tmp_path, NOW)
    assert [(d.id, d.spec) for d in found] == [
        ("T1", "docs/superpowers/plans/a-plan.md"),
        ("T2", "docs/superpowers/plans/b-plan.md"),
        ("T6", "docs/superpowers/specs/future.md"),
        ("T5", "docs/superpowers/specs/nested/c.md"),
    ]
    assert [d.id for d in scan_dirs(dirs, tmp_path, NOW, max_age_days=60)] == [
        "T1",
        "T2",
        "T3",
        "T6",
        "T5",
    ]
    # The same folder named twice does not double the rows.
    assert scan_dirs([plans, plans], tmp_path, NOW) == scan_dirs([plans], tmp_path, NOW)


def test_scan_dirs_tolerates_bad_bytes(tmp_path: Path) -> None:
    doc = tmp_path / "plans" / "x.md"
    doc.parent.mkdir()
    # BOM, then a row whose middle cell holds two invalid bytes, then "待派发" in UTF-8.
    doc.write_bytes(b"\xef\xbb\xbf| T1 | \xff\xfe broken | " + "待派发 |\n".encode())
    stamp = NOW.timestamp()
    os.utime(doc, (stamp, stamp))
    assert [d.id for d in scan_dirs([Path("plans")], tmp_path, NOW)] == ["T1"]


# --------------------------------------------------------------------------- merging


def _design(task_id: str, title: str, spec: str = SPEC, line: int = 1) -> DesignTask:
    return DesignTask(task_id, title, spec, line, f"| {title} | 待派发 |")


def test_merge_adds_new_rows_once() -> None:
    found = scan_markdown(DESIGN_DOC, SPEC)
    first = merge_design_tasks([], found, NOW)
    # The duplicate F-8 row (same spec, same id) is dropped within one scan.
    assert [t.id for t in first] == [
        "F-8",
        "AUTO-2026-10-25-cf-value-unification-1",
        "AUTO-2026-10-25-cf-value-unification-2",
        "T12",
        "T13",
        "T20",
        "AUTO-2026-10-25-cf-value-unification-3",
    ]
    task = first[0]
    assert (task.status, task.priority, task.spec, task.instance) == ("pending", "P2", SPEC, "")
    assert task.created_at == "2026-10-25T12:00:00+00:00"
    assert SPEC in task.prompt and "清理旧 CF 值" in task.prompt and "stop" in task.prompt
    assert merge_design_tasks(first, found, NOW + timedelta(hours=1)) == []


Q = "F-8@2026-10-25-cf-value-unification"  # F-8 qualified by the spec's slug


@pytest.mark.parametrize(
    ("existing", "item", "added_id"),
    [
        ([Task("F-8", "old title", spec=SPEC)], _design("F-8", "new title"), None),
        ([Task("X-1", "same title", spec=SPEC)], _design("F-9", "same title"), None),
        ([Task("F-8", "closed", spec=SPEC, status="done")], _design("F-8", "again"), None),
        ([Task("F-8", "other", spec="docs/other.md")], _design("F-8", "mine"), Q),
        ([Task(Q, "renamed", spec=SPEC)], _design("F-8", "renamed again"), None),
        ([Task("F-8", "a", spec="x.md"), Task(Q, "b", spec="p/2026-10-25-cf-value-unification.md")],
         _design("F-8", "c"), Q + "-2"),
        ([Task("T1", "same title", spec="docs/other.md")], _design("T2", "same title"), "T2"),
        ([], _design("T2", "fresh"), "T2"),
    ],
)  # fmt: skip
def test_merge_dedupe_rules(existing: list[Task], item: DesignTask, added_id: str | None) -> None:
    added = merge_design_tasks(existing, [item], NOW)
    assert [t.id for t in added] == ([] if added_id is None else [added_id])
    assert all(t.title == item.title and t.spec == item.spec for t in added)


def test_merge_dedupes_within_found() -> None:
    found = [
        _design("T1", "one"),
        _design("T1", "one, edited"),  # same id
        _design("T2", "one"),  # same title
        _design("T1", "one", spec="docs/other.md"),  # other spec: a different task
    ]
    added = merge_design_tasks([], found, NOW)
    assert [(t.id, t.spec) for t in added] == [(
        "T1", SPEC), ("T1@other", "docs/other.md")]  # fmt: skip


def test_sync_leaves_pool_untouched_when_nothing_is_new(tmp_path: Path) -> None:
    pool = tmp_path / "tasks_backlog.json"
    backlog = Backlog(pool)
    found = scan_markdown(DESIGN_DOC, SPEC)

    def sync(data: BacklogData) -> list[Task]:
        return data.extend(merge_design_tasks(data.tasks, found, NOW))

    assert len(backlog.update(sync)) == 7
    old = 1_600_000_000
    os.utime(pool, (old, old))
    before = (pool.read_bytes(), pool.stat().st_mtime_ns)
    assert backlog.update(sync) == []
    assert (pool.read_bytes(), pool.stat().st_mtime_ns) == before
    # Closing a task by hand does not bring its row back.
    backlog.mark_done("F-8", NOW)
    assert backlog.update(sync) == []
    assert len(backlog.load().tasks) == 7


# --------------------------------------------------------------------------- properties

_ALPHABET = st.sampled_from(
    list("|-:`~ \n\t*_[]()<>!")
    + ["待派发", "未派发", "⏳", "已派发", "to dispatch", "pending dispatch", "F-", "T", "W0."]
    + ["批次", "步骤", "任务", "阶段", "```", "~~~", "<!--", "-->", "\\|", "1", "23", "清理", "x"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ALPHABET, max_size=60).map("".join) | st.text(max_size=200))
def test_scan_markdown_never_crashes_and_rows_carry_a_marker(text: str) -> None:
    for task in scan_markdown(text, "docs/plans/p.md"):
        assert has_marker(task.row, DEFAULT_MARKERS)
        assert task.row.count("|") >= 2
        assert task.title.strip()
        assert task.id
        assert task.row in text


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=120))
def test_custom_patterns_never_crash(text: str) -> None:
    found = scan_markdown(
        text, "p.md", markers=(*DEFAULT_MARKERS, "x"), batch_patterns=(*DEFAULT_BATCH_PATTERNS, "")
    )
    assert all(has_marker(d.row, (*DEFAULT_MARKERS, "x")) for d in found)
