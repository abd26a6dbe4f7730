"""The labelled match set (bench/data, issue 36): the default rule meets its targets on the
part it was tuned on; title and folder alone do not (what the richer evidence buys); the
agent's words gain on the parts written blind to them."""

from __future__ import annotations

from bench.match import decision, load, measure, ranking


def test_the_labelled_set_is_big_mixed_and_names_real_sessions() -> None:
    sessions, cases = load()  # load refuses a case naming a session not in the fleet
    assert len(cases) >= 150
    kinds = {c.kind for c in cases}
    assert kinds == {"continue", "same_area", "generic"}
    assert any("\u4e00" <= ch <= "\u9fff" for c in cases for ch in c.text)
    assert sum(1 for c in cases if c.split == "heldout") >= 50
    assert len({s.id for s in sessions}) == len(sessions)


def test_default_rule_meets_the_targets_on_the_tuned_part() -> None:
    # With the evidence dispatch reads (the pool's texts, then the best candidates' messages).
    # On the pool's texts alone, the glossary's English words (core/glossary.json) lift new
    # work in the same area too: 5 of 45 matched there.
    tune = measure("read")["tune"]["decision"]
    assert tune["new_matched"] <= 0.10
    assert tune["recall"] >= 0.85


def test_title_and_folder_alone_cannot_meet_both_targets() -> None:
    # No threshold of the old evidence gives both: the curve is the case for the richer one.
    rows = measure("title")["tune"]["curve"]
    assert not any(r["new_matched"] <= 0.10 and r["recall"] >= 0.85 for r in rows)


def test_the_agents_words_take_more_follow_ups_and_less_new_work_on_blind_text() -> None:
    # The todo items and reply of the best candidates (issue 36), against the read without
    # them, on the last part written blind (blind6; scored once: 51 vs 46 right, 8 vs 12 new
    # tasks matched; blind5, written before they were in, the same way: 61 vs 58, 6 vs 11).
    sessions, cases = load()
    blind = [c for c in cases if c.split == "blind6"]
    got = decision(sessions, blind, ranking(sessions, "read"))["counts"]
    before = decision(sessions, blind, ranking(sessions, "prompts"))["counts"]
    assert got["right"] > before["right"]
    assert got["new_matched"] < before["new_matched"]
