"""Rank sessions against a task text: TF-IDF over character n-grams, cosine similarity.

Pure Python: an inverted index over the documents' sparse vectors (``Index``); a query touches
only the postings of its own n-grams. No numpy: it cost about 0.5 s of import per dispatch and
73 MB of install for a fleet of at most thousands of sessions (issue 36).

The TF-IDF weights are scikit-learn's (`TfidfTransformer(sublinear_tf=True)`: smooth idf, l2
norm), times a weight per entry: the field it comes from (a session's title and the task texts
the hub sent into it count more than its changed files, those more than its folder) and a low
weight for words any task uses ("add", "tests", 修复, 页面). The unit tests check the weights
and scores against scikit-learn's transformer on generated corpora; the labelled set in
bench/data (`python -m bench --match`) measures what they are worth.

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
import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass


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


# What the work *is* counts more than the words every task uses. A session's evidence comes in
# fields of different worth: its title and the task texts the hub sent into it say what it does;
# the files it changed say where; its folder is shared by every session working there, so it
# counts least. Words that any task might use ("add", "fix", "tests", "page", 修复, 页面) are
# weighted down in every field and in the query: on their own they never make a match.
TITLE_WEIGHT = 1.0
TASK_WEIGHT = 1.0
FILE_WEIGHT = 0.6
FOLDER_WEIGHT = 0.3
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
    """The n-grams of one run, each with its generic-word factor (1 or GENERIC_WEIGHT)."""
    grams = _run_grams(run)
    if _CJK_CHAR.match(run):
        return [(g, GENERIC_WEIGHT if g in _GENERIC_BIGRAMS else 1.0) for g in grams]
    factor = GENERIC_WEIGHT if run in _GENERIC_WORDS else 1.0
    return [(g, factor) for g in grams]


@dataclass(frozen=True)
class Evidence:
    """What the hub knows of one session: title, folder, the task texts sent into it (its first
    prompt among them) and the files it changed."""

    title: str = ""
    folder: str = ""
    tasks: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    def fields(self) -> list[tuple[str, float]]:
        """The texts to match with the weight of the field each comes from."""
        title = self.title.strip()
        if _PLACEHOLDER_TITLE.fullmatch(title):
            title = ""
        out = [(title, TITLE_WEIGHT), (folder_text(self.folder), FOLDER_WEIGHT)]
        out += [(task, TASK_WEIGHT) for task in self.tasks]
        out += [(path, FILE_WEIGHT) for path in self.files]
        return [(text, weight) for text, weight in out if text]


Document = str | Evidence

# One text's entries: n-gram -> [count, weight]; the weight is the highest weight of any of the
# n-gram's occurrences (its field's weight times its generic-word factor).
_Entries = dict[str, list[float]]


class _Grams:
    """n-grams of texts, each distinct run n-grammed once (runs repeat heavily across titles,
    folders and paths)."""

    def __init__(self, weighted: bool = True) -> None:
        self.weighted = weighted
        self.cache: dict[str, list[tuple[str, float]]] = {}

    def add(self, entries: _Entries, text: str, weight: float) -> None:
        """Count the n-grams of ``text`` into ``entries`` at the field weight ``weight``."""
        cache = self.cache
        for run in _runs(text):
            grams = cache.get(run)
            if grams is None:
                grams = _weighted_run_grams(run)
                if not self.weighted:
                    grams = [(g, 1.0) for g, _ in grams]
                cache[run] = grams
            for gram, factor in grams:
                w = weight * factor
                entry = entries.get(gram)
                if entry is None:
                    entries[gram] = [1.0, w]
                else:
                    entry[0] += 1.0
                    if w > entry[1]:
                        entry[1] = w

    def of(self, document: Document) -> _Entries:
        """The entries of one document (a plain text counts at weight 1)."""
        entries: _Entries = {}
        if isinstance(document, Evidence):
            for text, weight in document.fields():
                self.add(entries, text, weight)
        else:
            self.add(entries, document, 1.0)
        return entries


def _tfidf(texts: list[str], weighted: bool = False) -> list[dict[str, float]]:
    """The L2-normalised TF-IDF weights of the texts, one {n-gram: weight} per text.

    Unweighted they are scikit-learn's (``TfidfTransformer(sublinear_tf=True)``); weighted,
    each entry is also multiplied by its field and generic-word weight before the norm. The
    unit tests compare both with scikit-learn; ``rank`` computes the same numbers sparsely.
    """
    grams = _Grams(weighted)
    rows = [grams.of(text) for text in texts]
    df: dict[str, int] = {}
    for row in rows:
        for gram in row:
            df[gram] = df.get(gram, 0) + 1
    n = len(texts)
    out = []
    for row in rows:
        values = {
            g: (1.0 + math.log(c)) * (math.log((1.0 + n) / (1.0 + df[g])) + 1.0) * w
            for g, (c, w) in row.items()
        }
        norm = math.sqrt(math.fsum(v * v for v in values.values()))
        out.append({g: v / norm for g, v in values.items()} if norm else {})
    return out


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


def _idf(n: int, df: int) -> float:
    return math.log((1.0 + n) / (1.0 + df)) + 1.0


class Index:
    """An inverted index over the documents' sparse TF-IDF vectors, to rank queries against.

    The query counts in the population the IDF sees (as if it were one more document, so
    the weights are scikit-learn's over documents plus query). Only the entries of n-grams
    the query has change with it: each query touches the postings of its own n-grams, never
    the whole fleet.
    """

    def __init__(self, documents: Sequence[tuple[str, Document]]) -> None:
        self.keys = [key for key, _ in documents]
        self._grams = _Grams()
        rows = [self._grams.of(document) for _, document in documents]
        # n-gram -> [(document, (1 + log count) * weight)]
        self._postings: dict[str, list[tuple[int, float]]] = {}
        for i, row in enumerate(rows):
            for gram, (count, weight) in row.items():
                self._postings.setdefault(gram, []).append((i, (1.0 + math.log(count)) * weight))
        self._n = len(rows) + 1  # the query is one more text
        n = self._n
        squares: list[list[float]] = [[] for _ in rows]
        for posting in self._postings.values():
            idf = _idf(n, len(posting))
            for i, part in posting:
                squares[i].append((part * idf) ** 2)
        # fsum is exactly rounded: a document's norm does not depend on the order of its words.
        self._norm2 = [math.fsum(sq) for sq in squares]
        self._rows = rows

    def _query(self, query: str) -> dict[str, float]:
        entries: _Entries = {}
        self._grams.add(entries, query, 1.0)
        n = self._n
        values = {
            g: (1.0 + math.log(c)) * _idf(n, len(self._postings.get(g, ())) + 1) * w
            for g, (c, w) in sorted(entries.items())
        }
        norm = math.sqrt(math.fsum(v * v for v in values.values()))
        return {g: v / norm for g, v in values.items()} if norm else {}

    def scores(self, query: str) -> dict[int, tuple[float, dict[str, float]]]:
        """Document -> (cosine similarity, each shared n-gram's share of it), for documents
        sharing an n-gram with the query."""
        q = self._query(query)
        n = self._n
        dots: dict[int, dict[str, float]] = {}
        norm2 = list(self._norm2)
        for gram, weight in q.items():  # sorted by n-gram: sums do not depend on word order
            posting = self._postings.get(gram)
            if not posting:
                continue
            base, with_query = _idf(n, len(posting)), _idf(n, len(posting) + 1)
            for i, part in posting:
                # The query has this n-gram: its document frequency is one more.
                norm2[i] += (part * with_query) ** 2 - (part * base) ** 2
                dots.setdefault(i, {})[gram] = part * with_query * weight
        out = {}
        for i, shares in dots.items():
            norm = math.sqrt(norm2[i]) if norm2[i] > 0 else 1.0
            parts = {g: v / norm for g, v in shares.items()}
            out[i] = (min(1.0, max(0.0, sum(parts.values()))), parts)
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
        if key not in self.keys:
            return []
        i = self.keys.index(key)
        found = self.scores(query).get(i)
        if found is None:
            return []
        parts = found[1]
        words: dict[str, float] = {}
        for run in dict.fromkeys(_runs(query)):
            if _CJK_CHAR.match(run):
                for gram in _run_grams(run):
                    if gram in parts:
                        words[gram] = words.get(gram, 0.0) + parts[gram]
            else:
                share = sum(parts.get(gram, 0.0) for gram in set(_run_grams(run)))
                if share > 0:
                    words[run] = share
        ranked = sorted(words.items(), key=lambda item: (-item[1], item[0]))
        return [word for word, _ in ranked[:limit]]


def rank(query: str, documents: Sequence[tuple[str, Document]], top: int = 5) -> list[Candidate]:
    """Return the `top` documents most similar to the query, best first."""
    if top < 1 or not documents or not any(_run_grams(run) for run in _runs(query)):
        return []
    return Index(documents).rank(query, top)
