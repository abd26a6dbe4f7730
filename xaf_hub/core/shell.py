"""What a shell command runs, as far as a rule may judge it (pure, conservative).

``simple_commands`` splits a command into the simple commands it runs when it is nothing but
plain words joined by ``;``, ``&&``, ``||`` or ``|``. Anything a shell could turn into more
(a redirection, a substitution, an expansion, a glob, a group, a background job, a keyword,
an assignment, a second line) or anything this reader does not know makes it answer None:
such a command is for a person to read, never for a rule to approve.
"""

from __future__ import annotations

import string

__all__ = ["simple_commands"]

# Unquoted characters that are only ever part of a word, in every common shell.
_WORD = frozenset(string.ascii_letters + string.digits + "-_./:,+%@=")
_JOINS = ("&&", "||", ";", "|")
# Words that open or close a compound command where a command name stands.
_KEYWORDS = frozenset({
    "case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for", "function", "if", "in",
    "select", "then", "time", "until", "while",
})
# Inside double quotes, what still expands or escapes.
_LIVE_IN_DOUBLE = frozenset("$`\\!")


def simple_commands(command: str) -> tuple[str, ...] | None:
    """The simple commands ``command`` runs, each as its words written (quotes kept) joined by
    one space, or None when it is anything more than plain words joined by ``;``, ``&&``,
    ``||``, ``|``."""
    if not all(ch.isprintable() or ch == "\t" for ch in command):
        return None  # a newline, a control or format character, a line separator
    out: list[str] = []
    i = 0
    words: list[str] = []  # the current command's words so far, as written
    word_at = -1  # where the current word began, -1 between words
    n = len(command)
    while i <= n:
        ch = command[i] if i < n else ""
        join = next((j for j in _JOINS if command.startswith(j, i)), "") if ch else ";"
        if ch in (" ", "\t") or join:
            if word_at >= 0:
                words.append(command[word_at:i])
                word_at = -1
            if join:
                if not _plain(words):
                    return None
                out.append(" ".join(words))
                words = []
            i += len(join) or 1
            continue
        if word_at < 0:
            word_at = i
        if ch in ("'", '"'):  # a quoted piece: plain text, unless double quotes hold a live one
            end = command.find(ch, i + 1)
            if end < 0 or (ch == '"' and any(c in _LIVE_IN_DOUBLE for c in command[i + 1 : end])):
                return None
            i = end + 1
        elif ch in _WORD or (not ch.isascii() and ch.isprintable()):
            i += 1
        else:
            return None  # $ ` \ < > ( ) { } [ ] * ? ~ # ! & ^ and anything else
    return tuple(out)


def _plain(words: list[str]) -> bool:
    """Whether ``words`` make one plain simple command: not empty, not led by a keyword or
    an assignment, no word a shell expands by its first character (zsh's ``=cmd``)."""
    if not words or words[0] in _KEYWORDS or "=" in words[0]:
        return False
    return not any(w.startswith("=") for w in words)
