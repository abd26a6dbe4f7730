"""Which sessions belong to the project: pure functions over directory strings (architecture §2)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_SEPARATORS = re.compile(r"/{2,}")
_TRAILING = re.compile(r"[/\s]+$")


def normalize_dir(path: str) -> str:
    """Normalise a directory: `/` separators, no doubles, no trailing one, lower case."""
    text = path.strip().replace("\\", "/")
    unc = text.startswith("//")
    text = _SEPARATORS.sub("/", text)
    if unc:  # keep a Windows UNC prefix (//server/share) recognisable
        text = "/" + text
    if len(text) > 1:
        # Trailing separators and whitespace in any mix ("0\r\\" once left "0\r", which
        # the next call stripped: not idempotent).
        text = _TRAILING.sub("", text) or "/"
    return text.lower()


def is_under(path: str, root: str) -> bool:
    """True when normalised ``path`` equals ``root`` or lies below it on a segment boundary."""
    if not root:
        return False
    if path == root:
        return True
    prefix = root if root.endswith("/") else root + "/"
    return path.startswith(prefix)


def apply_aliases(path: str, aliases: Mapping[str, str]) -> str:
    """Map a path as written in a task to the instance's own spelling (longest prefix wins)."""
    norm = normalize_dir(path)
    best: tuple[int, str, str] | None = None
    for written, actual in aliases.items():
        key = normalize_dir(written)
        if is_under(norm, key) and (best is None or len(key) > best[0]):
            best = (len(key), written, actual)
    if best is None:
        return path
    _, written, actual = best
    rest = (
        path.strip().replace("\\", "/").rstrip("/")[len(written.replace("\\", "/").rstrip("/")) :]
    )
    rest = rest.lstrip("/")
    if not rest:
        return actual
    sep = "\\" if "\\" in actual else "/"
    return actual.rstrip("/\\") + sep + rest.replace("/", sep)


@dataclass(frozen=True)
class ProjectRules:
    """The directory rules of one instance, already normalised."""

    roots: tuple[str, ...] = ()
    fallback_segments: tuple[str, ...] = ()
    exclude_dirs: tuple[str, ...] = ()
    exclude_substrings: tuple[str, ...] = ()

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

    def classify(self, directory: str) -> str:
        """Say why a directory is (not) the project's: excluded, root, segment, outside, empty."""
        if not directory or not directory.strip():
            return "empty"
        norm = normalize_dir(directory)
        if any(is_under(norm, d) for d in self.exclude_dirs) or any(
            s in norm for s in self.exclude_substrings
        ):
            return "excluded"
        if any(is_under(norm, r) for r in self.roots):
            return "root"
        if self.fallback_segments:
            segments = set(norm.split("/"))
            if any(seg in segments for seg in self.fallback_segments):
                return "segment"
        return "outside"

    def is_project(self, directory: str) -> bool:
        """True when sessions in ``directory`` belong to the project."""
        return self.classify(directory) in ("root", "segment")

    def owns(self, directory: str, checkout: str = "") -> bool:
        """True when sessions in ``directory`` are the project's: by the rules, or because it is
        a worktree of ``checkout`` (the main checkout it was made from) and that one is."""
        verdict = self.classify(directory)
        if verdict in ("root", "segment"):
            return True
        return bool(checkout) and verdict != "excluded" and self.is_project(checkout)

    def relative(self, directory: str, keep: int = 2) -> str:
        """The telling part of a directory: below its root, else its last ``keep`` segments.

        The shared prefix of every project path says nothing about the work; matching on it
        only dilutes the similarity of the parts that differ.
        """
        norm = normalize_dir(directory)
        for root in sorted(self.roots, key=len, reverse=True):
            if is_under(norm, root):
                return norm[len(root) :].strip("/")
        return "/".join([seg for seg in norm.split("/") if seg][-keep:])

    def under_roots(self, directory: str) -> bool:
        """True when ``directory`` lies under one of this instance's roots and is not excluded."""
        return self.classify(directory) == "root"
