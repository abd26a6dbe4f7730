"""`xaf-hub models`: the list, a rest started by hand, a rest ended (audited, announced), and
bad input as one line with exit 4. The model state is a file in a tmp hub home."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.cli.main import main
from xaf_hub.config.load import load_config
from xaf_hub.core.clock import iso_time, to_ms
from xaf_hub.store.backends import Stores

FREE = "opencode/big-pickle"
OTHER = "opencode/other"
PAID = "fake/paid"
CONFIG = {
    "instances": [
        {"name": "a", "url": "http://127.0.0.1:9", "roots": ["/tmp/p"]},
        {"name": "b", "url": "http://127.0.0.1:9", "roots": ["/tmp/p"], "models": [PAID]},
    ],
    "models": {"chain": [FREE, OTHER, PAID], "timezone": "UTC"},
    "notify": {"webhooks": [{"name": "team", "url_env": "TEAM_HOOK", "format": "json"}]},
}


class Hub:
    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.config = tmp_path / "config.json"
        self.config.write_text(json.dumps(CONFIG), "utf-8")
        self.env = {"XAF_HUB_HOME": str(self.home), "TEAM_HOOK": "http://127.0.0.1:9/hook"}

    def cli(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["--config", str(self.config), *args], stdout=out, stderr=err, env=self.env)
        return code, out.getvalue(), err.getvalue()

    def json(self, *args: str) -> Any:
        code, out, err = self.cli(*args, "--json")
        assert code == 0, err
        return json.loads(out)

    def audit(self) -> list[dict[str, Any]]:
        path = self.home / "audit.log"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def outbox(self) -> list[dict[str, Any]]:
        path = next(self.home.rglob("state.json"), None)
        return [] if path is None else json.loads(path.read_text())["outbox"]


@pytest.fixture
def hub(tmp_path: Path) -> Hub:
    return Hub(tmp_path)


def by_model(doc: Any) -> dict[str, Any]:
    return {m["model"]: m for m in doc["models"]}


def test_list_rest_and_clear(hub: Hub) -> None:
    rows = by_model(hub.json("models"))
    assert list(rows) == [FREE, OTHER, PAID]
    assert rows[FREE]["resting"] is False and rows[FREE]["resting_until"] is None
    assert rows[FREE]["next_for"] == ["a"] and rows[PAID]["next_for"] == ["b"]

    code, out, err = hub.cli("models", "rest", FREE, "--until", "90m", "--reason", "incident")
    assert code == 0 and "rests until" in out, err
    rows = by_model(hub.json("models"))
    until = datetime.fromisoformat(rows[FREE]["resting_until"].replace("Z", "+00:00"))
    assert timedelta(minutes=89) < until - datetime.now(UTC) <= timedelta(minutes=90)
    assert (rows[FREE]["why"], rows[FREE]["why_words"]) == ("person", "set by a person")
    assert rows[OTHER]["resting"] is False  # a model's own rest leaves its family at work
    assert rows[OTHER]["next_for"] == ["a"]  # a moves on to the next model of its chain
    assert hub.audit()[-1]["command"] == "models.rest"

    # The family rests as a rate limit would rest it; clearing the model ends both rests.
    cfg = load_config(str(hub.config), env=hub.env)
    Stores(cfg).model_state().mark_blackout("opencode", "429", "test", datetime.now(UTC))
    assert by_model(hub.json("models"))[OTHER]["why"] == "reset_hour"
    code, out, _ = hub.cli("models", "clear", FREE)
    assert code == 0 and out.count("ended") == 2
    assert all(not m["resting"] for m in hub.json("models")["models"])
    last = hub.audit()[-1]
    assert last["command"] == "models.clear" and len(last["ended"]) == 2
    notices = [i["event"] for i in hub.outbox() if i["event"]["type"] == "rest_ended"]
    assert sorted(n["data"]["family"] for n in notices) == ["opencode", FREE]
    assert hub.cli("models", "clear", FREE)[1].startswith("nothing rests")


def test_a_family_rests_until_the_next_clock_time(hub: Hub) -> None:
    rest = hub.json("models", "rest", "opencode", "--until", "03:30")
    until = datetime.fromisoformat(rest["resting_until"].replace("Z", "+00:00"))
    assert (until.hour, until.minute) == (3, 30)  # models.timezone is UTC here
    assert timedelta(0) < until - datetime.now(UTC) <= timedelta(hours=24)
    rows = by_model(hub.json("models"))
    assert rows[FREE]["rests"] == rows[OTHER]["rests"] == "opencode"
    assert rows[PAID]["next_for"] == ["a", "b"]  # a's chain skips the resting family


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("models", "clear"), "name a FAMILY or a MODEL"),
        (("models", "clear", "nofamily"), "neither a blackout family"),
        (("models", "rest", FREE), "--until TIME is required"),
        (("models", "rest", FREE, "--until", "tomorrow-ish"), "is not a time"),
        (("models", "rest", FREE, "--until", "2020-01-01T00:00"), "not in the future"),
        (("models", "rest", FREE, "--until", "99999999999999d"), "further off than a calendar"),
        (("models", "list", FREE), "list takes no"),
    ],
)
def test_bad_input_is_one_line_exit_4(hub: Hub, args: tuple[str, ...], words: str) -> None:
    code, out, err = hub.cli(*args)
    assert code == 4 and out == "" and words in err and len(err.splitlines()) == 1, err
    assert not any(a["command"].startswith("models.") for a in hub.audit())


def test_rest_until_ms_is_what_the_state_holds(hub: Hub) -> None:
    rest = hub.json("models", "rest", PAID, "--until", "2h")
    cfg = load_config(str(hub.config), env=hub.env)
    held = Stores(cfg).model_state().active_blackouts(datetime.now(UTC))[PAID]
    assert (held.scope, held.why) == ("model", "person")
    assert rest["resting_until"] == iso_time(held.until_ms)
    assert to_ms(datetime.now(UTC) + timedelta(hours=2)) - held.until_ms < 5_000
