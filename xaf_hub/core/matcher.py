"""Rank sessions against a task text: TF-IDF over character n-grams, cosine similarity.

This is the only module that imports numpy, and it does so inside `rank`: the
CLI starts, and every command that does not smart-match runs, without it.

The TF-IDF weights are scikit-learn's (`TfidfTransformer(sublinear_tf=True)`:
smooth idf, l2 norm), computed with a few numpy calls rather than by
scikit-learn itself: its import alone cost about 1.1 s of CPU and 70 MB per
dispatch, more than the whole match. The unit tests check the weights and
scores against scikit-learn's transformer on generated corpora.

Why our own n-grams instead of sklearn's `char_wb` (measured on realistic
titles; the cases are in tests/unit/test_matcher.py):

* Chinese has no spaces, and one Han character is roughly one morpheme, so
  character bigrams are roughly words (登录, 样式, 回调). Unigrams add matches on
  single shared characters (用, 户, 新) that pushed unrelated tasks over the
  0.12 default threshold; trigrams only dilute short titles.
* In English a letter bigram or trigram is not a word: `char_wb` 1-3 or 2-3
  gave "Write release notes for v2.3" a 0.20 similarity to "Add unit tests
  for order service" (through "for", "tes", "es "). Padded 3-5 grams inside
  each word keep stems ("style"/"styles", "refactor"/"refactoring") while a
  whole short word ("csv", "502") still counts as one unit.
* English function words ("for", "the", "to") are dropped before n-gramming:
  they occur in many titles and carry no task meaning.

So each script gets the n-gram size at which a character n-gram means
something; both feed one TF-IDF space.
"""

from __future__ import annotations

import heapq
import re
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """One ranked document: the caller's key and its cosine similarity to the query."""

    key: str
    score: float


# Scripts written without spaces between words: kana, Han (BMP, Ext A, compat,
# Ext B and later planes), Hangul syllables.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f"
_CJK_CHAR = re.compile(rf"[{_CJK}]")
# A run of CJK characters, or a run of other letters/digits. Underscores and
# punctuation (path separators included) end a run, so an n-gram never
# straddles `order_service`, `web/src` or `D:\work`.
_RUN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")

_LATIN_NGRAMS = range(3, 6)

_STOP_WORDS = frozenset(
    {"a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "into", "is", "it"}
    | {"of", "on", "or", "the", "this", "that", "to", "with"}
)

# opencode names an untitled session "New session - <ISO time>" (sub-agents:
# "Child session - ..."); that text says nothing about the task, and its shared
# words and digits would make every untitled session look alike to any query.
_PLACEHOLDER_TITLE = re.compile(r"(new|child) session - \d{4}-\d\d-\d\dT[\d:.]+Z?", re.IGNORECASE)

# A Windows drive designator as a whole path segment ("c:").
_DRIVE = re.compile(r"[a-z]:")


def _runs(text: str) -> list[str]:
    """Split text into runs of CJK characters and runs of other letters/digits."""
    # NFKC folds full-width Latin and digits typed with a Chinese IME (ＣＳＶ, ５０２)
    # into their ASCII forms, so they match titles typed the other way.
    return _RUN.findall(unicodedata.normalize("NFKC", text).lower())


def _run_grams(run: str) -> list[str]:
    """Return the character n-grams of one run (see the module docstring for the sizes)."""
    if _CJK_CHAR.match(run):
        if len(run) == 1:
            return [run]
        return [run[i : i + 2] for i in range(len(run) - 1)]
    if run in _STOP_WORDS:
        return []
    padded = f" {run} "
    return [padded[i : i + n] for n in _LATIN_NGRAMS for i in range(len(padded) - n + 1)]


def _tfidf(texts: list[str]) -> tuple[Any, Any, Any, int]:
    """Return the L2-normalised TF-IDF weights of the texts as sparse (row, column, value) arrays
    and the number of columns.

    Rows are texts, columns n-grams numbered in sorted order; entries are sorted by row, then
    column. The weights are scikit-learn's (see the module docstring).
    """
    import numpy as np

    # Counting n-grams one by one in Python is several times slower at 10k sessions than
    # the 0.3 s budget allows. Runs (words, directory segments, CJK phrases) repeat heavily
    # across titles and directories, so n-gram each distinct run once and expand in numpy.
    all_runs: list[str] = []
    runs_per_text: list[int] = []
    for text in texts:
        runs = _runs(text)
        all_runs.extend(runs)
        runs_per_text.append(len(runs))
    # Number distinct runs in first-seen order; fromkeys and map run in C.
    run_ids: dict[str, int] = dict.fromkeys(all_runs, 0)
    for i, run in enumerate(run_ids):
        run_ids[run] = i
    grams_of_run = [_run_grams(run) for run in run_ids]  # dicts keep insertion order = id
    flat_grams = [gram for grams in grams_of_run for gram in grams]
    # np.unique numbers the n-grams in sorted order, in C. Sorted numbering makes the
    # entries of a text, and so the floating-point sums behind every score, independent of
    # the order of the documents and of the words in a text: texts equal up to word order
    # get exactly equal scores, and ties go by key.
    vocabulary, gram_column = np.unique(np.array(flat_grams, dtype=str), return_inverse=True)
    gram_column = gram_column.astype(np.int64)
    grams_per_run = np.fromiter(map(len, grams_of_run), dtype=np.int64, count=len(grams_of_run))
    first_gram = np.cumsum(grams_per_run) - grams_per_run

    # Expand every run occurrence into its n-grams: occurrence -> (text, n-gram column).
    occurrence_run = np.fromiter(
        map(run_ids.__getitem__, all_runs), dtype=np.int64, count=len(all_runs)
    )
    occurrence_text = np.repeat(np.arange(len(texts), dtype=np.int64), runs_per_text)
    width = grams_per_run[occurrence_run]
    total = int(width.sum())
    shift = np.repeat(first_gram[occurrence_run] - (np.cumsum(width) - width), width)
    columns = gram_column[shift + np.arange(total, dtype=np.int64)]
    rows = np.repeat(occurrence_text, width)

    # One entry per (text, n-gram) with its count, sorted by text then n-gram.
    keys, counts = np.unique(rows * len(vocabulary) + columns, return_counts=True)
    rows, columns = np.divmod(keys, len(vocabulary))
    document_frequency = np.bincount(columns, minlength=len(vocabulary))
    idf = np.log((1.0 + len(texts)) / (1.0 + document_frequency)) + 1.0
    values = (1.0 + np.log(counts)) * idf[columns]
    norms = np.sqrt(np.bincount(rows, weights=values * values, minlength=len(texts)))
    values /= norms[rows]
    return rows, columns, values, len(vocabulary)


def preload() -> threading.Thread:
    """Start importing numpy in a background thread; returns the thread.

    The import costs about 0.2 s of CPU; dispatch starts it before its network scan so the two
    overlap. ``rank`` then finds the module loaded (or waits for the import lock).
    """

    def load() -> None:
        import numpy  # noqa: F401

    thread = threading.Thread(target=load, name="xaf-hub-numpy-preload", daemon=True)
    thread.start()
    return thread


def document_text(title: str, directory: str) -> str:
    """Build the text that represents one session for matching: title plus directory."""
    title = title.strip()
    if _PLACEHOLDER_TITLE.fullmatch(title):
        title = ""
    # Same normalisation as the project rules (architecture §2): `\` and `/` alike,
    # repeated and trailing separators gone, lower case. The drive letter is
    # dropped and segments are joined by spaces, so `D:\Work\demo\web` and
    # `/work/demo/web` give the same text and the same n-grams.
    segments = [
        segment
        for segment in directory.replace("\\", "/").lower().split("/")
        if segment and not _DRIVE.fullmatch(segment)
    ]
    return " ".join(part for part in (title, " ".join(segments)) if part)


def rank(query: str, documents: Sequence[tuple[str, str]], top: int = 5) -> list[Candidate]:
    """Return the `top` documents most similar to the query, best first."""
    if top < 1 or not documents or not any(_run_grams(run) for run in _runs(query)):
        return []

    import numpy as np

    # The query is weighted with the documents so that its n-grams are in the
    # vocabulary and IDF sees the whole population being compared. Sublinear tf
    # damps an n-gram repeated within one text (a project name recurring along
    # a path); on realistic titles its effect is small.
    rows, columns, values, width = _tfidf([text for _, text in documents] + [query])
    query_row = len(documents)
    query_weights = np.zeros(width)
    in_query = rows == query_row
    query_weights[columns[in_query]] = values[in_query]
    # Rows are L2-normalised, so each text's dot product with the query is the
    # cosine similarity; only n-grams the query has contribute.
    raw = np.bincount(rows, weights=values * query_weights[columns], minlength=query_row + 1)
    scores: list[float] = np.clip(raw[:query_row], 0.0, 1.0).tolist()

    keys = [key for key, _ in documents]
    count = min(top, len(scores))
    # nsmallest on (-score, key) is a partial sort, O(n log top); ties go by key.
    best = heapq.nsmallest(count, range(len(scores)), key=lambda i: (-scores[i], keys[i]))
    return [Candidate(key=keys[i], score=scores[i]) for i in best]
