"""Rank sessions against a task text: TF-IDF over character n-grams, cosine similarity.

Pure Python (``Index``: an inverted index over sparse vectors), with scikit-learn's weights times
a weight per field and for generic words; why these n-grams and the glossary are in
docs/matching.md.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")


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
    if not text.isascii():  # NFKC leaves ASCII as it is
        text = unicodedata.normalize("NFKC", text)
    return _RUN.findall(text.lower())


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


# What the work *is* counts more than the words every task uses. A session's evidence comes in
# fields of different worth: its title and the task texts the hub sent into it say what it does;
# the files it changed and its folder say where, and are shared by every session working there
# (on the labelled set, files at 0.6 lost more continuations than they found; 0.3 did not).
# Words that any task might use ("add", "fix", "tests", "page", 修复, 页面) are weighted down
# in every field and in the query: on their own they never make a match.
TITLE_WEIGHT = 1.0
TASK_WEIGHT = 1.0
FILE_WEIGHT = 0.3
FOLDER_WEIGHT = 0.3
# The agent's own words (its todo items, its newest reply) say what the work became, but at
# length and about its neighbours too (tests, lint, what it read): half a task text's weight.
AGENT_WEIGHT = 0.5
GENERIC_WEIGHT = 0.25

# Whole words (after NFKC and lower-casing) weighted by GENERIC_WEIGHT.
_GENERIC_WORD_LIST = (
    "add adds added adding allow also again all any app apps bug bugs build can change changes "
    "check code create default do does doc docs document documentation done error errors every "
    "feature file files finish fix fixed fixes fixing get go handle implement improve instead "
    "issue issues js json let list make makes md more must new next not now only page pages py "
    "remove run script scripts see server service set should show so some src still support "
    "test tested testing tests then tool ts tsx unit up update updates use user users want web "
    "when work write writing yet api apis endpoint endpoints one two upgrade guide option "
    "options version"
)
_GENERIC_WORDS = frozenset(_GENERIC_WORD_LIST.split())
# Chinese bigrams weighted by GENERIC_WEIGHT: verbs and nouns of any task, and the glue
# bigrams a sentence is full of.
_GENERIC_BIGRAM_LIST = (
    "增加 添加 新增 加上 加一 一个 一下 修复 优化 支持 页面 测试 单元 元测 文档 接口 功能 问题 "
    "还是 需要 要能 时候 改成 改一 再改 一份 写一 处理 实现 继续 现在 用户 时要 的时 之后 以后 "
    "后台 管理 数据 系统 项目 代码 脚本 上的 中的 里的 没有 不对 能够 可以 要求"
)
_GENERIC_BIGRAMS = frozenset(_GENERIC_BIGRAM_LIST.split())


def _weighted_run_grams(run: str) -> list[tuple[str, float]]:
    """The n-grams of one run, each with its generic-word factor (1 or GENERIC_WEIGHT); a
    Chinese run also carries the English n-grams of the glossary's terms it holds."""
    grams = _run_grams(run)
    if _CJK_CHAR.match(run):
        out = [(g, GENERIC_WEIGHT if g in _GENERIC_BIGRAMS else 1.0) for g in grams]
        for word in _english(run):  # at the generic weight: tried at 1, new work rose
            out += [(g, GENERIC_WEIGHT) for g in _run_grams(word)]
        return out
    factor = GENERIC_WEIGHT if run in _GENERIC_WORDS else 1.0
    return [(g, factor) for g in grams]


# Chinese terms of software work and the English words for them (core/glossary.json): a follow-
# up is often written in the other language than its session ("the login page" for 修复登录页),
# and character n-grams share nothing across scripts. A Chinese run's terms bring their English
# words' n-grams, so both languages meet in one space.
_TERM_SIZES = range(2, 7)


@functools.cache
def _glossary() -> dict[str, tuple[str, ...]]:
    """The glossary's terms, read once on first use."""
    doc = json.loads((Path(__file__).with_name("glossary.json")).read_text("utf-8"))
    return {
        term: tuple(dict.fromkeys(w for phrase in words for w in _runs(phrase)))
        for term, words in doc["terms"].items()
    }


def _english(run: str) -> list[str]:
    """The English words of the glossary's terms found in one Chinese run, longest term first
    at each place (登录页 holds 登录; a term inside a longer one found is not counted again)."""
    terms = _glossary()
    words: list[str] = []
    i = 0
    while i < len(run) - 1:
        for size in reversed(_TERM_SIZES):
            found = terms.get(run[i : i + size])
            if found is not None:
                words.extend(found)
                i += size
                break
        else:
            i += 1
    return words


@dataclass(frozen=True)
class Evidence:
    """What the hub knows of one session: title, folder, the task texts sent into it (its first
    prompt among them), the files it changed and what its agent said of the work (its todo
    items and its newest reply, ``agent``)."""

    title: str = ""
    folder: str = ""
    tasks: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    agent: tuple[str, ...] = ()

    def fields(self, folder: Callable[[str], str] | None = None) -> list[tuple[str, float]]:
        """The texts to match with the weight of the field each comes from (``folder``: how a
        directory becomes words, ``folder_text`` unless given)."""
        title = self.title.strip()
        if " - " in title and _PLACEHOLDER_TITLE.fullmatch(title):
            title = ""
        out = [(title, TITLE_WEIGHT), ((folder or folder_text)(self.folder), FOLDER_WEIGHT)]
        out += [(task, TASK_WEIGHT) for task in self.tasks]
        out += [(path, FILE_WEIGHT) for path in self.files]
        out += [(said, AGENT_WEIGHT) for said in self.agent]
        return [(text, weight) for text, weight in out if text]

    def adding(
        self, tasks: Sequence[str] = (), files: Sequence[str] = (), agent: Sequence[str] = ()
    ) -> Evidence:
        """This evidence with more task texts, files and agent's words (what a session's own
        messages show), each text counted once however often it is known."""
        known, held, heard = set(self.tasks), set(self.files), set(self.agent)
        more = tuple(dict.fromkeys(t for t in tasks if t not in known))
        paths = tuple(dict.fromkeys(f for f in files if f not in held))
        said = tuple(dict.fromkeys(a for a in agent if a and a not in heard))
        return Evidence(
            self.title, self.folder, self.tasks + more, self.files + paths, self.agent + said
        )


Document = str | Evidence


@dataclass(frozen=True)
class _Row:
    """One text's n-grams: how often each occurs, and the weight of those whose weight is not 1
    (the highest of its occurrences: its field's weight times its generic-word factor)."""

    counts: Counter[str]
    weights: dict[str, float]


class _Memo(dict[_K, _V]):
    """key -> ``make(key)``, made on first use and kept (the caches of ``_Grams`` and ``Index``)."""

    def __init__(self, make: Callable[[_K], _V]) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, key: _K) -> _V:
        found = self[key] = self.make(key)
        return found


_Split = tuple[tuple[str, ...], tuple[str, ...]]  # n-grams at weight 1, at the generic weight


class _Grams:
    """n-grams of texts, each distinct text and run n-grammed once (titles, folders and paths
    repeat heavily across a fleet). Counting and weighting run in C (Counter, dict.fromkeys): a
    fleet of 10k sessions is about a million n-gram occurrences."""

    def __init__(self, weighted: bool = True) -> None:
        self.weighted = weighted
        self.runs: _Memo[str, _Split] = _Memo(self._run)
        self.texts: _Memo[str, _Split] = _Memo(self._text)
        self.rows: _Memo[str, _Row] = _Memo(self._row)
        self.folders: _Memo[str, str] = _Memo(folder_text)
        self.sets: _Memo[str, frozenset[str]] = _Memo(self._set)
        self.run_sets: _Memo[str, frozenset[str]] = _Memo(lambda r: frozenset(chain(*self.runs[r])))

    def _run(self, run: str) -> _Split:
        grams = _weighted_run_grams(run)
        if not self.weighted:
            return tuple(g for g, _ in grams), ()
        return tuple(g for g, f in grams if f == 1.0), tuple(g for g, f in grams if f != 1.0)

    def _text(self, text: str) -> _Split:
        parts = [self.runs[run] for run in _runs(text)]
        plain = tuple(chain.from_iterable(p for p, _ in parts))
        return plain, tuple(chain.from_iterable(g for _, g in parts))

    def _row(self, text: str) -> _Row:
        plain, generic = self.texts[text]
        low = set(generic).difference(plain)
        return _Row(Counter(plain + generic), dict.fromkeys(low, GENERIC_WEIGHT))

    def of(self, document: Document) -> _Row:
        """The n-grams of one document (a plain text counts at weight 1)."""
        if isinstance(document, str):
            return self.rows[document]
        # (weight, n-grams occurring at it), every field of the evidence
        groups: list[tuple[float, tuple[str, ...]]] = []
        for text, weight in document.fields(self.folders.__getitem__):
            plain, generic = self.texts[text]
            groups.append((weight, plain))
            if generic:
                groups.append((weight * GENERIC_WEIGHT, generic))
        counts = Counter(chain.from_iterable(grams for _, grams in groups))
        # Only weights other than 1 are kept; a higher weight overwrites a lower: the highest wins.
        groups.sort(key=lambda group: group[0])
        weights: dict[str, float] = {}
        for weight, grams in groups:
            if weight != 1.0:
                weights.update(dict.fromkeys(grams, weight))
            elif weights:
                for gram in grams:
                    weights.pop(gram, None)
        return _Row(counts, weights)

    def sets_of(self, document: Document) -> list[frozenset[str]]:
        """The n-gram sets of a document's texts (cached: no counting)."""
        if isinstance(document, str):
            return [self.sets[document]]
        return [self.sets[text] for text, _ in document.fields(self.folders.__getitem__)]

    def _set(self, text: str) -> frozenset[str]:
        # A union of the runs' cached sets, in C: no n-gram is counted here.
        return frozenset().union(*map(self.run_sets.__getitem__, _runs(text)))


def _idf(n: int, df: int) -> float:
    return math.log((1.0 + n) / (1.0 + df)) + 1.0


def _values(row: _Row, idf: Callable[[str], float]) -> dict[str, float]:
    """A row's TF-IDF values before the norm."""
    w = row.weights
    if not w:
        return {g: (1.0 + math.log(c)) * idf(g) for g, c in row.counts.items()}
    return {g: (1.0 + math.log(c)) * idf(g) * w.get(g, 1.0) for g, c in row.counts.items()}


def folder_text(directory: str) -> str:
    """A folder as words: its segments, drive letter dropped, lower case."""
    # Same normalisation as the project rules (architecture §2): `\` and `/` alike,
    # repeated and trailing separators gone, lower case. The drive letter is
    # dropped and segments are joined by spaces, so `D:\Work\demo\web` and
    # `/work/demo/web` give the same text and the same n-grams.
    return " ".join(
        segment
        for segment in directory.replace("\\", "/").lower().split("/")
        if segment and not _DRIVE.fullmatch(segment)
    )


def document_text(title: str, directory: str) -> str:
    """Build the text that represents one session for matching: title plus directory."""
    title = title.strip()
    if _PLACEHOLDER_TITLE.fullmatch(title):
        title = ""
    return " ".join(part for part in (title, folder_text(directory)) if part)


class Index:
    """The documents' sparse TF-IDF vectors, to rank queries against.

    The query counts in the population the IDF sees (as if it were one more document, so the
    weights are scikit-learn's over documents plus query). Only documents sharing an n-gram
    with the query are scored; their vectors are weighted then, the rest score 0.
    """

    def __init__(self, documents: Sequence[tuple[str, Document]]) -> None:
        self.keys = [key for key, _ in documents]
        self._documents = [document for _, document in documents]
        self._grams = _Grams()
        # Each document's texts as (cached, shared) sets of n-grams. A document's counts and
        # weights are worked out only when it shares an n-gram with a query.
        self._sets = [self._grams.sets_of(document) for document in self._documents]
        self._rows: _Memo[int, _Row] = _Memo(lambda i: self._grams.of(self._documents[i]))
        # Document frequency of every n-gram, counted in C over the texts' sets; an n-gram in
        # two texts of one document (title and folder) is counted once: the overlaps are small.
        df = Counter(chain.from_iterable(chain.from_iterable(self._sets)))
        twice: list[str] = []
        for sets in self._sets:
            if len(sets) == 2:
                twice.extend(sets[0] & sets[1])
            elif len(sets) > 2:
                seen = Counter(chain.from_iterable(sets))
                twice.extend(chain.from_iterable([g] * (k - 1) for g, k in seen.items() if k > 1))
        df.subtract(twice)
        self._df = df
        self._n = len(self._documents) + 1  # the query is one more text
        self._last: tuple[str, dict[int, tuple[float, dict[str, float]]]] | None = None

    def _query(self, query: str) -> dict[str, float]:
        row = self._grams.of(query)
        n, df = self._n, self._df
        values = _values(row, lambda g: _idf(n, df[g] + 1))
        norm = math.sqrt(math.fsum(v * v for v in values.values()))
        return {g: values[g] / norm for g in sorted(values)} if norm else {}

    def scores(self, query: str) -> dict[int, tuple[float, dict[str, float]]]:
        """Document -> (cosine similarity, each shared n-gram's share of it), for documents
        sharing an n-gram with the query. The last query's answer is kept: ``rank`` and then
        ``shared`` for each candidate score the fleet once."""
        if self._last is not None and self._last[0] == query:
            return self._last[1]
        out = self._scores(query)
        self._last = (query, out)
        return out

    def _scores(self, query: str) -> dict[int, tuple[float, dict[str, float]]]:
        q = self._query(query)
        n, df = self._n, self._df
        in_query = q.keys()
        idf: _Memo[str, float] = _Memo(lambda gram: _idf(n, df[gram] + (gram in in_query)))

        out = {}
        apart: dict[int, bool] = {}  # id(set) -> the query shares nothing with it
        for i, sets in enumerate(self._sets):
            near = False
            for one in sets:  # a folder's set is shared by many documents: ask once
                far = apart.get(id(one))
                if far is None:
                    far = apart[id(one)] = in_query.isdisjoint(one)
                near = near or not far
            if not near:
                continue
            shared = in_query & frozenset().union(*sets)
            values = _values(self._rows[i], idf.__getitem__)
            # fsum is exactly rounded: a norm does not depend on the order of the words.
            norm = math.sqrt(math.fsum(v * v for v in values.values()))
            parts = {g: values[g] * q[g] / norm for g in sorted(shared)}
            out[i] = (min(1.0, max(0.0, math.fsum(parts.values()))), parts)
        return out

    def rank(self, query: str, top: int = 5) -> list[Candidate]:
        """The ``top`` documents most similar to the query, best first (ties by key)."""
        if top < 1 or not self.keys or not any(_run_grams(run) for run in _runs(query)):
            return []
        found = self.scores(query)
        keys = self.keys
        scores = [found[i][0] if i in found else 0.0 for i in range(len(keys))]
        count = min(top, len(scores))
        # nsmallest on (-score, key) is a partial sort, O(n log top); ties go by key.
        best = heapq.nsmallest(count, range(len(scores)), key=lambda i: (-scores[i], keys[i]))
        return [Candidate(key=keys[i], score=scores[i]) for i in best]

    def shared(self, query: str, key: str, limit: int = 6) -> list[str]:
        """The query's words that the document ``key`` shares, most telling first: what a
        person reads to check a match."""
        found = self.scores(query).get(self.keys.index(key)) if key in self.keys else None
        if found is None:
            return []
        parts = found[1]

        def share(word: str) -> float:  # an English word's part of the score
            return sum(parts.get(gram, 0.0) for gram in set(_run_grams(word)))

        words: dict[str, float] = {}
        for run in dict.fromkeys(_runs(query)):
            if _CJK_CHAR.match(run):
                for gram in _run_grams(run):
                    if gram in parts:
                        words[gram] = words.get(gram, 0.0) + parts[gram]
                for word in _english(run):  # the glossary's words for its terms
                    if (part := share(word)) > 0:
                        words[word] = words.get(word, 0.0) + part
            elif (part := share(run)) > 0:
                words[run] = part
        ranked = sorted(words.items(), key=lambda item: (-item[1], item[0]))
        return [word for word, _ in ranked[:limit]]


def holds(text: str, words: Sequence[str]) -> bool:
    """Whether ``text`` holds one of ``words`` (as ``Index.shared`` names them) where a person
    would see it: a Chinese term inside a run, an English word as the start of one of its
    words, up to five letters (`export` is in "exported", `currencies` in "currency"; `port`
    is not in "export"). Folded as the matcher folds (NFKC, lower case)."""
    runs = _runs(text)
    for word in words:
        for run in _runs(word):
            cjk = _CJK_CHAR.match(run)
            if any(run in r if cjk else r.startswith(run[:5]) for r in runs):
                return True
    return False


def rank(query: str, documents: Sequence[tuple[str, Document]], top: int = 5) -> list[Candidate]:
    """Return the `top` documents most similar to the query, best first."""
    if top < 1 or not documents or not any(_run_grams(run) for run in _runs(query)):
        return []
    return Index(documents).rank(query, top)
