"""`xaf-hub show SESSION` against real servers: state, model, cost, the last prompt and the
last answer from the messages API, and the `opencode attach` command (no password in it);
`dispatch` prints that command too."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.fleet import Hub

pytestmark = pytest.mark.e2e


def _finished(hub: Hub, sid: str) -> bool:
    code, data = hub.cli_json("show", sid)
    return code == 0 and data["last_outcome"] == "succeeded" and data["last_answer"] is not None


def test_show_reads_the_last_prompt_and_answer(hub: Hub) -> None:
    sid = hub.session("local-a", "修复登录页样式")
    hub.prompt("local-a", sid, "请把登录按钮改成蓝色\nand keep the layout", "fake/fake-model")
    hub.wait_for(lambda: _finished(hub, sid), timeout=120, step=1.0)

    code, out, err = hub.cli("show", sid)
    assert code == 0, err
    assert f"session:   {sid} on local-a" in out
    assert "title:     修复登录页样式" in out
    assert "state:     idle; last run: succeeded" in out
    assert "model:     fake/fake-model" in out
    prompt = out.split("last prompt", 1)[1].split("last answer", 1)[0]
    assert "  请把登录按钮改成蓝色\n  and keep the layout" in prompt
    answer = out.split("last answer", 1)[1].split("open it in opencode:", 1)[0]
    assert "Hello from fake LLM." in answer
    attach = out.split("open it in opencode:", 1)[1].strip().splitlines()[0]
    url = hub.server("local-a").url
    assert attach == (
        f'OPENCODE_SERVER_PASSWORD="$XAF_HUB_PW_LOCAL_A" opencode attach {url} '
        f"--session {sid} --dir {hub.root / 'app'}"
    )
    assert hub.password("local-a") not in out + err

    code, data = hub.cli_json("show", sid, "-i", "local-a")
    assert code == 0
    assert data["last_prompt"]["text"] == "请把登录按钮改成蓝色\nand keep the layout"
    assert data["last_prompt"]["at"].endswith("Z") and data["last_prompt"]["at_ms"] > 0
    assert data["model"] == "fake/fake-model" and data["attach"] == attach
    assert isinstance(data["cost"], float) and data["updated"].endswith("Z")
    # One way to name a session everywhere: -s/--session as well as the positional.
    code, named = hub.cli_json("show", "-s", sid, "-i", "local-a")
    assert code == 0 and named == {**data, "updated": named["updated"],
                                   "updated_ms": named["updated_ms"]}
    code, seen = hub.cli_json("confirm", sid)
    assert code == 0 and seen["session_id"] == sid
    # Both name the session's project as `sessions --json` does: by its name.
    assert data["project"] == seen["project"] == hub.doc["project"]["name"], (data, seen)


def test_show_unknown_session_is_exit_4(hub: Hub) -> None:
    code, _, err = hub.cli("show", "ses_doesnotexist")
    assert code == 4 and "session ses_doesnotexist not found" in err


def test_a_unique_start_of_an_id_names_the_session(hub: Hub) -> None:
    a = hub.session("local-a", "named by a prefix")
    b = hub.session("lan-b", "its neighbour")
    part = a[:-2]  # what a narrow `sessions` table shows, or a person types: a unique start
    assert hub.cli_json("show", part)[1]["session_id"] == a
    assert hub.cli_json("confirm", part)[1]["session_id"] == a
    code, plan = hub.cli_json("dispatch", "-t", "more", "-s", part, "--dry-run")
    assert code == 0 and plan["session_id"] == a and plan["instance"] == "local-a"
    code, done = hub.cli_json("interrupt", part)
    assert code == 0 and done["session_id"] == a
    # The start of several ids names none: exit 4 listing them, nothing done.
    both = os.path.commonprefix([a, b])
    for argv in (("show", both), ("confirm", both), ("interrupt", both),
                 ("dispatch", "-t", "x", "-s", both, "--dry-run")):
        code, out, err = hub.cli(*argv)
        assert code == 4 and out == "", err
        assert f"{both} is the start of" in err
        named = re.findall(r"ses_\w+", err.split(" is the start of ", 1)[1])
        assert len(named) >= 2 and all(n.startswith(both) for n in named), err


def test_dispatch_prints_the_attach_command(hub: Hub) -> None:
    code, out, err = hub.cli("dispatch", "--new", "-i", "lan-b", "-t", "add a health check")
    assert code == 0, err
    sid = out.split("created session ", 1)[1].split()[0]
    assert f"open it in opencode: OPENCODE_SERVER_PASSWORD=\"$XAF_HUB_PW_LAN_B\" opencode " \
           f"attach {hub.server('lan-b').url} --session {sid}" in out
    code, data = hub.cli_json("show", sid)
    assert code == 0 and json.dumps(data)


def test_every_json_time_is_iso_with_the_epoch_ms_beside(hub: Hub) -> None:
    import re

    iso = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
    hub.session("local-a", "a session to list")
    code, status = hub.cli_json("status")
    assert code == 0 and iso.match(status["generated_at"]) and status["generated_at_ms"] > 0
    code, sessions = hub.cli_json("sessions")
    assert code == 0 and iso.match(sessions["generated_at"])
    first = sessions["sessions"][0]
    assert iso.match(first["updated_at"]) and iso.match(first["created_at"])
    assert isinstance(first["updated"], int) and first["updated"] > 0
