"""Strict, typed reading of JSON config objects: errors name the file, the key and the fix.

``Reader`` wraps one JSON object (a boolean is never a number; an unknown key gets a "did you
mean"); ``setting`` declares a key once as a dataclass field and ``read_section`` reads every key
a class declares, with the same words.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import field, fields
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from xaf_hub.errors import ConfigError, ConfigProblem

T = TypeVar("T")

# A key's own check: the reader, the key and the value as read (only when the file gives one);
# it returns the value kept (stripped, resolved, converted) or raises ``reader.fail``.
Check = Callable[["Reader", str, Any], Any]


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

    def fail(self, name: str, message: str, problem: ConfigProblem = "value") -> ConfigError:
        return ConfigError(f"{self.file}: key '{self.key(name)}': {message}", problem)

    def get(
        self, name: str, types: tuple[type, ...], default: Any, *, nullable: bool = True
    ) -> Any:
        self.seen.add(name)
        if name not in self.data:
            return default
        value = self.data[name]
        if value is None and nullable:
            return default
        problem = type_problem(value, types)
        if problem:
            raise self.fail(name, problem)
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
            raise self.fail(name, choice_problem(value, choices))
        return str(key)

    def sub(self, name: str) -> Reader:
        value = self.get(name, (dict,), {})
        return Reader(value, self.file, self.key(name))

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            raise self.fail(
                unknown[0], "unknown key" + _suggest(unknown[0], self.seen), "unknown_key"
            )


# The JSON types of a number or a flag, by the field's annotation ("float | None": an optional
# amount, whose check says what it may be; an int or a float has limits of its own).
_JSON_TYPES = {"int": (int,), "float": (int, float), "float | None": (int, float), "bool": (bool,)}


class Setting:
    """How one declared key is read (a field's ``metadata["setting"]``). A plain class: a
    dataclass here would slow every start, ``--help`` included."""

    __slots__ = ("key", "section", "minimum", "maximum", "choices", "quoted", "check")

    def __init__(
        self,
        key: str | None,  # its name in the file; None: the field's name
        section: str,  # for a class read from several objects (Config): the one it is in
        minimum: float,
        maximum: float | None,
        choices: tuple[str, ...],
        quoted: bool,  # the choices named quoted ('file' or 'redis') or bare (file or redis)
        check: Check | None,
    ) -> None:
        self.key, self.section, self.check = key, section, check
        self.minimum, self.maximum = minimum, maximum
        self.choices, self.quoted = choices, quoted

    def read(self, r: Reader, key: str, kind: str, default: Any) -> Any:
        """The value of ``key`` in ``r`` as a ``kind`` (the field's annotation), or ``default``."""
        if kind in _JSON_TYPES:
            value = r.get(key, _JSON_TYPES[kind], default)
        elif kind == "tuple[str, ...]":
            value = r.strings(key, default)
        elif kind in ("str", "str | None", "Path | None"):  # a path: its check makes the Path
            if self.choices and not self.quoted:
                value = r.choice(key, self.choices, default)
            else:
                value = r.get(key, (str,), default)
            if self.choices and value not in (*self.choices, None):
                words = ", ".join(repr(c) for c in self.choices[:-1])
                raise r.fail(key, f"must be {words} or {self.choices[-1]!r}, got {value!r}")
        else:
            raise TypeError(f"config key {key!r}: no reader for the type {kind}")
        if kind in ("int", "float"):
            if not value >= self.minimum:  # NaN too (JSON's NaN reads as a float)
                raise r.fail(key, f"must be at least {self.minimum:g}, got {value}")
            if self.maximum is not None and value > self.maximum:
                raise r.fail(key, f"must be {self.minimum:g}..{self.maximum:g}, got {value}")
            value = float(value) if kind == "float" else value
        if self.check is not None and r.data.get(key) is not None:
            value = self.check(r, key, value)
        return value


def http_url(
    r: Reader, name: str, url: str, credentials: str = "must not carry a user name or password",
    problem: ConfigProblem = "value",
) -> str:
    """An http(s) URL with a host and no user name or password in it (``credentials`` says
    why not, as ``problem``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise r.fail(name, f"must be an http:// or https:// URL, got {url!r}", "bad_url")
    if parts.username or parts.password:
        raise r.fail(name, credentials, problem)
    return url


def each(check: Check) -> Check:
    """``check`` of every item of a list of strings, each named by its place (``key[i]``)."""
    return lambda r, key, items: tuple(check(r, f"{key}[{i}]", v) for i, v in enumerate(items))


def setting(
    default: T,
    *,
    key: str | None = None,
    section: str = "",
    minimum: float = 0.0,
    maximum: float | None = None,
    choices: tuple[str, ...] = (),
    quoted: bool = True,
    check: Check | None = None,
) -> T:
    """A config key declared once, as a dataclass field with this ``default``.

    Its type is the field's annotation: ``int`` or ``float`` (at least ``minimum``, at most
    ``maximum``), ``float | None`` (no limit of its own: ``check`` says what it may be),
    ``bool``, ``str`` or ``str | None`` (one of ``choices`` when given), ``tuple[str, ...]``
    (a list of strings) or ``Path | None`` (a string ``check`` turns into the path). ``key``
    is its name in the file (the field's name when None); ``check`` runs on a value the file
    gives, after the type and the limits.
    """
    rule = Setting(key, section, minimum, maximum, choices, quoted, check)
    return field(default=default, metadata={"setting": rule})


@functools.cache
def _plan(cls: type, section: str) -> tuple[tuple[str, str, str, Setting, Any], ...]:
    """(field, key, annotation, setting, default) of each key ``cls`` declares in ``section``,
    in field order (worked out once a class)."""
    return tuple(
        (f.name, rule.key or f.name, str(f.type), rule, f.default)
        for f in fields(cls)
        if (rule := f.metadata.get("setting")) is not None and rule.section == section
    )


def read_settings(
    cls: type, r: Reader, *, section: str = "", defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Every key ``cls`` declares in ``section``, read from ``r``, by field name; ``defaults``
    replaces a declared default worked out at load time (one scan worker per instance, ...)."""
    got = {}
    for name, key, kind, rule, default in _plan(cls, section):
        if defaults and name in defaults:
            default = defaults[name]
        got[name] = rule.read(r, key, kind, default)
    return got


def read_section(
    cls: type[T], r: Reader, *, defaults: Mapping[str, Any] | None = None, **computed: Any
) -> T:
    """``cls`` with every key it declares read from ``r``, and the fields read another way
    (``computed``). The caller finishes ``r``: keys it reads itself count as known."""
    return cls(**read_settings(cls, r, defaults=defaults), **computed)


def _suggest(name: str, known: set[str]) -> str:
    import difflib  # deferred: start-up, docs/performance.md

    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def type_problem(value: Any, types: tuple[type, ...]) -> str:
    """Why ``value`` is not of the JSON ``types``, in words ("" when it is): every typed JSON
    file (config, task pool) says it the same way; a boolean is never a number."""
    if isinstance(value, types) and (bool in types or not isinstance(value, bool)):
        return ""
    return f"expected {_type_names(types)}, got {json_type(value)}"


def choice_problem(value: Any, choices: tuple[str, ...]) -> str:
    """Why ``value`` is not one of ``choices``, in words ("" when it is)."""
    if value in choices:
        return ""
    return f"must be {', '.join(choices[:-1])} or {choices[-1]}, got {value!r}"


# How a JSON value of each Python type is named in a message.
_WORDS: dict[type, str] = {
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "a list",
    tuple: "a list",
    dict: "an object",
}


def json_type(value: Any) -> str:
    return "null" if value is None else _WORDS.get(type(value), type(value).__name__)


def _type_names(types: tuple[type, ...]) -> str:
    whole = float not in types  # an int that may not be a float
    names = ("a whole number" if t is int and whole else _WORDS.get(t, t.__name__) for t in types)
    return " or ".join(dict.fromkeys(names))


# The kind of file ``load_json_file`` reads -> the problem of its being missing.
_MISSING: dict[str, ConfigProblem] = {
    "config": "config_missing", "password": "password_file_missing",
}


def load_json_file(path: Path, what: str = "config") -> Any:
    """Read a JSON file; errors name the file and, for bad JSON, line and column."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        missing = _MISSING.get(what, "value")
        raise ConfigError(f"{path}: {what} file not found", missing) from None
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot read {what} file: {exc.strerror or exc}", "unreadable"
        ) from None
    return parse_json(raw, lambda problem, code: ConfigError(f"{path}: {problem}", code))


def parse_json(
    raw: bytes, fail: Callable[[str, ConfigProblem], Exception], *, nul: bool = False
) -> Any:
    """``raw`` (UTF-8, a BOM allowed) as JSON, else ``fail(the problem, its code)`` raised; the
    problem names the position (``nul``: a NUL byte is one of its own)."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise fail(f"not UTF-8 text (bad byte at offset {exc.start})", "not_utf8") from None
    if nul and "\x00" in text:
        raise fail(f"contains a NUL byte at offset {text.index(chr(0))}", "bad_json")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise fail(f"invalid JSON at {where}: {exc.msg}", "bad_json") from None


def instances_list(raw: Any, file: Path) -> list[dict[str, Any]]:
    """The ``instances`` value as a list of objects (a list, or an object keyed by name), each
    with a name."""
    if isinstance(raw, dict):
        out = []
        for name, obj in raw.items():
            if not isinstance(obj, dict):
                raise ConfigError(f"{file}: key 'instances.{name}': expected an object")
            if "name" in obj and obj["name"] != name:
                raise ConfigError(f"{file}: key 'instances.{name}.name': differs from its key")
            out.append({**obj, "name": name})
    elif isinstance(raw, list):
        for i, obj in enumerate(raw):
            if not isinstance(obj, dict):
                raise ConfigError(f"{file}: key 'instances[{i}]': expected an object")
        out = list(raw)
    else:
        raise ConfigError(f"{file}: key 'instances': expected a list or an object")
    for i, obj in enumerate(out):
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{file}: key 'instances[{i}].name': expected a non-empty string")
    return out
