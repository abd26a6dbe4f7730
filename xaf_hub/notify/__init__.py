"""Chat notifications of patrol and fleet events (task done, needs a person, server down...).

Modules, each using only those below it:

* ``patrol``   — queue a round's events (under its lock); the sender posts them (never under it).
* ``outbox``   — the durable state in ``<state>/notify/state.json``: queued, claimed, sent, parked.
* ``send``     — POST one message with a short timeout; judge the answer (at most once).
* ``derive``   — a round's record (plus the previous round's view) -> events (pure).
* ``formats``  — event text -> each service's incoming-webhook request, signed (pure).
* ``messages`` — the small zh/en catalogue: an event in plain words (pure).
* ``events``   — the event record.
* ``record``   — ``RoundLog``: what a round did, appended to by the patrol's jobs; derive reads it.
* ``check``    — what ``doctor`` says about each webhook.
* ``config``   — the ``notify`` config section (imported by config loading; stays light).
"""
