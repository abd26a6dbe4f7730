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

from xaf_hub.errors import ConfigError, ConfigProblem

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
LANGUAGES: tuple[str, ...] = ("en", "zh")

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WEBHOOK_KEYS = frozenset({"name", "url_env", "format", "events", "secret_env"})
_NOTIFY_KEYS = frozenset(
    {
        "webhooks",
        "timeout_seconds",
        "retries",
        "queue_limit",
        "keep_hours",
        "round_seconds",
        "summary_hour",
    }
)
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
        out: list[str] = []
        if self.url:
            out += [self.url, *url_tokens(self.url)]
        if self.secret:
            out.append(self.secret)
        return tuple(out)


@dataclass(frozen=True)
class NotifyConfig:
    """Every webhook plus the sending policy and the message language."""

    webhooks: tuple[Webhook, ...] = ()
    language: str = "en"
    page_url: str = ""
    timeout_seconds: float = 5.0
    retries: int = 2
    queue_limit: int = 100
    keep_hours: float = 24.0
    round_seconds: float = 30.0
    summary_hour: int = 9

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


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


class _Problem:
    """Builds the one-line ConfigError that names the file and the key."""

    def __init__(self, file: Path | str) -> None:
        self.file = file

    def __call__(self, key: str, message: str, problem: ConfigProblem = "value") -> ConfigError:
        return ConfigError(f"{self.file}: key '{key}': {message}", problem)


def _number(
    raw: Mapping[str, Any], key: str, default: float, bad: _Problem, lo: float, hi: float
) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(f"notify.{key}", f"expected a number, got {_kind(value)}")
    if not lo <= value <= hi:
        raise bad(f"notify.{key}", f"must be {lo:g}..{hi:g}, got {value}")
    return float(value)


def _language(raw_page: Any) -> str:
    """'zh' for any Chinese page.language (zh, zh-CN, zh_TW...), else 'en'."""
    if not isinstance(raw_page, Mapping):
        return "en"
    lang = raw_page.get("language")
    if isinstance(lang, str) and lang.strip().lower().startswith("zh"):
        return "zh"
    return "en"


def _page_url(raw_page: Any, bad: _Problem) -> str:
    if raw_page is None:
        return ""
    if not isinstance(raw_page, Mapping):
        raise bad("page", f"expected an object, got {_kind(raw_page)}")
    url = raw_page.get("url")
    if url in (None, ""):
        return ""
    if not isinstance(url, str):
        raise bad("page.url", f"expected a string, got {_kind(url)}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad("page.url", f"must be an http:// or https:// URL, got {url!r}", "bad_url")
    if parts.username or parts.password:
        # The link goes to a chat everyone in it can read.
        raise bad("page.url", "must not carry a user name or password")
    return url


def _webhook(raw: Any, index: int, env: Mapping[str, str], bad: _Problem) -> Webhook:
    where = f"notify.webhooks[{index}]"
    if not isinstance(raw, Mapping):
        raise bad(where, f"expected an object, got {_kind(raw)}")
    for literal, hint in (("url", "url_env"), ("secret", "secret_env")):
        if raw.get(literal) not in (None, ""):
            raise bad(
                f"{where}.{literal}",
                f"a literal webhook {literal} does not belong in the config file (it carries "
                f"a token); put it in an environment variable and name that in '{hint}'",
            )
    unknown = sorted(set(raw) - _WEBHOOK_KEYS - {"url", "secret"})
    if unknown:
        raise bad(f"{where}.{unknown[0]}", "unknown key", "unknown_key")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad(f"{where}.name", "expected 1-40 letters, digits, '_', '.' or '-'")
    strings: dict[str, str] = {}
    for key in ("url_env", "secret_env"):
        value = raw.get(key, "")
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise bad(f"{where}.{key}", f"expected a string, got {_kind(value)}")
        if value and not _ENV_NAME.match(value):
            # The usual slip: the URL itself pasted where its variable's name belongs.
            raise bad(
                f"{where}.{key}",
                "expected the NAME of an environment variable (letters, digits, '_'), "
                "not its value",
            )
        strings[key] = value
    if not strings["url_env"]:
        raise bad(f"{where}.url_env", "missing (the environment variable holding the URL)")
    fmt = raw.get("format", "json")
    if fmt not in FORMATS:
        raise bad(f"{where}.format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if strings["secret_env"] and fmt not in SIGNED_FORMATS:
        raise bad(
            f"{where}.secret_env",
            f"{fmt} incoming webhooks have no signing secret; remove secret_env",
        )
    events_raw = raw.get("events")
    events = DEFAULT_EVENTS
    if events_raw is not None:
        if not isinstance(events_raw, list):
            raise bad(f"{where}.events", f"expected a list, got {_kind(events_raw)}")
        for j, ev in enumerate(events_raw):
            if ev not in EVENTS:
                raise bad(
                    f"{where}.events[{j}]", f"unknown event {ev!r} (known: {', '.join(EVENTS)})"
                )
        events = tuple(dict.fromkeys(events_raw))
    return Webhook(
        name=name,
        url_env=strings["url_env"],
        format=str(fmt),
        events=events,
        secret_env=strings["secret_env"],
        url=(env.get(strings["url_env"]) or "").strip() or None,
        secret=(env.get(strings["secret_env"]) or "").strip() or None
        if strings["secret_env"]
        else None,
    )


def parse_notify(
    raw: Any, raw_page: Any, *, file: Path | str, env: Mapping[str, str]
) -> NotifyConfig:
    """Validate ``notify`` (and read ``page.language`` / ``page.url``) from raw JSON values."""
    bad = _Problem(file)
    page_url = _page_url(raw_page, bad)
    language = _language(raw_page)
    if raw is None:
        return NotifyConfig(language=language, page_url=page_url)
    if not isinstance(raw, Mapping):
        raise bad("notify", f"expected an object, got {_kind(raw)}")
    unknown = sorted(set(raw) - _NOTIFY_KEYS)
    if unknown:
        raise bad(f"notify.{unknown[0]}", "unknown key", "unknown_key")
    hooks_raw = raw.get("webhooks", [])
    if not isinstance(hooks_raw, list):
        raise bad("notify.webhooks", f"expected a list, got {_kind(hooks_raw)}")
    hooks = [_webhook(h, i, env, bad) for i, h in enumerate(hooks_raw)]
    seen: set[str] = set()
    for i, hook in enumerate(hooks):
        if hook.name in seen:
            raise bad(f"notify.webhooks[{i}].name", f"duplicate webhook name {hook.name!r}")
        seen.add(hook.name)
    return NotifyConfig(
        webhooks=tuple(hooks),
        language=language,
        page_url=page_url,
        timeout_seconds=_number(raw, "timeout_seconds", 5.0, bad, 0.1, 60),
        retries=int(_number(raw, "retries", 2, bad, 0, 5)),
        queue_limit=int(_number(raw, "queue_limit", 100, bad, 1, 10_000)),
        keep_hours=_number(raw, "keep_hours", 24.0, bad, 0.1, 24 * 14),
        round_seconds=_number(raw, "round_seconds", 30.0, bad, 1, 600),
        summary_hour=int(_number(raw, "summary_hour", 9, bad, 0, 23)),
    )
