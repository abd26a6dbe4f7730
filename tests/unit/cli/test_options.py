"""The one reader of argparse's namespace: typed records, checked against their annotations."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

import pytest

from xaf_hub.cli.options import Common, OptionError, build


@dataclass(frozen=True)
class Opts:
    text: str
    instance: str | None = None
    count: int = 1
    wait: float | None = None
    mode: Literal["a", "b"] = "a"
    tags: tuple[str, ...] = ()


def ns(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**kw)


def test_fields_are_read_by_name_and_lists_become_tuples() -> None:
    got = build(Opts, ns(text="t", instance="dev", count=3, wait=2, mode="b", tags=["x", "y"],
                         unrelated=True))
    assert got == Opts("t", "dev", 3, 2, "b", ("x", "y"))


def test_an_option_the_parser_lacks_takes_the_default_unless_required() -> None:
    assert build(Opts, ns(text="t")) == Opts("t")
    with pytest.raises(OptionError, match=r"Opts.text: the parser defines no such option"):
        build(Opts, ns(instance="dev"))


@pytest.mark.parametrize("field, value", [
    ("count", "3"), ("count", True), ("wait", "soon"), ("mode", "c"), ("tags", ["x", 1]),
    ("text", None), ("instance", 5),
])
def test_a_value_of_the_wrong_type_is_refused_with_its_field(field: str, value: object) -> None:
    with pytest.raises(OptionError, match=rf"Opts.{field}: "):
        build(Opts, ns(**{"text": "t", field: value}))


def test_common_options_default_when_a_command_has_none() -> None:
    assert build(Common, ns()) == Common(None, False, False, False)
    assert build(Common, ns(config="c.json", json=True)).json is True
