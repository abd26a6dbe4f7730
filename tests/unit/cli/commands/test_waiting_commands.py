"""`waiting`, `approve`, `deny`, `answer` as a person runs them, over the fake 1.18.33 server of
tests/unit/ops/test_waiting.py: what they print, their exit codes, and a request text holding
terminal escapes and a password printed harmless."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx

from tests.unit.ops.waiting_support import PERM, Server, fleet_with_both
from xaf_hub.cli.main import main

PASSWORD = "pw-s3cret-value"


def run(tmp_path: Path, server: Server, *words: str) -> tuple[int, str, str]:
    doc = {"instances": [{"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/p"],
                          "password_env": "LAN_A_PW"}]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    out, err = io.StringIO(), io.StringIO()
    code = main(
        ["--config", str(path), *words], stdout=out, stderr=err,
        env={"XAF_HUB_HOME": str(tmp_path / "home"), "LAN_A_PW": PASSWORD},
        transport_factory=lambda _: httpx.MockTransport(server.route),
    )
    return code, out.getvalue(), err.getvalue()


def test_waiting_lists_each_request_and_how_to_answer(tmp_path: Path) -> None:
    server = fleet_with_both()
    server.permissions[0]["metadata"] = {"command": f"echo \x1b]0;pwned\x07 {PASSWORD}"}
    code, out, err = run(tmp_path, server, "waiting")
    assert code == 0, err
    assert "per_aaa1" in out and "que_bbb2" in out and "Which database?" in out
    assert "\x1b" not in out and "\x07" not in out and PASSWORD not in out
    assert "answer: xaf-hub approve per_aaa1" in err and "2 request(s) waiting" in err
    code, out, _ = run(tmp_path, server, "waiting", "--json")
    doc = json.loads(out)
    assert [w["id"] for w in doc["waiting"]] == ["per_aaa1", "que_bbb2"] and doc["unknown"] == []
    assert PASSWORD not in out


def test_approve_deny_answer_print_what_was_sent(tmp_path: Path) -> None:
    server = fleet_with_both()
    code, out, err = run(tmp_path, server, "approve", "per_aaa1")
    assert (code, out.strip()) == (
        0, "approved once: per_aaa1 of ses_perm on lan-a (git push origin main)"
    ), err
    code, out, err = run(tmp_path, server, "approve", "per_aaa1")
    assert code == 4 and out == "" and len(err.strip().splitlines()) == 1
    assert "per_aaa1 is not waiting on any instance" in err
    code, out, err = run(tmp_path, server, "answer", "que_bbb2", "staging", "--json")
    assert code == 0 and json.loads(out)["reply"] == "answered staging", err
    server.permissions.append(dict(PERM))
    code, out, err = run(tmp_path, server, "deny", "per_aaa1", "-m", "not today")
    assert code == 0 and out.startswith("denied (not today): per_aaa1"), err
    assert server.replies[-1][1] == {"reply": "reject", "message": "not today"}


MULTI = "git status\ntouch x\n\nrm -rf build"


def test_a_command_of_several_lines_is_shown_as_its_lines(tmp_path: Path) -> None:
    server = fleet_with_both()
    server.permissions[0]["metadata"] = {"command": MULTI}
    # The table says more lines follow, before anything a narrow terminal would cut.
    code, out, err = run(tmp_path, server, "waiting")
    assert code == 0, err
    [row] = [line for line in out.splitlines() if "per_aaa1" in line]
    assert "[4 lines] git status" in row and "touch" not in row
    # --json carries it whole.
    code, out, _ = run(tmp_path, server, "waiting", "--json")
    assert json.loads(out)["waiting"][0]["asked"] == MULTI
    # show: the first line in the state, then every line.
    code, out, err = run(tmp_path, server, "show", "ses_perm")
    assert code == 0, err
    assert ": permission bash: [4 lines] git status; last run" in out
    lines = out.splitlines()
    at = lines.index("asked (4 lines):")
    assert lines[at + 1 : at + 5] == ["  git status", "  touch x", "  ", "  rm -rf build"]
    # approve: one line said; the audit carries it whole.
    code, out, err = run(tmp_path, server, "approve", "per_aaa1")
    assert code == 0 and out.strip().endswith("([4 lines] git status)"), err
    audit = (tmp_path / "home" / "audit.log").read_text("utf-8").splitlines()
    assert json.loads(audit[-1])["asked"] == MULTI
