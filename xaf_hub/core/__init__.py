"""The pure core: records, run-state words, time, text and redaction, directory rules, the
matcher and the discipline. Nothing here does I/O or imports another folder of the package.

* ``records``   — SessionRecord, InstanceSummary, Snapshot: a session as every command sees it.
* ``runstate``  — the run-state vocabulary: an opencode error, a run, a verdict, a class.
* ``clock``     — time: epoch ms, ISO and local forms, "ago", time zones, the next reset hour.
* ``text``      — JSON and tables for output, redaction of secrets, terminal-safe text.
* ``rules``     — which directories belong to the project (exclude > roots > path segments).
* ``matcher``   — TF-IDF over character n-grams: which session a task is related to.
* ``discipline``— the commit/branch rules every prompt carries.
* ``aio``       — asyncio helpers: run, gather that cancels its siblings, cancel and wait.
"""
