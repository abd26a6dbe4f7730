"""The overview page a colleague reads, its exports and the server that serves it.

* ``words``      — every word of the page, English and Chinese.
* ``view``       — the page's rows, badges and cards from the records.
* ``export``     — JSON, CSV and the self-contained HTML page (templates/).
* ``autopilot``  — the Autopilot panel (reads the patrol's state files only).
* ``notices``    — serve's change notices: one follower for every open page.
* ``serve``      — the served page: routes, the scan cache, change-notice streams, who may
  see it and what a request may cost (``cli/commands/serve.py`` only parses and starts it).
"""
