"""Chat notifications end to end: real opencode servers, the fake model, the real patrol, and a
capture server on 127.0.0.1 standing in for each chat service (it checks signatures the way
the service documents them and refuses a wrong one).

Each test is one acceptance case: a heal is announced once when enabled and not at all when not;
a pool task finished by the patrol is announced once; a server stopped between two rounds is
announced down once and up once when it returns; with the receiver down the round still ends,
its report says what could not be sent, and the next round sends it once; a patrol killed
while posting never sends the message twice (at most once); `notify test` and `doctor`; and the
webhook URL and signing secret never appear in output, logs, reports, state files or the page.
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from sandbox import fleet as sandbox
from tests.fleet import Hub
from tests.notify_capture import TOKEN, Capture

pytestmark = pytest.mark.e2e

SECRET = "SECsigning-secret-9f8e7d6c"


def home(hub: Hub) -> Path:
    return Path(hub.env["XAF_HUB_HOME"])


def report(hub: Hub) -> dict[str, Any]:
    doc = json.loads((home(hub) / "patrol" / "report-latest.json").read_text("utf-8"))
    assert isinstance(doc, dict)
    return doc


def patrol(hub: Hub, *flags: str) -> dict[str, Any]:
    code, out, err = hub.cli("patrol", "--once", *flags)
    assert code == 0, err
    return report(hub)


def notify_errors(doc: dict[str, Any]) -> list[str]:
    return [e for e in doc["errors"] if e.startswith("notify:")]


def configure(hub: Hub, hooks: list[dict[str, Any]], **settings: Any) -> None:
    hub.write_config(notify={"webhooks": hooks, **settings})


def settled(hub: Hub, name: str, sid: str) -> dict[str, Any] | None:
    msgs = sandbox.messages(hub.server(name).url, hub.password(name), sid)
    if not msgs or msgs[-1]["info"]["role"] != "assistant":
        return None
    if not msgs[-1]["info"].get("time", {}).get("completed"):
        return None
    if sid in hub.status(name, str(hub.root / "app")):
        return None
    return msgs[-1]


@pytest.fixture
def captures() -> Iterator[list[Capture]]:
    started: list[Capture] = []
    yield started
    for cap in started:
        cap.stop()


def capture(captures: list[Capture], fmt: str, secret: str = "") -> Capture:
    cap = Capture(fmt, secret)
    cap.start()
    captures.append(cap)
    return cap


# ---------------------------------------------------------------------------------------------


def test_a_heal_is_announced_once_when_enabled_and_never_when_not(
    hub: Hub, captures: list[Capture]
) -> None:
    heal_on = capture(captures, "feishu", SECRET)
    default = capture(captures, "json")
    hub.env.update(HOOK_HEAL=heal_on.url, HOOK_HEAL_SECRET=SECRET, HOOK_DEFAULT=default.url)
    configure(
        hub,
        [
            {
                "name": "heal-on",
                "url_env": "HOOK_HEAL",
                "format": "feishu",
                "secret_env": "HOOK_HEAL_SECRET",
                "events": ["healed", "blackout"],
            },
            {"name": "default", "url_env": "HOOK_DEFAULT", "format": "json"},
        ],
    )
    hub.doc["models"] = {
        "default_dispatch_model": "fake/fake-model",
        "chain": ["opencode/free-model", "backup/good-model"],
        # The blackout lasts until the next reset hour: 12 h away, never seconds (a run at
        # 07:59:58 saw its 08:00 blackout over before the notice was derived).
        "blackout_reset_hour": (datetime.now().astimezone().hour + 12) % 24,
    }
    hub.write_config()
    hub.llm.set_mode("free-model", "429", retry_after=1)
    sid = hub.session("lan-b", "notify heal job")
    hub.prompt("lan-b", sid, "do the work", "opencode/free-model")
    hub.wait_for(lambda: settled(hub, "lan-b", sid), timeout=90)

    doc = patrol(hub, "--no-fill", "--no-design")
    assert [a["result"] for a in doc["healed"] if a["session"] == sid] == ["ok"]
    assert notify_errors(doc) == []
    healed = [t for t in heal_on.texts() if "Healed:" in t]
    assert len(healed) == 1, heal_on.texts()
    assert "notify heal job" in healed[0] and "lan-b" in healed[0]
    assert "backup/good-model" in healed[0]
    # The default webhook hears the blackout (so it does receive) but not the heal.
    kinds = [e["type"] for e in default.events()]
    assert "healed" not in kinds and kinds.count("blackout") == 1
    blackout = next(e for e in default.events() if e["type"] == "blackout")
    assert blackout["data"]["family"] == "opencode"
    assert any("sent" in n and "'heal-on'" in n for n in doc["notes"])

    # Another round: nothing new to tell.
    before = (len(heal_on.hits), len(default.hits))
    patrol(hub, "--no-fill", "--no-design")
    assert (len(heal_on.hits), len(default.hits)) == before


def test_a_task_finished_by_the_pool_is_announced_once(hub: Hub, captures: list[Capture]) -> None:
    ding = capture(captures, "dingtalk", SECRET)
    hub.env.update(HOOK_DING=ding.url, HOOK_DING_SECRET=SECRET)
    configure(
        hub,
        [
            {
                "name": "ding",
                "url_env": "HOOK_DING",
                "format": "dingtalk",
                "secret_env": "HOOK_DING_SECRET",
                "events": ["task_finished"],
            }
        ],
    )
    young = 2.0  # patrol.just_dispatched_seconds (10 by default)
    hub.write_config(page={"language": "zh-CN", "url": "http://127.0.0.1:8765/"},
                     patrol={"just_dispatched_seconds": young})
    code, _, err = hub.cli(
        "backlog",
        "add",
        "--title",
        "通知任务 notify pool task",
        "--id",
        "NT-1",
        "--instance",
        "lan-c",
    )
    assert code == 0, err
    doc = patrol(hub, "--no-design")
    sent_at = time.monotonic()
    task = next(a for a in doc["dispatched"] if a["task"] == "NT-1")
    assert ding.hits == []

    def finished() -> bool:
        code, data = hub.cli_json("sessions", "--instance", "lan-c")
        return (
            code == 0
            and not any(s["id"] == task["session"] and s["running"] for s in data["sessions"])
            and settled(hub, "lan-c", task["session"]) is not None
        )

    hub.wait_for(finished, timeout=90)
    # The pool leaves a row younger than that alone (its prompt may not show yet).
    time.sleep(max(0.0, young + 1 - (time.monotonic() - sent_at)))
    doc = patrol(hub, "--no-design")
    # No project.repository: finished, not verified, and announced as that.
    assert [a["task"] for a in doc["tasks_finished"]] == ["NT-1"] and doc["tasks_done"] == []
    assert notify_errors(doc) == []
    texts = ding.texts()
    assert len(texts) == 1, texts
    # Chinese (page.language), the task's title, its instance and the overview link.
    assert "任务已结束,未验证" in texts[0] and "通知任务" in texts[0] and "lan-c" in texts[0]
    assert "project.repository" in texts[0]
    assert "http://127.0.0.1:8765/" in texts[0]
    assert {"access_token", "timestamp", "sign"} == set(ding.hits[0].query)

    patrol(hub, "--no-design")
    assert len(ding.hits) == 1


def test_an_instance_stopped_between_rounds_is_announced_down_then_up(
    hub: Hub, tmp_path: Path, captures: list[Capture]
) -> None:
    wecom = capture(captures, "wecom")
    hub.env["HOOK_WECOM"] = wecom.url
    configure(
        hub,
        [
            {
                "name": "wecom",
                "url_env": "HOOK_WECOM",
                "format": "wecom",
                "events": ["instance_down", "instance_up"],
            }
        ],
    )

    def server(port: int, run: int) -> sandbox.OpencodeServer:
        # A fresh home each start: the log of the first run must not answer for the second.
        return sandbox.OpencodeServer(
            sandbox.find_opencode_binary(),
            home=tmp_path / f"h-x{run}",
            cwd=tmp_path / "c-x",
            password="pw-lan-x",
            config=sandbox.fake_provider_config(hub.llm.url),
            port=port,
            start_timeout=120,  # the machine is shared: a slow start is not a failure here
        )

    # An explicit free port: with port 0 opencode first tries 4096, which other servers on this
    # shared machine may take while lan-x is stopped.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    extra = server(port, 1)
    extra.start()
    try:
        hub.doc["instances"].append({"name": "lan-x", "url": extra.url, "roots": [str(hub.root)]})
        hub.write_config()
        hub.env["XAF_HUB_PW_LAN_X"] = "pw-lan-x"
        only_check = ("--no-fill", "--no-design", "--no-freelimit")
        patrol(hub, *only_check)
        assert wecom.hits == []  # the first round only records who answers

        extra.stop()
        doc = patrol(hub, *only_check)
        assert not next(i for i in doc["instances"] if i["name"] == "lan-x")["reachable"]
        texts = wecom.texts()
        assert len(texts) == 1 and "Server down: lan-x" in texts[0], texts
        assert "connection refused" in texts[0]
        patrol(hub, *only_check)
        assert len(wecom.hits) == 1  # still down: nothing new

        extra = server(port, 2)
        extra.start()
        assert extra.port == port
        patrol(hub, *only_check)
        texts = wecom.texts()
        assert len(texts) == 2 and "Server back: lan-x" in texts[1], texts
        patrol(hub, *only_check)
        assert len(wecom.hits) == 2
    finally:
        extra.stop()


def test_a_receiver_that_is_down_holds_nothing_up_and_gets_the_message_once_later(
    hub: Hub, captures: list[Capture]
) -> None:
    slack = capture(captures, "slack")
    slow = capture(captures, "json")
    slow.mode = "hang"
    hub.env.update(HOOK_SLACK=slack.url, HOOK_SLOW=slow.url)
    configure(
        hub,
        [
            {
                "name": "team",
                "url_env": "HOOK_SLACK",
                "format": "slack",
                "events": ["daily_summary"],
            },
            {
                "name": "slowpoke",
                "url_env": "HOOK_SLOW",
                "format": "json",
                "events": ["daily_summary"],
            },
        ],
        summary_hour=0,
        timeout_seconds=1,
        retries=1,
    )
    slack.stop()  # the chat service is down
    only_check = ("--no-fill", "--no-design", "--no-freelimit")
    t0 = time.monotonic()
    doc = patrol(hub, *only_check)
    print(f"round with one receiver down and one hanging: {time.monotonic() - t0:.1f} s")
    errors = notify_errors(doc)
    assert any(
        "could not send 1 message(s) (daily_summary) to webhook 'team': connection refused" in e
        for e in errors
    ), errors
    # The hanging receiver was given up on by the timeout, not waited for.
    assert any("'slowpoke'" in e and "no answer within 1s" in e for e in errors), errors
    md = (home(hub) / "patrol" / "report-latest.md").read_text("utf-8")
    assert "could not send 1 message(s)" in md
    code, out, _ = hub.cli("doctor")
    assert "last delivery failed" in out and "connection refused" in out

    slack.start()  # back, on the same address
    doc = patrol(hub, *only_check)
    texts = slack.texts()
    assert len(texts) == 1 and "Daily summary" in texts[0], texts
    assert any("sent 1 message(s) to 'team' (daily_summary 1)" in n for n in doc["notes"])
    assert not any("'team'" in e for e in notify_errors(doc))
    patrol(hub, *only_check)
    assert len(slack.hits) == 1


def test_a_patrol_killed_while_posting_never_sends_the_message_twice(
    hub: Hub, captures: list[Capture]
) -> None:
    """At most once: the claim says the request left before the kill, so no blind re-send."""
    receiver = capture(captures, "json")
    receiver.mode = "hang"
    hub.env["HOOK_JSON"] = receiver.url
    configure(
        hub,
        [{"name": "team", "url_env": "HOOK_JSON", "format": "json", "events": ["daily_summary"]}],
        summary_hour=0,
        timeout_seconds=20,
        retries=0,
    )
    proc = hub.popen("patrol", "--once", "--no-fill", "--no-design", "--no-freelimit")
    try:
        hub.wait_for(lambda: receiver.hits, timeout=90)  # the hub is waiting for the answer
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    state = json.loads((home(hub) / "notify" / "state.json").read_text("utf-8"))
    [item] = state["outbox"]
    assert item["event"]["type"] == "daily_summary"
    assert item["sending"]["posted"] is True  # recorded before the request's first byte

    receiver.mode = "ok"
    doc = patrol(hub, "--no-fill", "--no-design", "--no-freelimit")
    assert any("maybe delivered, not sent again" in e for e in notify_errors(doc)), doc["errors"]
    for _ in range(2):
        patrol(hub, "--no-fill", "--no-design", "--no-freelimit")
    assert len(receiver.hits) == 1  # the copy the receiver had: never a second one
    state = json.loads((home(hub) / "notify" / "state.json").read_text("utf-8"))
    assert state["outbox"] == []


def test_notify_test_and_doctor(hub: Hub, captures: list[Capture]) -> None:
    hooks = []
    for fmt in ("json", "slack", "feishu", "dingtalk", "wecom"):
        secret = SECRET if fmt in ("feishu", "dingtalk") else ""
        cap = capture(captures, fmt, secret)
        env = f"HOOK_{fmt.upper()}"
        hub.env[env] = cap.url
        hook: dict[str, Any] = {"name": fmt, "url_env": env, "format": fmt}
        if secret:
            hub.env[env + "_SECRET"] = secret
            hook["secret_env"] = env + "_SECRET"
        hooks.append(hook)
    configure(hub, hooks)
    code, out, err = hub.cli("notify", "test")
    assert code == 0, out + err
    for fmt in ("json", "slack", "feishu", "dingtalk", "wecom"):
        assert f"{fmt} ({fmt}): delivered" in out
    assert '"code": 0' in out and '"errcode": 0' in out and "receiver answered: ok" in out
    for cap in captures:
        assert len(cap.hits) == 1 and "Test message" in cap.texts()[0]

    code, data = hub.cli_json("notify", "test", "--webhook", "feishu")
    assert code == 0 and [r["delivered"] for r in data["results"]] == [True]

    # A wrong signing secret: the service refuses, exit 4 with its answer.
    hub.env["HOOK_FEISHU_SECRET"] = "SECnot-the-right-one"
    code, out, _ = hub.cli("notify", "test", "--webhook", "feishu")
    assert code == 4 and "NOT delivered" in out and "19021" in out
    # The receiver is down: exit 2.
    captures[1].stop()
    code, out, _ = hub.cli("notify", "test", "--webhook", "slack")
    assert code == 2 and "connection refused" in out
    code, _, err = hub.cli("notify", "test", "--webhook", "nope")
    assert code == 4 and "unknown webhook 'nope'" in err

    code, out, err = hub.cli("doctor", "--online")
    for fmt in ("json", "slack", "feishu", "dingtalk", "wecom"):
        assert f"webhook {fmt}" in out
    assert "host 127.0.0.1 resolves (nothing sent)" in out
    del hub.env["HOOK_WECOM"]
    code, out, _ = hub.cli("doctor")
    assert code == 4 and "$HOOK_WECOM is not set" in out

    # A literal URL in the config file is refused like a password.
    hooks[0]["url"] = captures[0].url
    configure(hub, hooks)
    code, _, err = hub.cli("notify", "test")
    assert code == 4 and "literal webhook url" in err


def forms(secret: str) -> list[str]:
    return [secret, quote(secret, safe=""), base64.b64encode(secret.encode()).decode()]


def test_webhook_url_and_signing_secret_never_leak(
    hub: Hub, tmp_path: Path, captures: list[Capture]
) -> None:
    feishu = capture(captures, "feishu", SECRET)
    ding = capture(captures, "dingtalk", SECRET)
    hub.env.update(HOOK_F=feishu.url, HOOK_F_SECRET=SECRET, HOOK_D=ding.url, HOOK_D_SECRET=SECRET)
    configure(
        hub,
        [
            {
                "name": "f",
                "url_env": "HOOK_F",
                "format": "feishu",
                "secret_env": "HOOK_F_SECRET",
                "events": ["daily_summary", "instance_down"],
            },
            {
                "name": "d",
                "url_env": "HOOK_D",
                "format": "dingtalk",
                "secret_env": "HOOK_D_SECRET",
                "events": ["daily_summary"],
            },
        ],
        summary_hour=0,
        timeout_seconds=1,
        retries=0,
    )
    secrets = [feishu.url, ding.url, TOKEN, SECRET]
    ding.stop()  # one failing receiver: its errors go to the log and the report
    outputs = []
    page = tmp_path / "page.html"
    for args in (
        ("patrol", "--once", "--no-fill", "--no-design"),
        ("patrol", "--once", "--no-fill", "--no-design", "--json"),
        ("patrol", "status"),
        ("notify", "test"),
        ("notify", "test", "--json", "--debug"),
        ("doctor",),
        ("doctor", "--online", "--json"),
        ("sessions", "--html", str(page)),
    ):
        code, out, err = hub.cli(*args)
        outputs.append((args, out + err))
    assert any("connection refused" in text for _, text in outputs)  # the failures were shown
    for args, text in outputs:
        leaked = [f for s in secrets for f in forms(s) if f in text]
        assert not leaked, (args, leaked)
    written = [p for p in [*home(hub).rglob("*"), page] if p.is_file()]
    assert {"state.json", "report-latest.json", "report-latest.md"} <= {p.name for p in written}
    for p in written:
        text = p.read_bytes().decode("utf-8", "replace")
        leaked = [f for s in secrets for f in forms(s) if f in text]
        assert not leaked, (p, leaked)
    # The chat message itself carries no secret either (the signature is not the secret).
    assert feishu.hits and not any(SECRET in h.raw.decode() for h in feishu.hits)
