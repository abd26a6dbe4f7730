"""Each chat service's incoming-webhook request, signed where the service signs, and how to read
its answer (pure; shapes and signatures: docs/notifications.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote_plus

from xaf_hub.config.notify import Webhook
from xaf_hub.notify.events import Event

WECOM_TEXT_BYTES = 2048
# Feishu and DingTalk take far more; a chat line longer than this is not read anyway.
TEXT_CHARS = 4000
# Service answers that mean "too many messages, try again later".
_BUSY_CODES = {
    "feishu": {11232},  # frequency limited
    "dingtalk": {130101},  # sending too fast
    "wecom": {45009},  # api freq out of limit
}
_JSON = "application/json; charset=utf-8"


@dataclass(frozen=True)
class Outgoing:
    """One HTTP POST ready to send (its URL holds the token: never print it)."""

    url: str
    body: bytes
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Verdict:
    """What an answer means: delivered, worth retrying, and a short reason."""

    ok: bool
    retry: bool
    reason: str


def feishu_sign(timestamp: int, secret: str) -> str:
    """Feishu/Lark custom bot signature for ``timestamp`` (seconds)."""
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def dingtalk_sign(timestamp_ms: int, secret: str) -> str:
    """DingTalk custom robot signature for ``timestamp_ms``, URL-encoded for the query."""
    mac = hmac.new(secret.encode(), f"{timestamp_ms}\n{secret}".encode(), hashlib.sha256)
    return quote_plus(base64.b64encode(mac.digest()).decode())


def json_signature(timestamp: int, body: bytes, secret: str) -> str:
    """The json format's signature header value."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def slack_escape(text: str) -> str:
    """Slack's three control characters as entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cut_bytes(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (never inside a character)."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode("utf-8", "ignore") + "\u2026"


def _dump(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def idempotency_key(webhook: str, event_id: str) -> str:
    """One message's key (webhook + event), ASCII whatever the names hold."""
    return hashlib.sha256(f"{webhook}\n{event_id}".encode()).hexdigest()[:32]


def build(
    hook: Webhook,
    event: Event,
    headline: str,
    text: str,
    *,
    project: str,
    language: str,
    page_url: str,
    now: datetime,
) -> Outgoing:
    """The request that delivers ``headline`` + ``text`` to ``hook`` at ``now``."""
    if not hook.url:
        raise ValueError(f"webhook {hook.name!r} has no URL (${hook.url_env} is not set)")
    url, secret = hook.url, hook.secret or ""
    message = (headline + "\n" + text)[:TEXT_CHARS]
    headers = {"Content-Type": _JSON}
    seconds = int(now.timestamp())
    doc: dict[str, Any]
    if hook.format == "slack":
        doc = {"text": f"*{slack_escape(headline)}*\n{slack_escape(text)}"[:TEXT_CHARS]}
    elif hook.format == "feishu":
        doc = {"msg_type": "text", "content": {"text": message}}
        if secret:
            doc = {"timestamp": str(seconds), "sign": feishu_sign(seconds, secret), **doc}
    elif hook.format == "dingtalk":
        doc = {"msgtype": "text", "text": {"content": message}}
        if secret:
            ms = int(now.timestamp() * 1000)
            url += ("&" if "?" in url else "?") + f"timestamp={ms}&sign={dingtalk_sign(ms, secret)}"
    elif hook.format == "wecom":
        doc = {"msgtype": "text", "text": {"content": cut_bytes(message, WECOM_TEXT_BYTES)}}
    else:
        doc = {
            "schema_version": 1,
            "project": project,
            "language": language,
            "headline": headline,
            "text": text,
            "link": page_url,
            "event": event.to_json(),
        }
        body = _dump(doc)
        # The same for every try of this message: a receiver that honours it drops a copy
        # re-sent after an error answer (the only re-send after a request left).
        headers["Idempotency-Key"] = idempotency_key(hook.name, event.id)
        if secret:
            headers["X-Xaf-Hub-Timestamp"] = str(seconds)
            headers["X-Xaf-Hub-Signature-256"] = json_signature(seconds, body, secret)
        return Outgoing(url, body, headers)
    return Outgoing(url, _dump(doc), headers)


def judge(fmt: str, status: int, body: str) -> Verdict:
    """Read a receiver's answer (status and body text)."""
    short = " ".join(body.split())[:200]
    # Busy (worth a retry), any other refusal, or a success the service does not explain.
    busy, fine = status in (408, 429) or status >= 500, 200 <= status < 300
    if busy or not fine or fmt not in ("feishu", "dingtalk", "wecom"):
        return Verdict(fine, busy, f"HTTP {status}" + (f": {short}" if short else ""))
    try:
        answer = json.loads(body)
    except ValueError:
        return Verdict(False, False, f"HTTP {status}, not the service's JSON answer: {short}")
    if not isinstance(answer, Mapping):
        return Verdict(False, False, f"HTTP {status}, not the service's JSON answer: {short}")
    if fmt == "feishu":
        code, msg = answer.get("code", answer.get("StatusCode")), answer.get("msg")
        msg = msg if msg is not None else answer.get("StatusMessage")
    else:
        code, msg = answer.get("errcode"), answer.get("errmsg")
    if code == 0:
        return Verdict(True, False, f"code 0 ({msg})" if msg else "code 0")
    busy = isinstance(code, int) and code in _BUSY_CODES.get(fmt, set())
    return Verdict(False, busy, f"code {code}: {msg or short}")
