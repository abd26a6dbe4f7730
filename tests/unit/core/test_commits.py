"""Reading the commit hashes an agent reports in its final answer (core.commits)."""

from __future__ import annotations

import pytest

from xaf_hub.core.commits import MAX_CLAIMS, claimed_commits, locked_paths, short
from xaf_hub.core.runstate import ANSWER_CHARS, answer_text, last_run
from xaf_hub.fleet.wire import message_of, messages_of

FULL = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Done. Commit 0123456 pushed to origin/main.", ("0123456",)),
        (f"Pushed {FULL}", (FULL,)),
        ("commit: `9C6325C` (upper case)", ("9c6325c",)),
        ("已提交并推送,提交 a1b2c3d4。", ("a1b2c3d4",)),
        ("https://git.example/shop/commit/a1b2c3d", ("a1b2c3d",)),
        # six characters is too short; 41 too long; a 64-character digest is no commit
        ("abc1234 and 123456 and " + "a" * 41, ("abc1234",)),
        ("sha256 " + "0a" * 32, ()),
        # parts of longer words, UUIDs and dashed names are not hashes
        ("id 123e4567-e89b-12d3-a456-426614174000 and build-1234567", ()),
        ("x1234567 or 1234567y or abc1234_def", ()),
        # a word made of letters a-f is English unless something calls it a hash
        ("the page was defaced, the effaced text restored", ()),
        ("commit defaced pushed", ("defaced",)),
        ("HEAD is at beadfeed now", ()),
        ("head beadfeed", ("beadfeed",)),
        # each hash once, in order
        ("commit 1111111 then commit 2222222, again commit 1111111", ("1111111", "2222222")),
        ("no hash here", ()),
    ],
)
def test_claimed_commits(answer: str, expected: tuple[str, ...]) -> None:
    assert claimed_commits(answer) == expected


# Labelled answers (issue 37): what an agent really writes, and what is read as its claim.
# Right: a word presents the commit, git printed it, or it is a full hash. Wrong: hex digits
# that are something else (a colour, a build number, the old side of a push).
LABELLED = [
    # -- claims --
    ("The commit hash is a1b2c3d.", ("a1b2c3d",)),
    ("**Commit:** `a1b2c3d4e5`", ("a1b2c3d4e5",)),
    ("Pushed commit id: 9f8e7d6", ("9f8e7d6",)),
    ("SHA-1 0a1b2c3d", ("0a1b2c3d",)),
    ("提交哈希是 a1b2c3d", ("a1b2c3d",)),
    ("Done:\n[main 5e6f7a8] fix the login form\n 1 file changed", ("5e6f7a8",)),
    ("[feature/x (root-commit) 1a2b3c4] first", ("1a2b3c4",)),
    ("To /srv/shop.git\n   1a2b3c4..5d6e7f8  main -> main", ("5d6e7f8",)),
    (" + 1a2b3c4...5d6e7f8 feature/x -> feature/x (forced update)", ("5d6e7f8",)),
    ("git rev-parse HEAD printed:\n" + FULL, (FULL,)),
    ("`1a2b3c4`\n", ("1a2b3c4",)),
    ("4c5d6e7 (HEAD -> main, origin/main) fix the form", ("4c5d6e7",)),
    ("Everything is pushed (" + FULL + ").", (FULL,)),
    ("I've committed the change as `a1b2c3d` and pushed it.", ("a1b2c3d",)),
    ("Pushed a1b2c3d to origin/main.", ("a1b2c3d",)),
    ("已提交到 main 分支: 9f8e7d6", ("9f8e7d6",)),
    # -- not claims --
    ("Commit 1a2b3c4 pushed; the header colour is now #a1b2c3d4.", ("1a2b3c4",)),
    ("Set the brand colour to #0f0f0f0 and #a1b2c3d4ff.", ()),
    ("Build 20261203 passed, ticket 4711234 closed.", ()),
    ("The token af12cd9 in the log is a request id.", ()),
    ("2026120 users; 1234567 rows.", ()),
    ("To /srv/shop.git\n   1a2b3c4..5d6e7f8  main -> main\nold tip was 1a2b3c4", ("5d6e7f8",)),
    ("I committed it; the header colour is #a1b2c3d4 now", ()),
    ("HEAD is now at abcdefa", ()),
    ("Committed 3 files; the request id 4f11234 took 5 s.", ()),  # another sentence
    ("I committed 3 files in 4711234 ms.", ()),  # digits only, words apart: a number
    ("The commit touched many many files and then, at last, module a1b2c3d", ()),  # too far
]


@pytest.mark.parametrize(("answer", "expected"), LABELLED)
def test_claims_are_read_where_the_answer_presents_a_commit(
    answer: str, expected: tuple[str, ...]
) -> None:
    assert claimed_commits(answer) == expected


def test_claims_are_bounded() -> None:
    answer = " ".join(f"commit {i:07d}" for i in range(50))
    assert len(claimed_commits(answer)) == MAX_CLAIMS


def test_short() -> None:
    assert short(FULL) == "0123456"


def test_last_run_carries_the_final_answer_text_only() -> None:
    messages = [
        {"info": {"role": "user", "id": "m1"}, "parts": [{"type": "text", "text": "do it"}]},
        {
            "info": {"role": "assistant", "id": "m2", "time": {"created": 1, "completed": 2}},
            "parts": [
                {"type": "tool", "state": {"output": "commit 7777777"}},
                {"type": "text", "text": "Done."},
                {"type": "text", "text": "Commit 0123456."},
            ],
        },
    ]
    run = last_run(messages_of(messages))
    assert run.answer == "Done.\nCommit 0123456."
    assert claimed_commits(run.answer) == ("0123456",)  # the tool's output is not the answer


def test_answer_keeps_the_end_of_a_long_answer() -> None:
    text = "x " * ANSWER_CHARS + "commit 0123456"
    kept = answer_text(message_of({"parts": [{"type": "text", "text": text}]}))
    assert len(kept) == ANSWER_CHARS and kept.endswith("commit 0123456")
    assert answer_text(message_of({"parts": "nonsense"})) == "" == answer_text(message_of({}))


# Labelled paths a commit touched, and whether project.locked_paths locks them.
LOCKS = [
    (("tests/**",), "tests/test_login.py", True),
    (("tests/**",), "tests/unit/deep/test_x.py", True),
    (("tests/**",), "src/tests.py", False),
    (("tests/**",), "src/tests/helper.py", False),
    (("tests",), "tests/a.py", True),  # a folder locks what is under it
    (("tests/",), "tests/a.py", True),
    (("./.ci/**",), ".ci/pipeline.yml", True),
    ((".ci/**",), "ci/pipeline.yml", False),
    (("*.lock",), "poetry.lock", True),  # no slash: a name at any depth
    (("*.lock",), "web/package.lock", True),
    (("*.lock",), "web/lockfile", False),
    (("src/*.py",), "src/a.py", True),
    (("src/*.py",), "src/sub/a.py", False),  # one * stays within one name
    (("**/conftest.py",), "conftest.py", True),
    (("**/conftest.py",), "a/b/conftest.py", True),
    (("test_?.py",), "test_a.py", True),
    (("test_[!a].py",), "test_a.py", False),
    (("test_[!a].py",), "test_b.py", True),
    (("Makefile", "tests/**"), "docs/index.md", False),
    ((), "tests/a.py", False),
]


@pytest.mark.parametrize(("globs", "path", "locked"), LOCKS)
def test_locked_paths(globs: tuple[str, ...], path: str, locked: bool) -> None:
    assert locked_paths([path], globs) == ((path,) if locked else ())


@pytest.mark.parametrize(
    ("path", "globs"),
    [
        ("tests/a\nb.py", ("tests/**",)),
        ("tests/a\nb.py", ("tests/a\nb.py",)),
        ("tests/a\nb.py", ("**/a?b.py",)),
        ("tests/x\n/test_login.py", ("**/test_login.py",)),
        ("tests/测试_登录.py", ("tests/测试_登录.py",)),
        ('tests/"q"\t.py', ('tests/"q"\t.py',)),
    ],
)
def test_locked_paths_match_names_with_any_character(path: str, globs: tuple[str, ...]) -> None:
    """A name as git gives it with -z (a newline, a tab, a quote, CJK) is matched as it is."""
    assert locked_paths([path], globs) == (path,)
