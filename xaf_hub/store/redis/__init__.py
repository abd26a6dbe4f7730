"""The hub's stores on Redis: one server shared by every host that points at it.

``client`` is the one public module for the client and its error helpers; each store is its own
module beside it (``gate``, ``model_state``, ``pool``, ``lease``, ``interrupts``, ``seen``,
``runs``), with the interface of its file twin in ``store`` and the same rules: only the storage
differs. Only ``store.backends`` picks them (and ``doctor`` probes the server), so the default
file stores never load the ``redis`` package. Importing this folder without it installed is a
``ConfigError`` that says how to install it.
"""

from __future__ import annotations

from xaf_hub.errors import ConfigError

try:
    import redis  # noqa: F401 - the package itself (absolute import), not this folder
except ImportError:  # pragma: no cover - exercised only where the extra is missing
    raise ConfigError(
        "lock.backend, models.state_backend or pool.backend is 'redis' but the Python package "
        "'redis' is not installed: pip install 'xaf-hub[redis]'"
    ) from None
