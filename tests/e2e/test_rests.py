"""Rests as long as the provider said, against real opencode servers and a fake model that
answers 429: with Retry-After 300, with Retry-After 7200, and with none. One patrol round heals
all three; `models` shows each rest's end and why; `models clear` ends one. A provider that
says "try again in 99999999999999 days" is healed too, and rests `models.max_rest_hours`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet as sandbox
from tests.fleet import Hub
from xaf_hub.core.clock import next_reset, to_ms

pytestmark = pytest.mark.e2e

GOOD = "backup/good-model"
FIVE_MIN = "fake/slow-model"  # no blackout family: a stated time rests the model alone
TWO_HOURS = "fake/missing-model"
UNSAID = "opencode/free-model"  # family "opencode": nothing stated -> the family, reset hour


def home(hub: Hub) -> Path:
    return Path(hub.env["XAF_HUB_HOME"])


def run_state(hub: Hub, name: str, sid: str) -> dict[str, Any]:
    code, data = hub.cli_json("sessions", "--instance", name)
    return next((s for s in data["sessions"] if s["id"] == sid), {})


def answered_by_good(hub: Hub, name: str, sid: str) -> bool:
    msgs = sandbox.messages(hub.server(name).url, hub.password(name), sid)
    info = msgs[-1]["info"] if msgs else {}
    return (
        info.get("role") == "assistant"
        and f"{info.get('providerID')}/{info.get('modelID')}" == GOOD
        and bool(info.get("time", {}).get("completed"))
        and not info.get("error")
    )


def iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_each_rest_lasts_as_long_as_the_provider_said_and_a_person_can_end_it(hub: Hub) -> None:
    # The reset hour 12 h from now (UTC): never near the real clock's reset while this runs.
    reset_hour = (datetime.now(UTC).hour + 12) % 24
    hub.doc["models"] = {
        "default_dispatch_model": "fake/fake-model",
        "blackout_reset_hour": reset_hour,
        "timezone": "UTC",
    }
    hub.set_instance("lan-b", models=[FIVE_MIN, GOOD])
    hub.set_instance("lan-c", models=[TWO_HOURS, GOOD])
    hub.set_instance("local-a", models=[UNSAID, GOOD])
    hub.llm.set_mode(FIVE_MIN, "429", retry_after=300)
    hub.llm.set_mode(TWO_HOURS, "429", retry_after=7200)
    hub.llm.set_mode(UNSAID, "429")  # opencode backs off 2 s, 4 s, ... 40 s: its own times
    cases = {"lan-b": FIVE_MIN, "lan-c": TWO_HOURS, "local-a": UNSAID}
    sids = {}
    for name, model in cases.items():
        sids[name] = hub.session(name, f"limited on {model}")
        hub.prompt(name, sids[name], "do the work", model)

    def all_retrying() -> bool:
        rows = {n: run_state(hub, n, s) for n, s in sids.items()}
        if any(r.get("run_state") != "retry" for r in rows.values()):
            return False
        # The back-off case: wait for a retry whose next try is a few seconds off, so the
        # patrol reads it in retry, not in the instant between two tries.
        nxt = iso(rows["local-a"]["retry_next_at"])
        return nxt - datetime.now(UTC) > timedelta(seconds=3)

    hub.wait_for(all_retrying, timeout=60, step=0.5)
    began = datetime.now(UTC)
    code, out, err = hub.cli("patrol", "--once")
    assert code == 0, err
    doc = json.loads((home(hub) / "patrol" / "report-latest.json").read_text("utf-8"))
    healed = {a["session"]: a for a in doc["healed"]}
    assert all(healed[s]["model"] == GOOD for s in sids.values()), doc["healed"]
    for name, sid in sids.items():
        hub.wait_for(lambda n=name, s=sid: answered_by_good(hub, n, s), timeout=60)

    code, view = hub.cli_json("models")
    assert code == 0
    rows = {m["model"]: m for m in view["models"]}
    five, two, unsaid = rows[FIVE_MIN], rows[TWO_HOURS], rows[UNSAID]
    assert (five["rests"], five["scope"], five["why"]) == (FIVE_MIN, "model", "stated")
    assert abs(iso(five["resting_until"]) - (began + timedelta(seconds=300))) < timedelta(
        seconds=30
    )
    assert (two["rests"], two["why"]) == (TWO_HOURS, "stated")
    assert abs(iso(two["resting_until"]) - (began + timedelta(seconds=7200))) < timedelta(
        seconds=30
    )
    # Nothing stated: the family rests until the reset hour, as before.
    assert (unsaid["rests"], unsaid["scope"], unsaid["why"]) == ("opencode", "family", "reset_hour")
    reset = next_reset(began, reset_hour, UTC)
    assert to_ms(iso(unsaid["resting_until"])) // 1000 == to_ms(reset) // 1000
    for model in (FIVE_MIN, TWO_HOURS, UNSAID):
        assert rows[model]["next_for"] == []
    assert sorted(rows[GOOD]["next_for"]) == ["lan-b", "lan-c", "local-a"]

    # A person ends the two-hour rest: lan-c's next dispatch goes back to its first model.
    code, out, err = hub.cli("models", "clear", TWO_HOURS)
    assert code == 0 and f"rest of {TWO_HOURS} ended" in out, err
    code, view = hub.cli_json("models")
    rows = {m["model"]: m for m in view["models"]}
    assert rows[TWO_HOURS]["resting"] is False and rows[TWO_HOURS]["next_for"] == ["lan-c"]
    assert rows[FIVE_MIN]["resting"] is True  # the others keep theirs
    code, plan = hub.cli_json(
        "dispatch", "--new", "--instance", "lan-c", "--text", "x", "--dry-run"
    )
    assert code == 0 and plan["model"] == TWO_HOURS
    audit = [json.loads(x) for x in (home(hub) / "audit.log").read_text().splitlines()]
    assert [a["command"] for a in audit if a["command"].startswith("models.")] == ["models.clear"]


def test_a_rest_stated_beyond_the_maximum_lasts_the_maximum(hub: Hub) -> None:
    # The provider's word, as a hostile or broken one said it: far more than a calendar holds.
    said = "Rate limit exceeded. Please try again in 99999999999999 days."
    hub.doc["models"] = {"default_dispatch_model": "fake/fake-model", "max_rest_hours": 48}
    hub.set_instance("lan-b", models=[FIVE_MIN, GOOD])
    hub.llm.set_mode(FIVE_MIN, "429", error_message=said)
    sid = hub.session("lan-b", "limited for ever")
    hub.prompt("lan-b", sid, "do the work", FIVE_MIN)

    def retrying() -> bool:
        row = run_state(hub, "lan-b", sid)
        return row.get("run_state") == "retry" and said in row.get("retry_message", "")

    hub.wait_for(retrying, timeout=60, step=0.5)
    began = datetime.now(UTC)
    code, out, err = hub.cli("patrol", "--once")
    assert code == 0, err
    doc = json.loads((home(hub) / "patrol" / "report-latest.json").read_text("utf-8"))
    assert [(a["session"], a["model"]) for a in doc["healed"]] == [(sid, GOOD)], doc["healed"]
    hub.wait_for(lambda: answered_by_good(hub, "lan-b", sid), timeout=60)
    code, view = hub.cli_json("models")
    row = {m["model"]: m for m in view["models"]}[FIVE_MIN]
    assert (row["rests"], row["why"]) == (FIVE_MIN, "stated")
    until = iso(row["resting_until"])
    assert began + timedelta(hours=48) - timedelta(seconds=30) <= until
    assert until <= datetime.now(UTC) + timedelta(hours=48)
