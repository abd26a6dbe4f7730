"""The soak's fault schedule: one seed, one schedule, so a broken run replays."""

from __future__ import annotations

from collections import Counter

from bench.soak import KINDS, schedule


def test_a_seed_fixes_the_schedule_and_every_kind_takes_its_turn() -> None:
    a, b, other = schedule(53, 600), schedule(53, 600), schedule(54, 600)
    assert [f.line() for f in a] == [f.line() for f in b] != [f.line() for f in other]
    counts = Counter(f.kind for f in a)
    assert set(counts) == set(KINDS)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert all(20 <= f.at < 600 - 15 for f in a)
    assert [f.at for f in a] == sorted(f.at for f in a)
