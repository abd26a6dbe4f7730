"""One catalogue of words: the page, the chat and the outcome words all read the same entry."""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.core import catalogue
from xaf_hub.core.outcomes import run_words
from xaf_hub.notify.events import Event
from xaf_hub.notify.messages import render
from xaf_hub.page import words


def test_a_word_changed_in_the_catalogue_changes_on_the_page_and_in_the_chat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(catalogue.TEXT, "chat.instance_up", ("Up: {instance}", "恢复：{instance}"))
    monkeypatch.setitem(catalogue.TEXT, "run.failed", ("broke", "坏了"))
    monkeypatch.setitem(catalogue.TEXT, "time.unknown", ("not known", "不知道"))
    up = Event("x", "instance_up", "2026-01-01T00:00:00+00:00", "lan-a")
    assert render(up, language="zh", project="p", page_url="", tz=UTC)[0].endswith("恢复：lan-a")
    assert run_words("failed", "en") == "broke" and words.text("zh", "run.failed") == "坏了"
    assert words.ago("en", 0, 1) == "not known"
    assert "not known" in render(Event("x", "blackout", "t"), language="en", project="p",
                                 page_url="", tz=UTC)[0]


def test_the_catalogue_file_writes_each_key_once_as_an_english_and_chinese_pair() -> None:
    keys: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys.extend(key for key, value in items if key != "sections" and isinstance(value, list))
        return dict(items)

    path = Path(catalogue.__file__).with_name("catalogue.json")
    doc = json.loads(path.read_text("utf-8"), object_pairs_hook=pairs)
    words = [w for section in doc["sections"] for w in section["words"].items()]
    assert all(isinstance(p, list) and len(p) == 2 for _, p in words)
    assert len(words) == len(catalogue.TEXT) > 200  # both languages: tests/unit/page/test_words.py
    assert len(keys) == len(set(keys))  # a key written twice would hide the first wording
