"""Allow ``python -m xaf_hub``."""

from __future__ import annotations

import sys

from xaf_hub.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
