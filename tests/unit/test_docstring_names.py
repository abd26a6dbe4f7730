"""Every module a docstring names exists: a name like ``store.statefile.write_text_atomic`` or
``gate.Gate`` in backticks resolves to a module of the package and, past the module, to its
attributes. A docstring that still names a module the code left (``output.redact``) fails.

Names that are not the package's own are told apart by their first part: a module Python can
import (``asyncio.timeout``, ``httpx.Client``), a config key path (``patrol.stale_minutes``:
the section's dataclass has the field), a file name (``config.json``), or a local variable
a docstring quotes (``ctx.config``, listed below)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "xaf_hub"
NAME = re.compile(r"``?([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?``?")
# First parts that are values a docstring quotes, not modules.
LOCAL = frozenset({"ctx", "cls", "self", "x", "info", "session", "state", "cycle", "pctx",
                   "sc", "rec", "req", "run", "doc", "args", "opts", "order", "plan", "policy"})
FILE_ENDINGS = ("json", "py", "md", "log", "lock", "toml", "txt", "html", "csv", "jsonc", "pid")
# Keys read outside the Config dataclasses, and fields of opencode's own answers.
OTHER_KEYS = frozenset({"page.language", "page.url", "retry.next"})


def _modules() -> dict[str, list[str]]:
    """Each module's short names: 'gate' and 'store.gate' both give 'xaf_hub.store.gate'
    ('dispatch' gives both the operation's module and the command's)."""
    names: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        dotted = ".".join(["xaf_hub", *parts])
        for i in range(len(parts)):
            names.setdefault(".".join(parts[i:]), []).append(dotted)
    return names


MODULES = _modules()


def _config_keys() -> set[str]:
    from xaf_hub.config import load

    keys = set()
    for f in dataclasses.fields(load.Config):
        keys.add(f.name)
        hint = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        cls = getattr(load, hint, None)
        if dataclasses.is_dataclass(cls):
            keys |= {f"{f.name}.{g.name}" for g in dataclasses.fields(cls)}
    return keys


def _classes() -> dict[str, list[str]]:
    """Each top-level class name of the package and the modules that define it."""
    found: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text("utf-8")).body:
            if isinstance(node, ast.ClassDef):
                rel = path.relative_to(PACKAGE).with_suffix("")
                parts = [p for p in rel.parts if p != "__init__"]
                found.setdefault(node.name, []).append(".".join(["xaf_hub", *parts]))
    return found


CLASSES = _classes()


def _resolves(name: str) -> bool:
    parts = name.removeprefix("xaf_hub.").split(".")
    if parts[0][:1].isupper():  # Class.attribute: some module's class has it
        return any(
            _has(getattr(importlib.import_module(m), parts[0]), parts[1:])
            for m in CLASSES.get(parts[0], [])
        )
    for i in range(len(parts), 0, -1):
        targets = MODULES.get(".".join(parts[:i]))
        if targets:
            return any(_has(importlib.import_module(t), parts[i:]) for t in targets)
    return False


def _has(obj: object, attrs: list[str]) -> bool:
    for attr in attrs:
        if not hasattr(obj, attr):
            # A dataclass field without a default is no class attribute, but it exists.
            return attr in getattr(obj, "__dataclass_fields__", {})
        obj = getattr(obj, attr)
    return True


def _foreign(first: str, name: str, keys: set[str]) -> bool:
    if first in LOCAL or name.rsplit(".", 1)[-1] in FILE_ENDINGS:
        return True
    if name in keys or name in OTHER_KEYS:
        return True
    if first in {"notify", "lock", "pool", "budget", "models", "project", "permissions",
                 "timeouts"} and first not in MODULES:
        return True
    if first in MODULES or first == "xaf_hub":
        return False
    return importlib.util.find_spec(first) is not None


def _docstrings() -> list[tuple[str, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node, clean=False)
                if text:
                    out.append((str(path.relative_to(PACKAGE.parent)), text))
    return out


def test_every_module_a_docstring_names_exists() -> None:
    keys = _config_keys()
    missing = set()
    for where, text in _docstrings():
        for m in NAME.finditer(text):
            name = m.group(1)
            if name in keys or _foreign(name.split(".")[0], name, keys):
                continue
            if not _resolves(name):
                missing.add(f"{where}: {name}")
    assert not missing, "docstrings name what does not exist:\n" + "\n".join(sorted(missing))


@pytest.mark.parametrize(("name", "exists"), [
    ("store.statefile.write_text_atomic", True), ("gate.Gate", True),
    ("xaf_hub.fleet.follow.FleetFollower", True), ("output.redact", False),
    ("dispatcher.model_state", False), ("gate.make_gate", False), ("ops.live_board.nope", False),
])
def test_the_check_itself_tells_a_name_that_exists_from_one_that_does_not(
    name: str, exists: bool
) -> None:
    foreign = _foreign(name.split(".")[0], name, _config_keys())
    assert (not foreign and _resolves(name)) == exists

