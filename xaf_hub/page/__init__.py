"""The overview page a colleague reads, its exports and the server that serves it.

* ``words``      — every word of the page, English and Chinese.
* ``view``       — the page's rows, badges and cards from the records.
* ``export``     — JSON, CSV and the self-contained HTML page (templates/).
* ``autopilot``  — the Autopilot panel (reads the patrol's state files only).
* ``notices``    — serve's change notices: one follower for every open page.
* ``serve_checks``, ``serve_limits`` — who may see the page, and what a request may cost.
"""
