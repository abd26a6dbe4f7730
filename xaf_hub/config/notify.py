"""The ``notify`` section of config.json: which chat webhooks hear which events
(docs/notifications.md).

A webhook URL or secret comes only from the environment variable the file names; a literal one
is refused (exit 4). Other values are not validated at load (``doctor`` says what is wrong).
Parsing is pure: raw JSON and the environment in, a frozen ``NotifyConfig`` out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from xaf_hub.config.reader import Reader, http_url, read_settings, setting
from xaf_hub.errors import ConfigError

EVENTS: tuple[str, ...] = (
    "task_done",
    "task_finished",
    "task_parked",
    "needs_person",
    "waiting_person",
    "healed",
    "blackout",
    "rest_ended",
    "run_ceiling",
    "instance_down",
    "instance_up",
    "daily_summary",
    "budget",
    "failover",
)
# Heals are routine (the hub fixed it itself); a team opts in to hear about them.
DEFAULT_EVENTS: tuple[str, ...] = tuple(e for e in EVENTS if e != "healed")
FORMATS: tuple[str, ...] = ("json", "slack", "feishu", "dingtalk", "wecom")
# Formats whose service signs requests (json: the hub's own HMAC header, optional).
SIGNED_FORMATS: frozenset[str] = frozenset({"json", "feishu", "dingtalk"})

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A path segment or query value this long in a webhook URL is its token: redacted on its own.
_TOKEN_MIN = 12


def url_tokens(url: str) -> tuple[str, ...]:
    """The parts of a webhook URL that carry its credential (long path segments, query values)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ()
    found = [seg for seg in parts.path.split("/") if len(seg) >= _TOKEN_MIN]
    found += [v for _, v in parse_qsl(parts.query) if len(v) >= _TOKEN_MIN]
    return tuple(found)


def url_problem(url: str) -> str:
    """Why ``url`` cannot be a webhook's address ("" when it can); never quotes the URL."""
    for i, ch in enumerate(url):
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            return f"a control character (U+{ord(ch):04X}) at position {i + 1}"
        if ch.isspace():
            return f"a space at position {i + 1}"
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("http", "https") or not host:
        return "not an http:// or https:// URL with a host"
    return ""


@dataclass(frozen=True)
class Webhook:
    """One chat receiver: where its URL and secret come from, its format and its events."""

    name: str
    url_env: str
    format: str
    events: tuple[str, ...] = DEFAULT_EVENTS
    secret_env: str = ""
    url: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)

    def wants(self, event_type: str) -> bool:
        """True when this webhook hears ``event_type``."""
        return event_type in self.events

    def secrets(self) -> tuple[str, ...]:
        """The URL, its token parts and the signing secret: never printed."""
        url = (self.url, *url_tokens(self.url)) if self.url else ()
        return url + ((self.secret,) if self.secret else ())


@dataclass(frozen=True)
class NotifyConfig:
    """Every webhook plus the sending policy and the message language."""

    webhooks: tuple[Webhook, ...] = ()
    language: str = "en"
    page_url: str = ""
    timeout_seconds: float = setting(5.0, minimum=0.1, maximum=60)
    retries: int = setting(2, maximum=5)
    queue_limit: int = setting(100, minimum=1, maximum=10_000)
    keep_hours: float = setting(24.0, minimum=0.1, maximum=24 * 14)
    round_seconds: float = setting(30.0, minimum=1, maximum=600)
    summary_hour: int = setting(9, maximum=23)

    def secrets(self) -> tuple[str, ...]:
        """Every webhook's secret values."""
        return tuple(s for hook in self.webhooks for s in hook.secrets())

    def webhook(self, name: str) -> Webhook:
        """One webhook by name (ConfigError naming the configured ones when unknown)."""
        for hook in self.webhooks:
            if hook.name == name:
                return hook
        known = ", ".join(h.name for h in self.webhooks) or "none"
        raise ConfigError(f"unknown webhook {name!r} (configured in notify.webhooks: {known})")


def _webhook(w: Reader, env: Mapping[str, str]) -> Webhook:
    for literal, hint in (("url", "url_env"), ("secret", "secret_env")):
        if w.data.get(literal) not in (None, ""):
            raise w.fail(
                literal,
                f"a literal webhook {literal} does not belong in the config file (it carries "
                f"a token); put it in an environment variable and name that in '{hint}'",
            )
    w.seen.update({"url", "secret"})
    name = w.get("name", (str,), "")
    if not _NAME.match(name):
        raise w.fail("name", "expected 1-40 letters, digits, '_', '.' or '-'")
    strings: dict[str, str] = {}
    for key in ("url_env", "secret_env"):
        value = strings[key] = w.get(key, (str,), "")
        if value and not _ENV_NAME.match(value):
            # The usual slip: the URL itself pasted where its variable's name belongs.
            raise w.fail(
                key,
                "expected the NAME of an environment variable (letters, digits, '_'), "
                "not its value",
            )
    if not strings["url_env"]:
        raise w.fail("url_env", "missing (the environment variable holding the URL)")
    fmt = w.get("format", (str,), "json")
    if fmt not in FORMATS:
        raise w.fail("format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if strings["secret_env"] and fmt not in SIGNED_FORMATS:
        raise w.fail(
            "secret_env", f"{fmt} incoming webhooks have no signing secret; remove secret_env"
        )
    events = DEFAULT_EVENTS
    if (events_raw := w.get("events", (list,), None)) is not None:
        for j, ev in enumerate(events_raw):
            if ev not in EVENTS:
                raise w.fail(f"events[{j}]", f"unknown event {ev!r} (known: {', '.join(EVENTS)})")
        events = tuple(dict.fromkeys(events_raw))
    w.finish()
    return Webhook(
        name=name,
        url_env=strings["url_env"],
        format=fmt,
        events=events,
        secret_env=strings["secret_env"],
        url=(env.get(strings["url_env"]) or "").strip() or None,
        secret=(env.get(strings["secret_env"]) or "").strip() or None,
    )


def parse_notify(
    raw: Any, raw_page: Any, *, file: Path | str, env: Mapping[str, str]
) -> NotifyConfig:
    """Validate ``notify`` (and read ``page.language`` / ``page.url``) from raw JSON values."""
    page = Reader({} if raw_page is None else raw_page, file, "page")
    r = Reader({} if raw is None else raw, file, "notify")
    hooks_raw = enumerate(r.get("webhooks", (list,), []))
    hooks = [_webhook(Reader(h, file, f"notify.webhooks[{i}]"), env) for i, h in hooks_raw]
    seen: set[str] = set()
    for i, hook in enumerate(hooks):
        if hook.name in seen:
            raise r.fail(f"webhooks[{i}].name", f"duplicate webhook name {hook.name!r}")
        seen.add(hook.name)
    numbers = read_settings(NotifyConfig, r)
    r.finish()
    # The messages are Chinese for any Chinese page.language (zh, zh-CN, zh_TW...), else English.
    lang = page.data.get("language")
    zh = isinstance(lang, str) and lang.strip().lower().startswith("zh")
    # The link goes to a chat everyone in it can read: no user name or password in it.
    url: str = page.get("url", (str,), "")
    link = http_url(page, "url", url) if url else ""
    return NotifyConfig(tuple(hooks), "zh" if zh else "en", link, **numbers)
