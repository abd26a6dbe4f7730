"""The fixtures several end-to-end modules share, offered to every module here (the session
fleet and ``hub`` are tests/fleet.py's, registered from tests/conftest.py)."""

from tests.e2e.daemon import own_server
from tests.e2e.ha_checks import daemons
from tests.e2e.two_hosts import hosts, rds

__all__ = ["daemons", "hosts", "own_server", "rds"]
