"""The operations: decide and act, for the commands, the patrol and the page alike.

* ``context``   — OpsContext: config, clock, env, transport seam and stores; Fleet.
* ``send``      — send_work, the one caller of prompt_async: lock, re-count, reserve, send.
* ``dispatch``  — a person's dispatch: scan, match, plan, record, send.
* ``planner``   — where work goes (pure: views + request -> Plan).
* ``load``      — an instance's load against its limit: the one count.
* ``heal``      — heal a rate-limited or model-unavailable session along its model chain.
* ``models``    — model state store, chains, model choice.
* ``confirm``   — look at one session, wait for a run to start, heal on the spot.
* ``decisions`` — what a person decided (interrupt, steered by hand): never overridden.
* ``cleanup``, ``interrupt`` — stale sessions deleted on request; a run stopped.
* ``health``    — doctor's checks: one finding per thing, with its fix.
"""
