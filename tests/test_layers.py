"""The package's layer order (docs/architecture.md §1), checked on every import.

Every `import` and `from ... import` in xaf_hub counts, those inside functions and those under
`if TYPE_CHECKING:` too. A module imports its own folder, lower layers and the package's face;
never a higher layer, never a sibling folder of its own layer, and no two modules (or folders)
import each other round in a cycle. The cycle checks leave the `TYPE_CHECKING` imports aside:
they never run, so an annotation may name a module of its own folder that imports it (a
context and the helpers it loads on use); the layer order holds for them all the same.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "xaf_hub"

# Lowest first. Folders on one row are siblings: neither imports the other.
LAYERS: list[tuple[str, ...]] = [
    ("core",),
    ("config",),
    ("fleet", "store"),
    ("ops",),
    ("notify",),
    ("patrol", "page"),
    ("cli",),
]
# The package's face at its root: anyone may import these; they import no folder but as noted.
FACE = {"xaf_hub", "xaf_hub.errors", "xaf_hub.__main__"}
FACE_MAY_IMPORT = {"xaf_hub.__main__": {"cli"}}
LAYER_OF = {folder: i for i, row in enumerate(LAYERS) for folder in row}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(
    name: str, path: Path, known: set[str], *, typing: bool = True
) -> Iterator[tuple[int, str]]:
    """(line, module) for every xaf_hub module this one imports; ``typing=False``: only those
    it imports at run time (not under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text("utf-8"))
    aside = set() if typing else _type_checking_lines(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in aside:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                targets.append(full if full in known else base)
        for target in targets:
            if target.startswith("xaf_hub") and target != name:
                yield node.lineno, target


def folder(name: str) -> str | None:
    """The top folder a module lives in (None for the face at the root)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYER_OF) else None


def graph() -> dict[str, set[str]]:
    """Who imports whom at run time (the cycle checks)."""
    mods = modules()
    known = set(mods)
    return {n: {t for _, t in imports_of(n, p, known, typing=False)} for n, p in mods.items()}


def violations(mods: dict[str, Path] | None = None) -> list[str]:
    mods = modules() if mods is None else mods
    known = set(mods)
    bad: list[str] = []
    for name, path in sorted(mods.items()):
        mine = folder(name)
        for line, target in imports_of(name, path, known):
            theirs = folder(target)
            where = f"{name}:{line} imports {target}"
            if theirs is None:
                if target not in FACE:
                    bad.append(f"{where}: not a module of the package's face")
                continue
            if mine is None:
                if theirs not in FACE_MAY_IMPORT.get(name, set()):
                    bad.append(f"{where}: the face imports no folder")
                continue
            if mine not in LAYER_OF or theirs not in LAYER_OF:
                bad.append(f"{where}: a folder the layer table does not name")
            elif mine == theirs:
                continue
            elif LAYER_OF[theirs] > LAYER_OF[mine]:
                bad.append(f"{where}: a higher layer ({theirs} above {mine})")
            elif LAYER_OF[theirs] == LAYER_OF[mine]:
                bad.append(f"{where}: a sibling of the same layer ({mine}, {theirs})")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_folder_is_in_the_layer_table() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(LAYER_OF)


def test_the_root_holds_only_the_face() -> None:
    root = {p.name for p in PACKAGE.glob("*.py")}
    assert root == {"__init__.py", "__main__.py", "errors.py"}


def test_no_module_imports_a_higher_layer_or_a_sibling() -> None:
    assert violations() == []


def test_no_cycle_between_modules() -> None:
    assert cycles(graph()) == []


def test_no_cycle_between_folders() -> None:
    edges: dict[str, set[str]] = {}
    for src, targets in graph().items():
        a = src.split(".")[:3]
        for t in targets:
            b = t.split(".")[:3]
            if a != b:
                edges.setdefault(".".join(a), set()).add(".".join(b))
    assert cycles(edges) == []


def test_a_command_imports_no_other_command() -> None:
    bad = []
    for name, targets in graph().items():
        if name.startswith("xaf_hub.cli.commands.") and not name.endswith("._common"):
            bad += [f"{name} imports {t}" for t in targets
                    if t.startswith("xaf_hub.cli.commands.") and not t.endswith("._common")]
    assert bad == []


def test_only_the_send_operation_calls_prompt_async() -> None:
    callers = sorted(
        module_name(p) for p in PACKAGE.rglob("*.py")
        if "prompt_async(" in p.read_text("utf-8")
        and module_name(p) not in ("xaf_hub.fleet.client", "xaf_hub.fleet.dialects")
        and not module_name(p).startswith("sandbox.")
    )
    assert callers == ["xaf_hub.ops.send"]


def test_the_package_never_imports_the_checkouts_harness() -> None:
    # The fake model and the fleet launcher live in the checkout's `sandbox` package, which the
    # wheel leaves out: a module of the package that imported it would fail once installed.
    harness = {p.name for p in (PACKAGE.parent / "sandbox").glob("*.py")}
    assert {"fake_llm.py", "fleet.py", "demo.py"} <= harness
    found = []
    for name, path in sorted(modules().items()):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            )
            found += [f"{name}:{node.lineno} imports {n}" for n in names
                      if n == "sandbox" or n.startswith(("sandbox.", "xaf_hub.sandbox"))]
    assert found == []


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    # The checker itself: an upward import hidden in a function body is still found.
    probe = tmp_path / "probe.py"
    probe.write_text("def f() -> None:\n    from xaf_hub.cli import main  # noqa\n", "utf-8")
    found = violations({**modules(), "xaf_hub.core.probe": probe})
    assert any(v.startswith("xaf_hub.core.probe:2 imports xaf_hub.cli") and "higher layer" in v
               for v in found)


def test_the_check_sees_an_import_for_annotations_only(tmp_path: Path) -> None:
    # An import under `if TYPE_CHECKING:` still names a layer: upward, sideways or from the
    # face, it is a violation too (notify once read the patrol's record this way).
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n"
        "    from xaf_hub.patrol.context import Cycle  # noqa\n"
        "    from xaf_hub.store.tasks import Task  # noqa\n",
        "utf-8",
    )
    found = violations({
        **modules(), "xaf_hub.notify.probe": probe, "xaf_hub.fleet.probe": probe,
        "xaf_hub.probe": probe,
    })
    assert {
        "xaf_hub.notify.probe:4 imports xaf_hub.patrol.context: "
        "a higher layer (patrol above notify)",
        "xaf_hub.fleet.probe:5 imports xaf_hub.store.tasks: "
        "a sibling of the same layer (fleet, store)",
        "xaf_hub.probe:5 imports xaf_hub.store.tasks: the face imports no folder",
    } <= set(found)


def test_no_command_reads_the_untyped_namespace() -> None:
    # Every option is read through a typed record (cli/options.py): ctx.options(Options). Only
    # the parser's home (cli/main.py: which command, --debug) reads the namespace itself.
    readers = sorted(
        module_name(p) for p in (PACKAGE / "cli").rglob("*.py")
        if ("ctx.args" in p.read_text("utf-8") or "getattr(args" in p.read_text("utf-8"))
        and module_name(p) != "xaf_hub.cli.main"
    )
    assert readers == []


def test_no_test_module_imports_another_test_module() -> None:
    # What tests share lives in helper modules and fixtures (CONTRIBUTING.md): a test module
    # imported by another runs its module-level code twice and couples two files' fixtures.
    tests = Path(__file__).parent
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = (
                [node.module or ""] if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            )
            for name in names:
                if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_"):
                    found.append(f"{path.relative_to(tests)}:{node.lineno} imports {name}")
    assert found == []
