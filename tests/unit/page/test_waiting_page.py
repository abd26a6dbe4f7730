"""The page's "waiting for a person": a badge on the session, a "Waiting for you" list a
colleague can act on, the count on the running card, and the request in the JSON export."""

from __future__ import annotations

import json

from xaf_hub.core.records import InstanceSummary, SessionRecord, Snapshot, Waiting
from xaf_hub.page import export
from xaf_hub.page.view import session_phase

NOW = 1_796_000_000_000
ASK = Waiting("permission", "per_abc", "git push <b>origin</b> \x1b[31m", NOW - 5 * 60_000,
              "bash", ("git push origin",), ("git push *",))


def snap() -> Snapshot:
    waiting = SessionRecord("a", "ses_w", "T-12 Fix the login page", "/p/app", NOW, NOW,
                            running=True, run_state="busy", project=True, waiting=ASK,
                            outcome="running")
    working = SessionRecord("a", "ses_r", "Other work", "/p/app", NOW, NOW, running=True,
                            run_state="busy", project=True, outcome="running")
    return Snapshot(NOW, (InstanceSummary("a", "http://127.0.0.1:1", True, waiting=1),),
                    (waiting, working))


def test_a_waiting_session_has_its_badge_and_a_line_in_waiting_for_you() -> None:
    s = snap()
    assert [session_phase(r) for r in s.sessions] == ["asking", "working"]
    html = export.render_html(s, now_ms=NOW, title="demo")
    panel = html[html.index('id="waiting-for-you"'):]
    panel = panel[: panel.index("</section>")]
    assert "Waiting for you" in panel and 'data-request="per_abc"' in panel
    assert "Fix the login page" in panel and "asks leave to run bash" in panel
    assert "waiting 5 min" in panel or "5 minutes" in panel
    assert "xaf-hub approve per_abc [--always] | xaf-hub deny per_abc" in panel
    # The server's text is escaped, never markup.
    assert "<b>origin</b>" not in html and "&lt;b&gt;origin&lt;/b&gt;" in panel
    assert ">waiting for a person<" in html  # the session's badge
    card = html[html.index('id="card-running"'):]
    assert "1 working, 1 waiting for a person" in card[: card.index("</div>\n  </div>")]
    zh = export.render_html(s, now_ms=NOW, title="demo", lang="zh")
    assert "等你回答" in zh


def test_no_list_when_nothing_waits() -> None:
    s = snap()
    quiet = Snapshot(NOW, s.instances, (s.sessions[1],))
    assert 'id="waiting-for-you"' not in export.render_html(quiet, now_ms=NOW, title="demo")


def test_the_json_export_carries_the_request_and_the_count() -> None:
    doc = json.loads(json.dumps(export.snapshot_document(snap())))
    by_id = {s["id"]: s for s in doc["sessions"]}
    assert by_id["ses_w"]["waiting"]["request_id"] == "per_abc"
    assert by_id["ses_w"]["waiting"]["since"] == NOW - 5 * 60_000
    assert by_id["ses_r"]["waiting"] is None
    assert doc["instances"][0]["waiting"] == 1
