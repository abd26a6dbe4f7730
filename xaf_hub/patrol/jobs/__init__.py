"""The patrol's four jobs, run in this order by ``patrol.runner`` (architecture §8).

* ``fix_free_limit``    — heal rate-limited / model-unavailable sessions.
* ``check_agents``      — classify sessions, resume interrupted ones once.
* ``sync_design``       — pending rows of design documents into pool tasks.
* ``fill_slots``        — settle dispatched tasks, fill free slots from the pool.
"""
