"""Allow ``python -m xaf_hub``."""

from __future__ import annotations

import sys

try:
    from xaf_hub.cli.main import run
except KeyboardInterrupt:  # Ctrl+C while the hub still loads: end as interrupted, quietly
    sys.exit(130)

if __name__ == "__main__":
    run()
