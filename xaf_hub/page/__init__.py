"""The overview page a colleague reads, its exports and the server that serves it
(docs/architecture.md §6.2).
"""
