"""Notifications, first half: the config section, each service's message shape and signature
(checked against a fixture per format), how answers are judged, and retries with back-off."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.notify_capture import TOKEN, dingtalk_expected, feishu_expected
from tests.unit.notify.support import EVENT, NOW, URL, hook, parse
from xaf_hub.config.load import parse_config
from xaf_hub.config.notify import DEFAULT_EVENTS, Webhook
from xaf_hub.core import aio
from xaf_hub.errors import ConfigError, ExitCode
from xaf_hub.notify.formats import Outgoing, build, judge
from xaf_hub.notify.send import deliver

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))




# ---------------------------------------------------------------------------------------------
# Config


def test_config_reads_urls_and_secrets_only_from_the_environment() -> None:
    cfg = parse(
        {
            "webhooks": [
                {"name": "team", "url_env": "HOOK", "format": "feishu", "secret_env": "HOOK_SECRET"}
            ]
        },
        {"language": "zh-CN", "url": "http://127.0.0.1:8080/"},
        {"HOOK": URL, "HOOK_SECRET": "s3cret-signing-key"},
    )
    team = cfg.webhook("team")
    assert (team.url, team.secret, team.events) == (URL, "s3cret-signing-key", DEFAULT_EVENTS)
    assert "healed" not in team.events
    assert (cfg.language, cfg.page_url) == ("zh", "http://127.0.0.1:8080/")
    # The URL, its token on its own and the secret are all redacted.
    assert {URL, TOKEN, "s3cret-signing-key"} <= set(cfg.secrets())
    assert "s3cret" not in repr(cfg)


@pytest.mark.parametrize(
    ("hook_raw", "page", "needle"),
    [
        (
            {"name": "t", "url_env": "H", "url": "https://x.example/hook/abc"},
            None,
            "key 'notify.webhooks[0].url': a literal webhook url",
        ),
        ({"name": "t", "url_env": "H", "secret": "abc"}, None, "webhooks[0].secret'"),
        ({"name": "t", "url_env": "https://x.example/hook"}, None, "NAME of an environment"),
        ({"name": "t"}, None, "url_env': missing"),
        ({"name": "t", "url_env": "H", "format": "teams"}, None, "must be one of json"),
        (
            {"name": "t", "url_env": "H", "events": ["task_done", "oops"]},
            None,
            "events[1]': unknown event 'oops'",
        ),
        (
            {"name": "t", "url_env": "H", "format": "wecom", "secret_env": "S"},
            None,
            "no signing secret",
        ),
        ({"name": "t", "url_env": "H", "colour": "red"}, None, "colour': unknown key"),
        ({"name": "t", "url_env": "H"}, {"url": "http://u:p@127.0.0.1/"}, "page.url"),
        ({"name": "t", "url_env": "H"}, {"url": "ftp://127.0.0.1/"}, "page.url"),
    ],
)
def test_bad_notify_config_is_one_line_naming_file_and_key(
    hook_raw: dict[str, Any], page: Any, needle: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse({"webhooks": [hook_raw]}, page)
    assert needle in str(err.value) and str(err.value).startswith("config.json: key '")
    assert err.value.exit_code == ExitCode.USAGE


def test_duplicate_names_and_bad_numbers_are_refused() -> None:
    two = [{"name": "t", "url_env": "A"}, {"name": "t", "url_env": "B"}]
    with pytest.raises(ConfigError, match="duplicate webhook name"):
        parse({"webhooks": two})
    with pytest.raises(ConfigError, match="notify.retries': must be 0..5"):
        parse({"webhooks": [], "retries": 9})
    with pytest.raises(ConfigError, match="notify.retries': expected a whole number, got a number"):
        parse({"webhooks": [], "retries": 1.5})
    with pytest.raises(ConfigError, match="notify.bogus': unknown key"):
        parse({"bogus": 1})


def test_config_loading_calls_the_notify_parser(tmp_path: Path) -> None:
    raw = {"notify": {"webhooks": [{"name": "t", "url_env": "H", "url": URL}]}, "instances": []}
    with pytest.raises(ConfigError, match="literal webhook url"):
        parse_config(raw, path=tmp_path / "config.json", env={})
    raw["notify"] = {"webhooks": [{"name": "t", "url_env": "H"}]}
    cfg = parse_config(raw, path=tmp_path / "config.json", env={"H": URL})
    assert URL in cfg.secrets() and cfg.notify.webhooks[0].name == "t"


# ---------------------------------------------------------------------------------------------
# Formats against each service's documented shape


def shape(value: Any) -> Any:
    """Keys and value types, recursively: what a documented example fixes about a request."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    return type(value).__name__


def sent(out: Outgoing) -> dict[str, Any]:
    body = json.loads(out.body)
    assert isinstance(body, dict)
    return body


def test_slack_matches_the_documented_shape_and_escapes_control_characters() -> None:
    doc = fixture("slack")
    out = build(
        hook("slack"), EVENT, "Head <b>", "a & b", project="p", language="en", page_url="", now=NOW
    )
    body = sent(out)
    assert shape(body) == shape(doc["request"]) and out.url == URL
    stripped = body["text"]
    for entity in doc["escaped_characters"].values():
        stripped = stripped.replace(entity, "")
    assert not set(stripped) & set(doc["escaped_characters"])
    assert "&lt;b&gt;" in body["text"] and "a &amp; b" in body["text"]


def test_feishu_matches_the_documented_shapes_and_signs_as_documented() -> None:
    doc = fixture("feishu")
    plain = sent(
        build(hook("feishu"), EVENT, "h", "t", project="p", language="en", page_url="", now=NOW)
    )
    assert shape(plain) == shape(doc["request_unsigned"])
    signed = sent(
        build(
            hook("feishu", "feishu-secret-1"),
            EVENT,
            "h",
            "t",
            project="p",
            language="en",
            page_url="",
            now=NOW,
        )
    )
    assert shape(signed) == shape(doc["request_signed"])
    assert signed["timestamp"] == str(int(NOW.timestamp()))  # seconds, as a string
    assert signed["sign"] == feishu_expected(signed["timestamp"], "feishu-secret-1")
    assert signed["content"]["text"] == "h\nt"


def test_dingtalk_matches_the_documented_shape_and_signs_the_query_as_documented() -> None:
    doc = fixture("dingtalk")
    h = Webhook(
        "d",
        "H",
        "dingtalk",
        url=f"http://127.0.0.1:9/robot/send?access_token={TOKEN}",
        secret="SECding-secret",
        secret_env="S",
    )
    out = build(h, EVENT, "h", "t", project="p", language="en", page_url="", now=NOW)
    assert shape(sent(out)) == shape(doc["request"])
    query = parse_qs(urlsplit(out.url).query)
    assert sorted(query) == sorted(doc["signed_query"])
    ts = query["timestamp"][0]
    assert ts == str(int(NOW.timestamp() * 1000))  # milliseconds
    assert query["sign"][0] == dingtalk_expected(ts, "SECding-secret")
    # The sign is URL-encoded in the URL itself (base64 '+', '/', '=' never appear raw).
    raw_sign = out.url.split("sign=", 1)[1]
    assert not set(raw_sign) & set("+/=")


def test_wecom_matches_the_documented_shape_and_byte_limit() -> None:
    doc = fixture("wecom")
    long_text = "长" * 3000
    body = sent(
        build(
            hook("wecom"), EVENT, "h", long_text, project="p", language="zh", page_url="", now=NOW
        )
    )
    assert shape(body) == shape(doc["request"])
    assert len(body["text"]["content"].encode()) <= doc["content_max_bytes"]


def test_json_carries_the_event_record_and_an_optional_signature() -> None:
    doc = fixture("json")
    out = build(
        hook("json", "json-secret"),
        EVENT,
        "h",
        "t",
        project="e2e",
        language="en",
        page_url="",
        now=NOW,
    )
    assert shape(sent(out)) == shape(doc["request"])
    assert sent(out)["event"] == EVENT.to_json()
    ts = out.headers["X-Xaf-Hub-Timestamp"]
    mac = hmac.new(b"json-secret", ts.encode() + b"." + out.body, hashlib.sha256).hexdigest()
    assert out.headers["X-Xaf-Hub-Signature-256"] == f"sha256={mac}"
    # One idempotency key per message: the same on every try, another for another event.
    later = build(hook("json"), EVENT, "h", "t", project="e2e", language="en", page_url="",
                  now=NOW.replace(hour=11))
    other = build(hook("json"), replace(EVENT, id="task_done:T-2:ses_2"), "h", "t",
                  project="e2e", language="en", page_url="", now=NOW)
    key = out.headers["Idempotency-Key"]
    assert later.headers["Idempotency-Key"] == key != other.headers["Idempotency-Key"]
    assert len(key) == 32 and key.isascii()


@pytest.mark.parametrize(
    ("fmt", "status", "body", "ok", "retry"),
    [
        ("slack", 200, "ok", True, False),
        ("slack", 400, "invalid_payload", False, False),
        ("slack", 404, "no_service", False, False),
        ("slack", 429, "", False, True),
        ("json", 503, "", False, True),
        ("feishu", 200, json.dumps(fixture("feishu")["answer_ok"]), True, False),
        ("feishu", 200, json.dumps({"StatusCode": 0, "StatusMessage": "success"}), True, False),
        ("feishu", 200, json.dumps(fixture("feishu")["answer_bad_sign"]), False, False),
        ("feishu", 200, json.dumps({"code": 11232, "msg": "frequency limited"}), False, True),
        ("dingtalk", 200, json.dumps(fixture("dingtalk")["answer_ok"]), True, False),
        ("dingtalk", 200, json.dumps(fixture("dingtalk")["answer_bad_sign"]), False, False),
        ("dingtalk", 200, json.dumps({"errcode": 130101, "errmsg": "too fast"}), False, True),
        ("wecom", 200, json.dumps(fixture("wecom")["answer_ok"]), True, False),
        ("wecom", 200, json.dumps({"errcode": 93000, "errmsg": "invalid url"}), False, False),
        ("wecom", 200, "<html>proxy</html>", False, False),
    ],
)
def test_answers_are_judged_per_service(
    fmt: str, status: int, body: str, ok: bool, retry: bool
) -> None:
    verdict = judge(fmt, status, body)
    assert (verdict.ok, verdict.retry) == (ok, retry), verdict


# ---------------------------------------------------------------------------------------------
# Delivery: timeout, retries, back-off


def run_deliver(handler: Callable[[httpx.Request], httpx.Response], retries: int = 2) -> Any:
    pauses: list[float] = []

    async def sleep(s: float) -> None:
        pauses.append(s)

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await deliver(
                client,
                "feishu",
                lambda: build(
                    hook("feishu", "k"),
                    EVENT,
                    "h",
                    "t",
                    project="p",
                    language="en",
                    page_url="",
                    now=datetime.now(UTC),
                ),
                retries=retries,
                timeout=1,
                sleep=sleep,
            )

    return aio.run(go()), pauses


def test_retries_with_back_off_then_delivers() -> None:
    calls: list[bytes] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.content)
        if len(calls) < 3:
            return httpx.Response(502, text="bad gateway")
        return httpx.Response(200, json={"code": 0, "msg": "success"})

    answer, pauses = run_deliver(handler)
    assert answer.ok and answer.tries == 3 and pauses == [0.5, 1.0]


def test_a_refusal_is_not_retried_and_a_dead_receiver_is_tried_retries_plus_one_times() -> None:
    calls = []

    def refuse(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, json={"code": 19021, "msg": "sign match fail"})

    answer, _ = run_deliver(refuse)
    assert (answer.ok, answer.retry, answer.tries, len(calls)) == (False, False, 1, 1)
    assert "19021" in answer.reason

    def dead(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=req)

    answer, pauses = run_deliver(dead, retries=2)
    assert (answer.ok, answer.retry, answer.tries) == (False, True, 3)
    assert answer.reason.startswith("connection refused") and len(pauses) == 2

    def slow(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=req)

    answer, _ = run_deliver(slow, retries=0)
    assert answer.reason.startswith("no answer within 1s") and answer.tries == 1
