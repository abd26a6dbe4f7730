"""Bad input of every kind gets one clear line and the documented exit code, never a crash.

Files (config.json, config.local.json, the task pool, the model state): truncated, wrong-typed,
non-UTF-8, NUL bytes, BOM-prefixed (accepted). Each error names the file and the position
(line and column, byte offset, or key) and exits 4 (config) or 1 (a corrupt state file, which
is never rewritten). Also: enormous titles and texts, NUL and terminal escapes in titles from a
server, paths with spaces and Windows drive letters, unknown flags, empty and blank --text.
Property tests add what tests/unit/test_rules.py, test_design_scan.py and test_discipline.py
do not already cover.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xaf_hub.cli.main import COMMANDS, main

WIN_ROOT = "C:\\Users\\Me\\My Project"
GOOD = {"instances": [{"name": "win", "url": "http://win.example:4096", "roots": [WIN_ROOT]}]}


class Hub:
    """A config in a folder whose name has spaces, a hub home, and main() with a fake server."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path / "my config dir"
        self.dir.mkdir()
        self.home = tmp_path / "hub home"
        self.home.mkdir()
        self.config = self.dir / "config.json"
        self.env = {"XAF_HUB_HOME": str(self.home), "XAF_HUB_PW_WIN": "pw-Secret-1"}
        self.sessions: list[dict[str, Any]] = []
        self.write(GOOD)

    def write(self, doc: Any) -> None:
        self.config.write_text(json.dumps(doc), "utf-8")

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        if path == "/experimental/session":  # escaped as a server's JSON.stringify does
            body = json.dumps(self.sessions).encode()
            return httpx.Response(200, content=body, headers={"content-type": "application/json"})
        if path == "/session/status":
            return httpx.Response(200, json={})
        return httpx.Response(200, text="<html></html>", headers={"content-type": "text/html"})

    def cli(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(
            ["--config", str(self.config), *args],
            stdout=out,
            stderr=err,
            env=self.env,
            cwd=self.dir,
            transport_factory=lambda inst: httpx.MockTransport(self.handler),
        )
        return code, out.getvalue(), err.getvalue()


@pytest.fixture
def hub(tmp_path: Path) -> Hub:
    return Hub(tmp_path)


def one_line(err: str) -> str:
    """The single stderr line of a failed run."""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xaf-hub: error: "), err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# config.json

BAD_CONFIGS = [
    (b'{"instances": [\n  {"name": "a"', "invalid JSON at line 2 column 15"),
    (b"", "invalid JSON at line 1 column 1"),
    (b'{"a": "x\x00y"}', "invalid JSON at line 1 column 9"),
    (b'{"a": \x00}', "invalid JSON at line 1 column 7"),
    (b'{"project": {"name": "\xff"}}', "not UTF-8 text (bad byte at offset 22)"),
    (b"\xef\xbb\xbf[1, 2]", "top level must be an object"),
    (b'{"concurrency_limit": "two"}',
     "key 'concurrency_limit': expected a whole number, got a string"),
    (b'{"timeouts": {"read_seconds": true}}', "key 'timeouts.read_seconds': expected a number"),
    (b'{"instances": 5}', "key 'instances': expected a list or an object"),
    (b'{"instances": [{"name": "a", "url": "http://h", "roots": "/srv"}]}',
     "key 'instances[0].roots': expected a list"),
    (b'{"instances": [{"name": "a", "url": "http://h", "roots": ["srv/x"]}]}',
     "key 'instances[0].roots[0]': must be an absolute path"),
    (b'{"instances": [{"name": "a", "url": "ftp://h"}]}', "must be an http:// or https:// URL"),
    (b'{"instances": [{"name": "a", "url": "http://h", "password": "pw"}]}',
     "move it to config.local.json"),
    (b'{"instnces": []}', "key 'instnces': unknown key (did you mean 'instances'?)"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "message"), BAD_CONFIGS)
def test_bad_config_is_one_line_naming_file_and_position(
    hub: Hub, raw: bytes, message: str
) -> None:
    hub.config.write_bytes(raw)
    code, out, err = hub.cli("backlog", "list")
    assert code == 4 and out == ""
    line = one_line(err)
    assert str(hub.config) in line and message in line, line


def test_bom_prefixed_config_and_local_file_are_read(hub: Hub) -> None:
    hub.config.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode())
    local = hub.dir / "config.local.json"
    local.write_bytes(b"\xef\xbb\xbf" + b'{"instances": {"win": {"password": "from-local"}}}')
    from xaf_hub.config.load import load_config

    cfg = load_config(str(hub.config), env={"XAF_HUB_HOME": str(hub.home)})
    assert cfg.instance("win").password == "from-local"
    assert hub.cli("backlog", "list")[0] == 0


BAD_LOCALS = [
    (b'{"instances": {"win": {"password": "x"', "invalid JSON at line 1 column 39"),
    (b'{"instances": {"win": {"password": 5}}}',
     "key 'instances.win.password': expected a string, got a number"),
    (b'{"instances": {"win": {"password_env": ["X"]}}}',
     "key 'instances.win.password_env': expected a string, got a list"),
    (b'{"instances": [{"password": "x"}]}', "key 'instances[0].name': expected a non-empty"),
    (b'{"instances": 5}', "key 'instances': expected a list or an object"),
    (b'{"concurrency_limit": 3}', "key 'concurrency_limit': unknown key"),
    (b'\xff\xfe{}', "not UTF-8 text (bad byte at offset 0)"),
    (b"[]", "top level must be an object"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "message"), BAD_LOCALS)
def test_bad_local_config_names_that_file(hub: Hub, raw: bytes, message: str) -> None:
    local = hub.dir / "config.local.json"
    local.write_bytes(raw)
    code, _, err = hub.cli("backlog", "list")
    assert code == 4
    line = one_line(err)
    assert str(local) in line and message in line, line
    assert "pw-Secret-1" not in err


# ---------------------------------------------------------------------------------------------
# The task pool and the model state: exit 1, file and position named, file never rewritten

BAD_POOLS = [
    (b'{"tasks": [', "invalid JSON at line 1 column 12"),
    (b'{"schema_version": 1,\n "tasks": [{"id": "a", "title": "t"}\n', "line 3 column 1"),
    (b'{"tasks": [{"id": "a", "title": "\xc3"}]}', "not UTF-8 text (bad byte at offset 33)"),
    (b'{"tasks": [{"id": "a", "title": "t\x00"}]}', "contains a NUL byte at offset 34"),
    (b'{"tasks": [{"id": "a", "title": "t", "priority": 5}]}',
     "tasks[0].priority: expected a string, got a number"),
    (b'{"tasks": [{"id": "a", "title": "t", "status": "running"}]}',
     "tasks[0].status: must be pending, dispatched or done"),
    (b'{"tasks": [{"id": "a", "title": "t", "attempts": "2"}]}', "tasks[0].attempts"),
    (b'{"tasks": {"a": 1}}', "tasks: expected a list, got an object"),
    (b'{"tasks": [{"id": "a", "title": "t"}, {"id": "a", "title": "u"}]}',
     "tasks[1].id: duplicate id 'a'"),
    (b'{"schema_version": 99, "tasks": []}', "schema_version 99 is not supported"),
    (b'[]', "expected a JSON object at the top"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "message"), BAD_POOLS)
@pytest.mark.parametrize(
    "args",
    [("backlog", "list"), ("backlog", "add", "--title", "new"), ("backlog", "show", "a")],
    ids=["list", "add", "show"],
)
def test_corrupt_task_pool_is_named_and_never_reset(
    hub: Hub, raw: bytes, message: str, args: tuple[str, ...]
) -> None:
    pool = hub.home / "tasks_backlog.json"
    pool.write_bytes(raw)
    code, _, err = hub.cli(*args)
    assert code == 1
    line = one_line(err)
    assert str(pool) in line and message in line, line
    assert pool.read_bytes() == raw


def test_bom_prefixed_task_pool_is_read_and_kept(hub: Hub) -> None:
    pool = hub.home / "tasks_backlog.json"
    pool.write_bytes(b"\xef\xbb\xbf" + b'{"tasks": [{"id": "old", "title": "kept", "note": 1}]}')
    assert hub.cli("backlog", "add", "--title", "new one", "--id", "N-1")[0] == 0
    tasks = json.loads(pool.read_text("utf-8"))["tasks"]
    assert [(t["id"], t.get("note")) for t in tasks] == [("old", 1), ("N-1", None)]


BAD_MODEL_STATES = [
    (b'{"schema_version": 1, "blackouts": [', "invalid JSON at line 1 column 37"),
    (b'{"schema_version": 1, "blackouts": []}', "blackouts: expected an object"),
    (b'{"schema_version": 1, "blackouts": {"opencode": {"until_ms": "soon"}}}',
     "blackouts.opencode.until_ms: expected an integer"),
    (b'{"schema_version": 7}', "schema_version: expected 1, found 7"),
    (b"\xff\xfe{}", "not UTF-8 text (bad byte at offset 0)"),
    (b'{"schema_version": 1, "healed": {"k": {"at_ms": 1\x00}}}', "NUL byte at offset 49"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "message"), BAD_MODEL_STATES)
def test_corrupt_model_state_is_named_and_never_reset(hub: Hub, raw: bytes, message: str) -> None:
    state = hub.home / ".model_state.json"
    state.write_bytes(raw)
    code, out, err = hub.cli("dispatch", "--dry-run", "--new", "--text", "t")
    assert code == 1
    line = one_line(err)
    assert str(state) in line and message in line, line
    assert state.read_bytes() == raw


def test_bom_prefixed_model_state_is_read(hub: Hub) -> None:
    (hub.home / ".model_state.json").write_bytes(
        b'\xef\xbb\xbf{"schema_version": 1, "blackouts": {}, "healed": {}}'
    )
    assert hub.cli("dispatch", "--dry-run", "--new", "--text", "t")[0] == 0


# ---------------------------------------------------------------------------------------------
# Big, odd and hostile values


def test_enormous_title_and_text(hub: Hub) -> None:
    title = "标题" * 100_000
    code, _, err = hub.cli("backlog", "add", "--title", title, "--id", "BIG")
    assert code == 0, err
    code, out, _ = hub.cli("backlog", "list")
    assert code == 0 and max(len(line) for line in out.splitlines()) < 300
    code, out, _ = hub.cli("backlog", "show", "BIG", "--json")
    assert json.loads(out)["title"] == title
    code, out, err = hub.cli("dispatch", "--dry-run", "--new", "--text", "x" * 1_000_000, "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert len(plan["title"]) < 200 and plan["prompt"].startswith("x" * 1_000_000)


def test_hostile_titles_from_a_server(hub: Hub, tmp_path: Path) -> None:
    """NUL, ESC sequences and a huge title reach tables as harmless text, exports verbatim."""
    hub.sessions = [
        {"id": "ses_1", "title": "t" * 200_000 + "\x00", "directory": "c:/users/me/my project/a b",
         "time": {"created": 1, "updated": 2}},
        {"id": "ses_2", "title": "red\x1b[31m\x1b]0;owned\x07\r\x9b2J", "time": {"updated": 3},
         "directory": "C:\\USERS\\ME\\MY PROJECT\\"},
        {"id": "ses_3", "title": "look-alike", "directory": "C:\\Users\\Me\\My Project2",
         "time": {"updated": 4}},
    ]  # fmt: skip
    code, out, err = hub.cli("sessions")
    assert code == 0, err
    assert not any(c in out + err for c in "\x00\x1b\x07\r\x9b")
    assert "ses_1" in out and "ses_2" in out and "ses_3" not in out
    assert max(len(line) for line in out.splitlines()) < 300

    code, out, _ = hub.cli("sessions", "--json")
    doc = json.loads(out)
    titles = {s["id"]: s["title"] for s in doc["sessions"]}
    assert titles["ses_2"] == "red\x1b[31m\x1b]0;owned\x07\r\x9b2J"  # data kept exactly
    assert len(titles["ses_1"]) == 200_001
    assert "\x1b" not in out  # JSON escapes it

    exports = tmp_path / "export dir with spaces"
    for name in ("s.json", "s.csv", "s.html"):
        flag = "--html" if name.endswith(".html") else "--out"
        code, _, err = hub.cli("sessions", flag, str(exports / name))
        assert code == 0, err
    assert "&lt;" not in titles["ses_2"] and (exports / "s.html").stat().st_size > 200_000


def test_half_a_surrogate_pair_in_a_title_costs_nothing_but_that_character(
    hub: Hub, tmp_path: Path
) -> None:
    """JSON may carry "\\ud800" alone; no UTF-8 writer takes it. It made the whole instance's
    scan fail ("unreachable: UnicodeEncodeError"), hiding its other sessions."""
    hub.sessions = [
        {"id": "ses_1", "title": "lone \ud800 half", "directory": "c:/users/me/my project/a",
         "time": {"created": 1, "updated": 2}},
        {"id": "ses_2", "title": "plain", "directory": "c:/users/me/my project/b",
         "time": {"created": 1, "updated": 3}},
    ]  # fmt: skip
    for args in (["sessions"], ["sessions", "--json"]):
        raw = io.BytesIO()
        out, err = io.TextIOWrapper(raw, encoding="utf-8"), io.StringIO()  # as a real stdout
        code = main(
            ["--config", str(hub.config), *args], stdout=out, stderr=err, env=hub.env,
            cwd=hub.dir, transport_factory=lambda inst: httpx.MockTransport(hub.handler),
        )  # fmt: skip
        out.flush()
        text = raw.getvalue().decode("utf-8")
        assert code == 0 and "unreachable" not in err.getvalue(), err.getvalue()
        assert "ses_1" in text and "ses_2" in text and "lone \ufffd half" in text
    for name in ("s.json", "s.csv", "s.html"):
        flag = "--html" if name.endswith(".html") else "--out"
        code, _, err = hub.cli("sessions", flag, str(tmp_path / name))
        assert code == 0 and "unreachable" not in err, err
        assert "\ufffd" in (tmp_path / name).read_text("utf-8")


def test_an_argument_a_gbk_terminal_typed_under_a_utf8_locale_is_one_clear_line(
    hub: Hub,
) -> None:
    # Python keeps bytes UTF-8 cannot read as lone surrogates: the dispatch ended in
    # "internal error: UnicodeEncodeError" when it first wrote the text.
    typed = "修复登录页".encode("gbk").decode("utf-8", "surrogateescape")
    for args in (["dispatch", "--dry-run", "--new", "--text", typed],
                 ["backlog", "add", "--text", "fix \udcff it"]):  # fmt: skip
        code, out, err = hub.cli(*args)
        line = one_line(err)
        assert code == 4 and f"argument {len(args) + 2} is not UTF-8 text" in line, err
        assert "LANG" in line and out == ""
    code, _, err = hub.cli("dispatch", "--dry-run", "--new", "--text", "half \ud800")
    assert code == 4 and "half a surrogate pair" in one_line(err)


def test_windows_paths_with_spaces_and_dot_segments(hub: Hub) -> None:
    inside = WIN_ROOT + "\\web app"
    code, out, err = hub.cli("dispatch", "--dry-run", "--new", "--text", "t", "--dir", inside,
                             "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["directory"] == inside
    code, out, err = hub.cli("dispatch", "--dry-run", "--new", "--text", "t", "--dir",
                             WIN_ROOT + "\\.\\docs\\..\\web app\\", "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["directory"] == inside, err
    for outside in ("D:\\other", WIN_ROOT + "2", "relative\\dir", WIN_ROOT + "\\..\\other"):
        code, _, err = hub.cli("dispatch", "--dry-run", "--new", "--text", "t", "--dir", outside)
        assert code == 5 and "not under" in one_line(err), (outside, err)
    code, _, err = hub.cli("dispatch", "--dry-run", "--new", "--text", "t", "--dir", "C:\\..\\x")
    assert code == 4 and "climbs above the start" in one_line(err), err


# ---------------------------------------------------------------------------------------------
# Command line


def _bogus(name: str) -> list[str]:
    required = {
        "dispatch": ["--text", "x"],
        "interrupt": ["--session", "ses_x"],
        "confirm": ["--session", "ses_x"],
        "backlog": ["list"],
        "show": ["ses_x"],
        "approve": ["per_x"],
        "deny": ["per_x"],
        "answer": ["que_x"],
        "land": ["T-x"],
    }
    return [name, *required.get(name, []), "--no-such-flag"]


@pytest.mark.parametrize("name", COMMANDS)
def test_unknown_flag_is_exit_4_one_line(hub: Hub, name: str) -> None:
    code, out, err = hub.cli(*_bogus(name))
    assert code == 4 and out == ""
    assert "unrecognized arguments: --no-such-flag" in one_line(err)


@pytest.mark.parametrize(
    "args",
    [
        ("frobnicate",),
        ("watch", "--interval", "abc"),
        ("watch", "--once", "--interval", "0"),
        ("sessions", "--limit", "-1"),
        ("sessions", "--out", "x.xlsx"),
        ("cleanup", "--ttl-days", "-1"),
        ("dispatch", "--text", "x", "--model", "no-slash"),
        ("dispatch", "--text", "x", "--instance", "nope"),
        ("backlog", "add", "--title", "t", "--priority", "P9"),
    ],
)
def test_bad_values_are_exit_4_one_line(hub: Hub, args: tuple[str, ...]) -> None:
    code, _, err = hub.cli(*args)
    assert code == 4
    one_line(err)


@pytest.mark.parametrize("text", ["", " ", "\n\t  \n", "\u3000"])
def test_empty_or_blank_text_is_refused(hub: Hub, text: str) -> None:
    for args in (("dispatch", "--text", text), ("dispatch", "--text", text, "--dry-run")):
        code, _, err = hub.cli(*args)
        assert code == 4 and "--text is empty" in one_line(err)
    code, _, err = hub.cli("backlog", "add", "--title", text)
    assert code == 4 and "--title is empty" in one_line(err)
    assert not (hub.home / "tasks_backlog.json").exists()


# ---------------------------------------------------------------------------------------------
# Properties not covered elsewhere

# Inner spaces only: normalize_dir strips the ends of a whole path (config typos).
_SEGMENT = st.text(alphabet="abcXYZ 中文-_.", min_size=1, max_size=6).filter(
    lambda s: s == s.strip() and s.strip(".") != ""
)


def _spellings(path: str) -> list[str]:
    """The same directory as different machines and people write it."""
    return [
        path,
        path.upper(),
        path.replace("/", "\\"),
        path[:1] + path[1:].replace("/", "//"),  # a leading "//" would be a UNC path
        path + "/",
        path.replace("/", "\\") + "\\",
    ]


@settings(max_examples=200, deadline=None)
@given(
    root=st.lists(_SEGMENT, min_size=1, max_size=3),
    rest=st.lists(_SEGMENT, max_size=3),
    drive=st.sampled_from(["", "c:", "D:"]),
)
def test_rules_ignore_case_separators_and_trailing_slash(
    root: list[str], rest: list[str], drive: str
) -> None:
    from xaf_hub.core.rules import ProjectRules

    root_path = drive + "/" + "/".join(root)
    rules = ProjectRules.build(roots=[root_path], exclude_substrings=["vendor"])
    path = "/".join([root_path, *rest])
    verdicts = {rules.classify(p) for p in _spellings(path)}
    assert verdicts == {"root"}


@settings(max_examples=200, deadline=None)
@given(
    root=st.lists(_SEGMENT, min_size=1, max_size=3),
    tail=st.text(alphabet="abc2-_. 中", min_size=1, max_size=5),
)
def test_rules_never_match_a_prefix_look_alike(root: list[str], tail: str) -> None:
    from xaf_hub.core.rules import ProjectRules

    root_path = "/" + "/".join(root)
    rules = ProjectRules.build(roots=[root_path])
    look_alike = root_path + tail
    if look_alike.strip().rstrip("/").lower() != root_path.strip().lower():
        assert not rules.under_roots(look_alike)


_ROW_BITS = st.sampled_from(
    [
        "| ",
        " | ",
        "|",
        "待派发",
        "⏳",
        "未派发",
        "F-8",
        "T12",
        "W0.3",
        "批次",
        "清理",
        "a",
        " ",
        "\n",
    ]
)


@settings(max_examples=200, deadline=None)
@given(text=st.lists(_ROW_BITS, max_size=80).map("".join))
def test_design_merge_is_idempotent_and_ids_unique(text: str) -> None:
    from xaf_hub.patrol.design_scan import merge_design_tasks, scan_markdown

    now = datetime(2026, 1, 1, tzinfo=UTC)
    found = scan_markdown(text, "docs/plans/p.md")
    first = merge_design_tasks([], found, now)
    ids = [t.id for t in first]
    assert len(ids) == len(set(ids))
    assert merge_design_tasks(first, found, now) == []
    assert scan_markdown(text, "docs/plans/p.md") == found  # deterministic


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(
        st.sampled_from(
            ["create ", "push ", "feature/x", "feature/u3 ", "branch ", "新建 ", "分支", "不要",
             "do not ", "@ 300dd07 ", ". ", "\n", "git checkout -b ", "main "]
        ),
        max_size=20,
    ).map("".join)
)  # fmt: skip
def test_mainline_rewrite_never_adds_a_feature_branch(text: str) -> None:
    from xaf_hub.core.discipline import rewrite_branch_to_mainline

    out = rewrite_branch_to_mainline(text, "main")
    assert out.count("feature/") <= text.count("feature/")
    assert out.count("\n") == text.count("\n")  # lines are rewritten in place, never merged


def test_terminal_safe_keeps_text_and_layout() -> None:
    from xaf_hub.core.text import terminal_safe

    assert terminal_safe("中文 tab\tnew\nline") == "中文 tab\tnew\nline"
    assert (
        terminal_safe("\x1b[31mred\x07\r\x00\x7f\x9b")
        == "\ufffd[31mred\ufffd\ufffd\ufffd\ufffd\ufffd"
    )


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9/hook/tok\x07en-abcdefgh",  # a control character (was: internal error)
    "http://127.0.0.1:9/hook/tok\x7fen-abcdefgh",
    "http://127.0.0.1:9/hook/tok en-abcdefgh",
])
def test_notify_test_with_an_unusable_webhook_url_is_one_line_exit_4(
    hub: Hub, url: str
) -> None:
    hub.write({**GOOD, "notify": {"webhooks": [
        {"name": "team", "url_env": "XAF_HUB_WEBHOOK_TEAM", "format": "slack"}]}})
    hub.env["XAF_HUB_WEBHOOK_TEAM"] = url
    code, out, err = hub.cli("notify", "test")
    assert code == 4, (out, err)
    assert out.splitlines() == [out.strip()] and "does not hold a usable URL" in out
    assert "Traceback" not in err and "internal error" not in err
    assert "en-abcdefgh" not in out + err  # the URL is a secret: never quoted
