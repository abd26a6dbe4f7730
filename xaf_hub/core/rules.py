"""Which sessions belong to the project: pure functions over directory strings (architecture §2)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

_SEPARATORS = re.compile(r"/{2,}")
_TRAILING = re.compile(r"[/\s]+$")
_DRIVE = re.compile(r"[A-Za-z]:")

# Why a directory is (not) the project's: ProjectRules.classify.
Where = Literal["empty", "excluded", "root", "sandbox", "segment", "outside"]


def _flatten(path: str) -> tuple[str, str | None]:
    """``path`` with `/` separators and no doubles (a UNC `//` prefix kept), and the same
    without `.` and `..` segments or a trailing separator: None when a `..` climbs above its
    start (the root, a drive, a UNC share, a relative path's first segment)."""
    text = path.strip().replace("\\", "/")
    unc = text.startswith("//")
    text = ("/" if unc else "") + _SEPARATORS.sub("/", text)
    if unc:
        server, share, *segments = text[2:].split("/") + [""]
        if {server, share} & {".", ".."}:
            return text, None
        head = f"//{server}/{share}".rstrip("/") or "/"
    elif _DRIVE.match(text):
        head, segments = text[:2] + ("/" if text[2:3] == "/" else ""), text[2:].split("/")
    else:
        head, segments = ("/" if text.startswith("/") else ""), text.split("/")
    kept: list[str] = []
    for segment in segments:
        if segment == "..":
            if not kept:
                return text, None
            kept.pop()
        elif segment not in ("", "."):
            kept.append(segment)
    body = "/".join(kept)
    return text, head + ("/" if body and head.startswith("//") else "") + body


def clean_dir(path: str) -> str:
    """A folder as a person or an agent wrote it, made plain as text: `.` and `..` segments
    removed, repeated and trailing separators dropped, the ends stripped; its case and its
    separator (`\\` when it has one) kept. ValueError when a `..` climbs above its start."""
    text, plain = None, path
    while text != plain:  # stripping the ends may uncover a segment to drop, and the reverse
        text = plain
        _, flat = _flatten(text)
        if flat is None:
            raise ValueError("a '..' climbs above the start of the path")
        plain = flat
    return plain.replace("/", "\\") if "\\" in path else plain


def normalize_dir(path: str) -> str:
    """A directory for comparing: `/` separators, no doubles, no `.` or `..` segments (a `..`
    above the start is left as written), no trailing separator or white space, lower case."""
    text = None
    while text != path:  # stripping may uncover a segment to drop, and dropping one white space
        text = path
        flat, dotless = _flatten(text)
        path = flat if dotless is None else dotless
        if len(path) > 1:
            path = _TRAILING.sub("", path) or ("/" if path.startswith("/") else "")
    return path.lower()


def is_under(path: str, root: str) -> bool:
    """True when normalised ``path`` equals ``root`` or lies below it on a segment boundary."""
    if not root:
        return False
    return path == root or path.startswith(root if root.endswith("/") else root + "/")


def _segments(path: str) -> list[str]:
    """The named segments of a path, in its own case (`.` and `..` resolved where they can be)."""
    flat, dotless = _flatten(path)
    return [s for s in (flat if dotless is None else dotless).split("/") if s]


def apply_aliases(path: str, aliases: Mapping[str, str]) -> str:
    """Map a path as written in a task to the instance's own spelling (longest prefix wins)."""
    norm = normalize_dir(path)
    best: tuple[int, str, str] | None = None
    for written, actual in aliases.items():
        key = normalize_dir(written)
        if is_under(norm, key) and (best is None or len(key) > best[0]):
            best = (len(key), key, actual)
    if best is None:
        return path
    _, key, actual = best
    rest = _segments(path)[len([s for s in key.split("/") if s]) :]
    if not rest:
        return actual
    sep = "\\" if "\\" in actual else "/"
    return actual.rstrip("/\\") + sep + sep.join(rest)


@dataclass(frozen=True)
class ProjectRules:
    """The directory rules of one instance, already normalised. ``sandboxes`` are folders the
    server keeps for the project outside its roots (its worktrees): inside, like a root."""

    roots: tuple[str, ...] = ()
    fallback_segments: tuple[str, ...] = ()
    exclude_dirs: tuple[str, ...] = ()
    exclude_substrings: tuple[str, ...] = ()
    sandboxes: tuple[str, ...] = ()

    @classmethod
    def build(
        cls,
        *,
        roots: Sequence[str] = (),
        fallback_segments: Sequence[str] = (),
        exclude_dirs: Sequence[str] = (),
        exclude_substrings: Sequence[str] = (),
    ) -> ProjectRules:
        """Normalise every rule once so matching is cheap."""
        return cls(
            roots=tuple(normalize_dir(r) for r in roots if r.strip()),
            fallback_segments=tuple(s.strip().lower() for s in fallback_segments if s.strip()),
            exclude_dirs=tuple(normalize_dir(d) for d in exclude_dirs if d.strip()),
            exclude_substrings=tuple(s.lower() for s in exclude_substrings if s),
        )

    def with_sandboxes(self, folders: Sequence[str]) -> ProjectRules:
        """These rules, with ``folders`` (what the server lists as the project's sandboxes)
        inside as well."""
        found = tuple(normalize_dir(f) for f in folders if f.strip())
        return dataclasses.replace(self, sandboxes=found)

    def classify(self, directory: str) -> Where:
        """Say why a directory is (not) the project's: excluded, root, sandbox, segment,
        outside, empty."""
        if not directory or not directory.strip():
            return "empty"
        norm = normalize_dir(directory)
        if any(is_under(norm, d) for d in self.exclude_dirs) or any(
            s in norm for s in self.exclude_substrings
        ):
            return "excluded"
        if any(is_under(norm, r) for r in self.roots):
            return "root"
        if any(is_under(norm, r) for r in self.sandboxes):
            return "sandbox"
        if self.fallback_segments and not set(norm.split("/")).isdisjoint(self.fallback_segments):
            return "segment"
        return "outside"

    def is_project(self, directory: str) -> bool:
        """True when sessions in ``directory`` belong to the project."""
        return self.classify(directory) in ("root", "sandbox", "segment")

    def owns(self, directory: str, checkout: str = "") -> bool:
        """True when sessions in ``directory`` are the project's: by the rules, or because it is
        a worktree of ``checkout`` (the main checkout it was made from) and that one is."""
        verdict = self.classify(directory)
        if verdict in ("root", "sandbox", "segment"):
            return True
        return bool(checkout) and verdict != "excluded" and self.is_project(checkout)

    def relative(self, directory: str, keep: int = 2) -> str:
        """The telling part of a directory: below its root, else its last ``keep`` segments.

        The shared prefix of every project path says nothing about the work; matching on it
        only dilutes the similarity of the parts that differ.
        """
        norm = normalize_dir(directory)
        for root in sorted(self.roots + self.sandboxes, key=len, reverse=True):
            if is_under(norm, root):
                return norm[len(root) :].strip("/")
        return "/".join([seg for seg in norm.split("/") if seg][-keep:])

    def under_roots(self, directory: str) -> bool:
        """True when ``directory`` lies under one of this instance's roots or sandboxes and is
        not excluded: where the hub may start a session."""
        return self.classify(directory) in ("root", "sandbox")
