"""The package's comments and docstrings say what a thing is for and what it promises: no
"issue N" reference and no dated or measured figure (history and figures live in CHANGELOG.md
and docs/)."""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "xaf_hub"
HISTORY = {
    "an issue reference": re.compile(r"\bissues?\s+#?\d+", re.I),
    "a calendar date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b(?!T)"),
    "a measurement's provenance": re.compile(r"\bmeasured\s+(on|at|in a|at most)\b", re.I),
    "a timing or size": re.compile(r"\d[\d,.]*\s?(ms|µs|KB|kB|MB|GB)\b"),
    "an approximate figure": re.compile(
        r"(~|≈|\babout\s|\bcosts?\s|\btook\s)\s?\d[\d,.]*\s?(s|ms|KB|kB|MB|GB|bytes)\b"),
}


def _texts(source: str) -> list[tuple[int, str]]:
    """Every comment and docstring line of ``source`` with its line number."""
    found = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                found += [(first.lineno + i, line)
                          for i, line in enumerate(first.value.value.splitlines())]
    return found


def _history(source: str) -> list[str]:
    return [f"{line}: {what}: {text.strip()}" for line, text in _texts(source)
            for what, pattern in HISTORY.items() if pattern.search(text)]


def test_no_comment_or_docstring_carries_history_or_a_measured_figure() -> None:
    found = [f"{path.relative_to(PACKAGE.parent)}:{hit}" for path in sorted(PACKAGE.rglob("*.py"))
             for hit in _history(path.read_text("utf-8"))]
    assert not found, "history belongs in CHANGELOG.md and docs/:\n" + "\n".join(found)


@pytest.mark.parametrize(("source", "flagged"), [
    ("x = 1  # the lock (issue 37)\n", True),
    ('"""Read the pool, measured on opencode 1.18.33."""\n', True),
    ("# written 2026-12-04\n", True),
    ("def f() -> None:\n    '''Load it (costs ~0.14 s per client).'''\n", True),
    ("# a 10k fleet reads in 40 ms\n", True),
    ("x = 'issue 37, 40 ms, 2026-12-04'\n", False),
    ("# ISO 8601 ('2026-12-01T14:05:09Z'); back-off 0.5 s, 1 s, 2 s... capped\n", False),
    ('"""Ages are measured with the Redis server\'s clock."""\n', False),
])
def test_the_check_tells_history_from_a_promise(source: str, flagged: bool) -> None:
    assert bool(_history(source)) == flagged
