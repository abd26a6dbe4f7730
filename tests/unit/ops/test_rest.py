"""The rest a rate limit calls for (``ops.heal.rest_for``) and how the store keeps rests.

Labelled cases: a failure (retry with its next try and message, or a failed run with its
error) and the settings -> what rests, until when, and why. The reset hour is 08:00 in Berlin.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from xaf_hub.core.clock import to_ms
from xaf_hub.ops.heal import HealCandidate, Rest, rest_for
from xaf_hub.store.model_state import FileModelState, ModelState, resolve_dispatch_model

BERLIN = ZoneInfo("Europe/Berlin")
FAMILIES = {"opencode": ["opencode/", "opencode-go/"]}
NOW = datetime(2026, 12, 3, 14, 0, tzinfo=BERLIN)
RESET = to_ms(datetime(2026, 12, 4, 8, 0, tzinfo=BERLIN))
FREE = "opencode/big-pickle"
PAID = "anthropic/claude-sonnet-4"
LIMIT = "Rate limit exceeded: free usage limit reached. Please try again later."


def in_(**kw: float) -> int:
    return to_ms(NOW + timedelta(**kw))


def retry(model: str, next_ms: int, message: str = LIMIT) -> HealCandidate:
    return HealCandidate("a", "ses_1", "retry", "rate_limited", model, "k", message, 0, next_ms)


def failed(model: str, error: dict[str, Any], at_ms: int) -> HealCandidate:
    text = str(error["data"]["message"])
    return HealCandidate("a", "ses_1", "failed", "rate_limited", model, "k", text, at_ms, 0, error)


def err(headers: dict[str, str]) -> dict[str, Any]:
    return {
        "name": "APIError",
        "data": {"message": LIMIT, "statusCode": 429, "responseHeaders": headers},
    }


CASES: list[tuple[str, HealCandidate, str, Rest | None]] = [
    (
        "Retry-After 300 on a free model: its family rests 5 min",
        retry(FREE, in_(seconds=300)),
        "family",
        Rest("opencode", "family", in_(seconds=300), "stated"),
    ),
    (
        "Retry-After 7200: two hours, though the reset hour is 18 h away",
        retry(FREE, in_(seconds=7200)),
        "family",
        Rest("opencode", "family", in_(seconds=7200), "stated"),
    ),
    (
        "no Retry-After (back-off next): the family rests to the reset hour",
        retry(FREE, in_(seconds=4)),
        "family",
        Rest("opencode", "family", RESET, "reset_hour"),
    ),
    (
        "scope model: only the model rests, to the stated time",
        retry(FREE, in_(seconds=300)),
        "model",
        Rest(FREE, "model", in_(seconds=300), "stated"),
    ),
    (
        "scope model, nothing stated: the model rests to the reset hour",
        retry(FREE, in_(seconds=4)),
        "model",
        Rest(FREE, "model", RESET, "reset_hour"),
    ),
    (
        "a paid model (no family) with a stated time rests alone",
        retry(PAID, in_(seconds=600)),
        "family",
        Rest(PAID, "model", in_(seconds=600), "stated"),
    ),
    (
        "a paid model with nothing stated rests nothing (as before)",
        retry(PAID, in_(seconds=4)),
        "family",
        None,
    ),
    (
        "the time in the retry message counts",
        retry(FREE, in_(seconds=4), "Please try again in 6m0s."),
        "family",
        Rest("opencode", "family", in_(minutes=6), "stated"),
    ),
    (
        "a failed run with a Retry-After header, read in time",
        failed(FREE, err({"retry-after": "3600"}), in_(minutes=-5)),
        "family",
        Rest("opencode", "family", in_(minutes=55), "stated"),
    ),
    (
        "a failed run whose stated time is over: nothing rests (not the reset hour)",
        failed(FREE, err({"retry-after": "60"}), in_(minutes=-5)),
        "family",
        None,
    ),
    (
        "a failed run that stated nothing, read before the reset",
        failed(FREE, err({}), in_(hours=-2)),
        "family",
        Rest("opencode", "family", RESET, "reset_hour"),
    ),
    (
        "a failed run that stated nothing, read after a reset passed: its rest is over",
        failed(FREE, err({}), in_(hours=-8)),
        "family",
        None,
    ),
    (
        "not a rate limit: nothing rests",
        HealCandidate("a", "s", "failed", "model_unavailable", FREE, "k", "gone", in_(minutes=-1)),
        "family",
        None,
    ),
]


@pytest.mark.parametrize(("case", "cand", "scope", "want"), CASES, ids=[c[0] for c in CASES])
def test_rest_for(case: str, cand: HealCandidate, scope: str, want: Rest | None) -> None:
    got = rest_for(cand, scope=scope, families=FAMILIES, reset_hour=8, tz=BERLIN, now=NOW,
                   longest=timedelta(days=7))
    assert got == want, case


@pytest.fixture
def store(tmp_path: Path) -> ModelState:
    return FileModelState(tmp_path / "ms.json", 8, BERLIN, FAMILIES)


def rest(store: ModelState, target: str, until_ms: int, why: str, now: datetime = NOW) -> int:
    scope = "family" if target in FAMILIES else "model"
    return store.mark_rest(
        target, scope=scope, until_ms=until_ms, why=why, reason=why, source="test", now=now
    )


def test_a_later_stated_end_pushes_a_rest_out_an_earlier_one_does_not(store: ModelState) -> None:
    assert rest(store, "opencode", in_(seconds=300), "stated") == in_(seconds=300)
    assert rest(store, "opencode", in_(seconds=100), "stated") == in_(seconds=300)
    assert rest(store, "opencode", in_(seconds=7200), "stated") == in_(seconds=7200)


def test_a_limit_stating_nothing_rests_a_stated_rest_to_the_reset(store: ModelState) -> None:
    rest(store, "opencode", in_(seconds=300), "stated")
    assert store.mark_blackout("opencode", "429", "t", NOW) == RESET
    assert store.active_blackouts(NOW)["opencode"].why == "reset_hour"


def test_a_stated_two_hours_at_seven_outlasts_the_eight_oclock_reset(store: ModelState) -> None:
    seven = datetime(2026, 12, 4, 7, 0, tzinfo=BERLIN)
    store.mark_blackout("opencode", "429", "t", seven)
    nine = to_ms(seven + timedelta(hours=2))
    assert rest(store, "opencode", nine, "stated", seven) == nine


def test_a_person_sets_the_end_exactly_and_automatic_marks_keep_it(store: ModelState) -> None:
    store.mark_blackout("opencode", "429", "t", NOW)
    assert rest(store, "opencode", in_(minutes=10), "person") == in_(minutes=10)
    assert store.mark_blackout("opencode", "429", "t", NOW) == in_(minutes=10)
    b = store.active_blackouts(NOW)["opencode"]
    assert (b.why, b.scope) == ("person", "family")


def test_end_rests_returns_what_was_in_force(store: ModelState) -> None:
    rest(store, FREE, in_(seconds=300), "stated")
    rest(store, "opencode", in_(seconds=300), "stated")
    ended = store.end_rests([FREE, "opencode", "nothing"], NOW)
    assert sorted(b.family for b in ended) == ["opencode", FREE]
    assert store.active_blackouts(NOW) == {}
    assert store.end_rests([FREE], NOW) == []


def test_a_resting_model_is_skipped_its_family_siblings_are_not(store: ModelState) -> None:
    rest(store, FREE, in_(seconds=300), "stated")
    assert store.blacked_out_families(NOW) == set()
    chain = [FREE, "opencode/other", PAID]
    pick = resolve_dispatch_model(
        explicit=FREE,
        chain=chain,
        default_model=None,
        blacked_out=store.resting(NOW),
        families=FAMILIES,
    )
    assert pick == "opencode/other"
    later = NOW + timedelta(seconds=301)
    assert (
        resolve_dispatch_model(
            explicit=FREE,
            chain=chain,
            default_model=None,
            blacked_out=store.resting(later),
            families=FAMILIES,
        )
        == FREE
    )


def test_bad_rest_fields_name_their_place(store: ModelState, tmp_path: Path) -> None:
    rest(store, FREE, in_(seconds=300), "stated")
    text = (tmp_path / "ms.json").read_text().replace('"stated"', '"guess"')
    (tmp_path / "ms.json").write_text(text)
    with pytest.raises(Exception, match=r"blackouts\.opencode/big-pickle\.why"):
        store.active_blackouts(NOW)
