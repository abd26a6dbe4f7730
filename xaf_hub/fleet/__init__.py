"""The fleet of opencode servers as the hub sees it over HTTP.

* ``client``   — OpencodeClient: one server's API, every release's dialect, redacted errors.
* ``wire``     — defensive readers of the server's JSON (sessions, messages, errors).
* ``releases`` — what each opencode release answers (run state, dialects) and the pinned one.
* ``scan``     — scan every instance in parallel into records; one bad server never stops others.
* ``events``   — a stream frame or a rescan -> FleetEvent changes (pure).
* ``follow``   — FleetFollower: one event stream per instance, reconnects, rescans, polling.
* ``web_ui``   — links into opencode's own web app; ``attach`` — the ``opencode attach`` line.
"""
