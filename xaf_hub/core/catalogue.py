"""Every word the hub says to people, in English and Chinese, in one catalogue (pure).

A key maps to its (English, Chinese) words; ``text(lang, key, **values)`` fills ``{name}``
placeholders. The page (``page.words``), the chat (``notify.messages``), the words of a run's
outcome and a task's state (``core.outcomes``) and the config notes all read from here, so a
word is written and translated once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

Lang = Literal["en", "zh"]
LANGS: tuple[Lang, ...] = ("en", "zh")

# key -> (English, Chinese), read once from catalogue.json (data beside the code, grouped by
# where the words appear). Keep the wording plain: the readers are not programmers.
_DOC = json.loads(Path(__file__).with_name("catalogue.json").read_text("utf-8"))
TEXT: dict[str, tuple[str, str]] = {
    key: (en, zh) for section in _DOC["sections"] for key, (en, zh) in section["words"].items()
}


def text(lang: str, key: str, **values: object) -> str:
    """The ``lang`` wording of ``key`` (Chinese for "zh", else English) with ``{name}``
    placeholders filled."""
    words = TEXT[key][lang == "zh"]
    return words.format(**values) if values else words

