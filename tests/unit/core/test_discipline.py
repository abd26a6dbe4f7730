"""Tests for the discipline block, prompt composition and the mainline rewrite."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xaf_hub.core.discipline import (
    BRANCH_POLICIES,
    CONTINUE_PROMPT,
    DISCIPLINE_END_MARKER,
    DISCIPLINE_MARKER,
    RESUME_PROMPT,
    BranchPolicy,
    base_commit,
    compose_prompt,
    discipline_block,
    expected_branches,
    pushed_branch,
    rewrite_branch_to_mainline,
    slugify,
    strip_discipline,
)

# (input, base_branch, expected) -- exact outputs of rewrite_branch_to_mainline.
REWRITE_CASES: list[tuple[str, str, str]] = [
    # Chinese imperatives
    ("新建 feature/u3-login 分支", "main", "直接使用 main 主分支"),
    (
        "请基于 origin/main 新建 feature/u3-login 分支,完成后 push 到 feature/u3-login。",
        "main",
        "请直接使用 main 主分支,完成后 push 到 main 主分支。",
    ),
    ("基于 origin/main 新建 feature/xxx", "main", "直接使用 main 主分支"),
    ("从 main 拉一个 feature/u5 分支开发", "main", "直接使用 main 主分支开发"),
    (
        "创建分支 feature/u4-pay 并在 feature/u4-pay 分支上开发",
        "main",
        "直接使用 main 主分支 并在 main 主分支上开发",
    ),
    ("切换到 feature/u3 分支继续开发", "main", "切换到 main 主分支继续开发"),
    ("完成后推送到 feature/u3 分支", "main", "完成后推送到 main 主分支"),
    ("完成后 push 到 `feature/u3-login`", "main", "完成后 push 到 `main` 主分支"),
    ("在 feature/u6 分支上开发登录页", "main", "在 main 主分支上开发登录页"),
    ("基于 feature/u6 分支开发", "main", "基于 main 主分支开发"),
    ("新建feature/u3分支", "main", "直接使用 main 主分支"),
    ("特别注意:新建 feature/x 分支", "main", "特别注意:直接使用 main 主分支"),
    ("checkout 到 feature/x 分支", "main", "checkout 到 main 主分支"),
    (
        "基于 origin/cfclub 新建 feature/<slug> 分支,完成后 push 自己的分支",
        "cfclub",
        "直接使用 cfclub 主分支,完成后 push 自己的分支",
    ),
    ("创建名为 feature/order-sync 的分支", "main", "直接使用 main 主分支"),
    ("从 main 拉取 feature/u5 的最新代码", "main", "从 main 拉取 feature/u5 的最新代码"),
    ("push 到 origin/feature/x", "main", "push 到 origin/main 主分支"),
    ("新建 `feature/x` 分支", "main", "直接使用 `main` 主分支"),
    # English imperatives and git commands
    ("Create `feature/login` from main.", "main", "Work directly on `main`."),
    ("Make sure to push to feature/x", "main", "Make sure to push to main"),
    ("git checkout -b origin/feature/x", "main", "git checkout main"),
    ("git checkout -b feature/xxx", "main", "git checkout main"),
    ("git checkout -b feature/xxx origin/main", "main", "git checkout main"),
    ("Create a branch feature/x", "main", "Work directly on main"),
    (
        "create a branch feature/x from origin/main and push feature/x when done.",
        "main",
        "work directly on main and push main when done.",
    ),
    ("push feature/x", "main", "push main"),
    ("Push your commits to the feature/x branch.", "main", "Push your commits to main."),
    ("Switch to feature/x first.", "main", "Switch to main first."),
    (
        "Based on origin/main, create a new branch called feature/login.",
        "main",
        "Work directly on main.",
    ),
    (
        "git switch -c feature/a && git push --set-upstream origin feature/a",
        "main",
        "git switch main && git push origin main",
    ),
    ("Work on feature/x and commit to feature/x.", "main", "Work on main and commit to main."),
    ("git push origin HEAD:feature/x", "main", "git push origin main"),
    ("Checkout feature/x.", "main", "Checkout main."),
    ("git branch feature/zz", "main", "git checkout main"),
    (
        "Create feature/a, then never merge it into main.",
        "main",
        "Work directly on main, then never merge it into main.",
    ),
    ("Note: push feature/x when done", "main", "Note: push main when done"),
    ("Whenever you finish, push to feature/x", "main", "Whenever you finish, push to main"),
    ("create a feature/x branch", "main", "work directly on main"),
    ("git push -u upstream feature/x", "main", "git push upstream main"),
    ("push feature/x", "origin/develop", "push develop"),
    # factual references: records of what happened stay as written
    (
        "verified: done on branch feature/u3 @ 300dd0765",
        "main",
        "verified: done on branch feature/u3 @ 300dd0765",
    ),
    (
        "判定=实质完成:分支 feature/u3 @ 300dd0765",
        "main",
        "判定=实质完成:分支 feature/u3 @ 300dd0765",
    ),
    (
        "核验方违规在 feature/xxx 多推了 1 个空commit",
        "main",
        "核验方违规在 feature/xxx 多推了 1 个空commit",
    ),
    (
        "pushed one empty commit to feature/xxx by mistake",
        "main",
        "pushed one empty commit to feature/xxx by mistake",
    ),
    ("已新建 feature/u3 分支并推送", "main", "已新建 feature/u3 分支并推送"),
    ("之前已 push 到 feature/u3,请核对", "main", "之前已 push 到 feature/u3,请核对"),
    ("the push to feature/x failed", "main", "the push to feature/x failed"),
    ("The branch feature/u3 was merged.", "main", "The branch feature/u3 was merged."),
    ("在 feature/x 分支上开发了登录页", "main", "在 feature/x 分支上开发了登录页"),
    (
        "参考 https://example.com/feature/x 的说明",
        "main",
        "参考 https://example.com/feature/x 的说明",
    ),
    ("核验:push 到 feature/u3 @ 300dd0765", "main", "核验:push 到 feature/u3 @ 300dd0765"),
    ("核验方违规 push 到 feature/xxx", "main", "核验方违规 push 到 feature/xxx"),
    (
        "I accidentally push to feature/x every time",
        "main",
        "I accidentally push to feature/x every time",
    ),
    # negations stay verbatim
    ("do not create a feature/xxx branch", "main", "do not create a feature/xxx branch"),
    ("不要新建 feature/xxx 分支", "main", "不要新建 feature/xxx 分支"),
    ("不要新建任何分支", "main", "不要新建任何分支"),
    ("never push to feature/x", "main", "never push to feature/x"),
    ("lan-204 不再新建 feature/<slug> 分支", "main", "lan-204 不再新建 feature/<slug> 分支"),
    ("Don't push to feature/x; push to main", "main", "Don't push to feature/x; push to main"),
    ("You must not create feature/x.", "main", "You must not create feature/x."),
    ("别在 feature/x 上开发", "main", "别在 feature/x 上开发"),
    ("禁止 push 到 feature/x", "main", "禁止 push 到 feature/x"),
    ("No need to create feature/x.", "main", "No need to create feature/x."),
    ("不 push 到 feature/x", "main", "不 push 到 feature/x"),
    (
        "Never run this: git push origin feature/x",
        "main",
        "Never run this: git push origin feature/x",
    ),
    # several mentions, mixed lines, code blocks, no mention at all
    (
        "Create feature/a but do not push feature/b.",
        "main",
        "Work directly on main but do not push feature/b.",
    ),
    (
        "新建 feature/a 分支;不要 push 到 feature/b",
        "main",
        "直接使用 main 主分支;不要 push 到 feature/b",
    ),
    (
        "Create feature/a. Verified earlier: done on feature/b @ 1234abcd.",
        "main",
        "Work directly on main. Verified earlier: done on feature/b @ 1234abcd.",
    ),
    (
        "新建 feature/a 分支,完成后 push 到 feature/a;核验方违规在 feature/a 多推了 1 个空commit",
        "main",
        "直接使用 main 主分支,完成后 push 到 main 主分支;"
        "核验方违规在 feature/a 多推了 1 个空commit",
    ),
    (
        "git checkout -b feature/a; git push origin feature/a",
        "main",
        "git checkout main; git push origin main",
    ),
    ("实现登录页,完成后提交。", "main", "实现登录页,完成后提交。"),
    ("Implement the login page and open a PR.", "main", "Implement the login page and open a PR."),
    (
        "```bash\ngit fetch origin\ngit checkout -b feature/u3 origin/main\n"
        "# ... work ...\ngit push -u origin feature/u3\n```",
        "main",
        "```bash\ngit fetch origin\ngit checkout main\n# ... work ...\ngit push origin main\n```",
    ),
    (
        "```\n# do not run: git checkout -b feature/old\ngit checkout -b feature/new\n```",
        "main",
        "```\n# do not run: git checkout -b feature/old\ngit checkout main\n```",
    ),
    (
        "步骤:\n1. 基于 origin/main 新建 feature/u7 分支\n2. 实现接口\n"
        "3. push 到 feature/u7\n备注:feature/u6 @ abcdef12 已合并",
        "main",
        "步骤:\n1. 直接使用 main 主分支\n2. 实现接口\n"
        "3. push 到 main 主分支\n备注:feature/u6 @ abcdef12 已合并",
    ),
]

NEGATION_PHRASES = [
    "do not create a feature/xxx branch",
    "不要新建 feature/xxx 分支",
    "不要新建任何分支",
    "never push to feature/x",
    "Never run git checkout -b feature/x",
    "不要 push 到 feature/u3-login",
    "不再新建 feature/<slug> 分支",
    "You must not switch to feature/x",
    "禁止切换到 feature/x 分支",
]

# Fragments that steer generated text towards the shapes the rewrite reacts to.
FRAGMENTS = [
    "feature/x",
    "feature/u3-login",
    "`feature/<slug>`",
    "origin/feature/y",
    "新建",
    "基于 origin/main ",
    "分支",
    "push ",
    "push 到 ",
    "推送到",
    "切换到",
    "在 ",
    "上开发",
    "git checkout -b ",
    "git push -u origin ",
    "create a branch ",
    "Switch to ",
    "work on ",
    "不要",
    "never ",
    "do not ",
    "已",
    "by mistake",
    " @ 300dd0765",
    ",",
    "。",
    ";",
    ". ",
    "\n",
    "```\n",
    " ",
]

branchy_text = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=25
).map("".join)


@pytest.mark.parametrize(("text", "base", "expected"), REWRITE_CASES)
def test_rewrite_table(text: str, base: str, expected: str) -> None:
    assert rewrite_branch_to_mainline(text, base) == expected


def test_rewrite_table_is_big_enough_and_covers_both_languages() -> None:
    assert len(REWRITE_CASES) >= 40
    han = [case for case in REWRITE_CASES if re.search(r"[\u4e00-\u9fff]", case[0])]
    latin = [case for case in REWRITE_CASES if not re.search(r"[\u4e00-\u9fff]", case[0])]
    assert len(han) >= 15 and len(latin) >= 15
    assert any(text != expected for text, _, expected in REWRITE_CASES)
    assert any(text == expected for text, _, expected in REWRITE_CASES)


@pytest.mark.parametrize(("text", "base", "expected"), REWRITE_CASES)
def test_rewrite_table_is_idempotent(text: str, base: str, expected: str) -> None:
    once = rewrite_branch_to_mainline(text, base)
    assert rewrite_branch_to_mainline(once, base) == once


@pytest.mark.parametrize("phrase", NEGATION_PHRASES)
def test_negation_phrase_survives_next_to_an_imperative(phrase: str) -> None:
    text = f"新建 feature/a 分支;{phrase}。Then push feature/b."
    out = rewrite_branch_to_mainline(text, "main")
    assert phrase in out
    assert out.startswith("直接使用 main 主分支;")
    assert out.endswith("Then push main.")


def test_text_without_branch_mentions_is_returned_unchanged() -> None:
    text = "Implement login.\n实现登录;完成后 git commit + git push。\n"
    assert rewrite_branch_to_mainline(text, "main") is text


@pytest.mark.parametrize("base", ["", "  ", "origin/", "feature/x", "origin/feature/x"])
def test_rewrite_rejects_unusable_base_branch(base: str) -> None:
    with pytest.raises(ValueError, match="base_branch"):
        rewrite_branch_to_mainline("push feature/x", base)


@settings(database=None, max_examples=300, deadline=None)
@given(text=st.one_of(st.text(), branchy_text))
def test_rewrite_never_crashes_and_is_idempotent(text: str) -> None:
    once = rewrite_branch_to_mainline(text, "main")
    assert isinstance(once, str)
    assert rewrite_branch_to_mainline(once, "main") == once


@settings(database=None, max_examples=200, deadline=None)
@given(text=branchy_text)
def test_rewrite_leaves_text_without_feature_token_alone(text: str) -> None:
    text = text.replace("feature/", "feature-")
    assert rewrite_branch_to_mainline(text, "develop") == text


@settings(database=None, max_examples=300, deadline=None)
@given(
    prefix=branchy_text,
    phrase=st.sampled_from(NEGATION_PHRASES),
    suffix=branchy_text,
)
def test_negation_phrase_is_kept_verbatim(prefix: str, phrase: str, suffix: str) -> None:
    out = rewrite_branch_to_mainline(f"{prefix} {phrase} {suffix}", "main")
    assert phrase in out


# --------------------------------------------------------------------------
# discipline_block / compose_prompt


def test_branch_block_names_feature_branch_push_hash_and_no_merge() -> None:
    block = discipline_block("branch", base_branch="develop", slug="u3-login")
    assert block.splitlines()[0] == DISCIPLINE_MARKER
    assert block.splitlines()[-1] == DISCIPLINE_END_MARKER
    assert "feature/u3-login" in block
    assert "origin/develop" in block
    assert "git push -u origin feature/u3-login" in block
    assert "commit hash" in block and "commit 哈希" in block
    assert "Never merge into `develop`" in block
    assert "不要合并到 develop" in block
    # English first, then Chinese.
    assert block.index("Branch policy: branch") < block.index("分支纪律")


@pytest.mark.parametrize(("state", "said", "not_said"), [
    ("new", ["create `feature/u3` from `origin/main`", "基于 origin/main 新建 feature/u3"],
     ["exists already"]),
    ("exists", ["Continue on `feature/u3`: it exists already", "在已有的 feature/u3 分支上继续",
                "do not create it again"], ["create `feature/u3`", "新建 feature/u3"]),
    ("unknown", ["if it exists already (locally or on origin), check it out",
                 "otherwise fetch and create it from `origin/main`", "若它已存在"],
     ["then create `feature/u3`"]),
])
def test_the_branch_rule_fits_where_the_branch_stands(
    state: str, said: list[str], not_said: list[str]
) -> None:
    block = discipline_block("branch", base_branch="main", slug="u3",
                             branch=state)  # type: ignore[arg-type]  # each state in turn
    assert all(s in block for s in said) and not any(s in block for s in not_said), block
    assert "git push -u origin feature/u3" in block and "不要合并到 main" in block
    # Mainline creates no branch whatever the state; the block is stripped whole.
    assert "Do not create any branch" in discipline_block(
        "mainline", base_branch="main", slug="u3", branch=state)  # type: ignore[arg-type]
    assert strip_discipline(f"task\n\n{block}") == "task"


def test_mainline_block_stays_on_base_branch() -> None:
    block = discipline_block("mainline", base_branch="origin/cfclub", slug="ignored")
    assert block.splitlines()[0] == DISCIPLINE_MARKER
    assert "git push origin cfclub" in block
    assert "Do not create any branch" in block
    assert "不要新建任何分支" in block
    assert "commit hash" in block and "commit 哈希" in block
    assert "feature/ignored" not in block
    assert "origin/origin" not in block
    assert block.index("Branch policy: mainline") < block.index("分支纪律")


def test_mainline_block_is_a_fixed_point_of_the_rewrite() -> None:
    block = discipline_block("mainline", base_branch="main", slug="")
    assert rewrite_branch_to_mainline(block, "main") == block


def test_blocks_differ_by_policy() -> None:
    branch = discipline_block("branch", base_branch="main", slug="s")
    mainline = discipline_block("mainline", base_branch="main", slug="s")
    assert branch != mainline
    assert "feature/s" in branch and "feature/s" not in mainline


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "trunk", "base_branch": "main", "slug": "s"}, "branch policy"),
        ({"policy": "branch", "base_branch": "main", "slug": "  "}, "slug"),
        ({"policy": "branch", "base_branch": "", "slug": "s"}, "base_branch"),
        ({"policy": "mainline", "base_branch": "feature/x", "slug": ""}, "base_branch"),
    ],
)
def test_discipline_block_rejects_bad_arguments(kwargs: dict[str, str], message: str) -> None:
    policy = kwargs.pop("policy")
    with pytest.raises(ValueError, match=message):
        discipline_block(policy, **kwargs)  # type: ignore[arg-type]  # bad policy on purpose


def test_branch_override_replaces_default_body() -> None:
    override = "Team rule: push feature/{slug} to {base_branch}-review when done."
    block = discipline_block("branch", base_branch="main", slug="u9", override=override)
    assert block == (
        f"{DISCIPLINE_MARKER}\n"
        "Team rule: push feature/u9 to main-review when done.\n"
        f"{DISCIPLINE_END_MARKER}"
    )


def test_mainline_override_is_rewritten_and_followed_by_mainline_rules() -> None:
    override = "完成后基于 origin/main 新建 feature/{slug} 分支并 push 到 feature/{slug}。"
    block = discipline_block("mainline", base_branch="main", slug="u9", override=override)
    default = discipline_block("mainline", base_branch="main", slug="u9")
    lines = block.splitlines()
    assert lines[0] == DISCIPLINE_MARKER
    assert lines[1] == "完成后直接使用 main 主分支并 push 到 main 主分支。"
    # The rest is exactly the default mainline block body.
    assert lines[2:] == default.splitlines()[1:]
    assert "feature/" not in lines[1]


def test_mainline_override_without_slug_still_rewrites_placeholder_branch() -> None:
    block = discipline_block(
        "mainline", base_branch="main", slug="", override="新建 feature/{slug} 分支"
    )
    assert block.splitlines()[1] == "直接使用 main 主分支"


@pytest.mark.parametrize("override", [None, "", "   \n"])
def test_blank_override_means_default(override: str | None) -> None:
    default = discipline_block("branch", base_branch="main", slug="s")
    assert discipline_block("branch", base_branch="main", slug="s", override=override) == default


def test_compose_branch_keeps_task_text_and_appends_block() -> None:
    task = "基于 origin/main 新建 feature/u3 分支,实现登录。"
    out = compose_prompt(task, "branch", base_branch="main", slug="u3")
    block = discipline_block("branch", base_branch="main", slug="u3")
    assert out == f"{task}\n\n{block}"


def test_compose_mainline_rewrites_task_text() -> None:
    task = "基于 origin/main 新建 feature/u3 分支,实现登录。\n"
    out = compose_prompt(task, "mainline", base_branch="main", slug="u3")
    block = discipline_block("mainline", base_branch="main", slug="u3")
    assert out == f"直接使用 main 主分支,实现登录。\n\n{block}"


@pytest.mark.parametrize("policy", BRANCH_POLICIES)
@pytest.mark.parametrize(
    "task",
    [
        "Implement login; push feature/x when done.",
        "新建 feature/a 分支\n\n\n",
        RESUME_PROMPT,
        CONTINUE_PROMPT,
        "",
    ],
)
def test_compose_is_idempotent_with_one_marker(policy: BranchPolicy, task: str) -> None:
    once = compose_prompt(task, policy, base_branch="main", slug="t")
    twice = compose_prompt(once, policy, base_branch="main", slug="t")
    assert twice == once
    assert once.count(DISCIPLINE_MARKER) == 1
    assert once.count(DISCIPLINE_END_MARKER) == 1
    assert once.endswith(DISCIPLINE_END_MARKER)


def test_compose_replaces_old_block_when_policy_changes() -> None:
    first = compose_prompt("Do the task.", "branch", base_branch="main", slug="t")
    second = compose_prompt(first, "mainline", base_branch="main", slug="t")
    assert second == compose_prompt("Do the task.", "mainline", base_branch="main", slug="t")
    assert "feature/t" not in second


def test_compose_of_empty_task_is_just_the_block() -> None:
    out = compose_prompt("  \n", "mainline", base_branch="main", slug="")
    assert out == discipline_block("mainline", base_branch="main", slug="")


@pytest.mark.parametrize("prompt", [RESUME_PROMPT, CONTINUE_PROMPT])
def test_base_prompts_are_bilingual_and_compose_cleanly(prompt: str) -> None:
    assert re.search(r"[A-Za-z]{4}", prompt) and re.search(r"[\u4e00-\u9fff]", prompt)
    assert DISCIPLINE_MARKER not in prompt
    assert rewrite_branch_to_mainline(prompt, "main") == prompt
    out = compose_prompt(prompt, "mainline", base_branch="main", slug="")
    assert out.startswith(prompt + "\n\n" + DISCIPLINE_MARKER)


def test_resume_and_continue_prompts_differ() -> None:
    assert RESUME_PROMPT != CONTINUE_PROMPT
    assert "interrupted" in RESUME_PROMPT
    assert "model" in CONTINUE_PROMPT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no block here", "no block here"),
        (f"task\n\n{DISCIPLINE_MARKER}\nold rules\n{DISCIPLINE_END_MARKER}", "task"),
        (
            f"task\n\n{DISCIPLINE_MARKER}\nold rules\n{DISCIPLINE_END_MARKER}\n\nP.S. hi",
            "task\n\nP.S. hi",
        ),
        (f"task\n{DISCIPLINE_MARKER}\ntruncated block without end", "task"),
        (
            f"a\n{DISCIPLINE_MARKER}\nx\n{DISCIPLINE_END_MARKER}\nb\n{DISCIPLINE_MARKER}\ny\n"
            f"{DISCIPLINE_END_MARKER}",
            "a\n\nb",
        ),
        (f"{DISCIPLINE_MARKER}\nx\n{DISCIPLINE_END_MARKER}", ""),
    ],
)
def test_strip_discipline(text: str, expected: str) -> None:
    assert strip_discipline(text) == expected


def _strip_one_at_a_time(text: str) -> str:
    """strip_discipline as it was written first: cut one block, join, look again."""
    while True:
        start = text.find(DISCIPLINE_MARKER)
        if start < 0:
            return text
        end = text.find(DISCIPLINE_END_MARKER, start)
        tail = "" if end < 0 else text[end + len(DISCIPLINE_END_MARKER) :].lstrip("\n")
        head = text[:start].rstrip()
        text = "\n\n".join(part for part in (head, tail) if part.strip())


_pieces = st.lists(
    st.sampled_from(
        [DISCIPLINE_MARKER, DISCIPLINE_END_MARKER, "--- ", " end of ", "\n", "\n\n", " ", "\t",
         "task", "x", "rules\n"]
    )
    | st.text(max_size=5),
    max_size=12,
).map("".join)


@given(text=_pieces)
def test_strip_discipline_cuts_every_block_as_one_at_a_time(text: str) -> None:
    assert strip_discipline(text) == _strip_one_at_a_time(text)


def test_strip_discipline_is_linear_in_the_blocks() -> None:
    # A hostile server's user message may hold a block after a block (session_trace strips
    # every prompt it reads): cutting them one at a time copied the text once per block,
    # 12 s for 4 MB, an hour for the 64 MB an answer may hold, the dispatch stalled. One pass
    # takes about 0.2 s even under a load of 40: the bound sits between the two.
    import time

    text = ("x" + DISCIPLINE_MARKER + DISCIPLINE_END_MARKER) * 70_000  # 4 MB
    started = time.perf_counter()
    assert strip_discipline(text) == "\n\n".join(["x"] * 70_000)
    assert time.perf_counter() - started < 5.0


# --------------------------------------------------------------------------
# slugify


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        ("Implement login page", "implement-login-page"),
        ("Fix the Café login bug (#42) — now!", "fix-the-cafe-login-bug-42-now"),
        ("  U3: Login / Register  ", "u3-login-register"),
        ("feature/u3-login", "feature-u3-login"),
        ("a" * 60, "a" * 40),
        ("word " * 20, "-".join(["word"] * 8)),
    ],
)
def test_slugify_ascii_titles(title: str, expected: str) -> None:
    assert slugify(title) == expected


def test_slugify_chinese_title_gets_stable_hash_slug() -> None:
    slug = slugify("实现登录页面")
    assert re.fullmatch(r"task-[0-9a-f]{8}", slug)
    assert slugify("实现登录页面") == slug
    assert slugify("实现注册页面") != slug


def test_slugify_mixed_title_keeps_ascii_words_and_adds_hash() -> None:
    login, register = slugify("U3 登录页面"), slugify("U3 注册页面")
    assert re.fullmatch(r"u3-[0-9a-f]{8}", login)
    assert login != register


def test_slugify_empty_and_punctuation_only_titles() -> None:
    assert re.fullmatch(r"task-[0-9a-f]{8}", slugify("!!! ???"))
    assert slugify("") != slugify("!!! ???")


def test_slugify_rejects_too_small_max_len() -> None:
    with pytest.raises(ValueError, match="max_len"):
        slugify("anything", max_len=5)


@settings(database=None, max_examples=300, deadline=None)
@given(title=st.text(), max_len=st.integers(min_value=13, max_value=80))
def test_slugify_is_git_safe_bounded_and_stable(title: str, max_len: int) -> None:
    slug = slugify(title, max_len)
    assert re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", slug)
    assert len(slug) <= max_len
    assert slugify(title, max_len) == slug


# ---------------------------------------------------------------------------------------------
# pushed_branch: where the discipline told the agent to push (what the patrol verifies against)


@pytest.mark.parametrize(
    ("policy", "override", "expected"),
    [
        ("mainline", None, "main"),
        ("mainline", "Work on feature/{slug} and push it.", "main"),  # the mainline rules win
        ("branch", None, "feature/fix-login"),
        ("branch", "Push to feature/{slug} when done.", "feature/fix-login"),
        ("branch", "Use `feature/team-x/{slug}`.", "feature/team-x/fix-login"),
        ("branch", "Commit and push; report the hash.", None),  # names no branch: any
        ("branch", "Push to feature/<name> when done.", None),  # a placeholder we cannot fill
    ],
)
def test_pushed_branch(policy: BranchPolicy, override: str | None, expected: str | None) -> None:
    assert (
        pushed_branch(policy, base_branch="origin/main", slug="fix-login", override=override)
        == expected
    )


def test_pushed_branch_is_the_branch_the_block_names() -> None:
    for policy in ("branch", "mainline"):
        block = discipline_block(policy, base_branch="main", slug="fix-login")
        branch = pushed_branch(policy, base_branch="main", slug="fix-login")
        assert f"git push -u origin {branch}" in block or f"git push origin {branch}" in block


def test_expected_branches_and_the_base_a_task_is_sent_from() -> None:
    """Issue 37: the branch(es) the discipline named, and the tip recorded as the base."""
    assert expected_branches(True, base_branch="origin/main", titles=["Fix it"]) == ("main",)
    assert expected_branches(
        False, base_branch="main", titles=["Add the export", "T-1 Add the export", "Add the export"]
    ) == ("feature/add-the-export", "feature/t-1-add-the-export")
    # An override that names no branch: any branch.
    assert expected_branches(False, base_branch="main", titles=["x"], override="push it") == ()
    tips = {"main": "a" * 40, "feature/x": "f" * 40}
    assert base_commit(tips, ("feature/x",), "main") == "f" * 40  # the branch exists already
    assert base_commit(tips, ("feature/new",), "origin/main") == "a" * 40  # starts at main
    assert base_commit(tips, (), "main") == "a" * 40
    assert base_commit({}, ("main",), "main") is None  # unknown: judged as before
