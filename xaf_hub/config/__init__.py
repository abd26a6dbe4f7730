"""Configuration: finding, loading and checking ``config.json`` with file and key in every
error, credential lookup, and each section's schema.

* ``load``     — Config and its sections, ``load_config`` / ``find_config`` / ``parse_config``.
* ``reader``   — typed readers of one JSON value with its path.
* ``credentials`` — where each password comes from; the variable names a person sets.
* ``notify``   — the ``notify`` section (webhooks), kept light: config loading imports it.
"""
