"""Labelled cases of when a reservation still counts, shared by the file gate's tests
(test_gate.py) and the Redis gate's (test_redis_gate.py)."""

from __future__ import annotations

# When a reservation still counts (TTL 60 s, grace 5 s, this host "h1", pid 4242), for the
# file gate (test_gate.py) and the Redis gate (test_redis_gate.py) alike:
# (age s, attached session, running ids or None = unknown, pid alive, host, live)
LIVENESS_CASES = [
    (1, "", None, True, "h1", True),
    (61, "", None, True, "h1", False),  # past TTL (Redis would have expired it too)
    (4, "ses_1", set(), True, "h1", True),  # not running yet, within grace
    (6, "ses_1", set(), True, "h1", False),  # not running after grace
    (30, "ses_1", {"ses_1"}, True, "h1", True),  # running: live until TTL
    (6, "ses_1", None, True, "h1", True),  # running state unknown: keep
    (1, "", None, False, "h1", False),  # process gone on this host
    (1, "", None, False, "h2", True),  # another host's process: cannot tell, keep
]


# How far the prompt got changes what frees a reservation of session ses_1 (this host's pid
# 4242): (age s, prompt, running ids, pid alive, age when the running ids were read, live)
PROMPT_CASES = [
    (1, "sent", None, False, None, True),  # the sender is gone: the prompt is out, kept
    (30, "sent", set(), True, None, True),  # not shown running past the grace: may still land
    (61, "sent", set(), True, None, False),  # the TTL ends it
    (3, "accepted", set(), False, None, True),  # answered, within the grace, sender gone
    (30, "accepted", {"ses_1"}, False, None, True),  # running: kept, whoever sent it
    (30, "accepted", set(), True, None, False),  # answered, not running after the grace
    (30, "accepted", set(), True, 2, True),  # the reading was taken 2 s after it was made
    (30, "accepted", set(), True, -1, True),  # the reading predates it: it cannot judge it
    (30, "", set(), True, 10, False),  # a reading made after the grace judges it
]
