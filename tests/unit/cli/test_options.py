"""The one reader of argparse's namespace: typed records, checked against their annotations."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import pytest

from xaf_hub.cli.main import COMMANDS, build_parser
from xaf_hub.cli.options import Common, OptionError, add_record, build, declared, flag, opt


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
    assert build(Common, ns()) == Common()
    assert Common() == Common(config=None, project=None, debug=False, json=False, wide=False)
    assert build(Common, ns(config="c.json", json=True)).json is True


# -- every option declared once: as a field of the record its command reads ---------------------


def _parsers(parser: argparse.ArgumentParser, path: str = "xaf-hub") -> Iterator[
        tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def declaration_problems(root: argparse.ArgumentParser) -> list[str]:
    """Each option of each command that is not exactly one field of the command's records, each
    field of a record its parser does not take, and each flag that means two things."""
    common = {o.dest for o in declared(Common)} | {"help", "version", "command"}
    problems: list[str] = []
    meaning: dict[str, set[str]] = {}
    for path, parser in _parsers(root):
        records = getattr(parser, "records", [])
        fields = [(o.dest, o.flags) for cls in records for o in declared(cls)]
        own = [a for a in parser._actions
               if a.dest not in common and not isinstance(a, argparse._SubParsersAction)]
        for a in own:
            for word in a.option_strings:
                meaning.setdefault(word, set()).add(a.dest)
            if [x.dest for x in own].count(a.dest) > 1:
                problems.append(f"{path}: {a.dest} declared twice")
            elif (a.dest, tuple(a.option_strings)) not in fields:
                problems.append(f"{path}: {a.option_strings or a.dest} declared outside a record")
        takes = {a.dest for a in parser._actions}
        problems += [f"{path}: {cls.__name__}.{f.name} has no flag"
                     for cls in records for f in dataclasses.fields(cls) if f.name not in takes]
    problems += [f"{word} means {sorted(dests)}" for word, dests in meaning.items()
                 if len(dests) > 1]
    return problems


def test_every_option_of_every_command_is_declared_once_as_a_field_of_its_record() -> None:
    root = build_parser(None)
    assert declaration_problems(root) == []
    walked = [path for path, _ in _parsers(root)]
    assert "xaf-hub backlog set" in walked and len(walked) > len(COMMANDS)


def test_a_second_declaration_or_a_field_without_a_flag_is_found() -> None:
    root = build_parser(None)
    parsers = dict(_parsers(root))
    parsers["xaf-hub status"].add_argument("--fresh-too", dest="fresh", action="store_true")
    parsers["xaf-hub watch"].add_argument("--verbosely", action="store_true")

    @dataclass(frozen=True, kw_only=True)
    class Extra:
        quiet: bool = False

    parsers["xaf-hub doctor"].records.append(Extra)  # type: ignore[attr-defined]
    assert declaration_problems(root) == [
        "xaf-hub status: fresh declared twice",
        "xaf-hub status: fresh declared twice",
        "xaf-hub watch: ['--verbosely'] declared outside a record",
        "xaf-hub doctor: Extra.quiet has no flag",
    ]


def test_one_declaration_gives_the_flag_its_help_type_default_and_field() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Rec:
        name: str = opt(help="the name", required=True, metavar="N")
        count: int = opt("-c", "--count", help="how many", default=2)
        wait: float | None = opt("--wait", help="seconds", const=30.0)
        tags: tuple[str, ...] = opt("--tag", help="a tag", default=(), append=True)
        fast: bool = flag("--fast", help="go fast")
        mode: Literal["a", "b"] | None = opt("--mode", help="the mode", group="m")
        other: bool = flag("--other", help="the other", group="m")

    p = argparse.ArgumentParser(exit_on_error=False)
    add_record(p, Rec)
    got = build(Rec, p.parse_args(["x", "-c", "3", "--wait", "--tag", "a", "--tag", "b"]))
    assert got == Rec(name="x", count=3, wait=30.0, tags=("a", "b"))
    assert build(Rec, p.parse_args(["x"])) == Rec(name="x")
    assert [o.kind for o in declared(Rec)][:4] == [str, int, float, list[str]]
    with pytest.raises(argparse.ArgumentError, match="not allowed with"):
        p.parse_args(["x", "--mode", "a", "--other"])  # one group: one of them
