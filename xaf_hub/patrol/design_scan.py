"""Find task rows waiting for dispatch in design documents (patrol step sync_design_tasks).

A task row is a markdown table row with a pending marker and a batch code; the rules for rows,
markers, ids and titles are in docs/architecture.md §8, step 3. Everything here is pure except
``scan_dirs``, which reads the files.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final

from xaf_hub.store.tasks import Task, format_instant

__all__ = [
    "DEFAULT_BATCH_PATTERNS",
    "DEFAULT_ENGLISH_MARKERS",
    "DEFAULT_MARKERS",
    "DEFAULT_PENDING_MARKERS",
    "DesignTask",
    "design_prompt",
    "has_marker",
    "merge_design_tasks",
    "scan_dirs",
    "scan_markdown",
    "slug_of",
]

DEFAULT_PENDING_MARKERS: Final[tuple[str, ...]] = ("待派发", "未派发", "⏳")
# English equivalents seen in mixed-language plans. Whole-word, case-insensitive matches.
# "dispatched"/"done" wording is deliberately absent: only *waiting* rows are work to add.
DEFAULT_ENGLISH_MARKERS: Final[tuple[str, ...]] = (
    "pending dispatch",
    "to dispatch",
    "to be dispatched",
    "not dispatched",
    "undispatched",
    "TODO-dispatch",
)
DEFAULT_MARKERS: Final[tuple[str, ...]] = DEFAULT_PENDING_MARKERS + DEFAULT_ENGLISH_MARKERS

# The code patterns carry ASCII word boundaries so "SPRINT1" or "UTF8" is not read as T1/F8,
# while a code glued to Chinese text ("F-8清理") still counts.
DEFAULT_BATCH_PATTERNS: Final[tuple[str, ...]] = (
    r"(?<![A-Za-z0-9_.-])F-?\d+(?![0-9])",
    r"(?<![A-Za-z0-9_.-])T\d+(?![0-9])",
    r"(?<![A-Za-z0-9_.-])W0\.\d+(?![0-9])",
    "批次",
    "步骤",
    "任务",
    "阶段",
)

_SEPARATOR_CELL = re.compile(r"^:?-{1,}:?$")
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")
_FENCE = re.compile(r"^(`{3,}|~{3,})")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_EMPHASIS = re.compile(r"(\*\*|__|~~|\*|`)")
_UNDERSCORE_EMPHASIS = re.compile(r"(?<!\w)_+|_+(?!\w)")
_DIGIT = re.compile(r"[0-9]")
_SLUG_DROP = re.compile(r"[^\w]+")


@dataclass(frozen=True)
class DesignTask:
    """One pending task row found in a design document."""

    id: str
    title: str
    spec: str  # the document, relative to the repo root, forward slashes
    line: int  # 1-based line of the row
    row: str  # the row as written, for the prompt
    auto_id: bool = False  # True when the id is AUTO-<slug>-<n>


def slug_of(spec: str) -> str:
    """Return the id slug of a spec path: its lower-cased stem, words joined by '-'."""
    stem = Path(spec.replace("\\", "/")).stem
    slug = _SLUG_DROP.sub("-", unicodedata.normalize("NFKC", stem).lower()).strip("-_")
    return slug[:40].rstrip("-_") or "doc"


def _cells(line: str) -> list[str]:
    """Split a table row into cells on unescaped pipes (outer pipes dropped)."""
    text = line.strip().removeprefix("|")
    if text.endswith("|") and not text.endswith("\\|"):
        text = text[:-1]
    return [c.strip().replace("\\|", "|") for c in _UNESCAPED_PIPE.split(text)]


def _plain(cell: str) -> str:
    """Strip markdown decoration from a cell: links to their text, emphasis, code ticks."""
    text = _LINK.sub(r"\1", cell)
    text = _EMPHASIS.sub("", text)
    text = _UNDERSCORE_EMPHASIS.sub("", text)
    text = re.sub(r"<br\s*/?>", " ", text, flags=re.IGNORECASE)
    return " ".join(text.split())


def _marker_patterns(markers: Iterable[str]) -> list[re.Pattern[str]]:
    """Compile the markers: ASCII ones as whole words in any case, others as plain substrings."""
    return [
        re.compile(rf"(?<![A-Za-z0-9_-]){re.escape(m)}(?![A-Za-z0-9_-])", re.IGNORECASE)
        if m.isascii()
        else re.compile(re.escape(m))
        for m in markers
        if m
    ]


def has_marker(text: str, markers: Sequence[str] = DEFAULT_MARKERS) -> bool:
    """Tell whether ``text`` carries one of the pending markers."""
    return any(p.search(text) for p in _marker_patterns(markers))


def _batch_id(text: str, patterns: Sequence[re.Pattern[str]]) -> tuple[bool, str]:
    """Return (has any batch code, id from the leftmost code containing a digit or "")."""
    hits = [m for p in patterns for m in p.finditer(text) if m.group(0)]
    codes = [(m.start(), "-".join(m.group(0).split())) for m in hits]
    # The leftmost code with a digit; at one place, the longest (then the first in order).
    best = min(((at, -len(code), code) for at, code in codes if _DIGIT.search(code)), default=None)
    return bool(hits), (best[2] if best else "")


def _title(cells: Sequence[str], code: str, markers: Sequence[re.Pattern[str]]) -> str:
    """First non-empty cell; when it is only the code and/or a marker, use the next real cell."""
    plain = [p for p in (_plain(c) for c in cells) if p]
    if not plain:
        return ""

    def bare(text: str) -> bool:
        rest = text.replace(code, " ") if code else text
        for pattern in markers:
            rest = pattern.sub(" ", rest)
        # Bare: no letter, digit or ideograph left (only punctuation or symbols).
        return not any(unicodedata.category(ch)[0] in "LN" for ch in rest)

    first = plain[0]
    if bare(first):
        for other in plain[1:]:
            if not bare(other):
                return f"{code} {other}" if code and code in first else other
    return first


def scan_markdown(
    text: str,
    spec: str,
    markers: Sequence[str] = DEFAULT_MARKERS,
    batch_patterns: Sequence[str] = DEFAULT_BATCH_PATTERNS,
) -> list[DesignTask]:
    """Return the pending task rows of one markdown document, in file order."""
    tests = _marker_patterns(markers)
    patterns = [re.compile(p) for p in batch_patterns]
    slug = slug_of(spec)
    found: list[DesignTask] = []
    fence: str | None = None
    in_comment = False
    in_table = False
    previous_cells: list[str] | None = None  # the last line, when it could be a table header
    auto = 0
    for number, raw_line in enumerate(text.splitlines(), start=1):
        stripped = raw_line.strip()
        if fence is not None:
            if stripped.startswith(fence) and not stripped[len(fence) :].strip(fence[0]).strip():
                fence = None
            continue
        if in_comment:
            in_comment = "-->" not in stripped
            continue
        opening = _FENCE.match(stripped)
        in_comment = stripped.startswith("<!--") and "-->" not in stripped
        if opening or in_comment or len(_UNESCAPED_PIPE.findall(stripped)) < 2:
            # A fence, a comment or a line with too few pipes ends a table; a comment does not
            # part a header from its separator.
            fence = opening.group(1) if opening else None
            in_table = False
            previous_cells = previous_cells if in_comment else None
            continue
        cells = _cells(stripped)
        filled = [c.replace(" ", "") for c in cells if c.strip()]
        if filled and all(_SEPARATOR_CELL.match(c) for c in filled):  # |---|:--:|
            # A separator right after a candidate header opens a table without leading pipes.
            in_table = previous_cells is not None
            previous_cells = None
            continue
        is_row = stripped.startswith("|") or in_table
        previous_cells = cells
        if not is_row or not any(p.search(stripped) for p in tests):
            continue
        has_code, code = _batch_id(stripped, patterns)
        if not has_code:
            continue
        title = _title(cells, code, tests)
        if not title:
            continue
        auto += not code  # a row without a code gets AUTO-<slug>-<n>
        task_id = code or f"AUTO-{slug}-{auto}"
        found.append(DesignTask(task_id, title, spec, number, stripped, auto_id=not code))
    return found


def scan_dirs(
    dirs: Sequence[Path],
    repo_root: Path,
    now: datetime,
    max_age_days: int = 30,
    markers: Sequence[str] = DEFAULT_MARKERS,
    batch_patterns: Sequence[str] = DEFAULT_BATCH_PATTERNS,
    *,
    on_error: Callable[[Path, OSError], None] | None = None,
) -> list[DesignTask]:
    """Scan the ``.md`` files under ``dirs`` modified in the last ``max_age_days`` days.

    Relative dirs are taken under ``repo_root``; missing dirs are skipped. An unreadable file
    is reported to ``on_error`` (if given) and skipped, so one bad file does not hide the rest.
    """
    oldest = now.timestamp() - max_age_days * 86400
    report = on_error or (lambda path, exc: None)
    files: dict[str, Path] = {}
    for folder in dirs:
        base = folder if folder.is_absolute() else repo_root / folder
        if not base.is_dir():
            continue
        for path in base.rglob("*.md"):
            try:
                if not path.is_file() or path.stat().st_mtime < oldest:
                    continue
            except OSError as exc:
                report(path, exc)
                continue
            try:
                spec = path.resolve().relative_to(repo_root.resolve()).as_posix()
            except ValueError:  # a design dir outside the repo: keep the full path
                spec = path.resolve().as_posix()
            files.setdefault(spec, path)
    result: list[DesignTask] = []
    for spec in sorted(files):
        try:
            # A stray non-UTF-8 byte should not hide the file's other rows.
            text = files[spec].read_bytes().decode("utf-8-sig", errors="replace")
        except OSError as exc:
            report(files[spec], exc)
            continue
        result.extend(scan_markdown(text, spec, markers, batch_patterns))
    return result


def design_prompt(task: DesignTask) -> str:
    """Return the work text of a pool task made from a design row (discipline comes later)."""
    return (
        f"Design task {task.id} from {task.spec} (line {task.line}): {task.title}\n\n"
        f"The row in the design document:\n{task.row}\n\n"
        f"Read {task.spec} first and do the work this row describes. If {task.spec} does not "
        "exist in your checkout, stop and say so instead of guessing."
    )


def merge_design_tasks(
    existing: Sequence[Task],
    found: Sequence[DesignTask],
    now: datetime,
    *,
    project: str = "",
    mine: Callable[[Task], bool] = lambda task: True,
) -> list[Task]:
    """Return the new pending tasks of ``project`` for rows not yet in the pool; never touch
    existing ones.

    A row is already known when a task of the project (``mine``) has the same spec and the same
    id or title. Pool ids are unique across projects, so a code already used by another task
    becomes ``<code>@<slug>`` (then ``-2``, ``-3``... in the rare case that is taken too).
    """
    taken = {t.id for t in existing}
    known = [(t.spec, t.id, t.title) for t in existing if mine(t)]
    stamp = format_instant(now)
    added: list[Task] = []
    for item in found:
        qualified = f"{item.id}@{slug_of(item.spec)}"
        if any(
            spec == item.spec and (tid in (item.id, qualified) or title == item.title)
            for spec, tid, title in known
        ):
            continue
        numbered = (f"{qualified}-{n}" for n in itertools.count(2))
        task_id = next(t for t in itertools.chain((item.id, qualified), numbered) if t not in taken)
        taken.add(task_id)
        known.append((item.spec, item.id, item.title))
        added.append(Task(
            id=task_id,
            title=item.title,
            spec=item.spec,
            prompt=design_prompt(item),
            created_at=stamp,
            project=project,
        ))
    return added
