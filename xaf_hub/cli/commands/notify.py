"""Chat notifications: `notify test` sends one test message to each webhook (or the one named)
and prints what the receiver answered.

Webhooks are configured under notify.webhooks; each URL comes from the environment variable
named by its url_env, never from the config file. The patrol sends the real events at the end
of each round (see docs/notifications.md); this command only proves the path works.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from xaf_hub.cli.context import Context
from xaf_hub.cli.options import JSON, opt
from xaf_hub.config.notify import url_problem
from xaf_hub.core import aio
from xaf_hub.core.text import redact
from xaf_hub.errors import ExitCode, UsageError
from xaf_hub.notify.patrol import send_test

EXAMPLES = """\
examples:
  xaf-hub notify test                    # one test message to every configured webhook
  xaf-hub notify test --webhook team     # only to the webhook named "team"
  xaf-hub notify test --json
exit codes: 0 every receiver took the message; 2 a receiver could not be reached (or answered
HTTP 5xx / 429); 4 no webhook configured, an unknown name, its URL variable unset, or the
receiver refused the message (wrong token, bad signature).
"""


@dataclass(frozen=True, kw_only=True)
class Options:
    """The options of `notify`."""

    action: Literal["test"] | None = opt(help="test: send one test message")
    webhook: str | None = opt("--webhook", metavar="NAME", help="only this webhook (default: all)")
    json: bool = JSON.field()


def run(ctx: Context) -> int:
    """Send one test message per chosen webhook and print each receiver's answer."""

    opts = ctx.options(Options)
    if opts.action is None:
        raise UsageError("notify needs an action: `xaf-hub notify test` (see --help)")
    cfg = ctx.config
    notify = cfg.notify
    if not notify.webhooks:
        raise UsageError(
            "no webhook configured: add one under notify.webhooks (see docs/notifications.md)")
    hooks = [notify.webhook(opts.webhook)] if opts.webhook else list(notify.webhooks)
    secrets = cfg.secrets()
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    code = ExitCode.OK
    for hook in hooks:
        row: dict[str, Any] = {"webhook": hook.name, "format": hook.format}
        if not hook.url:
            row.update(delivered=False, status=0, reason=f"${hook.url_env} is not set", answer="")
            code = max(code, ExitCode.USAGE)
        elif problem := url_problem(hook.url):
            row.update(delivered=False, status=0, answer="",
                       reason=f"${hook.url_env} does not hold a usable URL: {problem}")
            code = max(code, ExitCode.USAGE)
        else:
            answer = aio.run(send_test(cfg, hook))
            row.update(delivered=answer.ok, status=answer.status,
                       reason=redact(answer.reason, secrets), answer=redact(answer.body, secrets))
            if not answer.ok:
                code = max(code, ExitCode.UNREACHABLE if answer.retry else ExitCode.USAGE)
        rows.append(row)
        state = "delivered" if row["delivered"] else "NOT delivered"
        lines.append(f"{row['webhook']} ({row['format']}): {state}: {row['reason']}")
        lines += [f"  receiver answered: {row['answer']}"] if row["answer"] else []
    # redacted as it prints
    return ctx.answer({"exit_code": int(code), "results": rows}, *lines, code=int(code))
