"""`confirm` and `dispatch --confirm-wait` against real opencode servers whose fake model we steer.

The cases: a session stuck in `retry` (429 with a one-hour Retry-After) is reported as
retrying with the provider's message and the next try, and `confirm --fix` heals it through the
patrol's own heal (abort, next model, continue prompt, blackout through the one writer);
`dispatch --confirm-wait` heals a 429 on the spot - as a stuck retry and as a run that failed
inside the window - and an unavailable model without a blackout; without the option dispatch
does not wait.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.fleet import Hub
from xaf_hub.core.clock import next_reset, resolve_timezone, to_ms
from xaf_hub.core.discipline import CONTINUE_PROMPT, DISCIPLINE_MARKER
from xaf_hub.ops import heal as heal_module
from xaf_hub.patrol.jobs import fix_free_limit
from xaf_hub.store.model_state import ModelState

pytestmark = pytest.mark.e2e

CONTINUE_HEAD = CONTINUE_PROMPT.splitlines()[0]
CHAIN = ["opencode/free-model", "backup/good-model"]


def home(hub: Hub) -> Path:
    return Path(hub.env["XAF_HUB_HOME"])


def audit_lines(hub: Hub) -> list[dict[str, Any]]:
    path = home(hub) / "audit.log"
    return [json.loads(ln) for ln in path.read_text("utf-8").splitlines()] if path.exists() else []


def model_state(hub: Hub) -> dict[str, Any]:
    return dict(json.loads((home(hub) / ".model_state.json").read_text("utf-8")))


def an_hour_on() -> int:
    return to_ms(datetime.now(UTC)) + 3_600_000


def next_eight() -> int:
    return to_ms(next_reset(datetime.now(UTC), 8, resolve_timezone("local")))


def use_chain(hub: Hub, chain: list[str], **models: Any) -> None:
    hub.doc["models"] = {"chain": chain, "default_dispatch_model": "fake/fake-model", **models}
    hub.write_config()


def agent_requests(hub: Hub, model: str, needle: str) -> list[dict[str, Any]]:
    return [
        r
        for r in hub.llm.requests()
        if r["model"] == model and not r["title_call"] and needle in r["last_user_text"]
    ]


def settled_by(hub: Hub, name: str, sid: str, model: str) -> Callable[[], bool]:
    """True once the session is idle and its newest message is a finished answer of ``model``."""

    def check() -> bool:
        msgs = sandbox.messages(hub.server(name).url, hub.password(name), sid)
        if not msgs or sid in hub.status(name, hub.root / "app"):
            return False
        info = msgs[-1]["info"]
        return (
            info["role"] == "assistant"
            and not info.get("error")
            and bool(info.get("time", {}).get("completed"))
            and f"{info['providerID']}/{info['modelID']}" == model
        )

    return check


@pytest.fixture
def writers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Spy on the one blackout writer and on the patrol's heal, as the commands call them."""
    calls: list[str] = []
    # The commands heal with the patrol's own function, not a copy of it.
    assert fix_free_limit.__dict__["heal"] is heal_module.heal
    real_mark, real_heal = ModelState.mark_rest, heal_module.heal

    def mark(self: ModelState, target: str, **kw: Any) -> int:
        calls.append(f"mark_rest {target} {kw['source'].split()[0]}")
        return real_mark(self, target, **kw)

    async def heal(*args: Any, **kwargs: Any) -> heal_module.Healing:
        calls.append(f"heal {kwargs.get('origin')}")
        return await real_heal(*args, **kwargs)

    monkeypatch.setattr(ModelState, "mark_rest", mark)
    monkeypatch.setattr(heal_module, "heal", heal)
    yield calls


def abort_all(hub: Hub, name: str) -> None:
    for sid in hub.busy_ids(name):
        sandbox.abort(hub.server(name).url, hub.password(name), sid)


# ---------------------------------------------------------------------------------------------
# confirm


def test_confirm_reports_a_stuck_retry_and_fix_heals_it(hub: Hub, writers: list[str]) -> None:
    use_chain(hub, CHAIN)
    hub.llm.set_mode("free-model", "429", retry_after=3600)
    sid = hub.session("local-a", "stuck in retry")
    hub.prompt("local-a", sid, "do the work", "opencode/free-model")
    app = hub.root / "app"
    hub.wait_for(lambda: hub.status("local-a", app).get(sid, {}).get("type") == "retry", 60)

    code, doc = hub.cli_json("confirm", "--session", sid)
    assert code == 1, doc
    assert (doc["instance"], doc["state"], doc["model"]) == (
        "local-a",
        "retrying",
        "opencode/free-model",
    )
    assert "free usage limit reached" in doc["retry"]["message"] and doc["signal"] == "rate_limited"
    now_ms = to_ms(datetime.now(UTC))
    assert now_ms + 3000_000 < doc["retry"]["next_ms"] < now_ms + 3700_000
    assert doc["healable"] and doc["fix"] is None
    code, out, _ = hub.cli("confirm", "--session", sid, "--instance", "local-a")
    assert code == 1
    assert f"{sid} on local-a (stuck in retry): retrying on opencode/free-model" in out
    assert "free usage limit reached" in out and "; next try at " in out and "(in 59 min)" in out
    assert writers == [] and not (home(hub) / ".model_state.json").exists()

    code, doc = hub.cli_json("confirm", "--session", sid, "--fix")
    assert code == 0, doc
    fix = doc["fix"]
    assert (fix["healed"], fix["state"], fix["from_model"], fix["to_model"]) == (
        True,
        "retry",
        "opencode/free-model",
        "backup/good-model",
    )
    assert fix["blackout"]["family"] == "opencode"
    assert abs(fix["blackout"]["until_ms"] - an_hour_on()) < 60_000  # as Retry-After: 3600 said
    assert writers == ["heal confirm", "mark_rest opencode confirm.fix_free_limit"]
    blackout = model_state(hub)["blackouts"]["opencode"]
    assert blackout["until_ms"] == fix["blackout"]["until_ms"] and blackout["why"] == "stated"
    assert "free usage limit" in blackout["reason"]
    assert blackout["source"] == f"confirm.fix_free_limit local-a/{sid}"

    hub.wait_for(settled_by(hub, "local-a", sid, "backup/good-model"), 60)
    sent = agent_requests(hub, "good-model", CONTINUE_HEAD)
    assert len(sent) == 1 and DISCIPLINE_MARKER in sent[0]["last_user_text"]
    audit = [(e["command"], e["result"]) for e in audit_lines(hub) if e["session"] == sid]
    assert audit == [("confirm.blackout", "blackout"), ("confirm.heal", "abort+prompt")]

    # Healed: the session finished on the new model, and there is nothing left to fix.
    code, out, _ = hub.cli("confirm", "--session", sid, "--fix")
    assert code == 0
    assert "finished (last run on backup/good-model)" in out and "nothing to fix" in out
    assert len(agent_requests(hub, "good-model", CONTINUE_HEAD)) == 1
    assert writers == ["heal confirm", "mark_rest opencode confirm.fix_free_limit"]


def test_confirm_fix_heals_a_run_that_failed_with_429(hub: Hub, writers: list[str]) -> None:
    use_chain(hub, CHAIN)
    hub.llm.set_mode("free-model", "429", retry_after=1)
    sid = hub.session("lan-c", "failed on a rate limit")
    hub.prompt("lan-c", sid, "do the work", "opencode/free-model")

    def failed() -> dict[str, Any] | None:
        code, doc = hub.cli_json("confirm", "--session", sid)
        return doc if doc["state"] == "failed" else None

    doc = hub.wait_for(failed, 60)
    assert doc["detail"].startswith("APIError: HTTP 429: Rate limit exceeded")
    assert (doc["signal"], doc["model"], doc["healable"]) == (
        "rate_limited",
        "opencode/free-model",
        True,
    )
    code, out, _ = hub.cli("confirm", "--session", sid)
    assert code == 1 and "failed on opencode/free-model: APIError: HTTP 429" in out

    code, out, _ = hub.cli("confirm", "--session", sid, "--fix")
    assert code == 0, out
    assert "fix: rate-limited on opencode/free-model, healed: re-sent on backup/good-model" in out
    assert writers == ["heal confirm", "mark_rest opencode confirm.fix_free_limit"]
    assert model_state(hub)["blackouts"]["opencode"]["until_ms"] == next_eight()
    hub.wait_for(settled_by(hub, "lan-c", sid, "backup/good-model"), 60)
    assert [
        (e["command"], e["result"]) for e in audit_lines(hub) if e["command"].startswith("confirm")
    ] == [("confirm.blackout", "blackout"), ("confirm.heal", "reuse")]
    # The patrol remembers the heal: its next cycle leaves the session alone.
    code, out, err = hub.cli("patrol", "--once", "--no-check", "--no-design", "--no-fill")
    assert code == 0, err
    report = json.loads((home(hub) / "patrol" / "report-latest.json").read_text("utf-8"))
    assert report["healed"] == []


def test_confirm_guards(hub: Hub) -> None:
    code, _, err = hub.cli("confirm", "--session", "ses_doesnotexist")
    assert code == 4 and "not found on any instance" in err
    # A failed run that is not a rate limit: reported with its error; --fix leaves it alone.
    hub.llm.set_mode("fake-model", "401")
    sid = hub.session("lan-c", "bad key")
    hub.prompt("lan-c", sid, "do the work", "fake/fake-model")
    hub.wait_for(lambda: hub.cli_json("confirm", "--session", sid)[1]["state"] == "failed", 60)
    code, doc = hub.cli_json("confirm", "--session", sid, "--fix")
    assert code == 1 and "HTTP 401" in doc["detail"] and not doc["healable"]
    assert doc["fix"] == {"healed": False, "reason": "nothing the patrol would heal"}
    assert len(agent_requests(hub, "fake-model", "")) == 1


# ---------------------------------------------------------------------------------------------
# dispatch --confirm-wait


def test_confirm_wait_heals_a_stuck_retry_on_the_spot(hub: Hub, writers: list[str]) -> None:
    use_chain(hub, CHAIN)
    hub.llm.set_mode("free-model", "429", retry_after=3600)
    hub.llm.set_mode("good-model", "slow", delay=60)
    try:
        code, doc = hub.cli_json(
            "dispatch",
            "--new",
            "--instance",
            "local-a",
            "--text",
            "build the export page",
            "--confirm-wait",
            "20",
        )
        assert code == 0, doc
        sid, confirm = doc["session_id"], doc["confirm"]
        assert doc["model"] == "opencode/free-model"
        assert (confirm["state"], confirm["model"]) == ("running", "backup/good-model")
        assert [(h["state"], h["from_model"], h["to_model"]) for h in confirm["healed"]] == [
            ("retry", "opencode/free-model", "backup/good-model")
        ]
        assert confirm["message"].startswith(
            "rate-limited on opencode/free-model, healed: now running on backup/good-model "
            "(blackout of family opencode until "
        )
        assert writers == ["heal dispatch", "mark_rest opencode dispatch.fix_free_limit"]
        rest = model_state(hub)["blackouts"]["opencode"]
        assert abs(rest["until_ms"] - an_hour_on()) < 60_000 and rest["why"] == "stated"
        sent = hub.wait_for(lambda: agent_requests(hub, "good-model", CONTINUE_HEAD), 30)
        assert len(sent) == 1 and DISCIPLINE_MARKER in sent[0]["last_user_text"]
        # The server agrees: the session runs, on the good model, and it is not retrying.
        assert hub.status("local-a", hub.root / "app").get(sid, {}).get("type") == "busy"
        code, seen = hub.cli_json("confirm", "--session", sid)
        assert (code, seen["state"], seen["model"]) == (0, "running", "backup/good-model")
    finally:
        abort_all(hub, "local-a")


def test_confirm_wait_heals_a_run_that_fails_in_the_window(hub: Hub, writers: list[str]) -> None:
    use_chain(hub, CHAIN)
    # Retry-After 1: opencode retries for about 5 s, then the run ends with APIError 429. The
    # wait heals it either while it retries or once it failed, whichever it sees first.
    hub.llm.set_mode("free-model", "429", retry_after=1)
    code, out, err = hub.cli(
        "dispatch", "--new", "--instance", "lan-b", "--text", "fix the invoice", "--confirm-wait"
    )
    assert code == 0, out + err
    sent_line, attach_line, confirm_line = out.strip().splitlines()
    assert attach_line.startswith("open it in opencode: OPENCODE_SERVER_PASSWORD=")
    assert sent_line.startswith("created session ") and "model: opencode/free-model" in sent_line
    assert confirm_line.startswith("confirm: rate-limited on opencode/free-model, healed: ")
    assert (
        "now running on backup/good-model" in confirm_line
        or "ran on backup/good-model and already finished" in confirm_line
    )
    assert "(blackout of family opencode until " in confirm_line
    assert writers == ["heal dispatch", "mark_rest opencode dispatch.fix_free_limit"]
    sid = sent_line.split()[2]
    hub.wait_for(settled_by(hub, "lan-b", sid, "backup/good-model"), 60)
    assert len(agent_requests(hub, "good-model", CONTINUE_HEAD)) == 1


def test_confirm_wait_switches_an_unavailable_model_without_blackout(
    hub: Hub, writers: list[str]
) -> None:
    use_chain(hub, ["fake/missing-model", "backup/good-model"])
    hub.llm.set_mode("missing-model", "404")
    code, doc = hub.cli_json(
        "dispatch", "--new", "--instance", "lan-c", "--text", "tidy the logs", "--confirm-wait"
    )
    assert code == 0, doc
    healed = doc["confirm"]["healed"]
    assert [(h["state"], h["signal"], h["to_model"], h["blackout"]) for h in healed] == [
        ("failed", "model_unavailable", "backup/good-model", None)
    ]
    assert doc["confirm"]["state"] in ("running", "finished")
    assert doc["confirm"]["message"].startswith("model unavailable on fake/missing-model, healed: ")
    assert writers == ["heal dispatch"]
    assert model_state(hub)["blackouts"] == {}
    hub.wait_for(settled_by(hub, "lan-c", doc["session_id"], "backup/good-model"), 60)
    assert any(e["command"] == "dispatch.heal" and e["result"] == "reuse" for e in audit_lines(hub))


def test_dispatch_without_confirm_wait_does_not_wait(hub: Hub, writers: list[str]) -> None:
    use_chain(hub, CHAIN)
    hub.llm.set_mode("free-model", "429", retry_after=3600)
    try:
        code, doc = hub.cli_json("dispatch", "--new", "--instance", "lan-c", "--text", "x")
        assert code == 0 and "confirm" not in doc and doc["model"] == "opencode/free-model"
        assert writers == [] and not (home(hub) / ".model_state.json").exists()
    finally:
        hub.wait_for(lambda: agent_requests(hub, "free-model", "x"), 30)
        abort_all(hub, "lan-c")
    for bad in (["--dry-run", "--confirm-wait"], ["--confirm-wait", "0"]):
        code, _, err = hub.cli("dispatch", "--new", "--text", "x", *bad)
        assert code == 4 and "--confirm-wait" in err
