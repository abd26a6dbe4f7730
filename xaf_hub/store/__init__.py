"""What the hub keeps: state files, the audit log, the task pool, the gate and the model state.

* ``statefile``    — atomic writes under a lock, JSON read with a clear error; nothing half-written.
* ``audit``        — the append-only log of every write to a server.
* ``pool``         — the task pool's interface, and its rules (claims, requeue) written once.
* ``backlog``      — the task pool's file store; ``redis/pool`` is the other.
* ``pick``         — which ready tasks an instance takes now (pure).
* ``tasks``        — the pool's task records and their schema.
* ``gate``         — per-instance lock plus slot reservations on files (this host).
* ``redis/``       — the same stores on one Redis shared by every host: ``client`` (the client
  and its error helpers), ``gate``, ``model_state``, ``pool`` (a key per task), ``lease`` (the
  HA patrol's one active daemon; ``fence`` its token), ``interrupts``, ``seen``, ``runs``.
* ``backends``     — the one factory: picks each store as the config names it (file or Redis).
* ``model_state``  — blackouts per provider family and the memory of healed failures.
* ``patrol_state`` — the patrol's files others read: pause flag, heartbeat, latest report.
"""
