"""Directory rules (SPEC §4), table-driven over POSIX and Windows paths."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from xaf_hub.core.rules import ProjectRules, apply_aliases, clean_dir, is_under, normalize_dir

RULES = ProjectRules.build(
    roots=["/srv/demo", r"E:\cfc", "C:/code/CFC/"],
    fallback_segments=["cfc", "caremate"],
    exclude_dirs=[r"D:\tmp", "/srv/demo/vendor"],
    exclude_substrings=["workbuddy"],
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/srv/demo/", "/srv/demo"),
        ("/srv//demo///app", "/srv/demo/app"),
        (r"E:\CFC\Frontend\\", "e:/cfc/frontend"),
        ("C:/Code/CFC", "c:/code/cfc"),
        ("/", "/"),
        (r"\\server\share\cfc", "//server/share/cfc"),
        ("  /srv/demo  ", "/srv/demo"),
        ("/srv/demo/./app", "/srv/demo/app"),
        ("/srv/demo/../outside", "/srv/outside"),
        (r"C:\a\..\B", "c:/b"),
        (r"\\server\share\x\..", "//server/share"),
        (r"\\server\share\..\x", "//server/share/../x"),  # a UNC share is its own top
        ("/../x", "/../x"),  # above the top: left as written, under no root but "/"
        ("/srv/项目/./代码/", "/srv/项目/代码"),
    ],
)
def test_normalize(raw: str, expected: str) -> None:
    assert normalize_dir(raw) == expected


@pytest.mark.parametrize(
    ("directory", "verdict"),
    [
        ("/srv/demo", "root"),
        ("/srv/demo/", "root"),
        ("/srv/demo/app/sub", "root"),
        ("/SRV/Demo/App", "root"),
        ("/srv/demo2", "outside"),  # prefix look-alike
        ("/srv/demo2/cfc", "segment"),  # look-alike, but a fallback segment
        ("/srv/demo/vendor", "excluded"),  # exclusion beats the root
        ("/srv/demo/vendor/lib", "excluded"),
        ("/srv/demo/vendorish", "root"),  # exclusion on a segment boundary only
        (r"E:\cfc\cfc-frontend", "root"),
        (r"e:\CFC", "root"),
        (r"E:\cfc2", "outside"),
        ("C:\\code\\cfc\\book", "root"),
        (r"D:\tmp\cfc", "excluded"),  # excluded prefix beats fallback segment
        ("/home/x/workbuddy/cfc", "excluded"),  # excluded substring beats segment
        ("/home/x/WorkBuddy-2/cfc", "excluded"),
        ("/opt/CareMate/api", "segment"),
        ("/opt/cfc-tools", "outside"),  # segment must be whole
        ("/home/x/project", "outside"),
        ("", "empty"),
        ("   ", "empty"),
    ],
)
def test_classify(directory: str, verdict: str) -> None:
    assert RULES.classify(directory) == verdict
    assert RULES.is_project(directory) == (verdict in ("root", "segment"))


@pytest.mark.parametrize(
    ("written", "plain"),
    [
        ("a/./b", "a/b"),
        ("a/../b", "b"),
        ("/srv/demo/../outside", "/srv/outside"),
        ("/srv/demo/app/./../web/", "/srv/demo/web"),
        (r"C:\a\..\b", r"C:\b"),
        (r"C:\a\..", "C:\\"),
        ("C:/Code//CFC///", "C:/Code/CFC"),  # repeated and trailing separators; case kept
        (r"E:\CFC\Frontend\\", r"E:\CFC\Frontend"),
        (r"\\server\share\a\..\b", r"\\server\share\b"),
        ("/", "/"),
        ("  /srv/demo/  ", "/srv/demo"),
        ("/srv/项目/./代码//", "/srv/项目/代码"),
        ("/srv/Ünïcode/../Café", "/srv/Café"),
        ("/srv/．．/x", "/srv/．．/x"),  # full-width dots are a name, not a step up
        ("/srv/.../x", "/srv/.../x"),  # so are three dots
        ("/srv/.hidden/..x", "/srv/.hidden/..x"),
    ],
)
def test_clean_dir_removes_dot_segments_as_text(written: str, plain: str) -> None:
    assert clean_dir(written) == plain
    assert clean_dir(plain) == plain


@pytest.mark.parametrize(
    "written", ["/../x", "/srv/../../x", r"C:\..\x", "C:/a/../../x", "../x", "a/../..",
                r"\\server\share\..\other"],
)
def test_clean_dir_refuses_a_climb_above_the_start(written: str) -> None:
    with pytest.raises(ValueError, match="climbs above the start"):
        clean_dir(written)


@given(st.text(alphabet="/\\aB.: 中", max_size=30))
def test_clean_dir_agrees_with_the_rules(text: str) -> None:
    try:
        plain = clean_dir(text)
    except ValueError:
        return
    assert normalize_dir(plain) == normalize_dir(text)
    assert clean_dir(plain) == plain


@pytest.mark.parametrize(
    ("directory", "verdict"),
    [
        ("/srv/demo/../outside", "outside"),
        ("/srv/demo/app/../../outside/cfc", "segment"),
        ("/srv/demo/vendor/../app", "root"),
        ("/srv/demo/app/../vendor", "excluded"),
        (r"E:\cfc\..\cfc2", "outside"),
        ("/srv/demo/./app", "root"),
    ],
)
def test_classify_reads_dot_segments(directory: str, verdict: str) -> None:
    assert RULES.classify(directory) == verdict


def test_a_sandbox_the_server_lists_is_inside() -> None:
    worktree = "/home/u/.local/share/opencode/worktree/abc/task-42"
    rules = RULES.with_sandboxes([worktree + "/", "  "])
    assert RULES.classify(worktree) == "outside" and not RULES.under_roots(worktree)
    assert rules.classify(worktree + "/src") == "sandbox"
    assert rules.under_roots(worktree) and rules.is_project(worktree + "/src")
    assert rules.relative(worktree + "/src/app") == "src/app"
    assert not rules.under_roots(worktree + "/../task-43")  # a neighbour is not the sandbox
    assert not rules.under_roots(worktree + "2")
    assert rules.classify("/srv/demo/vendor") == "excluded"  # exclusions still come first
    assert rules.with_sandboxes([]).sandboxes == ()


def test_no_rules_means_nothing_is_project() -> None:
    assert not ProjectRules.build().is_project("/srv/demo")


@pytest.mark.parametrize(
    ("path", "root", "expected"),
    [
        ("/a/b", "/a", True),
        ("/a", "/a", True),
        ("/ab", "/a", False),
        ("/a/b", "", False),
        ("/", "/", True),
        ("/x", "/", True),
    ],
)
def test_is_under(path: str, root: str, expected: bool) -> None:
    assert is_under(path, root) is expected


@pytest.mark.parametrize(
    ("path", "aliases", "expected"),
    [
        ("/sc-data/cfc/book", {"/sc-data/cfc": r"C:\code\cfc"}, r"C:\code\cfc\book"),
        ("/sc-data/cfc", {"/sc-data/cfc": r"C:\code\cfc"}, r"C:\code\cfc"),
        ("/sc-data/cfc2", {"/sc-data/cfc": r"C:\code\cfc"}, "/sc-data/cfc2"),
        ("/a/b/c", {"/a": "/x", "/a/b": "/y"}, "/y/c"),  # longest prefix wins
        (r"E:\cfc\docs", {"E:/cfc": "/srv/cfc"}, "/srv/cfc/docs"),
        ("/none", {}, "/none"),
        ("/SC-Data//cfc/Book/", {"/sc-data/cfc": "/srv/cfc"}, "/srv/cfc/Book"),
        (r"\\nas\share\x\y", {r"\\NAS\share\x": "/mnt/x"}, "/mnt/x/y"),
        ("/any/where", {"/": "/srv"}, "/srv/any/where"),
    ],
)
def test_aliases(path: str, aliases: dict[str, str], expected: str) -> None:
    assert apply_aliases(path, aliases) == expected


@given(st.text(max_size=80))
@example("0\r\\")  # whitespace before a trailing separator, found by hypothesis in CI
@example("D:\\work\\ \t/\\")
def test_normalize_is_idempotent_and_never_crashes(text: str) -> None:
    once = normalize_dir(text)
    assert normalize_dir(once) == once
    RULES.classify(text)


@given(st.text(alphabet="/\\abcDEF:. ", max_size=40))
def test_excluded_never_project(text: str) -> None:
    rules = ProjectRules.build(roots=["/a"], fallback_segments=["a"], exclude_substrings=["b"])
    if "b" in text.lower():
        assert not rules.is_project(text)


@pytest.mark.parametrize(
    ("directory", "expected"),
    [
        ("/srv/demo/web/src", "web/src"),
        ("/srv/demo", ""),
        (r"E:\cfc\docs", "docs"),
        ("/opt/x/caremate/api", "caremate/api"),
        ("/a", "a"),
    ],
)
def test_relative_part(directory: str, expected: str) -> None:
    assert RULES.relative(directory) == expected


def test_a_worktree_is_the_projects_when_its_checkout_is() -> None:
    rules = ProjectRules.build(roots=["/srv/shop"], exclude_dirs=["/srv/shop/vendor"])
    room = "/home/u/.local/share/opencode/worktree/abc/t-1-fix"
    assert rules.owns(room, "/srv/shop") and rules.owns("/srv/shop/app")
    assert not rules.owns(room, "/srv/blog") and not rules.owns(room, "")
    # An excluded checkout's worktrees are not the project's, nor is an excluded worktree.
    assert not rules.owns(room, "/srv/shop/vendor/lib")
    excluding = ProjectRules.build(roots=["/srv/shop"], exclude_dirs=[room])
    assert not excluding.owns(room, "/srv/shop")
