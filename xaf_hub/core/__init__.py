"""The pure core: records, run-state words, time, text and redaction, directory rules, the
matcher and the discipline. Nothing here does I/O or imports another folder of the package
(docs/architecture.md §1 lists the modules).
"""
