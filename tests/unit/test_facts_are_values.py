"""No branch of the package reads the words of a message: a fact the code acts on is a value.

A comparison such as ``"timed out" in reason``, ``any(w in text for w in HINTS)``,
``WORDS in error`` or ``detail.startswith("...")`` on a name that holds prose (a reason,
message, detail, error, text, note...) is flagged. Text from outside the hub (an OS, httpx,
git, Redis or a file's content) is parsed into a value in the places listed below, each with
why it reads words.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "xaf_hub"

# Parts of a name that say it holds prose.
PROSE = {
    "reason", "reasons", "message", "msg", "detail", "details", "error", "err", "text",
    "why", "note", "lowered", "said", "words", "line", "stderr", "output",
}

# path (under xaf_hub/), or path::function -> why it may read words.
PARSERS = {
    "fleet/client.py::explain": "turns httpx and OS error messages into a Cause",
    "fleet/events.py": "reads the server-sent event stream's lines",
    "store/redis/client.py": "turns the Redis client's error messages into one error",
    "store/landing.py": "reads git push's porcelain output",
    "store/repository.py": "reads git's stderr",
    "store/contain.py": "reads the sandbox probe's key=value lines",
    "config/reader.py": "checks a JSON file's content (a NUL byte) before parsing it",
    "ops/rooms.py": "reads the keeps command's key: value lines from a server's shell",
    "ops/decisions.py": "skips audit log lines that cannot hold a decision before parsing them",
    "core/text.py": "text helpers: case folding and word search",
    "core/rules.py": "parses a directory rule written in the config",
    "core/clock.py": "checks a time zone name from the config",
    "core/discipline.py": "rewrites an agent's orders (words in, words out)",
    "patrol/design_scan.py": "parses design documents",
    "page/export.py": "guards spreadsheet cells against formulas",
    "cli/termfit.py": "colours a table cell by the value it prints (the table holds text)",
}


def _name(node: ast.expr) -> str:
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        node = node.func.value  # reason.lower().strip() -> reason
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return ""


def _prose(node: ast.expr, aliases: set[str]) -> bool:
    name = _name(node)
    if name.isupper():  # a constant: a catalogue or a set of codes, not a message
        return False
    return name in aliases or any(part in PROSE for part in name.lower().split("_"))


def findings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, code) of every branch on words in ``tree``."""
    aliases: set[str] = set()  # names bound to prose: lowered = reason.lower(), r = ...
    loops: set[str] = set()  # names a loop binds: the words of a hint list
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _prose(node.value, aliases):
            aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.For | ast.comprehension):
            loops.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators, strict=True):
                left = node.left
                literal = isinstance(left, ast.JoinedStr) or (
                    isinstance(left, ast.Constant) and isinstance(left.value, str)
                )
                words = literal or _name(left) in loops or _name(left).isupper()
                if isinstance(op, ast.In | ast.NotIn) and _prose(right, aliases) and words:
                    yield node.lineno, ast.unparse(node)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("startswith", "endswith")
                and _prose(node.func.value, aliases)):
            yield node.lineno, ast.unparse(node)


def _scope(entry: str) -> ast.AST:
    """The tree an entry of PARSERS names: a module, or one function of it."""
    rel, _, function = entry.partition("::")
    tree = ast.parse((PACKAGE / rel).read_text("utf-8"))
    if not function:
        return tree
    return next(n for n in ast.walk(tree) if getattr(n, "name", None) == function)


def test_no_branch_reads_the_words_of_a_message() -> None:
    allowed = {(e.partition("::")[0], line) for e in PARSERS for line, _ in findings(_scope(e))}
    found = [
        f"xaf_hub/{rel}:{line}: {code}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, code in findings(ast.parse(path.read_text("utf-8")))
        if ((rel := path.relative_to(PACKAGE).as_posix()), line) not in allowed
    ]
    assert not found, "branches on words; carry a code instead:\n" + "\n".join(found)


def test_every_parser_listed_still_reads_words() -> None:
    idle = [entry for entry in PARSERS if not list(findings(_scope(entry)))]
    assert not idle, f"listed as reading words but no longer does: {idle}"


def test_the_scan_sees_the_shapes_it_names() -> None:
    src = """
def f(reason, exc, HINTS):
    lowered = str(exc).lower()
    if "timed out" in reason or reason.startswith("dns"):
        return 1
    if any(h in lowered for h in HINTS):
        return 2
    if f"{x}" not in exc.detail:
        return 3
    if key in reason_codes or exc.cause == "dns" or DOWN in s.error:
        return 4
"""
    assert sorted(line for line, _ in findings(ast.parse(src))) == [4, 4, 6, 8, 10]
