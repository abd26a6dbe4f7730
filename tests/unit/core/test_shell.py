"""What a rule may judge of a shell command (``core.shell.simple_commands``): labelled
commands, those split into their simple commands and those only a person may read."""

from __future__ import annotations

import pytest

from xaf_hub.core.shell import simple_commands

PLAIN: list[tuple[str, tuple[str, ...]]] = [
    ("git status", ("git status",)),
    ("  git   status\t-s  ", ("git status -s",)),
    ("git status; git log -1", ("git status", "git log -1")),
    ("git status && git diff --stat || true", ("git status", "git diff --stat", "true")),
    ("git log --oneline | head -5", ("git log --oneline", "head -5")),  # each side judged
    ("git log|wc -l", ("git log", "wc -l")),
    ("git commit -m 'fix: a; b > c $(x) `y` *'", ("git commit -m 'fix: a; b > c $(x) `y` *'",)),
    ('git commit -m "two words"', ('git commit -m "two words"',)),
    ("git -c user.name=me status", ("git -c user.name=me status",)),  # = after the name
    ("git log --grep=测试 -- 文件.py", ("git log --grep=测试 -- 文件.py",)),
    ("npm run build:prod", ("npm run build:prod",)),
    ("ls -la ./src/a_b-c.py", ("ls -la ./src/a_b-c.py",)),
]


@pytest.mark.parametrize(("command", "commands"), PLAIN, ids=[c for c, _ in PLAIN])
def test_plain_commands_are_split_into_what_they_run(
    command: str, commands: tuple[str, ...]
) -> None:
    assert simple_commands(command) == commands


TWENTY = "; ".join(f"git status -s f{i}" for i in range(1, 21))

REFUSED: list[tuple[str, str]] = [
    ("a line after the first", "git status\ntouch x"),
    ("a line continued", "git status \\\n; touch x"),
    ("a carriage return", "git status\rtouch x"),
    ("a Unicode line separator", "git status\u2028touch x"),
    ("a no-break space", "git\u00a0status"),
    ("a right-to-left override", "git status \u202e"),
    ("a NUL", "git status\x00"),
    ("redirection out", "git status > /tmp/x/file"),
    ("redirection appended", "git status >> f"),
    ("redirection of a descriptor", "git status 2>&1"),
    ("redirection in", "sort < f"),
    ("a here-doc", "cat <<EOF"),
    ("a here-string", "cat <<< x"),
    ("command substitution", "echo $(touch x)"),
    ("backquote substitution", "echo `touch x`"),
    ("substitution in double quotes", 'echo "$(touch x)"'),
    ("process substitution", "diff <(ls) f"),
    ("a variable", "git log $HOME"),
    ("a variable in double quotes", 'git log "$X"'),
    ("braces of a variable", "echo ${X}"),
    ("arithmetic", "echo $((1+1))"),
    ("ANSI-C quoting", "echo $'\\x41'"),
    ("a glob", "rm *.py"),
    ("a one-character glob", "ls ?"),
    ("a bracket glob", "ls [ab]"),
    ("brace expansion", "touch {a,b}"),
    ("tilde", "ls ~"),
    ("tilde of a user", "ls ~root/x"),
    ("a background job", "git status &"),
    ("a background job between", "sleep 9 & git status"),
    ("a pipe of stderr", "git status |& cat"),
    ("a subshell", "(cd /; ls)"),
    ("a brace group", "{ ls; }"),
    ("an assignment prefix", "X=1 git log"),
    ("an assignment alone", "PATH=/tmp"),
    ("a keyword", "if true; then rm x; fi"),
    ("a loop", "for f in a; do rm x; done"),
    ("time", "time git status"),
    ("a negation", "! git status"),
    ("a comment hiding the rest", "git status # ; touch x"),
    ("a backslash", "git status\\;touch x"),
    ("zsh's =command", "=ls -la"),
    ("an empty command", "git status;; ls"),
    ("a trailing separator", "git status;"),
    ("a leading join", "&& git status"),
    ("an unclosed quote", "git commit -m 'oops"),
    ("an unclosed double quote", 'git commit -m "oops'),
    ("nothing", ""),
    ("blanks", "   "),
    ("the attack: 20 plain commands then a redirection", f"{TWENTY}; git status > m_21th"),
    ("the attack: 20 plain commands then a substitution", f"{TWENTY}; echo $(touch m_21th)"),
]


@pytest.mark.parametrize(("why", "command"), REFUSED, ids=[w for w, _ in REFUSED])
def test_anything_more_than_plain_words_is_for_a_person(why: str, command: str) -> None:
    assert simple_commands(command) is None, why


def test_the_command_after_twenty_is_seen() -> None:
    # Not refused: split, so a rule must allow the 21st command too (tests/unit/ops).
    split = simple_commands(f"{TWENTY}; touch m_21th")
    assert split is not None and len(split) == 21 and split[-1] == "touch m_21th"
