"""The single source of the commit/branch discipline every prompt ends with (pure).

Every prompt the hub sends goes through :func:`compose_prompt`, which appends
:func:`discipline_block` for the target's branch policy (``branch`` or ``mainline``);
:func:`rewrite_branch_to_mainline` rewrites a task's own branch instructions for mainline
targets (docs/architecture.md §6).
"""

from __future__ import annotations

import bisect
import hashlib
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Literal

BranchPolicy = Literal["branch", "mainline", "worktree"]
BRANCH_POLICIES: tuple[BranchPolicy, ...] = ("branch", "mainline", "worktree")
# Where a prompt finds its feature branch: "new" (a new session starts the work: create it),
# "exists" (work on it was pushed: continue there), "unknown" (a session that may have made
# it: continue there if it exists, else create it).
BranchState = Literal["new", "exists", "unknown"]

DISCIPLINE_MARKER = "--- xaf-hub discipline ---"
DISCIPLINE_END_MARKER = "--- end of xaf-hub discipline ---"

RESUME_PROMPT = (
    "Your previous run was interrupted. Continue the task from where it stopped: "
    "check `git status` and the conversation above, finish what is left, and keep "
    "the work that is already done.\n"
    "上次运行被中断。请从中断处继续:先查看 git status 和上文,完成剩余工作,"
    "已完成的部分保持不变。"
)

CONTINUE_PROMPT = (
    "The previous model hit a rate limit or became unavailable, so this session now "
    "runs on another model. Continue the task from where it stopped and keep the "
    "work that is already done.\n"
    "上一个模型触发限流或不可用,本会话已换用其他模型。请从停下的地方继续完成任务,"
    "保留已完成的工作。"
)

_HASH_SLUG_PREFIX = "task-"
_HASH_LEN = 8
_MIN_SLUG_LEN = len(_HASH_SLUG_PREFIX) + _HASH_LEN


def slugify(text: str, max_len: int = 40) -> str:
    """Return a git-branch-safe slug (``[a-z0-9]+(-[a-z0-9]+)*``) for a task title."""
    if max_len < _MIN_SLUG_LEN:
        raise ValueError(f"max_len must be at least {_MIN_SLUG_LEN}, got {max_len}")
    decomposed = unicodedata.normalize("NFKD", text)
    ascii_part = decomposed.encode("ascii", "ignore").decode("ascii").lower()
    words = re.findall(r"[a-z0-9]+", ascii_part)
    # Letters or digits that have no ASCII spelling (Chinese, ß, ...) carry
    # meaning the ASCII words lose; a hash of the title keeps such slugs apart.
    lost = any(ord(ch) > 127 and unicodedata.category(ch)[0] in "LN" for ch in decomposed)
    if not lost and (slug := _join_words(words, max_len)):
        return slug
    digest = hashlib.sha1(unicodedata.normalize("NFC", text.strip()).encode("utf-8"))
    tag = digest.hexdigest()[:_HASH_LEN]
    head = _join_words(words, max_len - _HASH_LEN - 1)
    return f"{head}-{tag}" if head else f"{_HASH_SLUG_PREFIX}{tag}"


def _join_words(words: list[str], max_len: int) -> str:
    """Join words with '-', cutting at a word boundary to fit max_len."""
    slug = ""
    for word in words:
        candidate = f"{slug}-{word}" if slug else word
        if len(candidate) > max_len:
            if not slug:
                # One word longer than the limit: a hard cut beats an empty slug.
                return word[:max_len]
            break
        slug = candidate
    return slug


def discipline_block(
    policy: BranchPolicy,
    *,
    base_branch: str,
    slug: str,
    override: str | None = None,
    branch: BranchState = "new",
) -> str:
    """Build the discipline block appended to every prompt for one target; ``branch`` says
    where the feature branch stands (a branch policy's first rule depends on it)."""
    base = _base_name(base_branch)
    # A pool's override, filled in ("" none): never empty when given.
    custom = _fill_override(override, base=base, slug=slug) if override and override.strip() else ""
    if policy == "branch":
        if not slug.strip():
            raise ValueError("branch policy needs a non-empty slug")
        body = custom or _branch_body(base, slug, branch)
    elif policy in ("mainline", "worktree"):
        rules = _mainline_body(base) if policy == "mainline" else _worktree_body(base)
        if custom and policy == "mainline":
            custom = rewrite_branch_to_mainline(custom, base)
        body = f"{custom}\n{rules}" if custom else rules
    else:
        raise ValueError(f"unknown branch policy {policy!r}; expected one of {BRANCH_POLICIES}")
    return f"{DISCIPLINE_MARKER}\n{body}\n{DISCIPLINE_END_MARKER}"


def pushed_branch(
    policy: BranchPolicy, *, base_branch: str, slug: str, override: str | None = None
) -> str | None:
    """The branch ``discipline_block`` tells the agent to push, or None when it names none.

    Mainline: the base branch (its rules always close the block). Branch: ``feature/<slug>``,
    or the first feature/ branch a pool override names once its placeholders are filled.
    """
    base = _base_name(base_branch)
    if policy == "mainline":
        return base
    if policy == "worktree":
        return None  # the worktree's own branch, which the server named: the task records it
    if override is None or not override.strip():
        return f"feature/{slug}"
    m = _FEATURE_TOKEN.search(_fill_override(override, base=base, slug=slug))
    if m is None or any(c in m.group(0) for c in "<>{}"):
        return None  # an override that names no branch (or a placeholder we cannot fill)
    return m.group(0)


def expected_branches(
    mainline: bool, *, base_branch: str, titles: Sequence[str], override: str | None = None
) -> tuple[str, ...]:
    """Every branch the discipline named for a task called by any of ``titles`` (the task's
    own, its session's); () when an override names no branch (any branch then)."""
    policy: BranchPolicy = "mainline" if mainline else "branch"
    named = [
        pushed_branch(policy, base_branch=base_branch, slug=slugify(title), override=override)
        for title in titles
    ]
    branches = [b for b in named if b is not None]
    return tuple(dict.fromkeys(branches)) if len(branches) == len(named) else ()


def base_commit(tips: Mapping[str, str], branches: Sequence[str], base_branch: str) -> str | None:
    """A task's base: its expected branch's tip, or for a branch not made yet (a
    feature branch starts there) the base branch's; None when neither is known."""
    for branch in branches:
        if branch in tips:
            return tips[branch]
    return tips.get(_base_name(base_branch))


def strip_discipline(text: str) -> str:
    """Remove every discipline block from text, keeping what surrounds it: the pieces between
    blocks, each trimmed, joined by a blank line. One pass (a server's message may hold any
    number of blocks)."""
    start = text.find(DISCIPLINE_MARKER)
    if start < 0:
        return text
    pieces = [text[:start].rstrip()]
    while True:
        end = text.find(DISCIPLINE_END_MARKER, start)
        # A start marker without its end (a truncated or hand-edited prompt)
        # can only have been followed by block text, so drop to the end.
        if end < 0:
            break
        after = end + len(DISCIPLINE_END_MARKER)
        start = text.find(DISCIPLINE_MARKER, after)
        if start < 0:
            pieces.append(text[after:].lstrip("\n"))
            break
        pieces.append(text[after:start].lstrip("\n").rstrip())
    return "\n\n".join(piece for piece in pieces if piece.strip())


def compose_prompt(
    task_text: str,
    policy: BranchPolicy,
    *,
    base_branch: str,
    slug: str,
    override: str | None = None,
    branch: BranchState = "new",
) -> str:
    """Return the task text followed by exactly one discipline block."""
    block = discipline_block(
        policy, base_branch=base_branch, slug=slug, override=override, branch=branch
    )
    body = strip_discipline(task_text)
    if policy == "mainline":
        body = rewrite_branch_to_mainline(body, base_branch)
    return f"{body.rstrip()}\n\n{block}" if body.strip() else block


def _base_name(base_branch: str) -> str:
    """Return the integration branch without a remote prefix, validated."""
    name = base_branch.strip()
    for remote in ("origin/", "upstream/"):
        name = name.removeprefix(remote)
    if not name:
        raise ValueError("base_branch must name a branch")
    if _FEATURE_TOKEN.search(name):
        # The rewrite replaces feature/ mentions by the base name; a base that
        # is itself a feature/ branch would make it chase its own output.
        raise ValueError(f"base_branch {base_branch!r} must not be a feature/ branch")
    return name


def _fill_override(text: str, *, base: str, slug: str) -> str:
    """Substitute the {base_branch} and {slug} placeholders of a pool override."""
    # Plain replace, not str.format: override text may hold other braces.
    text = text.strip().replace("{base_branch}", base)
    # Without a slug (mainline) "{slug}" stays: feature/{slug} is still a
    # branch token the mainline rewrite recognises.
    return text.replace("{slug}", slug) if slug.strip() else text


def _branch_start(base: str, branch: str, state: BranchState) -> tuple[str, str]:
    """The first rule of the branch discipline, English and Chinese, for the branch's state."""
    if state == "exists":
        return (
            f"- Continue on `{branch}`: it exists already, with your earlier work. Fetch, "
            f"check it out and pull; do not create it again or start it over from "
            f"`origin/{base}`.",
            f"- 在已有的 {branch} 分支上继续(之前的工作就在上面):fetch 后检出并 pull;"
            f"不要重新创建它,也不要从 origin/{base} 重新开始;",
        )
    if state == "unknown":
        return (
            f"- Work on `{branch}`: if it exists already (locally or on origin), check it out "
            f"and pull; otherwise fetch and create it from `origin/{base}`. Do all the work "
            "there.",
            f"- 在 {branch} 分支上工作:若它已存在(本地或 origin 上),检出并 pull;"
            f"否则 fetch 后基于 origin/{base} 新建;全部工作在该分支上完成;",
        )
    return (
        f"- Start from the integration branch `{base}`: fetch, then create `{branch}` "
        f"from `origin/{base}` and do all the work there.",
        f"- 基于 origin/{base} 新建 {branch} 分支,全部工作在该分支上完成;",
    )


def _branch_body(base: str, slug: str, state: BranchState = "new") -> str:
    """Return the default discipline for an isolated feature branch."""
    branch = f"feature/{slug}"
    start, start_zh = _branch_start(base, branch, state)
    return (
        "Branch policy: branch (isolated feature branch)\n"
        f"{start}\n"
        f"- When the task is done: git commit, then git push -u origin {branch}. "
        "No confirmation is needed.\n"
        "- Report the commit hash in your final message.\n"
        f"- Never merge into `{base}` or any other main line; a person decides merges.\n"
        "分支纪律(branch,隔离开发):\n"
        f"{start_zh}\n"
        f"- 完成后自行 git commit 并 git push 该分支(origin {branch}),无需等待确认;\n"
        "- 在最终回复中回报 commit 哈希;\n"
        f"- 不要合并到 {base} 或任何主干,合并由人工裁决。"
    )


def _mainline_body(base: str) -> str:
    """Return the default discipline for working on the integration branch."""
    return (
        "Branch policy: mainline (work on the integration branch)\n"
        f"- Work directly on `{base}`: git checkout {base}, then pull the latest.\n"
        "- Do not create any branch. Where the text above asks for a feature/ branch, "
        "this rule wins.\n"
        f"- When the task is done: git commit, then git push origin {base}. "
        "No confirmation is needed.\n"
        "- Report the commit hash in your final message.\n"
        "分支纪律(mainline,主分支):\n"
        f"- 直接在 {base} 主分支上工作:git checkout {base} 后拉取最新代码;\n"
        "- 不要新建任何分支;上文若要求使用 feature/ 分支,以本条为准;\n"
        f"- 完成后自行 git commit 并 git push origin {base},无需等待确认;\n"
        "- 在最终回复中回报 commit 哈希。"
    )


def _worktree_body(base: str) -> str:
    """Return the discipline for a task in a worktree of its own."""
    return (
        "Branch policy: worktree (your own worktree and branch)\n"
        f"- This folder is a git worktree of its own, already on a branch of its own that "
        f"starts from `origin/{base}`. Do all the work here, on this branch: do not switch "
        "or create branches. Where the text above asks for another branch, this rule wins.\n"
        "- When the task is done: git commit, then git push -u origin HEAD (this branch). "
        "No confirmation is needed.\n"
        f"- Never push to `{base}` and never merge: the hub lands verified work itself.\n"
        "- Report the commit hash in your final message.\n"
        "分支纪律(worktree,独立工作区):\n"
        f"- 当前目录是独立的 git 工作区,已在从 origin/{base} 开出的专属分支上;"
        "全部工作在此分支完成,不要切换或新建分支;上文若要求其他分支,以本条为准;\n"
        "- 完成后自行 git commit 并 git push -u origin HEAD(推送本分支),无需等待确认;\n"
        f"- 不要推送到 {base},也不要合并:经验证的工作由 hub 负责合入;\n"
        "- 在最终回复中回报 commit 哈希。"
    )


# --------------------------------------------------------------------------
# rewrite_branch_to_mainline
#
# Each rule is one imperative shape ("新建 feature/x 分支", "push to feature/x",
# "git checkout -b feature/x", ...) with a named group `feat` on the branch
# token.  Candidates from all rules are collected on the original text, those
# in a negated or factual clause are dropped, overlaps keep the earliest and
# longest, and the survivors are replaced in one pass.

_SEG = r"(?:[A-Za-z0-9_\-]|<[A-Za-z0-9_\-]+>|\{[A-Za-z0-9_\-]+\})+"
_NAME = rf"{_SEG}(?:[./]{_SEG})*"
_FEATURE_TOKEN = re.compile(rf"(?<![A-Za-z0-9_/\-])feature/{_NAME}")
# The branch token, optionally remote-prefixed and wrapped in matching backticks.
_FEAT = (
    r"(?P<tick>`?)(?<![A-Za-z0-9_/\-])"
    rf"(?P<feat>(?P<remote>(?:origin|upstream)/)?(?-i:feature/){_NAME})(?P=tick)"
)
_BASEISH = r"`?(?:(?:origin|upstream)/)?[A-Za-z0-9][A-Za-z0-9._\-/]*`?"

# A '.' only ends a clause when a space follows ("v1.2" does not).  Colons do
# not end one: "never run this: git push origin feature/x" stays negated.
_CLAUSE_BOUNDARY = re.compile(r"[\n。;;!!??,,]|\.(?=\s)")
_NEGATION = re.compile(
    # An ASCII left edge, not \b: "完成后never push" is still a negation.
    r"(?i:(?<![A-Za-z0-9_])(?:not|never|cannot|no\s+need|without|avoid|instead\s+of|rather\s+than)\b"
    r"|n['’]t\b)"
    r"|不要|不得|不能|不可|不准|不许|不应|不必|不用|不需|无需|无须|禁止|严禁|切勿|请勿|勿"
    r"|不再|避免|而非|而不是|(?<![分特区类级个识差告鉴辨性])别"
    r"|不\s*(?:新建|创建|建立|新开|拉|切|检出|签出|checkout|check|push|推|基于|在|使用|用|开)"
)
# Reports of what already happened; the seed insists they stay as written.
_FACTUAL_BEFORE = re.compile(r"已|曾")
_MISTAKE = re.compile(
    r"(?i:by\s+mistake|accidentally|mistakenly)"
    r"|违规|误推|误提交|误操作|不小心|错误地"
)
_COMMIT_REF_AFTER = re.compile(r"`?\s*@\s*[0-9a-fA-F]{7,40}\b")
# "the push to feature/x", "was work on feature/x": a noun, not an order.
_NOUN_BEFORE = re.compile(r"(?i:(?<![A-Za-z0-9_])(?:a|an|the|one|that|this|was|were|been)\s+)$")

_ZH_CREATE_VERB = r"(?:新建|创建|建立|新开|拉出|切出|开出|开一个|开个|拉(?![取下到回]))"
_ZH_CREATE_FILL = (
    r"\s*(?:一个|一条|个|条)?\s*(?:新的?)?\s*(?:(?:名为|叫做?|命名为)\s*)?(?:分支\s*[::]?\s*)?"
)
_ZH_TAIL = r"(?:\s*的?\s*分支)?"


# One imperative shape, and how to reword a match of it.
_Rule = tuple[re.Pattern[str], Callable[[re.Match[str], str], str]]


def _target(m: re.Match[str], base: str, remote: bool = True, zh: bool = False) -> str:
    """The branch token reworded as the base branch, in the token's backticks: with its remote
    prefix unless ``remote`` is off (git commands: "git checkout origin/main" would detach
    HEAD), and "主分支" after it in Chinese wording (``zh``)."""
    tick = m.group("tick")
    name = f"{tick}{(m.group('remote') or '') if remote else ''}{base}{tick}"
    return f"{name} 主分支" if zh else name


def _zh_work(m: re.Match[str], base: str) -> str:
    """Reword a whole "create a feature branch" order, Chinese."""
    return f"直接使用 {_target(m, base, remote=False, zh=True)}"


def _en_work(m: re.Match[str], base: str) -> str:
    """Reword a whole "create a feature branch" order, English (keeping a leading capital)."""
    text = f"work directly on {_target(m, base, remote=False)}"
    return text[:1].upper() + text[1:] if m.group(0)[:1].isupper() else text


def _lead_target_tail_zh(m: re.Match[str], base: str) -> str:
    """Keep the Chinese verb and its tail, swap the branch for the base."""
    return f"{m.group('lead')}{_target(m, base, zh=True)}{m.groupdict().get('tail') or ''}"


def _lead_target_en(m: re.Match[str], base: str) -> str:
    """Keep the English verb phrase, swap the branch for the base."""
    # A Chinese "分支" after an English verb ("push feature/x 分支") keeps Chinese.
    return f"{m.group('lead')}{m.group('gap')}{_target(m, base, zh='分支' in m.group('tgt'))}"


def _git_create(m: re.Match[str], base: str) -> str:
    """Turn a branch-creating git command into a checkout of the base."""
    verb = "switch" if m.group("cmd").startswith("switch") else "checkout"
    return f"{m.group('git') or ''}{verb} {_target(m, base, remote=False)}"


def _git_switch(m: re.Match[str], base: str) -> str:
    """Point a git checkout/switch at the base."""
    return f"git {m.group('cmd')} {_target(m, base, remote=False)}"


def _git_push(m: re.Match[str], base: str) -> str:
    """Point a git push at the base."""
    # Flags are dropped on purpose: -u is moot and --force on the main line is
    # never what a task meant.
    return f"git push {m.group('rname') or 'origin'} {_target(m, base, remote=False)}"


@lru_cache(maxsize=32)
def _rules(base: str) -> tuple[_Rule, ...]:
    """Compile the rewrite rules for one base branch name."""
    from_base = (
        rf"(?:(?:origin|upstream)/[A-Za-z0-9._\-/]+|{re.escape(base)}"
        r"|main|master|trunk|develop|dev)\b"
    )
    en_create_verb = r"(?:create|open|make|cut|start|spin\s+up|set\s+up|branch\s+off)"
    en_create_fill = (
        r"\s+(?:(?:a|an|the|your|one)\s+)?(?:new\s+)?"
        r"(?:(?:local\s+|git\s+|feature\s+)?branch\s+)?(?:(?:called|named)\s+)?"
    )
    # The start point a branch-creating git command may name after the branch.
    start = rf"(?:\s+(?:(?:origin|upstream)/[A-Za-z0-9._\-/]+|{re.escape(base)})\b)?"
    spec: list[tuple[str, str, Callable[[re.Match[str], str], str]]] = [
        (
            "git-create",
            rf"(?P<git>\bgit\s+)?\b(?P<cmd>checkout\s+-[bB]|switch\s+(?:-c|-C|--create))\s+"
            rf"{_FEAT}{start}",
            _git_create,
        ),
        ("git-branch", rf"(?P<git>\bgit\s+)(?P<cmd>branch)\s+{_FEAT}{start}", _git_create),
        ("git-switch", rf"\bgit\s+(?P<cmd>checkout|switch)\s+(?:--\s+)?{_FEAT}", _git_switch),
        (
            "git-push",
            r"\bgit\s+push(?:\s+(?:-u|--set-upstream|-f|--force|--force-with-lease))*"
            r"(?:\s+(?P<rname>(?!-)[A-Za-z0-9._\-]+))?\s+(?:HEAD:)?(?:refs/heads/)?"
            rf"{_FEAT}(?::(?:refs/heads/)?[A-Za-z0-9._\-/<>{{}}]+)?",
            _git_push,
        ),
        (
            "zh-base-create",
            rf"(?:基于|从|以)\s*{_BASEISH}\s*(?:分支)?\s*(?:上|为基础|为基线)?\s*[,,]?\s*"
            rf"{_ZH_CREATE_VERB}{_ZH_CREATE_FILL}{_FEAT}{_ZH_TAIL}",
            _zh_work,
        ),
        ("zh-create", rf"{_ZH_CREATE_VERB}{_ZH_CREATE_FILL}{_FEAT}{_ZH_TAIL}", _zh_work),
        (
            "zh-switch",
            r"(?P<lead>(?:(?:切换到|切换至|切到|切回|检出|签出)\s*"
            r"|(?:checkout|check\s+out)\s*(?:到|至)\s*)(?:分支\s*)?)"
            rf"{_FEAT}(?P<tail>){_ZH_TAIL}",
            _lead_target_tail_zh,
        ),
        (
            "zh-push",
            r"(?P<lead>(?:push|推送|推)\s*(?:到|至|去)\s*(?:远端|远程)?\s*(?:的\s*)?(?:分支\s*)?)"
            rf"{_FEAT}(?P<tail>){_ZH_TAIL}",
            _lead_target_tail_zh,
        ),
        (
            "zh-on",
            rf"(?P<lead>(?:基于|在)\s*(?:分支\s*)?){_FEAT}{_ZH_TAIL}"
            r"(?P<tail>\s*(?:上|之上|上面|里)?\s*(?:开发|工作|提交|实现|完成|修改|编码|继续))(?![了过])",
            _lead_target_tail_zh,
        ),
        (
            "en-base-create",
            rf"\b(?:starting\s+from|branching\s+(?:off|from)|based\s+on|from|off(?:\s+of)?)\s+"
            rf"`?{from_base}`?\s*,?\s+(?:create|open|make|cut|start)"
            rf"{en_create_fill}{_FEAT}(?:\s+branch)?",
            _en_work,
        ),
        (
            "en-create",
            rf"\b{en_create_verb}{en_create_fill}{_FEAT}(?:\s+branch)?"
            rf"(?:\s+(?:from|off(?:\s+of)?|based\s+on|on\s+top\s+of)\s+`?{from_base}`?)?",
            _en_work,
        ),
        (
            "en-switch",
            r"\b(?P<lead>(?:switch|change)\s+(?:over\s+)?to|check\s*out)(?P<gap>\s+)"
            rf"(?P<tgt>(?:the\s+)?(?:branch\s+)?{_FEAT}(?:\s+branch|\s*分支)?)",
            _lead_target_en,
        ),
        (
            "en-push",
            r"\b(?P<lead>push(?:\s+(?:it|them|this|everything|all|changes|commits?"
            r"|(?:your|the|my|all)\s+(?:work|changes|commits?)))?"
            r"(?:\s+(?:up\s+)?(?:to|into|onto))?(?:\s+origin)?)(?P<gap>\s+)"
            rf"(?P<tgt>(?:the\s+)?(?:remote\s+)?(?:branch\s+)?{_FEAT}(?:\s+branch|\s*分支)?)",
            _lead_target_en,
        ),
        (
            "en-work",
            r"\b(?P<lead>(?:work|develop|commit|implement\s+it|do\s+(?:the|all\s+the)\s+work"
            r"|base\s+(?:your|the|all)\s+(?:work|changes)|continue)\s+(?:directly\s+)?"
            r"(?:on|in|to|onto|into))(?P<gap>\s+)"
            rf"(?P<tgt>(?:the\s+)?(?:branch\s+)?{_FEAT}(?:\s+branch|\s*分支)?)",
            _lead_target_en,
        ),
    ]
    # Case-insensitive for the English verbs ("Create", "Push"); the feature/
    # literal itself stays case-sensitive to match the fast path and loop bound.
    # Whitespace inside a shape never spans a line: a line break ends a clause.
    # The names only tell the shapes apart to a reader.
    return tuple(
        (re.compile(pattern.replace(r"\s", r"[^\S\n]"), re.IGNORECASE), render)
        for _name, pattern, render in spec
    )


def _protected(text: str, m: re.Match[str], boundaries: list[int]) -> bool:
    """Tell whether a match sits in a negated or factual context."""
    feat_start = m.start("feat")
    # The clause that holds the branch token: from the boundary before it to the one after.
    i = bisect.bisect_right(boundaries, feat_start)
    start = boundaries[i - 1] + 1 if i > 0 else 0
    end = boundaries[i] if i < len(boundaries) else len(text)
    return bool(
        _NEGATION.search(text, start, feat_start)
        or _FACTUAL_BEFORE.search(text, start, feat_start)
        or _MISTAKE.search(text, start, end)
        or _COMMIT_REF_AFTER.match(text, m.end("feat"))
        or _NOUN_BEFORE.search(text, max(start, m.start() - 20), m.start())
    )


def _rewrite_once(text: str, base: str) -> str:
    """Apply one round of rewriting to text."""
    boundaries = [b.start() for b in _CLAUSE_BOUNDARY.finditer(text)]
    candidates: list[tuple[int, int, int, str]] = []
    for index, (pattern, render) in enumerate(_rules(base)):
        for m in pattern.finditer(text):
            if not _protected(text, m, boundaries):
                candidates.append((m.start(), -(m.end() - m.start()), index, render(m, base)))
    candidates.sort()
    pieces: list[str] = []
    cursor = 0
    for start, neg_len, _index, replacement in candidates:
        if start < cursor:
            continue
        pieces += [text[cursor:start], replacement]
        cursor = start - neg_len
    pieces.append(text[cursor:])
    return "".join(pieces)


def rewrite_branch_to_mainline(text: str, base_branch: str) -> str:
    """Reword orders to create, switch to or push a feature/ branch into mainline ones."""
    base = _base_name(base_branch)
    if "feature/" not in text:
        return text
    # Each round removes at least one feature/ token and adds none (the base is
    # never a feature/ branch), so this reaches a fixpoint: idempotent by
    # construction even where overlapping shapes hid a second match.
    for _ in range(text.count("feature/") + 1):
        rewritten = _rewrite_once(text, base)
        if rewritten == text:
            break
        text = rewritten
    return text
