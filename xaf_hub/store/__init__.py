"""What the hub keeps: state files, the audit log, the task pool, the gate and the model state.

* ``statefile``    — atomic writes under a lock, JSON read with a clear error; nothing half-written.
* ``audit``        — the append-only log of every write to a server.
* ``backlog``      — the task pool's interface and rules (claims, requeue), and its file store.
* ``redis_pool``   — the same task pool as one Redis document shared by every hub.
* ``redis_lease``  — the HA patrol lease (one active daemon among hosts); ``fence`` its token.
* ``tasks``        — the pool's task records and their schema.
* ``gate``         — per-instance lock plus slot reservations on files (this host).
* ``redis_backend``— the same gate and the model state shared through Redis (several hosts).
* ``backends``     — the gate ``lock.backend`` names and the pool ``pool.backend`` names.
* ``model_state``  — blackouts per provider family and the memory of healed failures.
* ``patrol_state`` — the patrol's files others read: pause flag, heartbeat, latest report.
"""
