"""Serve the overview page over HTTP, rescanning the fleet at most every few seconds.

Read-only: the server lists sessions and nothing else; it never dispatches, deletes or
interrupts. Routes: `/` (the same page as `sessions --html`, in the browser's language, and
fetching itself again every few seconds), `/api/snapshot` (the same JSON as
`sessions --json`), `/api/events` (server-sent change notices) and `/health`. However many
people refresh, the fleet is scanned at most once per --cache-seconds, and requests that
arrive during a scan share it. One follower of the servers' event streams serves every open
page: a change marks the cached snapshot stale and notifies the pages, which can fetch
`/api/snapshot` again at once; it is then built from the follower's view of each instance it
keeps current (`page.notices.LiveFleet`), and only the others are scanned.

It listens on loopback only, unless --public is given AND a viewer password is set in the
environment variable XAF_HUB_VIEWER_PASSWORD; then every request must log in (any user name,
that password). The password crosses the network as plain HTTP: use --public on a trusted
network, or put a TLS reverse proxy in front.
"""

from __future__ import annotations

import signal
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xaf_hub.cli.commands._common import scan
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import flag, opt
from xaf_hub.config.watch import ConfigState, ConfigWatch
from xaf_hub.core import aio
from xaf_hub.errors import UsageError
from xaf_hub.fleet.scan import fill_outcomes
from xaf_hub.page.notices import ChangeFeed, LiveFleet
from xaf_hub.page.serve import (
    REFRESH_SECONDS,
    VIEWER_PASSWORD_ENV,
    Limits,
    RequestLog,
    SnapshotCache,
    Viewer,
    check_exposure,
    config_notes,
    start_feed,
    url_of,
)
from xaf_hub.page.view import QUIET_REFRESH_FACTOR
from xaf_hub.store.patrol_state import daemon_alive, heartbeat

WATCH_SECONDS = 1.0  # how often serve looks whether its config was saved

if TYPE_CHECKING:
    from xaf_hub.config.load import Config
    from xaf_hub.core.records import Snapshot

EXAMPLES = """\
examples:
  xaf-hub serve                                  # http://127.0.0.1:7317/ on this machine only
  xaf-hub serve --port 0                         # any free port; the URL is printed
  XAF_HUB_VIEWER_PASSWORD='long shared secret' xaf-hub serve --public --host 0.0.0.0
routes:
  /              the page
  /api/snapshot  the same JSON as `sessions --json`
  /api/events    change notices (server-sent events)
  /health
Ctrl+C stops it.
"""


@dataclass(frozen=True, kw_only=True)
class Options:
    """The options of `serve`."""

    host: str = opt("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    port: int = opt("--port", default=7317, help="port (default 7317; 0 picks a free one)")
    cache_seconds: float = opt("--cache-seconds", default=5.0, metavar="S",
                               help="reuse a scan for S seconds before scanning again (default 5)")
    refresh_seconds: int = opt(
        "--refresh-seconds", default=REFRESH_SECONDS, metavar="S",
        help="an open page fetches itself every S seconds when its change notices are cut off, "
        f"every {QUIET_REFRESH_FACTOR}xS while they flow (it also refreshes at once on each "
        f"change; default {REFRESH_SECONDS})")
    public: bool = flag("--public",
                        help=f"allow a non-loopback --host; requires ${VIEWER_PASSWORD_ENV}")


def run(ctx: Context) -> int:
    """Serve until Ctrl+C or SIGTERM."""
    opts = ctx.options(Options)
    if not 0 <= opts.port <= 65535:
        raise UsageError("--port must be between 0 and 65535")
    if not opts.cache_seconds >= 0:
        raise UsageError("--cache-seconds must be 0 or more")
    if not 1 <= opts.refresh_seconds <= 86400:
        raise UsageError("--refresh-seconds must be between 1 and 86400")
    password = ctx.env.get(VIEWER_PASSWORD_ENV) or None
    check_exposure(opts.host, opts.public, password)
    # deferred: start-up, docs/performance.md
    from xaf_hub.ops.decisions import hub_stops, shown_outcomes

    ctx.see_every_project()
    cfg = ctx.config
    watch = ConfigWatch(cfg, ctx.env)
    # No request waits for a scan longer than one instance's scan deadline.
    feeds: list[ChangeFeed] = []  # the change feed, once a page follows (it says who is polled)

    # Each instance from the change feed's follower while its view is fresh there, the rest
    # scanned; last results read once per change of a session (page.notices.LiveFleet).
    fleet = LiveFleet(
        cfg, scan=lambda rest: scan(ctx, rest)[1],
        outcomes=lambda scans: aio.run(fill_outcomes(ctx.config, scans, ctx.transport_factory)),
    )

    def scan_fleet() -> Snapshot:
        snap = shown_outcomes(fleet(), hub_stops(ctx.ops()))
        return feeds[0].annotate(snap) if feeds else snap

    def follow() -> ChangeFeed:
        feeds.append(start_feed(ctx.config, ctx.transport_factory, cache, log,
                                lambda: watch.state))
        fleet.follow(feeds[0])
        return feeds[0]

    cache = SnapshotCache(scan_fleet, opts.cache_seconds, wait=cfg.scan_timeout)
    # deferred: start-up, docs/performance.md
    from xaf_hub.fleet.web_ui import Finder
    from xaf_hub.page import autopilot as overview

    def states() -> list[tuple[str, ConfigState]]:
        """How serve, and the patrol daemon running beside it, stand with their config."""
        beat = heartbeat(ctx.config.state_dir / "patrol")
        daemon = ConfigState.from_json(beat.get("config")) if beat and daemon_alive(beat) else None
        return [("config.serve", watch.state)] + ([("config.patrol", daemon)] if daemon else [])

    viewer = Viewer(
        cache, title=cfg.project_name or cfg.project_names(),
        password=password if opts.public else None,
        autopilot=lambda now, lang, snap: overview.build(ctx.config, now, lang, snap),
        language=cfg.page_language, links=Finder(cfg, ctx.transport_factory),
        tasks=lambda: overview.task_ids_by_session(ctx.config),
        refresh_seconds=opts.refresh_seconds, redact=ctx.redact,
        notes=lambda lang: config_notes(states(), lang), projects=cfg.shown_projects(),
        named=ctx.named,
    )
    log = RequestLog(ctx.stderr, ctx.redact)

    def reconfigure(new: Config) -> None:
        """Show what the config read again names: its instances, folders, title, language."""
        ctx.use(new)
        fleet.use(new)
        if feeds:
            feeds[0].use(new)
        viewer.configure(new.project_name or new.project_names(), new.page_language,
                         Finder(new, ctx.transport_factory), new.shown_projects())

    def look(stop: threading.Event) -> None:
        """Every WATCH_SECONDS: read the config again if it was saved."""
        while not stop.wait(WATCH_SECONDS):
            try:
                if watch.look("serve", reconfigure, log.line):
                    cache.invalidate()  # the next page shows it
            except Exception as exc:  # noqa: BLE001 - the watch must outlive one bad look
                log.line(f"config: {type(exc).__name__}: {exc}")

    # deferred: start-up, docs/performance.md
    from xaf_hub.page.asgi import PageApp, listen, serve

    page = PageApp(viewer, log, Limits(answer_seconds=cfg.scan_timeout + Limits.answer_seconds),
                   feed_factory=follow)
    sock = listen(opts.host, opts.port)
    # uvicorn takes SIGINT and SIGTERM while it runs and raises them again once stopped;
    # SIGTERM then ends here as Ctrl+C does (exit 0: it raises KeyboardInterrupt too), not
    # as the default handler would (the main thread only: a handler is set there).
    restore: Any = (signal.signal(signal.SIGTERM, signal.default_int_handler)
                    if threading.current_thread() is threading.main_thread() else None)
    stop = threading.Event()
    watcher = threading.Thread(target=look, args=(stop,), name="xaf-hub serve watch", daemon=True)
    watcher.start()
    try:
        host, port = sock.getsockname()[:2]
        url = url_of(str(host), int(port))
        ctx.out(url, flush=True)  # stdout holds only the URL, for scripts
        login = " (log in with any user name and the viewer password)" if opts.public else ""
        ctx.info(f"serving the overview of {len(cfg.instances)} instance(s) at {url}{login}; "
                 f"read-only, rescans at most every {opts.cache_seconds:g}s; Ctrl+C stops")
        if opts.host in ("0.0.0.0", "::"):
            ctx.info(f"colleagues open {url_of(socket.gethostname(), int(port))}")
        serve(page, sock)
    except KeyboardInterrupt:
        pass
    finally:
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)
        stop.set()
        watcher.join(timeout=30)  # a config change under way ends before the follower does
        sock.close()
        page.close()  # ends every open /api/events stream and the follower
    ctx.info("stopped with requests still in flight" if page.counts.in_flight else "stopped")
    return 0
