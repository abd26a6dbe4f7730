"""What both halves of the notification unit tests build on: a webhook, a parsed section, an
event, and the moment they happen at."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.notify_capture import TOKEN
from xaf_hub.config.notify import NotifyConfig, Webhook, parse_notify
from xaf_hub.notify.events import Event

URL = f"http://127.0.0.1:9/hook/{TOKEN}"
NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def parse(notify: Any, page: Any = None, env: dict[str, str] | None = None) -> NotifyConfig:
    return parse_notify(notify, page, file="config.json", env=env or {})


def hook(fmt: str, secret: str = "", **kw: Any) -> Webhook:
    return Webhook(
        "team",
        "HOOK",
        fmt,
        url=URL,
        secret=secret or None,
        secret_env="SECRET" if secret else "",
        **kw,
    )


EVENT = Event(
    "task_done:T-1:ses_1",
    "task_done",
    "2026-12-01T10:00:00+00:00",
    "lan-b",
    "ses_1",
    "登录页 <!channel> & more",
    "T-1",
)
