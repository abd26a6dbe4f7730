"""Strict, typed reading of JSON config objects: errors name the file, the key and the fix.

``Reader`` wraps one JSON object: typed getters that reject wrong types (a boolean is never
a number), unknown keys reported with a "did you mean" suggestion, and ``load_json_file``
that names the file and, for bad JSON, the line and column. ``config.py`` builds the
configuration with it; other JSON config sections can use it the same way. Also the names of
the env vars that hold instance passwords (``pw_env_name``, ``password_var``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xaf_hub.errors import ConfigError


class Reader:
    """Typed access to one JSON object that reports unknown keys and wrong types."""

    def __init__(self, data: Any, file: Path | str, where: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{file}: {where or 'top level'} must be an object")
        self.data: dict[str, Any] = data
        self.file = file
        self.where = where
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def fail(self, name: str, message: str) -> ConfigError:
        return ConfigError(f"{self.file}: key '{self.key(name)}': {message}")

    def get(
        self, name: str, types: tuple[type, ...], default: Any, *, nullable: bool = True
    ) -> Any:
        self.seen.add(name)
        if name not in self.data:
            return default
        value = self.data[name]
        if value is None and nullable:
            return default
        if isinstance(value, bool) and bool not in types:
            raise self.fail(name, f"expected {_type_names(types)}, got a boolean")
        if not isinstance(value, types):
            raise self.fail(name, f"expected {_type_names(types)}, got {json_type(value)}")
        return value

    def num(self, name: str, default: float, *, minimum: float = 0.0, integer: bool = False) -> Any:
        types: tuple[type, ...] = (int,) if integer else (int, float)
        value = self.get(name, types, default)
        if value < minimum:
            raise self.fail(name, f"must be at least {minimum:g}, got {value}")
        return value

    def strings(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = self.get(name, (list,), None)
        if value is None:
            return default
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.fail(f"{name}[{i}]", f"expected a string, got {json_type(item)}")
        return tuple(value)

    def choice(
        self, name: str, choices: tuple[str, ...], default: str, *, tags: bool = False
    ) -> str:
        """A string that must be one of ``choices``; with ``tags``, a language tag such as
        "zh-CN" or "en_US" counts as its first part ("zh", "en")."""
        value = self.get(name, (str,), default)
        key = value.strip().lower().replace("_", "-").split("-")[0] if tags else value
        if key not in choices:
            words = f"{', '.join(choices[:-1])} or {choices[-1]}"
            raise self.fail(name, f"must be {words}, got {value!r}")
        return str(key)

    def sub(self, name: str) -> Reader:
        value = self.get(name, (dict,), {})
        return Reader(value, self.file, self.key(name))

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            raise self.fail(unknown[0], "unknown key" + _suggest(unknown[0], self.seen))


def _suggest(name: str, known: set[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _type_names(types: tuple[type, ...]) -> str:
    names = {
        int: "a number",
        float: "a number",
        str: "a string",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
    }
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def load_json_file(path: Path, what: str = "config") -> Any:
    """Read a JSON file; errors name the file and, for bad JSON, line and column."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what} file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None






def instances_list(raw: Any, file: Path) -> list[dict[str, Any]]:
    """The ``instances`` value as a list of objects (a list, or an object keyed by name)."""
    if isinstance(raw, dict):
        out = []
        for name, obj in raw.items():
            if not isinstance(obj, dict):
                raise ConfigError(f"{file}: key 'instances.{name}': expected an object")
            if "name" in obj and obj["name"] != name:
                raise ConfigError(f"{file}: key 'instances.{name}.name': differs from its key")
            out.append({**obj, "name": name})
        return out
    if isinstance(raw, list):
        for i, obj in enumerate(raw):
            if not isinstance(obj, dict):
                raise ConfigError(f"{file}: key 'instances[{i}]': expected an object")
        return list(raw)
    raise ConfigError(f"{file}: key 'instances': expected a list or an object")
