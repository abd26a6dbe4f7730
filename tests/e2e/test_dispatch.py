"""`dispatch` against real opencode servers: smart match, the gate under races, exit codes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from sandbox import fleet as sandbox
from tests.e2e.dispatch_checks import abort_all, audit_lines, slow
from tests.e2e.proxy import StallProxy
from tests.fleet import Hub

pytestmark = pytest.mark.e2e


def race(hub: Hub, n: int) -> list[int]:
    procs = [
        hub.popen(
            "dispatch", "--new", "--instance", "local-a", "--text", f"race task {i}", "--no-record"
        )
        for i in range(n)
    ]
    codes = []
    for p in procs:
        _, err = p.communicate(timeout=120)
        codes.append(p.returncode)
        assert p.returncode in (0, 3), err
        if p.returncode == 3:
            assert "at its limit" in err or "dispatch lock" in err
    return codes


# Two attempts, not five: the eight-process race below, the twenty dispatches of test_load and
# the fault matrix race the same lock; on the release matrix (``core``) each attempt costs
# about 10 s of a serial run.
@pytest.mark.core
@pytest.mark.parametrize("attempt", range(2))
def test_race_three_processes(hub: Hub, attempt: int) -> None:
    slow(hub)
    try:
        codes = race(hub, 3)
        assert sorted(codes) == [0, 0, 3]
        assert len(hub.busy_ids("local-a")) == 2
    finally:
        abort_all(hub, "local-a")


def test_race_eight_processes(hub: Hub) -> None:
    slow(hub)
    try:
        codes = race(hub, 8)
        assert codes.count(0) == 2 and codes.count(3) == 6
        assert len(hub.busy_ids("local-a")) == 2
        ok = [e for e in audit_lines(hub) if e["result"] == "create"]
        assert len(ok) == 2
    finally:
        abort_all(hub, "local-a")


@pytest.mark.core
def test_smart_match_dry_run_and_steer(hub: Hub) -> None:
    # The steered prompt is queued behind the running one, so keep that run short-ish.
    slow(hub, 15)
    login = hub.session("lan-b", "修复登录页样式", "web")
    tests = hub.session("lan-b", "补充单元测试", "api")
    hub.prompt("lan-b", tests, "write tests", "fake/slow-model")
    hub.wait_for(lambda: tests in hub.busy_ids("lan-b"))
    try:
        code, plan = hub.cli_json("dispatch", "--text", "登录页样式再调整一下", "--dry-run")
        assert code == 0
        assert (plan["action"], plan["session_id"], plan["instance"]) == ("reuse", login, "lan-b")
        top = plan["candidates"][0]
        assert top["session_id"] == login and top["similarity"] >= 0.12
        assert "--- xaf-hub discipline ---" in plan["prompt"]
        assert "feature/" in plan["prompt"]  # lan-b is a branch-policy instance
        assert plan["model"] == "fake/slow-model"
        # Dry run wrote nothing: no reservation, no audit line, no new session.
        assert not list((Path(hub.env["XAF_HUB_HOME"]) / "slots").glob("*.slot"))
        assert audit_lines(hub) == []
        # The same follow-up in English finds the Chinese session through the glossary's
        # words (登录 login, 样式 style), and says which.
        code, plan = hub.cli_json("dispatch", "--text", "the login page styles are off again",
                                  "--dry-run")
        top = plan["candidates"][0]
        assert code == 0 and top["session_id"] == login, plan["candidates"]
        assert "login" in top["evidence"]["shared_terms"], top

        # A running related session is steered even when its instance is full. Steering needs
        # more than the generic words of its title ("单元测试" alone is any task's): its name.
        hub.set_instance("lan-b", concurrency_limit=1)
        code, out, err = hub.cli("dispatch", "--text", "补充单元测试：再补几个边界用例")
        assert code == 0, err
        assert f"steered running session {tests} on lan-b" in out
        hub.wait_for(
            lambda: any("边界用例" in r["last_user_text"] for r in hub.llm.requests()), timeout=60
        )

        # The idle login session sits on the full instance now: skipped, a new session elsewhere.
        code, plan = hub.cli_json("dispatch", "--text", "登录页样式再调整一下", "--dry-run")
        assert code == 0 and plan["action"] == "create" and plan["instance"] != "lan-b"
        verdicts = {c["session_id"]: c["verdict"] for c in plan["candidates"]}
        assert verdicts[login] == "instance full"
    finally:
        abort_all(hub, "lan-b")


def test_match_uses_the_task_texts_the_hub_sent_and_says_why(hub: Hub) -> None:
    # Two sessions started through the hub: their task texts are in the pool. Their titles
    # are the texts' first lines, cut at 60 characters.
    export = (
        "Orders list: add an export button that downloads the filtered orders as CSV with "
        "order number, amount and status"
    )
    webhook = (
        "Stripe webhooks fail with 502 under load; make the payment webhook handler "
        "idempotent and retry failed deliveries with backoff"
    )
    ids = {}
    for name, text in (("export", export), ("webhook", webhook)):  # both in the default folder
        code, sent = hub.cli_json("dispatch", "--new", "--instance", "local-a", "--text", text)
        assert code == 0, sent
        ids[name] = sent["session_id"]
    hub.wait_for(lambda: not hub.busy_ids("local-a"), timeout=60)

    def free() -> bool:  # both runs over and their reservations past the slot's grace (5 s)
        code, doc = hub.cli_json("status", "--instance", "local-a")
        return code == 0 and doc["instances"][0]["reserved"] == 0

    hub.wait_for(free, timeout=30, step=0.5)

    # A continuation that shares words with the task text, not only with the title.
    code, plan = hub.cli_json(
        "dispatch", "--dry-run", "--text", "The orders CSV export drops the amount column"
    )
    assert code == 0, plan
    assert (plan["action"], plan["session_id"], plan["via"]) == (
        "reuse",
        ids["export"],
        "smart match",
    )
    top = plan["candidates"][0]
    assert top["verdict"].startswith("chosen: idle, free slot")
    assert top["similarity"] >= 0.30 and top["margin"] >= 0.10
    assert {"csv", "export", "amount"} <= set(top["evidence"]["shared_terms"])
    assert top["evidence"]["tasks"] == 1
    assert top["evidence"]["refers_back"] == ""

    # A follow-up in few of the task's words that refers back to it ("also") needs less.
    code, plan = hub.cli_json(
        "dispatch", "--dry-run", "--text", "Also put the order status in the CSV"
    )
    assert code == 0, plan
    top = plan["candidates"][0]
    assert (plan["action"], plan["session_id"]) == ("reuse", ids["export"]), plan["candidates"]
    assert top["evidence"]["refers_back"] == "also" and "refers back ('also')" in top["verdict"]

    # New work sharing only generic words with both ("Add", "handler", "fail"): a new session.
    code, plan = hub.cli_json(
        "dispatch",
        "--dry-run",
        "--text",
        "Add a health check handler that fails when the database is down",
    )
    assert code == 0, plan
    assert (plan["action"], plan["via"]) == ("create", "no related session")
    assert not any(c["verdict"].startswith("chosen") for c in plan["candidates"])

    # The text form says the same in words: score, lead, shared terms.
    code, out, err = hub.cli(
        "dispatch", "--dry-run", "--text", "The orders CSV export drops the amount column"
    )
    assert code == 0, err
    assert "(lead " in out and "shares: " in out and "csv" in out


def test_dispatch_creates_prompts_and_records(hub: Hub) -> None:
    code, out, err = hub.cli(
        "dispatch", "--new", "--instance", "local-a", "--text", "Add a health check endpoint"
    )
    assert code == 0, err
    sid = out.split("created session ", 1)[1].split()[0]
    hub.wait_for(
        lambda: any(
            r["last_user_text"].startswith("Add a health check") for r in hub.llm.requests()
        ),
        timeout=30,
    )
    req = next(r for r in hub.llm.requests() if r["last_user_text"].startswith("Add a health"))
    assert "--- xaf-hub discipline ---" in req["last_user_text"]
    assert "create no branch" in req["last_user_text"].lower() or "主分支" in req["last_user_text"]
    code, doc = hub.cli_json("sessions", "--instance", "local-a")
    s = next(x for x in doc["sessions"] if x["id"] == sid)
    assert s["directory"] == str(hub.root / "app")
    pool = json.loads((Path(hub.env["XAF_HUB_HOME"]) / "tasks_backlog.json").read_text("utf-8"))
    task = pool["tasks"][-1]
    assert (task["status"], task["session_id"], task["dispatched_to"]) == (
        "dispatched",
        sid,
        "local-a",
    )
    entry = audit_lines(hub)[-1]
    assert (entry["command"], entry["instance"], entry["session"]) == ("dispatch", "local-a", sid)
    assert not any(pw in json.dumps(audit_lines(hub)) for pw in hub.secrets())


def test_exit_codes(hub: Hub) -> None:
    hub.doc["instances"].append(
        {"name": "lan-down", "url": "http://127.0.0.1:9", "roots": [str(hub.root)]}
    )
    hub.doc["instances"].append(
        {"name": "prod-x", "url": hub.server("lan-c").url, "roots": [str(hub.root)], "danger": True}
    )
    hub.write_config()
    hub.env["XAF_HUB_PW_PROD_X"] = hub.password("lan-c")
    outside = hub.session("lan-c", "not ours", directory=hub.root.parent / "other")

    assert hub.cli("dispatch", "--text", "x", "--instance", "lan-down", "--new")[0] == 2
    code, _, err = hub.cli("dispatch", "--text", "x", "--instance", "prod-x", "--new")
    assert code == 4 and "--allow-prod" in err
    assert (
        hub.cli(
            "dispatch", "--text", "x", "--instance", "prod-x", "--new", "--allow-prod", "--dry-run"
        )[0]
        == 0
    )
    code, _, err = hub.cli("dispatch", "--text", "   ", "--new")
    assert code == 4 and "empty" in err
    code, _, err = hub.cli("dispatch", "--text", "x", "--session", outside)
    assert code == 5 and "not a project session" in err
    assert hub.cli("dispatch", "--text", "x", "--session", outside, "--force", "--dry-run")[0] == 0
    assert hub.cli("dispatch", "--text", "x", "--instance", "nope")[0] == 4
    assert (
        hub.cli("dispatch", "--text", "x", "--new", "--dir", "/etc", "--instance", "lan-b")[0] == 5
    )

    slow(hub)
    hub.set_instance("lan-b", concurrency_limit=1)
    try:
        assert hub.cli("dispatch", "--text", "fill", "--new", "--instance", "lan-b")[0] == 0
        code, _, err = hub.cli("dispatch", "--text", "one more", "--new", "--instance", "lan-b")
        assert code == 3 and "at its limit" in err
        assert (
            hub.cli("dispatch", "--text", "one more", "--new", "--instance", "lan-b", "--dry-run")[
                0
            ]
            == 3
        )
    finally:
        abort_all(hub, "lan-b")


def sessions_in(hub: Hub, name: str, directory: Path) -> list[str]:
    """The sessions the server keeps in ``directory`` (deleted ones are gone)."""
    server = hub.server(name)
    got = httpx.get(f"{server.url}/session", params={"directory": str(directory)},
                    headers=sandbox.auth_headers(hub.password(name)), timeout=30)
    return [s["id"] for s in got.raise_for_status().json()]


def test_a_dir_spelt_out_of_the_roots_starts_nothing_and_the_limit_holds(hub: Hub) -> None:
    outside = hub.root.parent / "outside"
    outside.mkdir()
    slow(hub)
    hub.set_instance("lan-b", concurrency_limit=1)
    try:
        for i in range(4):  # the attack: runs outside the project were not counted, so 4 ran
            code, _, err = hub.cli("dispatch", "--text", f"outside {i}", "--new", "--instance",
                                   "lan-b", "--dir", f"{hub.root}/../outside")
            assert code == 5 and f"({outside}) is not under lan-b's project roots" in err, err
        assert sessions_in(hub, "lan-b", outside) == []
        assert hub.cli("dispatch", "--text", "inside", "--new", "--instance", "lan-b")[0] == 0
        assert len(hub.busy_ids("lan-b")) == 1
        code, plan = hub.cli_json("dispatch", "--text", "x", "--new", "--instance", "lan-c",
                                  "--dir", f"{hub.root}/app/../../outside", "--force",
                                  "--dry-run")
        assert code == 0 and plan["directory"] == str(outside)  # --force: a person's choice
    finally:
        abort_all(hub, "lan-b")


@pytest.mark.core  # each release resolves the link itself
def test_a_link_out_of_the_root_is_refused_by_the_folder_the_server_resolved(hub: Hub) -> None:
    outside = hub.root.parent / "linked"
    outside.mkdir()
    (hub.root / "link").symlink_to(outside)
    code, _, err = hub.cli("dispatch", "--text", "follow the link", "--new", "--instance",
                           "lan-c", "--dir", str(hub.root / "link"))
    assert code == 5, err
    assert f"placed the new session for {hub.root / 'link'} in {outside}, outside" in err
    assert "nothing was sent" in err and "it was deleted" in err
    assert sessions_in(hub, "lan-c", outside) == []
    assert [e["result"] for e in audit_lines(hub)] == ["failed"]


def test_killed_between_reserve_and_create_frees_the_slot(hub: Hub) -> None:
    target = hub.server("lan-c").url
    with StallProxy(target, lambda m, p: m == "POST" and p.startswith("/session?")) as proxy:
        hub.set_instance("lan-c", url=proxy.url, concurrency_limit=1)
        proc = hub.popen("dispatch", "--new", "--instance", "lan-c", "--text", "doomed")
        assert proxy.stalled.wait(60), "the dispatch never reached create"
        slots = list((Path(hub.env["XAF_HUB_HOME"]) / "slots").glob("lan-c.*.slot"))
        assert len(slots) == 1 and json.loads(slots[0].read_text())["pid"] == proc.pid
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        proxy.released.set()
    hub.set_instance("lan-c", url=target)
    code, data = hub.cli_json("status", "--instance", "lan-c")
    assert data["instances"][0]["reserved"] == 0  # its process is gone: the slot is dead
    assert not list((Path(hub.env["XAF_HUB_HOME"]) / "slots").glob("lan-c.*.slot"))
    code, out, err = hub.cli("dispatch", "--new", "--instance", "lan-c", "--text", "after crash")
    assert code == 0, err


def test_reservation_of_live_process_counts_until_ttl(hub: Hub) -> None:
    # A slot left by a process that is still alive (another host would look the same) counts
    # until its TTL, then stops counting.
    hub.doc["lock"]["slot_ttl_seconds"] = 8
    hub.set_instance("lan-c", concurrency_limit=1)
    slots = Path(hub.env["XAF_HUB_HOME"]) / "slots"
    slots.mkdir(parents=True, exist_ok=True)
    created = time.time()
    (slots / "lan-c.manual.slot").write_text(
        json.dumps(
            {
                "instance": "lan-c",
                "pid": os.getpid(),
                "host": "other-host",
                "created": created,
                "session_id": "",
            }
        )
    )
    code, _, err = hub.cli(
        "dispatch", "--new", "--instance", "lan-c", "--text", "blocked", "--dry-run"
    )
    assert code == 3 and "at its limit" in err
    hub.wait_for(
        lambda: (
            hub.cli("dispatch", "--new", "--instance", "lan-c", "--text", "ok now", "--dry-run")[0]
            == 0
        ),
        timeout=30,
        step=1,
    )
    assert time.time() - created >= 8


def test_an_instance_init_marks_prod_refuses_writes_without_allow_prod(
    hub: Hub, tmp_path: Path
) -> None:
    import io

    from xaf_hub.cli.main import main

    url = hub.server("lan-c").url
    made = tmp_path / "init.json"
    code = main(
        ["--config", str(made), "init", "-i", f"live={url}", "--root", str(hub.root),
         "--prod", "live"],
        stdout=io.StringIO(), stderr=(err := io.StringIO()), env=hub.env,
    )
    assert code == 0, err.getvalue()
    record = json.loads(made.read_text("utf-8"))["instances"][0]
    hub.doc["instances"].append(record)  # init's own record, beside the test fleet
    hub.write_config()
    hub.env["XAF_HUB_PW_LIVE"] = hub.password("lan-c")
    code, _, err = hub.cli("dispatch", "--text", "x", "--instance", "live", "--new")
    assert code == 4 and "--allow-prod" in err
    code, out, err = hub.cli(
        "dispatch", "--text", "x", "--instance", "live", "--new", "--allow-prod", "--dry-run"
    )
    assert code == 0, err


@pytest.mark.core  # the read of its messages (prompts, files, todo list) on every release
def test_a_session_started_outside_the_hub_is_matched_on_its_own_messages(hub: Hub) -> None:
    # Two sessions a person started on the server itself (nothing of theirs in the hub's pool),
    # titled alike: only their messages tell them apart. The agent of one wrote a file.
    folder = hub.project_dir("shop")
    export = hub.session("local-a", "Orders work", "shop")
    login = hub.session("local-a", "Orders work too", "shop")
    script = folder / "orders" / "export_csv.py"
    write = ["write", {"filePath": str(script), "content": "HEADER = 'id,amount'\n"}]
    todos = [  # what its agent left on its todo list (todowrite holds the whole list)
        {"content": "Write the CSV header and rows", "status": "completed", "priority": "high"},
        {"content": "Zero-decimal currencies such as JPY", "status": "pending", "priority": "low"},
    ]
    hub.llm.set_mode(
        "fake-model", "tools", calls=[write, ["todowrite", {"todos": todos}]], text="written"
    )
    url, pw = hub.server("local-a").url, hub.password("local-a")
    # Run in its folder, as the TUI there does (1.2-1.14 run a prompt without one elsewhere).
    sandbox.prompt_async(url, pw, export, "Add a CSV export of the orders list", None, folder)
    hub.wait_for(script.exists, timeout=60)
    hub.wait_for(lambda: not hub.status("local-a", folder), timeout=60)  # its todo list too
    hub.llm.reset()
    hub.prompt("local-a", login, "Fix the login page style on small phones")
    hub.wait_for(lambda: not hub.status("local-a", folder), timeout=60)  # both runs over

    code, plan = hub.cli_json(
        "dispatch", "--dry-run", "--text", "export_csv.py writes the header row twice"
    )
    assert code == 0, plan
    assert (plan["action"], plan["session_id"], plan["via"]) == (
        "reuse", export, "smart match"
    ), plan["candidates"]
    top = plan["candidates"][0]
    assert top["evidence"]["files"] == ["orders/export_csv.py"]
    assert top["evidence"]["tasks"] == 1  # the prompt read from its messages
    # The text names the file its agent wrote: that, not the score, decides (core.cues).
    assert top["evidence"]["named_files"] == ["orders/export_csv.py"]
    assert "the task names its file export_csv.py" in top["verdict"], top
    # A follow-up that shares nothing with its prompt, only with its agent's todo list.
    code, plan = hub.cli_json(
        "dispatch", "--dry-run", "--text", "the pending item: zero-decimal currencies such as JPY"
    )
    assert code == 0, plan
    assert (plan["action"], plan["session_id"]) == ("reuse", export), [
        (c["similarity"], c["margin"], c["verdict"], c["evidence"]) for c in plan["candidates"]]
    assert plan["candidates"][0]["evidence"]["todos"] == ["Zero-decimal currencies such as JPY"]
    code, out, err = hub.cli(
        "dispatch", "--dry-run", "--text", "the pending item: zero-decimal currencies such as JPY"
    )
    assert code == 0 and "its todo: Zero-decimal currencies such as JPY" in out, err
    # New work in the same folder still gets its own session.
    code, plan = hub.cli_json("dispatch", "--dry-run", "--text", "Add a health check endpoint")
    assert code == 0 and plan["action"] == "create", plan["candidates"]
