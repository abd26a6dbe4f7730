"""`watch`'s printed line for an answered request shows the answer the event carries, whatever
its detail's words say."""

from __future__ import annotations

from xaf_hub.cli.commands.watch import _event_line
from xaf_hub.core.records import SessionRecord
from xaf_hub.fleet.events import FleetEvent

REC = SessionRecord("a", "ses_1", "fix it", "/srv/p", created=1, updated=2, project=True)


def test_an_answered_line_shows_the_answer_not_words_of_its_detail() -> None:
    for detail in ("permission bash: ls", "permission bash: a -> b", ""):
        line = _event_line(FleetEvent("answered", "a", REC, detail=detail, answer="replied once"))
        assert line.endswith("ses_1  fix it -> replied once"), line
        bare = _event_line(FleetEvent("answered", "a", REC, detail=detail))
        assert " -> " not in bare, bare
