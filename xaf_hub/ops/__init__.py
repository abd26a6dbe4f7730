"""The operations: decide and act, for the commands, the patrol and the page alike
(docs/architecture.md §1 lists the modules).
"""
