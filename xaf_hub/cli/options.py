"""Options declared once: each command's options record is a frozen dataclass whose fields
are its options (``opt``, ``flag``, ``Opt.field``): one declaration gives the field, the flag,
its help, type and default, and the MCP tool's parameter. The parser is built from the record
(``add_record``), and ``build`` is the one place an argparse namespace is read: every field is
checked against its annotation, so an option of the wrong type is a loud internal error on the
first run of the command's tests, not a silent ``None``; mypy checks every read of the record.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


PROJECT_HELP = "the project to work on (needed when the config names several)"


class OptionError(TypeError):
    """A command's options record does not match what its parser defines (a programming error)."""


def _fits(value: Any, hint: Any) -> bool:
    origin = get_origin(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin in (Union, types.UnionType):
        return any(_fits(value, h) for h in get_args(hint))
    if origin is Literal:
        return value in get_args(hint)
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        inner = [a for a in get_args(hint) if a is not Ellipsis]
        return not inner or all(_fits(v, inner[0]) for v in value)
    if hint in (int, float):  # an int is a float's value too; a bool is neither
        return isinstance(value, (int, hint)) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a hint this checker does not read (mypy still checks every use)


@functools.cache
def _hints(cls: type[Any]) -> dict[str, Any]:
    return get_type_hints(cls)


def build(cls: type[T], namespace: argparse.Namespace) -> T:
    """The record ``cls`` from ``namespace``: each field read by its name, checked against its
    annotation; a field the parser did not define takes the field's default (an option another
    form of the command has), and one with no default is an error."""
    if not dataclasses.is_dataclass(cls):
        raise OptionError(f"{cls.__qualname__} is not a dataclass")
    given = vars(namespace)
    values: dict[str, Any] = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name not in given:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise OptionError(f"{cls.__qualname__}.{f.name}: the parser defines no such option")
            continue
        value = given[f.name]
        if isinstance(value, list) and get_origin(hints[f.name]) is tuple:
            value = tuple(value)
        if not _fits(value, hints[f.name]):
            raise OptionError(
                f"{cls.__qualname__}.{f.name}: {value!r} is not {hints[f.name]}"
            )
        values[f.name] = value
    return cls(**values)


# -- options declared once: the record's field, argparse's flag and the MCP tool's parameter ------

MAX_TEXT = 64_000  # one task text: far more than any prompt needs, far less than a memory risk
MAX_SHORT = 512  # a title, a keyword, an instance or session id, a model, a directory
HIDDEN = argparse.SUPPRESS  # the help of an option for tests and demos, left out of --help


@dataclasses.dataclass(frozen=True)
class Opt:
    """One option, declared once as a field of its command's options record (``Opt.field``):
    flags, help, default and limits here; its name (``dest``, also the MCP parameter) and kind
    come from the field (``declared``). ``add_options`` gives argparse its face,
    ``tool_parameter`` the MCP tool's.

    No ``flags``: a positional argument. ``const``: the value of the flag given bare. Options of
    one ``group`` exclude each other. ``tool_help`` is for the rare option whose meaning differs
    on the MCP face.
    """

    flags: tuple[str, ...]
    help: str | None = None
    default: Any = None
    metavar: str | None = None
    required: bool = False
    append: bool = False
    const: Any = None
    group: str | None = None
    max_length: int | None = MAX_SHORT
    max_items: int | None = None
    minimum: int | None = None
    maximum: int | None = None
    tool_help: str | None = None
    dest: str = ""
    kind: Any = str

    def but(self, **changes: Any) -> Opt:
        """This option with some fields changed (another command's wording or default)."""
        return dataclasses.replace(self, **changes)

    def field(self, **changes: Any) -> Any:
        """A field of an options record that is this option (``changes``: ``but``'s)."""
        o = self.but(**changes)
        if o.required:
            return dataclasses.field(metadata={"opt": o})
        default = tuple(o.default) if isinstance(o.default, list) else o.default
        return dataclasses.field(default=default, metadata={"opt": o})

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The words a ``Literal`` kind allows."""
        return tuple(get_args(self.kind)) if get_origin(self.kind) is Literal else None

    def add_to(self, parser: argparse.ArgumentParser | Any, suppress: bool = False) -> None:
        """This option's argparse face (``parser`` may be a mutually exclusive group);
        ``suppress``: no default, so a value given before the subcommand is kept."""
        how: dict[str, Any] = {"help": self.help}
        if self.kind is bool:
            how.update(action="store_true")
        else:
            how["metavar"] = self.metavar
            if get_origin(self.kind) is list:
                # A positional list that may be empty takes none or more words ("*").
                many = "*" if not self.flags and not self.required else "+"
                how.update(default=list(self.default or []))
                how.update(action="append") if self.append else how.update(nargs=many)
            else:
                how["default"] = self.default
                if self.choices:
                    how["choices"] = self.choices
                elif self.kind in (int, float):
                    how["type"] = self.kind
                if self.const is not None:
                    how.update(nargs="?", const=self.const)
        if suppress:
            how["default"] = argparse.SUPPRESS
        if self.flags:  # a positional is named by its dest, and is required unless "?"
            how.update(dest=self.dest, required=self.required)
        elif not self.required:
            how.setdefault("nargs", "?")
        parser.add_argument(*(self.flags or (self.dest,)), **how)

    def tool_parameter(self) -> tuple[Any, Any]:
        """(annotation, default) of this option as an MCP tool parameter: pydantic's ``Field``
        carries the help and the limits, so the tool's JSON schema states them."""
        # deferred: an optional dependency (the mcp extra), see docs/performance.md
        from pydantic import Field

        limits: dict[str, Any] = {"description": self.tool_help or self.help}
        kind: Any = self.kind
        if get_origin(self.kind) is list:
            item = Annotated[str, Field(min_length=1, max_length=self.max_length)]
            kind = list[item]
            if self.max_items is not None:
                limits["max_length"] = self.max_items
        elif self.kind is str:
            limits["max_length"] = self.max_length
            if self.required:
                limits["min_length"] = 1
        elif self.kind is int:
            limits.update(ge=self.minimum, le=self.maximum)
        default: Any = inspect.Parameter.empty if self.required else self.default
        if default is None and kind is not bool:
            kind = kind | None
        return Annotated[kind, Field(**limits)], default


def opt(*flags: str, **how: Any) -> Any:
    """A field of an options record declared as its option (``Opt``'s fields by name)."""
    return Opt(flags, **how).field()


def flag(*flags: str, **how: Any) -> Any:
    """A field of an options record that is a flag (false unless given)."""
    return opt(*flags, default=False, **how)


def _kind(hint: Any) -> Any:
    """The kind of option a field's annotation declares: ``None`` dropped, a tuple a list."""
    if get_origin(hint) in (Union, types.UnionType):
        hint = next(h for h in get_args(hint) if h is not type(None))
    return list[str] if get_origin(hint) is tuple else hint


def declared(cls: type[Any]) -> tuple[Opt, ...]:
    """The options of the record ``cls``, in its fields' order, named and typed by them."""
    hints = get_type_hints(cls)
    return tuple(f.metadata["opt"].but(dest=f.name, kind=_kind(hints[f.name]))
                 for f in dataclasses.fields(cls) if "opt" in f.metadata)


def add_options(
    parser: argparse.ArgumentParser | Any, options: Sequence[Opt], suppress: bool = False
) -> None:
    """Every option's argparse face, in order (options of one ``group`` in one exclusive
    group)."""
    groups: dict[str, Any] = {}
    for o in options:
        if o.group and o.group not in groups:
            groups[o.group] = parser.add_mutually_exclusive_group()
        o.add_to(groups[o.group] if o.group else parser, suppress)


def add_record(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """The options of the record ``cls`` on ``parser``, which remembers the record (a test
    checks every flag of every parser against its records)."""
    records = getattr(parser, "records", None)
    if isinstance(records, list):
        records.append(cls)
    add_options(parser, declared(cls))


def pick(options: Sequence[Opt], *names: str) -> tuple[Opt, ...]:
    """The options named, in the order named (a tool offers a command's options or some)."""
    by_name = {o.dest: o for o in options}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise OptionError(f"no such option declared: {', '.join(missing)}")
    return tuple(by_name[n] for n in names)


def record(cls: type[T], given: Mapping[str, Any]) -> T:
    """The record ``cls`` from values given by name (an MCP call); an option not given takes
    its field's default, as argparse would give it. Checked as ``build`` checks."""
    return build(cls, argparse.Namespace(**given))


JSON = Opt(("-j", "--json"), "print JSON for scripts on stdout", default=False)
WIDE = Opt(("-w", "--wide"), "show every column whole (on a terminal, tables are cut to its width)",
           default=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Answers:
    """The record of a command that answers in JSON with --json (its first option)."""

    json: bool = JSON.field()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tables(Answers):
    """The record of a command that prints tables, whole with --wide."""

    wide: bool = WIDE.field()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Common(Tables):
    """The options every command has (``GLOBAL``: given before or after the command), and
    ``--json`` and ``--wide`` where the command's record declares them (``Answers``,
    ``Tables``)."""

    config: str | None = opt("--config", help="config file (default: see README)", metavar="PATH")
    project: str | None = opt("--project", help=PROJECT_HELP, metavar="NAME")
    debug: bool = flag("--debug", help="show tracebacks on errors")


GLOBAL = ("config", "project", "debug")


def common_parser(suppress: bool = False) -> argparse.ArgumentParser:
    """A parser of the ``GLOBAL`` options only, the parent of the root parser and of each
    command's (``suppress``: on a command, so a value given before it is kept)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_options(parser, pick(declared(Common), *GLOBAL), suppress)
    return parser
