"""Hostile webhook receivers against the real patrol daemon and real opencode servers.

Each case runs the daemon (live reactions) with one webhook (``json`` format, ``healed``
notices) whose receiver (``tests.notify_capture.Capture`` on 127.0.0.1) misbehaves: it hangs,
answers 200 after the hub's timeout, refuses (400), redirects (302), is unreachable, closes the
connection mid-answer, or the hub is killed mid-POST. Two sessions are rate-limited by the fake
model one after the other; the second while the first one's notice is being posted. Measured
per case: each heal's latency (prompt -> heal in the audit log), copies received per message,
and what `patrol --once` did meanwhile; the table is printed after the module's run.

Held in every case: a heal never waits on a webhook (in the hanging case the second session is
healed while the first notice's POST is still open), `patrol --once` is never kept out of the
lock by a daemon that is posting, and each notice arrives at most once — exactly once where the
receiver can take it.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemon import Lines, _audit, _daemon
from tests.fleet import Hub
from tests.notify_capture import Capture

pytestmark = pytest.mark.e2e

FIGURES: dict[str, dict[str, Any]] = {}
ONLY_NOTIFY = ("--no-fill", "--no-design", "--no-freelimit")


@pytest.fixture(scope="module", autouse=True)
def _table(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if tr is None or capture is None or not FIGURES:
        return
    with capture.global_and_fixture_disabled():  # the table goes to the terminal, not a capture
        _write(tr)


def _write(tr: Any) -> None:
    cols = ("heal 1 s", "heal 2 s", "2nd healed mid-POST", "--once", "POSTs", "max copies",
            "parked", "queued")
    tr.write_sep("=", "hostile webhook receivers (patrol daemon, real opencode)")
    tr.write_line("case".ljust(16) + "".join(c.ljust(21) for c in cols))
    for case, f in FIGURES.items():
        cells = [f.get(k, "-") for k in ("heal1", "heal2", "mid_post", "once", "posts",
                                          "copies", "parked", "queued")]
        tr.write_line(case.ljust(16) + "".join(str(c).ljust(21) for c in cells))


def _home(hub: Hub) -> Path:
    return Path(hub.env["XAF_HUB_HOME"])


def _notify_state(hub: Hub) -> dict[str, Any]:
    path = _home(hub) / "notify" / "state.json"
    try:
        return dict(json.loads(path.read_text("utf-8")))
    except (OSError, ValueError):
        return {}


def _posting(hub: Hub) -> bool:
    """Whether a message is claimed and its request has left (a POST in flight)."""
    return any((i.get("sending") or {}).get("posted") for i in _notify_state(hub).get("outbox", []))


def _configure(hub: Hub, cap: Capture, timeout: float) -> None:
    hub.doc["models"] = {"default_dispatch_model": "fake/fake-model",
                         "chain": ["opencode/free-model", "backup/good-model"]}
    hub.env["HOOK_TEAM"] = cap.url
    hub.doc["notify"] = {
        "webhooks": [{"name": "team", "url_env": "HOOK_TEAM", "format": "json",
                      "events": ["healed"]}],
        "timeout_seconds": timeout,
        "retries": 2,
    }
    hub.write_config()
    hub.llm.set_mode("free-model", "429", retry_after=1)


def _rate_limited(hub: Hub, title: str) -> tuple[str, float]:
    sid = hub.session("lan-b", title, "rl")
    t0 = time.monotonic()
    hub.prompt("lan-b", sid, "do the work", "opencode/free-model")
    return sid, t0


def _healed(hub: Hub, sid: str, t0: float) -> float:
    hub.wait_for(lambda: [r for r in _audit(hub, "patrol.heal") if r["session"] == sid],
                 timeout=240, step=0.1)
    return round(time.monotonic() - t0, 1)


def _once(hub: Hub) -> tuple[int, float]:
    t0 = time.monotonic()
    code, _, err = hub.cli("patrol", "--once", *ONLY_NOTIFY)
    assert code in (0, 3), err
    return code, round(time.monotonic() - t0, 1)


def _copies(cap: Capture) -> Counter[str]:
    return Counter(h.body["event"]["id"] for h in list(cap.hits))


# Mode of the receiver, the hub's timeout, and whether the hub is killed mid-POST. "hang": each
# POST stays open for the timeout (both notices, then the daemon's stop waits out the second),
# long enough that the second heal comes while the first one is still open (2-8 s after it).
CASES = {
    "healthy": ("ok", 5.0),
    "hang": ("hang", 20.0),
    "slow-200": ("slow", 2.0),
    "refuse-400": ("refuse", 5.0),
    "redirect-302": ("redirect", 5.0),
    "unreachable": ("down", 5.0),
    "cut-mid-answer": ("cut", 5.0),
    "kill-mid-post": ("hang", 30.0),
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", list(CASES))
def test_receiver(hub: Hub, case: str) -> None:
    mode, timeout = CASES[case]
    cap = Capture("json")
    cap.mode = "ok" if mode == "down" else mode
    cap.delay = 90.0 if mode == "hang" else timeout + 3.0  # "slow": 200 after the timeout
    cap.start()
    if mode == "down":
        cap.stop()  # connection refused until it comes back on the same port
    _configure(hub, cap, timeout)
    fig: dict[str, Any] = FIGURES.setdefault(case, {})
    lines: Lines | None = _daemon(hub, "--no-fill")
    try:
        first, t1 = _rate_limited(hub, f"{case} one")
        fig["heal1"] = _healed(hub, first, t1)
        if mode != "down":
            hub.wait_for(lambda: cap.hits, timeout=120)  # the first notice reached it
        if mode == "hang":
            hub.wait_for(lambda: _posting(hub), timeout=60)  # ...and its POST is open
            code, took = _once(hub)  # cron's round beside a daemon that is posting
            fig["once"] = f"exit {code}, {took} s"
            assert code == 0, "patrol --once found the lock held by a daemon that was posting"
        if case == "kill-mid-post":
            assert lines is not None
            lines.proc.send_signal(signal.SIGKILL)
            lines.proc.wait(30)
            lines.stop()
            lines = None
            cap.mode = "ok"
            for _ in range(2):
                _once(hub)
        else:
            second, t2 = _rate_limited(hub, f"{case} two")
            fig["heal2"] = _healed(hub, second, t2)
            if mode == "hang":
                # Healed while the first notice's POST was still open: no heal waits on it.
                fig["mid_post"] = _posting(hub)
                assert fig["mid_post"], "the second heal came only after the POST ended"
            if mode == "down":
                cap.start()  # back: the back-off brings both notices, once each
            hub.wait_for(lambda: len(cap.hits) >= 2, timeout=240)
            code, took = _once(hub)  # a round: would re-send whatever is still owed
            fig.setdefault("once", f"exit {code}, {took} s")
            time.sleep(8)  # the daemon's sender polls every 5 s: a re-send would show
        copies = _copies(cap)
        state = _notify_state(hub)
        fig.update(posts=len(cap.hits), copies=max(copies.values(), default=0),
                   parked=len(state.get("parked", [])), queued=len(state.get("outbox", [])))
        expected = 1 if case == "kill-mid-post" else 2
        assert len(copies) == expected and set(copies.values()) == {1}, copies
        if mode in ("refuse", "redirect"):
            assert fig["parked"] == 2 and fig["queued"] == 0
    finally:
        if lines is not None:
            assert lines.stop() == 0, lines.err
        cap.stop()
