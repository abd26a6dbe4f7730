"""The one redaction point, and `serve`'s scan wait and request log (its connection limits:
tests/unit/page/test_serve_limits.py)."""

from __future__ import annotations

import base64
import html
import io
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xaf_hub.config.load import InstanceConfig
from xaf_hub.core.records import InstanceSummary, SessionRecord, Snapshot
from xaf_hub.core.text import dumps, redact, secret_forms
from xaf_hub.page.serve import RequestLog, SnapshotCache, Viewer
from xaf_hub.store import audit

PW = 'pa"ss/w:rd+<&>'
INST = InstanceConfig(name="a", url="http://127.0.0.1:1", username="alice", password=PW)
BASIC = base64.b64encode(f"alice:{PW}".encode()).decode()


def test_instance_secrets_cover_the_basic_credential() -> None:
    # user:password is a secret; its base64 form (the Basic credential) is one of its forms.
    assert INST.secrets() == (PW, f"alice:{PW}")
    assert BASIC in secret_forms(f"alice:{PW}")
    assert InstanceConfig(name="b", url="http://127.0.0.1:1").secrets() == ()


@pytest.mark.parametrize("form", sorted(secret_forms(PW) | {BASIC, BASIC.rstrip("=")}))
def test_every_form_is_redacted(form: str) -> None:
    text = f"before {form} after"
    assert redact(text, INST.secrets()) == "before *** after"


@given(st.text(alphabet="&<>\"'a;#x", max_size=12))
def test_the_html_forms_are_html_escape_s(secret: str) -> None:
    # The forms are built without loading the html package (start-up): the same text.
    assert {html.escape(secret), html.escape(secret, quote=False)} - {""} <= secret_forms(secret)


def test_redacting_loads_neither_html_nor_secrets() -> None:
    # (what httpx's own command line would load is left out, as the hub's command line does)
    code = ("import sys\nsys.modules['httpx._main'] = None\nfrom xaf_hub.core.text import redact\n"
            "import xaf_hub.store.gate, xaf_hub.store.tasks, xaf_hub.ops.rooms\n"
            "redact('a', ['p<&\"'])\nprint(sorted({'html', 'secrets'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("echo", "expected"),
    [
        ("Authorization: Basic Zm9vOmJhcg==", "Authorization: Basic ***"),
        ("authorization=Bearer abc.def", "authorization=Bearer ***"),
        ('{"Authorization": "Basic Zm9v"}', '{"Authorization": "Basic ***"}'),
        ("Proxy-Authorization: Zm9v", "Proxy-Authorization: ***"),
        ("AUTHORIZATION:token123 next", "AUTHORIZATION:***next"),
    ],
)
def test_authorization_echoes_lose_their_credential(echo: str, expected: str) -> None:
    # Any credential, configured or not: a proxy may echo one the hub never knew.
    assert redact(echo, ()) == expected.replace("***next", "*** next")


def test_redacted_json_stays_json() -> None:
    doc = {"title": f"x {PW} y", "echo": f"Authorization: Basic {BASIC}"}
    text = redact(dumps(doc), INST.secrets())
    back = json.loads(text)
    assert back == {"title": "x *** y", "echo": "Authorization: Basic ***"}


def test_audit_log_is_redacted(tmp_path: Path) -> None:
    audit.append(
        tmp_path,
        command="dispatch",
        reason=f"HTTP 400: echo Authorization: Basic {BASIC}; pw {PW}",
        extra={"title": f"t {PW}", "cost": float("nan")},
        env={},
        secrets=INST.secrets(),
    )
    text = (tmp_path / "audit.log").read_text("utf-8")
    assert PW not in text and BASIC not in text and "NaN" not in text
    entry = json.loads(text)
    assert entry["reason"] == "HTTP 400: echo Authorization: Basic ***; pw ***"
    assert entry["cost"] is None


def test_dumps_never_writes_nan() -> None:
    text = dumps({"a": [float("nan"), float("inf"), 1.5], "b": (float("-inf"),)})
    assert json.loads(text) == {"a": [None, None, 1.5], "b": [None]}


def _json_dumps(data: object) -> str:
    """What dumps wrote before its fast path: json's own indented encoder."""
    from xaf_hub.core.text import finite

    try:
        return json.dumps(data, ensure_ascii=False, indent=2, allow_nan=False)
    except ValueError:
        return json.dumps(finite(data), ensure_ascii=False, indent=2)


_SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text()
    | st.sampled_from(["中文 \udc00 \x1b \u2028", "", '"\\'])
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4)
    | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    | st.dictionaries(st.integers() | st.booleans() | st.none(), inner, max_size=2),
    max_leaves=20,
)


@given(_VALUES)
def test_dumps_writes_exactly_what_json_writes(data: object) -> None:
    assert dumps(data) == _json_dumps(data)


def test_dumps_of_a_snapshot_document_is_json_s_own() -> None:
    from xaf_hub.page.export import snapshot_document

    snap = Snapshot(
        generated_at=1_717_000_000_000,
        instances=(InstanceSummary("a", "http://127.0.0.1:1", True, total_sessions=2),),
        sessions=tuple(
            SessionRecord("a", f"ses_{i}", f"标题 {i}", "/p/app", created=1_717_000_000_000,
                          updated=1_717_000_000_000 + i, cost=0.25 * i, project=True)
            for i in range(50)
        ),
        warnings=("a: note",),
    )
    doc = snapshot_document(snap)
    assert dumps(doc) == _json_dumps(doc)


# --------------------------------------------------------------------------- serve


def _snap() -> Snapshot:
    return Snapshot(
        generated_at=1_717_000_000_000,
        instances=(InstanceSummary("a", "http://127.0.0.1:1", True),),
        sessions=(SessionRecord("a", "ses_1", f"title {PW}", "/p/app", project=True),),
    )


def test_a_scan_that_outlives_the_wait_never_blocks_the_viewer() -> None:
    entered, release = threading.Event(), threading.Event()

    def stuck_scan() -> Snapshot:
        entered.set()
        assert release.wait(30)
        return _snap()

    # max_age 0: every request wants a fresh scan, so each one meets the stuck scan.
    cache = SnapshotCache(stuck_scan, 0.0, wait=0.3)
    viewer = Viewer(cache, title="T", password=None, redact=lambda t: redact(t, INST.secrets()))
    for first in (True, False):
        entered.clear()
        release.clear()
        holder = threading.Thread(target=lambda: cache.get(time.monotonic() + 1))
        holder.start()
        try:
            assert entered.wait(10)
            health = viewer.respond("GET", "/health", {}.get)
            page = viewer.respond("GET", "/", {}.get)
            api = viewer.respond("GET", "/api/snapshot", {}.get)
            if first:  # nothing to show yet: say so at once instead of waiting
                assert health.status == 503
                assert json.loads(health.body) == {"ok": False, "scanning": True}
                assert page.status == api.status == 503
            else:  # the previous scan is served, redacted, while the new one is stuck
                assert health.status == page.status == api.status == 200
                assert b"title ***" in api.body and PW.encode() not in page.body + api.body
        finally:
            release.set()
            holder.join(10)
    assert cache.scans == 2


def test_request_log_is_redacted() -> None:
    stream = io.StringIO()
    RequestLog(stream, lambda t: redact(t, INST.secrets())).line(f"GET /{PW}")
    assert PW not in stream.getvalue() and "***" in stream.getvalue()


@pytest.mark.parametrize("text", [
    "Authorization: Basic dXNlcjpwdw==",
    '{"authorization":"Bearer abc.def"}',
    "AuThOrIzAtIoN=token xyz; rest",
    "proxy-authorization: Digest q",
    "no header here at all, just authoriz ation split",
    "中文 authorization: Basic 5Lit5paH",
    "Authorızation: Basic dotless-i",  # (?i) folds U+0131 to i: the pattern still sees it
    "AUTHORİZATION: Basic dotted-I",
    "",
])
def test_the_fast_path_redacts_exactly_as_the_header_pattern(text: str) -> None:
    from xaf_hub.core.text import _AUTH_ECHO

    slow = _AUTH_ECHO.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}***", text)
    assert redact(text, ()) == slow


@given(st.lists(st.sampled_from([
    "authorization", "AUTHORIZATION", "AuThOrIzAtIoN", "proxy-", ":", "=", " ", '"', "'",
    "basic ", "Bearer ", "tok", "ı", "İ", "K", "中文", "\n", "autho", "rization", "x",
]), max_size=12).map("".join))
def test_the_fast_path_agrees_with_the_header_pattern_on_any_text(text: str) -> None:
    from xaf_hub.core.text import _AUTH_ECHO

    slow = _AUTH_ECHO.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}***", text)
    assert redact(text, ()) == slow


def _slow_redact(text: str, secrets: tuple[str, ...]) -> str:
    """The redaction without its fast paths: the whole alternation, then the header pattern."""
    from xaf_hub.core.text import _AUTH_ECHO, _secret_pattern

    found = _secret_pattern(tuple(sorted(set(secrets))))
    if found is not None:
        text = found[0].sub("***", text)
    return _AUTH_ECHO.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}***", text)


# Secrets whose forms hold one another ("a=" holds "a"), or differ by escaping only.
_SECRETS = (PW, f"alice:{PW}", "tok==", "tok", "中文密码", 'q"uote')
_PIECES = sorted({f for s in _SECRETS for f in secret_forms(s)} | {
    "x", " ", "\n", "=", "Authorization: Basic ", "ı", "\udc00", "中", "to", "k=", "alice:",
})


@given(st.lists(st.sampled_from(_PIECES), max_size=10).map("".join),
       st.lists(st.sampled_from(_SECRETS), max_size=4).map(tuple))
def test_the_witness_search_redacts_exactly_as_the_whole_pattern(
    text: str, secrets: tuple[str, ...]
) -> None:
    # Text with no witness skips the alternation: only text no form can match.
    assert redact(text, secrets) == _slow_redact(text, secrets)


def test_every_form_holds_a_witness() -> None:
    from xaf_hub.core.text import _secret_pattern

    found = _secret_pattern(tuple(sorted(_SECRETS)))
    assert found is not None
    forms = {f for s in _SECRETS for f in secret_forms(s)}
    assert all(any(w in f for w in found[1]) for f in forms)
    assert len(found[1]) < len(forms)  # the point: fewer searches than forms


def test_text_with_lone_surrogates_is_still_redacted() -> None:
    # A server's JSON may decode to a lone surrogate; the byte-level header check takes it.
    text = "\udc00 Authorization: Basic Zm9v \ud800" + PW
    assert redact(text, (PW,)) == "\udc00 Authorization: Basic *** \ud800***"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ('curl -H "Authorization: Bearer abc.def" x', 'curl -H "Authorization: Bearer *** x'),
        ("export API_KEY=sk-abcdefghijklmnopqrstu", "export API_KEY=***"),
        ("git clone https://bob:s3cret@example.com/r.git", "git clone https://***@example.com/r.git"),
        ("psql --password hunter2 db", "psql --password *** db"),
        ("echo ghp_abcdefghijklmnopqrstuvwxyz", "echo ***"),
        # what must stay as it is: a person reads it to decide
        ("git push -u origin main", "git push -u origin main"),
        ("ls secrets/ && cat tokenizer.py", "ls secrets/ && cat tokenizer.py"),
        ("echo hi", "echo hi"),
    ],
)
def test_mask_credentials_in_a_request_text(text: str, masked: str) -> None:
    from xaf_hub.core.text import mask_credentials

    assert mask_credentials(text) == masked
