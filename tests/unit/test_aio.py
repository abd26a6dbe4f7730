"""Tests for xaf_hub.aio.run: asyncio.run without formatting the result on the way out."""

from __future__ import annotations

import asyncio

import pytest

from xaf_hub import aio


class Counted:
    """A result that counts how often it is formatted with repr()."""

    reprs = 0

    def __repr__(self) -> str:
        Counted.reprs += 1
        return "Counted()"


async def _give(value: object) -> object:
    await asyncio.sleep(0)
    return value


def test_returns_the_coroutine_result_without_formatting_it() -> None:
    Counted.reprs = 0
    value = Counted()
    assert aio.run(_give(value)) is value
    assert Counted.reprs == 0


def test_exceptions_propagate() -> None:
    async def fail() -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError, match="nope"):
        aio.run(fail())


def test_none_is_a_result_like_any_other() -> None:
    assert aio.run(_give(None)) is None
