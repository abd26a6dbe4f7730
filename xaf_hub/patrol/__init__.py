"""The patrol: four jobs that keep the fleet busy and healthy without a human (architecture §8).

One cycle runs, in order, each surviving the others' failure:

1. ``fix_free_limit``    — heal rate-limited / model-unavailable sessions (jobs/fix_free_limit.py)
2. ``check_agents``      — classify sessions, resume interrupted ones (jobs/check_agents.py)
3. ``sync_design_tasks`` — add pending tasks found in design documents (jobs/sync_design.py)
4. ``fill_slots``        — settle dispatched tasks, fill free slots (jobs/fill_slots.py)

``runner.py`` runs a cycle (lock, pause flag, report) and the APScheduler loop; ``report.py``
writes the markdown + JSON report. Every job is a plain async function of a ``OpsContext``
(config, clock, I/O seams) and the round as its jobs see it, ``Cycle``: what they read, and
``Cycle.log`` (``notify.record.RoundLog``), what they did, which the report and notify read.

Nothing here is imported by ``xaf-hub --help`` or ``status``: the command imports it lazily.
"""
