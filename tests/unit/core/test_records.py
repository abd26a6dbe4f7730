"""Naming a session by the start of its id, and how short a table may show ids."""

from __future__ import annotations

import pytest

from xaf_hub.core.records import SessionRecord, find_session, prefix_width
from xaf_hub.errors import UsageError

A = "ses_db4d38ec5ffe1Xq2m9Yk3vT0aB"
B = "ses_db4d38ec4ffeWoansOsS970g1I"  # shares 12 characters with A
C = "ses_aa01b2c3dffe7Zk0pQ2rS4tU6v"


def rec(instance: str, sid: str) -> SessionRecord:
    return SessionRecord(instance, sid, "a title", "/srv/app")


PLACES = [("local-a", [rec("local-a", A), rec("local-a", C)]),
          ("lan-b", [rec("lan-b", B)])]


@pytest.mark.parametrize(("wanted", "found"), [
    (A, ("local-a", A)),  # a whole id
    ("ses_db4d38ec5", ("local-a", A)),  # the start of one id only
    ("ses_aa", ("local-a", C)),
    ("ses_db4d38ec4f", ("lan-b", B)),
    ("ses_ff", None),  # the start of no id
    ("", None),
    (A + "x", None),
])
def test_find_session_by_id_or_a_unique_start(wanted: str, found: tuple[str, str] | None) -> None:
    hit = find_session(PLACES, wanted)
    assert (hit if hit is None else (hit[0], hit[1].id)) == found


def test_the_start_of_several_ids_names_none() -> None:
    with pytest.raises(UsageError, match=f"ses_db4d is the start of 2 session ids \\({B}, {A}\\)"):
        find_session(PLACES, "ses_db4d")
    # An id that is itself the start of another is still found whole.
    longer = [("x", [rec("x", "ses_ab"), rec("x", "ses_abc")])]
    assert find_session(longer, "ses_ab") == ("x", longer[0][1][0])
    # The same session seen on two instances (a shared database) is one id, not two.
    shared = [("x", [rec("x", A)]), ("y", [rec("y", A)])]
    assert find_session(shared, "ses_db") == ("x", shared[0][1][0])
    many = [("x", [rec("x", f"ses_{i:026d}") for i in range(9)])]
    with pytest.raises(UsageError, match=r"9 session ids \(.*04 and 4 more\): give more of it"):
        find_session(many, "ses_")


def test_prefix_width_tells_each_shown_id_apart_from_every_known_one() -> None:
    known = [A, B, C]
    assert prefix_width(known, [C]) == 12  # never shorter than "ses_" and 8
    assert prefix_width(known, [A]) == 13  # A and B share 12 characters
    assert prefix_width(known, []) == 12
    # Each width printed is a start that find_session takes back to its own session.
    for sid in known:
        width = prefix_width(known, known)
        hit = find_session(PLACES, sid[:width])
        assert hit is not None and hit[1].id == sid
    assert prefix_width(["ses_ab", "ses_abcdefghijkl"], ["ses_ab"]) == 12
    assert prefix_width(["ses_abcdefghijk", "ses_abcdefghijkl"], ["ses_abcdefghijk"]) == 16
