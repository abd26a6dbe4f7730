"""Typed options: each command reads one frozen record, built here from argparse's namespace.

A command declares what it reads as a dataclass whose field names are its options' ``dest``
names (the ``DispatchOrder`` pattern), and asks ``ctx.options(Options)``. ``build`` is the one
place an argparse namespace is read: every field is checked against its annotation, so a
misspelt field or an option of the wrong type is a loud internal error on the first run of the
command's tests, not a silent ``None``; mypy checks every read of the record.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
from collections.abc import Sequence
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Common:
    """The options every command has (``--config``, ``--debug``; ``--json``, ``--wide`` where the
    command takes them)."""

    config: str | None = None
    debug: bool = False
    json: bool = False
    wide: bool = False


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
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
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
