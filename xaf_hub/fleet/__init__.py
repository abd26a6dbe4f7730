"""The fleet of opencode servers as the hub sees it over HTTP: one server's client, the readers
of its JSON, its release's rules, the scan and the live follower (docs/architecture.md §1 lists
the modules).
"""
