"""Chat notifications of patrol and fleet events (task done, needs a person, server down...).

Modules, each using only those below it:

* ``patrol``   — the patrol's one hook: derive a round's events, queue them, send, report.
* ``outbox``   — the durable state in ``<state>/notify/state.json``: what was seen, queued, sent.
* ``send``     — POST one message with a short timeout and a few retries; judge the answer.
* ``derive``   — a finished cycle (plus the previous round's view) -> events (pure).
* ``formats``  — event text -> each service's incoming-webhook request, signed (pure).
* ``messages`` — the small zh/en catalogue: an event in plain words (pure).
* ``events``   — the event record.
* ``check``    — what ``doctor`` says about each webhook.
* ``config``   — the ``notify`` config section (imported by config loading; stays light).
"""
