"""The patrol: the jobs that keep the fleet busy and healthy without a person
(docs/architecture.md §8 lists them in order).

``runner`` runs a round and the daemon, ``report`` writes its report; each job is an async
function of an ``OpsContext`` and the round's ``Cycle``. ``xaf-hub --help`` and ``status`` never
import this package.
"""
