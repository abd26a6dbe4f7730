"""xaf-hub: run a team's fleet of opencode servers as one."""

__version__ = "0.2.0"
