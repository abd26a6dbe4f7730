"""What in a task text points at one session beyond the words it shares (pure).

``named_files``: the files a task names that a session changed; ``refers_back``: the first word
that refers back to earlier work. Both are evidence for ``ops.planner.match_decision``, not
scores (docs/matching.md, "What people write when they continue").
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

# A path or file name with an extension starting with a letter ("queue.ts", "web/src/Steps.tsx",
# "pg_backup.sh", "schema.prisma"; not "v2.3", "1.5x"), the extension taken whole (``*+``).
# ASCII only: a Chinese sentence writes file names in ASCII, and its characters must not join
# the name ("在queue.ts里").
_FILE = re.compile(r"(?<![A-Za-z0-9_.\-/])[A-Za-z0-9_.\-/]*[A-Za-z0-9_]\.[A-Za-z][A-Za-z0-9]*+"
                   r"(?![A-Za-z0-9_])")
# What is a file name of the ones it finds: an extension of source, config or docs. Not
# "e.g.", "i.e.", "myshop.com", "django.utils", "locator.click"; nor an abbreviation's letter
# (a.m., p.s.: no "m", "s", "r").
_EXTENSIONS = frozenset(
    {
        # source
        "py", "pyi", "pyx", "ipynb", "js", "jsx", "mjs", "cjs", "ts", "tsx", "mts", "cts",
        "vue", "astro", "go", "rs", "java", "kt", "kts", "scala", "swift", "c", "h", "cc",
        "cpp", "cxx", "hh", "hpp", "hxx", "cs", "rb", "erb", "rake", "php", "pl", "lua", "dart",
        "exs", "erl", "hrl", "hs", "elm", "clj", "cljs", "jl", "nim", "zig", "sol", "sql",
        "gql", "proto", "tf", "hcl", "nix", "sh", "bash", "zsh", "fish", "ps1", "bat", "cmd",
        "mk", "cmake", "bzl", "svelte", "prisma", "gradle", "groovy", "graphql", "coffee",
        "thrift", "tfvars", "jsonnet", "gemspec", "podspec", "csproj", "fsproj", "vcxproj",
        "dockerfile", "feature",
        # web and templates
        "html", "htm", "xhtml", "css", "scss", "sass", "less", "styl", "svg", "ejs", "hbs",
        "pug", "jinja", "j2", "njk", "twig", "tmpl", "tpl", "xaml", "mustache", "handlebars",
        "liquid", "cshtml", "razor", "storyboard",
        # config and data
        "json", "jsonc", "json5", "yaml", "yml", "toml", "ini", "cfg", "conf", "env", "xml",
        "plist", "lock", "mod", "sum", "csv", "tsv", "sln", "properties", "service",
        "xcconfig", "pbxproj", "entitlements",
        # docs
        "md", "mdx", "rst", "txt", "adoc", "tex",
    }
)
# Products named like a file ("Next.js 15", "the Node.js 22 upgrade"): written bare, they are
# the product; with a folder ("web/next.js") a file.
_PRODUCTS = frozenset(
    f"{name}.js"
    for name in (
        "next", "node", "nuxt", "vue", "react", "express", "nest", "three", "d3", "chart",
        "ember", "backbone", "angular", "alpine", "solid", "moment", "day", "p5", "anime",
        "video", "meteor", "knockout", "require", "pixi", "paper", "fabric",
    )
)
# An identifier written as code: with an underscore, or camelCase / PascalCase. The shape is
# looked at once from the word's start, then the word is taken whole and never given back
# (``\w++``): "\w*_\w+" followed by a test that fails backtracks through every underscore, so
# a long run of "a_a_…" would take time quadratic in its length.
_SHAPE = r"(?=\w*_\w|[a-z]+[A-Z]|[A-Z][a-z0-9]+[A-Z])"
_CODE = re.compile(_SHAPE + r"\w++", re.ASCII)
_CODE_WORD = re.compile(r"(?<![A-Za-z0-9_.\-/])" + _SHAPE + r"\w++(?!\.)", re.ASCII)

# Stems of files that most projects have: naming one says where, not which work.
_COMMON_STEMS = frozenset(
    {
        "index", "main", "app", "__init__", "__main__", "package", "package-lock", "yarn",
        "pnpm-lock", "setup", "settings", "config", "readme", "changelog", "license", "utils",
        "util", "helpers", "types", "models", "views", "urls", "conftest", "mod", "lib", "tsconfig",
        "requirements", "pyproject", "makefile", "dockerfile", "docker-compose", "go", "test",
        "tests",
    }
)

_BACK_EN = (
    "also", "too", "still", "again", "same", "instead", "anymore", "already",
    "as well", "since the", "while you're", "works", "the other",
)
_BACK_ZH = (
    "也", "还", "又", "再", "现在", "之后", "以后", "顺便", "同样", "刚才", "上次", "之前",
    "剩下", "其余", "另外", "继续", "依然", "仍然", "已经",
)
# Words that hold one of those characters and mean something else: 还原 (restore), 退还 / 归还
# (give back), 偿还 / 还款 / 还钱 (repay), 也许 (perhaps), 再见 (goodbye).
_NOT_BACK_ZH = ("还原", "退还", "归还", "偿还", "还款", "还钱", "也许", "再见")


def _zh(word: str) -> str:
    """``word`` as a pattern that does not match inside the words of ``_NOT_BACK_ZH``."""
    before = [w[: -len(word)] for w in _NOT_BACK_ZH if w.endswith(word) and w != word]
    after = [w[len(word) :] for w in _NOT_BACK_ZH if w.startswith(word) and w != word]
    return (
        "".join(f"(?<!{re.escape(b)})" for b in before)
        + re.escape(word)
        + (f"(?!{'|'.join(map(re.escape, after))})" if after else "")
    )


# An English cue is a word of its own: not inside a hyphenated compound ("same-day delivery",
# "an also-ran"), which says what a thing is, not that it came before.
_BACK = re.compile(
    r"(?<![\w\-\u2010\u2011])(?:"
    + "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in _BACK_EN)
    + r")(?![\w\-\u2010\u2011])|"
    + "|".join(map(_zh, _BACK_ZH)),
    re.IGNORECASE,
)

# Quoted text and code say what is written, not what the writer means: an "Also bought" row, a
# 「猜你还喜欢」 module, `retry again`. A quote ends on its line (an inch mark must not hide
# the rest of the text); an apostrophe inside a word (don't, user’s) is none.
_APOSTROPHE = re.compile(r"(?<=\w)['\u2019](?=\w)")
_QUOTED = re.compile(
    r"```[\s\S]*?```"
    r"|`[^`\n]*`"
    r'|"[^"\n]*"'
    r"|\u201c[^\u201c\u201d\n]*\u201d"  # “…”
    r"|\u2018[^\u2018\u2019\n]*\u2019"  # ‘…’
    r"|「[^「」\n]*」"
    r"|『[^『』\n]*』"
    r"|(?<!\w)'[^'\n]*'(?!\w)"
)


def _unquoted(text: str) -> str:
    """``text`` with what it quotes blanked out (each character a space)."""
    masked = _APOSTROPHE.sub("\x00", text)  # the same length: spans found in it fit ``text``
    parts, last = [], 0
    for m in _QUOTED.finditer(masked):
        parts += [text[last : m.start()], " " * (m.end() - m.start())]
        last = m.end()
    return "".join([*parts, text[last:]])


def _fold(text: str) -> str:
    # Full-width letters typed with a Chinese IME (ｑｕｅｕｅ．ｔｓ) are the ASCII ones.
    return text if text.isascii() else unicodedata.normalize("NFKC", text)


def _base(path: str) -> str:
    return path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def _stem(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name.strip(".") else name


def _file_keys(path: str) -> set[str]:
    """How a text may name this file: its name, and its stem when the stem is code-shaped."""
    name = _base(path)
    stem = _stem(name)
    if not name or stem.lower() in _COMMON_STEMS:
        return set()
    keys = {name.lower()} if "." in name.strip(".") else set()
    if _CODE.fullmatch(stem):
        keys.add(stem.lower())
    return keys


def _files(text: str) -> list[str]:
    """The paths and file names written in ``text`` (folded): those with a known extension,
    products named like a file left out."""
    paths = [m.group(0) for m in _FILE.finditer(text)]
    return [p for p in paths
            if p.rsplit(".", 1)[1].lower() in _EXTENSIONS and p.lower() not in _PRODUCTS]


def _folders(path: str) -> tuple[str, ...]:
    """The folders of ``path``, lower-cased, outermost first ("./" and empty ones left out)."""
    parts = path.replace("\\", "/").lower().split("/")[:-1]
    return tuple(p for p in parts if p not in ("", "."))


def _same_place(said: tuple[str, ...], held: tuple[str, ...]) -> bool:
    """Can a name written in ``said`` folders be a file in ``held`` ones? They agree on the
    folders both give, counted from the file up ("a/queue.ts" is "src/a/queue.ts", not
    "src/b/queue.ts"); a bare name is in any folder."""
    k = min(len(said), len(held))
    return said[len(said) - k :] == held[len(held) - k :]


def _said(text: str) -> dict[str, set[tuple[str, ...]]]:
    """The file names and code-shaped words of ``text``, lower-cased (file names by their last
    segment, and their stems), each with the folders it was written in (``()``: bare)."""
    text = _fold(text)
    out: dict[str, set[tuple[str, ...]]] = {}
    for path in _files(text):
        name = _base(path).lower()
        for key in (name, _stem(name)):
            out.setdefault(key, set()).add(_folders(path))
    for m in _CODE_WORD.finditer(text):
        out.setdefault(m.group(0).lower(), set()).add(())
    return out


def names(text: str) -> set[str]:
    """The file names and code-shaped words of ``text``, lower-cased (file names by their last
    segment, and their stems)."""
    return set(_said(text))


def files_in(texts: Iterable[str]) -> list[str]:
    """The file names written in ``texts`` (a task sent into a session names its files too)."""
    return [path for t in texts for path in _files(_fold(t))]


def named_files(text: str, tasks: Sequence[str] = (), files: Sequence[str] = ()) -> tuple[str, ...]:
    """The session's files that ``text`` names: of ``files`` (those it changed) and of the file
    names in ``tasks`` (the texts sent into it), each once, in that order. A name written with
    folders names a file only in those folders."""
    said = _said(text)
    if not said:
        return ()

    def named(f: str) -> bool:
        held = _folders(f)
        return any(_same_place(where, held) for key in _file_keys(f) for where in said.get(key, ()))

    found = [f for f in dict.fromkeys([*files, *files_in(tasks)]) if named(f)]
    first: dict[str, str] = {}
    for f in found:  # "web/src/queue.ts" and a task's "queue.ts" are one file to a reader
        first.setdefault(_base(f).lower(), f)
    return tuple(first.values())


def refers_back(text: str) -> str:
    """The first word of ``text`` that refers back to earlier work ("" when none), outside
    what it quotes."""
    m = _BACK.search(_unquoted(_fold(text)))
    return re.sub(r"\s+", " ", m.group(0).lower()) if m else ""
