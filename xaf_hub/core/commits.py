"""The commit hashes an agent reports in its final answer (pure).

The discipline (``core.discipline``) ends every prompt with "report the commit hash in your
final message"; ``claimed_commits`` reads them back so the patrol can look them up on the
project's repository instead of taking the agent's word. A hash is 7 to 40 hexadecimal
characters standing alone (not part of a longer word, path segment with a dash, a UUID or a
64-character digest). A run of letters a-f only ("defaced", "effaced") is an English word far
more often than a hash: it counts only right after a word that calls it one (commit, hash,
sha, 提交, 哈希).
"""

from __future__ import annotations

import re

MIN_HASH = 7
MAX_HASH = 40
# At most this many distinct hashes are looked up for one answer (each costs a git call).
MAX_CLAIMS = 10

_HASH = re.compile(r"(?<![0-9A-Za-z_\-])([0-9A-Fa-f]{7,40})(?![0-9A-Za-z_\-])")
_CALLED_A_HASH = re.compile(
    r"(?i:\b(?:commit(?:ted|s)?|hash|sha(?:-?1)?|head)\b|提交|哈希)[\s:：=`'\"(（#@]*$"
)


def claimed_commits(answer: str) -> tuple[str, ...]:
    """The hashes ``answer`` reports, lower case, each once, in the order they appear."""
    found: list[str] = []
    for m in _HASH.finditer(answer):
        token = m.group(1).lower()
        before = answer[max(0, m.start() - 40) : m.start()]
        if not any(c.isdigit() for c in token) and not _CALLED_A_HASH.search(before):
            continue
        if token not in found:
            found.append(token)
        if len(found) >= MAX_CLAIMS:
            break
    return tuple(found)


def short(commit: str) -> str:
    """A hash as people write it: its first seven characters."""
    return commit[:MIN_HASH]
