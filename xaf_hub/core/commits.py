"""The commit hashes an agent reports in its final answer (pure).

``claimed_commits`` returns the hashes the answer presents as commits, so the patrol can look them
up instead of taking the agent's word; any other run of hex digits is not a claim (the rule is in
docs/verification.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MIN_HASH = 7
MAX_HASH = 40
# At most this many distinct hashes are looked up for one answer (each costs a git call).
MAX_CLAIMS = 10
# At most this many commits between a task's base and its claim are judged as its work: more
# than a busy branch gains during one task's run, so a longer range (a base far behind, a
# rewritten history) waits for a person, and one judgment stays a few git calls.
MAX_RANGE = 200

_HEX = r"[0-9A-Fa-f]{7,40}"
_HASH = re.compile(rf"(?<![0-9A-Za-z_\-#])({_HEX})(?![0-9A-Za-z_\-])")
# The word that presents a commit, then at most three small words ("hash is", "id was"),
# then separators only, right up to the hash.
_SEP = r"[\s:：=`'\"(（#@*/]"
_WORD = r"(?i:\b(?:commit(?:ted|s)?|hash|sha(?:-?1)?|head|rev(?:ision)?)\b|提交|哈希)"
_CALLED_A_HASH = re.compile(
    rf"{_WORD}(?:{_SEP}+(?i:is|was|id|hash|sha|of|now|at|as|pushed|are)\b){{0,3}}"
    rf"{_SEP}*(?:(?:是|为){_SEP}*)?$"
)
# A run of letters a-f only ("defaced", "effaced") is an English word far more often than a
# hash: it counts only right after the word, nothing but separators between.
_RIGHT_AFTER = re.compile(rf"{_WORD}{_SEP}*$")
# A hash of letters and digits both (the common case) also counts a few words after the word,
# in the same sentence: "committed the change as a1b2c3d", "pushed it to main as a1b2c3d".
_NEAR_WORD = re.compile(
    r"(?i:\b(?:commit(?:ted|s)?|hash|sha(?:-?1)?|push(?:ed)?)\b|提交|哈希)"
    r"[^.;!?。；！？\n]{0,40}$"
)
_NEAR_WORDS = 5
# Lines git prints: "[main a1b2c3d] msg", "[topic (root-commit) a1b2c3d] msg".
_GIT_COMMIT_LINE = re.compile(rf"^\s*\[[^\]\s]+(?: \([^)]*\))? ({_HEX})\]")
# "   a1b2c3d..e4f5a6b  main -> main" (push): the new tip is the claim, the old one is not.
_GIT_PUSH_LINE = re.compile(rf"^\s*[+*]?\s*({_HEX})\.\.\.?({_HEX})\s+\S+\s+->\s+\S+")
# "a1b2c3d" alone (rev-parse), "a1b2c3d (HEAD -> main) msg" / "a1b2c3d msg" (log --oneline).
_GIT_HASH_FIRST = re.compile(rf"^\s*`?({_HEX})`?(?:\s|$)")


def _mixed(token: str) -> bool:
    return any(c.isdigit() for c in token) and any(not c.isdigit() for c in token)


def _near(before: str) -> bool:
    """The word is among the last few words before the hash, in the same sentence."""
    m = _NEAR_WORD.search(before)
    return m is not None and len(before[m.end() :].split()) <= _NEAR_WORDS


def _candidates(answer: str) -> list[tuple[int, str]]:
    """(position, hash) for every hash the answer presents as a commit."""
    found: list[tuple[int, str]] = []
    offset = 0
    for line in answer.splitlines(keepends=True):
        skip: set[int] = set()
        if m := _GIT_PUSH_LINE.match(line):
            found.append((offset + m.start(2), m.group(2)))
            skip = {m.start(1), m.start(2)}
        c = _GIT_COMMIT_LINE.match(line)
        f = None if c or skip else _GIT_HASH_FIRST.match(line)
        for m in (c, f if f and _mixed(f.group(1)) else None):
            if m:
                found.append((offset + m.start(1), m.group(1)))
                skip.add(m.start(1))
        for h in _HASH.finditer(line):
            if h.start(1) in skip:
                continue
            token = h.group(1)
            before = line[max(0, h.start(1) - 48) : h.start(1)]
            letters = not any(c.isdigit() for c in token)
            called = (_RIGHT_AFTER if letters else _CALLED_A_HASH).search(before)
            near = _mixed(token) and _near(before)
            if called or near or (len(token) == MAX_HASH and _mixed(token)):
                found.append((offset + h.start(1), token))
        offset += len(line)
    found.sort()
    return found


def claimed_commits(answer: str) -> tuple[str, ...]:
    """The hashes ``answer`` reports, lower case, each once, in the order they appear."""
    return tuple(dict.fromkeys(token.lower() for _, token in _candidates(answer)))[:MAX_CLAIMS]


def short(commit: str) -> str:
    """A hash as people write it: its first seven characters."""
    return commit[:MIN_HASH]


# Locked by default beside project.locked_paths (project.locked_defaults): what decides how the
# check runs and what it runs, so a commit cannot pass by changing the check rather than the
# code. Whole files: a glob cannot see package.json's "scripts", and a dependency change there
# or in pyproject.toml can swap the test runner itself.
RUNNER_CONFIG = (
    "Makefile", "GNUmakefile", "makefile", "*.mk",
    "conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", "tox.ini", "noxfile.py",
    "setup.cfg", "pyproject.toml", ".coveragerc",
    "package.json", "jest.config.*", "vitest.config.*", ".mocharc*",
    ".github/**", ".gitlab-ci.yml", ".gitlab/**", ".ci/**", ".circleci/**", ".buildkite/**",
    "Jenkinsfile", ".travis.yml", "azure-pipelines.yml", ".drone.yml", ".woodpecker.yml",
    ".woodpecker/**", "bitbucket-pipelines.yml",
)


def _glob_regex(glob: str) -> re.Pattern[str]:
    """``**`` any path (slashes too; ``**/`` zero or more folders), ``*`` and ``?`` within one
    name, ``[...]`` a class; a glob without a slash matches a name at any depth."""
    out, i = [], 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 2  # and one more below: the three characters
        elif glob.startswith("**", i):
            out.append(".*")
            i += 1
        elif c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in glob[i + 2 :]:
            end = glob.index("]", i + 2)
            body = glob[i + 1 : end].replace("\\", "\\\\")
            out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    body = "".join(out)
    lead = "" if "/" in glob.rstrip("/") else "(?:.*/)?"
    # DOTALL: a name holding a newline is matched as it is, like any other character.
    return re.compile(f"{lead}{body.rstrip('/')}", re.DOTALL)


def locked_paths(paths: Sequence[str], globs: Sequence[str]) -> tuple[str, ...]:
    """The ``paths`` (as git names them, relative, with slashes, unquoted) that a glob locks
    (pure); compared exactly: non-ASCII names, newlines, quotes and tabs are plain characters.

    A glob naming a folder (``tests``, ``tests/``) locks everything under it, as ``tests/**``.
    """
    patterns = [_glob_regex(g.strip().removeprefix("./")) for g in globs]
    hit = []
    for path in paths:
        parts = path.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(len(parts), 0, -1)]
        if any(p.fullmatch(pre) for p in patterns for pre in prefixes):
            hit.append(path)
    return tuple(hit)
