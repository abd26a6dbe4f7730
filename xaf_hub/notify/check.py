"""What ``doctor`` says about each webhook: its environment variables, its last deliveries, and
(``--online``) whether its host name resolves. Nothing is ever sent from here."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from xaf_hub.config.notify import NotifyConfig, Webhook
from xaf_hub.errors import ExitCode, StateFileError
from xaf_hub.notify.outbox import read_state, state_path
from xaf_hub.ops.health import Finding, error, info, ok, warn

RESOLVE_SECONDS = 5.0
AREA = "notify"

Resolver = Callable[[str, int], Any]


def resolves(host: str, port: int, resolver: Resolver, timeout: float) -> str | None:
    """None when ``host`` resolves within ``timeout``, else why not."""
    box: list[str | None] = []

    def run() -> None:
        try:
            resolver(host, port)
            box.append(None)
        except OSError as exc:
            box.append(exc.strerror or str(exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    return box[0] if box else f"no answer from the resolver within {timeout:g}s"


def _hook_checks(hook: Webhook, online: bool, resolver: Resolver) -> list[Finding]:
    subject = f"webhook {hook.name}"
    if not hook.url:
        return [error(
            AREA, subject,
            f"${hook.url_env} is not set: the {hook.format} webhook '{hook.name}' sends nothing",
            f"Set {hook.url_env} to the webhook URL the chat service gave you, in the "
            "environment the patrol runs in (never in config.json).",
            ExitCode.USAGE,
        )]
    parts = urlsplit(hook.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [error(
            AREA, subject, f"${hook.url_env} does not hold an http:// or https:// URL",
            f"Set {hook.url_env} to the full webhook URL, starting with https://.", ExitCode.USAGE,
        )]
    out: list[Finding] = []
    if hook.secret_env and not hook.secret:
        out.append(error(
            AREA, subject,
            f"${hook.secret_env} (the signing secret) is not set: the service refuses "
            "unsigned messages when signing is on",
            f"Set {hook.secret_env} to the bot's signing secret, or remove secret_env.",
            ExitCode.USAGE,
        ))
    elif hook.format in ("feishu", "dingtalk") and not hook.secret_env:
        out.append(info(
            AREA, subject, "no signing secret: anyone holding the URL can post to the chat",
            "Turn on signing in the bot's security settings and name its environment "
            "variable in secret_env.",
        ))
    signed = " signed" if hook.secret else ""
    said = f"{hook.format}{signed}, URL from ${hook.url_env}; events: {', '.join(hook.events)}"
    out.append(ok(AREA, subject, said))
    if online:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        problem = resolves(parts.hostname, port, resolver, RESOLVE_SECONDS)
        if problem is None:
            out.append(ok(AREA, subject, f"host {parts.hostname} resolves (nothing sent)"))
        else:
            out.append(error(
                AREA, subject, f"host {parts.hostname} does not resolve: {problem}",
                "Check the URL and this machine's DNS (xaf-hub notify test sends one "
                "message once it resolves).",
                ExitCode.UNREACHABLE,
            ))
    return out


def _delivery_checks(cfg: NotifyConfig, state_dir: Path) -> list[Finding]:
    try:
        state = read_state(state_dir)
    except StateFileError as exc:
        fix = f"Repair or move aside {state_path(state_dir)} (never reset silently)."
        return [error(AREA, "notifications", str(exc), fix, ExitCode.INTERNAL)]
    if state is None:
        return []
    out = []
    for hook in cfg.webhooks:
        subject, test = f"webhook {hook.name}", f"`xaf-hub notify test --webhook {hook.name}`"
        last = state["last"].get(hook.name) or {}
        queued = sum(1 for i in state["outbox"] if i.get("webhook") == hook.name)
        parked = [p for p in state["parked"] if p.get("webhook") == hook.name]
        if parked:
            out.append(warn(
                AREA, subject,
                f"{len(parked)} message(s) refused in the last 24 h and parked, not sent "
                f"again; the latest: {parked[-1].get('reason')}",
                f"Fix the webhook (URL, secret, format); {test} shows the receiver's answer.",
            ))
        ok_at, error_at = str(last.get("ok_at") or ""), str(last.get("error_at") or "")
        if error_at and error_at >= ok_at:
            out.append(warn(
                AREA, subject,
                f"last delivery failed at {error_at}: {last.get('error')}; "
                f"{queued} message(s) queued",
                f"Run {test} to see the receiver's answer; queued messages go out with the "
                "patrol's next try.",
            ))
        elif ok_at:
            out.append(ok(AREA, subject, f"last delivered at {ok_at}; {queued} message(s) queued"))
    return out


def webhook_checks(
    cfg: NotifyConfig,
    state_dir: Path,
    *,
    online: bool = False,
    resolver: Resolver = socket.getaddrinfo,
) -> list[Finding]:
    """Every webhook's checks, then what the last rounds delivered."""
    hooks = [finding for hook in cfg.webhooks for finding in _hook_checks(hook, online, resolver)]
    return hooks + _delivery_checks(cfg, state_dir)
