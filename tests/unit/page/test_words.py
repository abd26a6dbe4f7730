"""The page's word catalogue: both languages complete, relative times, language choice."""

from __future__ import annotations

import re
import string

import pytest

from xaf_hub.core.catalogue import TEXT
from xaf_hub.page import words as page_text
from xaf_hub.page.words import ago, pick_language, text

NOW = 1_700_000_000_000
MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR
_CJK = re.compile(r"[\u4e00-\u9fff]")


def fields(words: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(words) if name}


@pytest.mark.parametrize("key", sorted(TEXT))
def test_every_entry_has_both_languages_with_the_same_placeholders(key: str) -> None:
    en, zh = TEXT[key]
    assert fields(en) == fields(zh), key
    if key in ("ap.by_unknown",):
        return
    assert en.strip() and zh.strip(), key
    assert not _CJK.search(en), key  # no Chinese in the English page...
    # ...and the Chinese wording is Chinese, apart from names, numbers and commands
    if key not in ("ap.by", "down.item", "page.title", "cards.bar_count", "cards.of",
                   "chat.prefix"):
        assert _CJK.search(zh), key


@pytest.mark.parametrize(
    ("then", "en", "zh"),
    [
        (0, "unknown", "未知"),
        (NOW - 30_000, "just now", "刚刚"),
        (NOW - MIN, "1 minute ago", "1 分钟前"),
        (NOW - 5 * MIN, "5 minutes ago", "5 分钟前"),
        (NOW - 3 * HOUR, "3 hours ago", "3 小时前"),
        (NOW - DAY, "1 day ago", "1 天前"),
        (NOW - 75 * DAY, "2 months ago", "2 个月前"),
        (NOW - 800 * DAY, "2 years ago", "2 年前"),
        (NOW + 10 * MIN, "in 10 minutes", "10 分钟后"),
    ],
)
def test_relative_times_in_both_languages(then: int, en: str, zh: str) -> None:
    assert ago("en", then, NOW) == en
    assert ago("zh", then, NOW) == zh


def test_clock_words_carry_what_the_script_needs() -> None:
    words = page_text.clock_words("zh")
    assert words["now"] == "刚刚" and words["zh"] is True
    units = words["units"]
    assert isinstance(units, list) and units[-1][1] == 0  # years: the open-ended last unit
    assert page_text.clock_words("en")["ago"] == "{span} ago"


@pytest.mark.parametrize(
    ("setting", "header", "lang"),
    [
        ("auto", "zh-CN,zh;q=0.9,en;q=0.8", "zh"),
        ("auto", "en-US,en;q=0.9,zh-CN;q=0.8", "en"),
        ("auto", "zh-TW", "zh"),
        ("auto", "de-DE,en;q=0.1,zh;q=0.2", "zh"),
        ("auto", "zh;q=0, en", "en"),
        ("auto", "zh;q=bad, en;q=0.5", "en"),
        ("auto", "*", "en"),
        ("auto", None, "en"),
        ("zh", "en-US", "zh"),
        ("en", "zh-CN", "en"),
    ],
)
def test_pick_language(setting: str, header: str | None, lang: str) -> None:
    assert pick_language(setting, header) == lang


def test_sentences_with_a_live_time() -> None:
    sentence = text("en", "page.data_from", exact="2024-01-01 10:00", when=page_text.WHEN)
    # The page's template splits a sentence at its mark (``say``): one mark, where the time goes.
    assert sentence.split(page_text.WHEN) == ["Data from 2024-01-01 10:00 (", ")."]
    assert page_text.clean(f"a{page_text.WHEN}b") == "ab"
