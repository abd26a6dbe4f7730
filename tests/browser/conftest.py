"""The fixture every browser module uses: headless Chromium, one per module
(tests/browser/support.py)."""

from tests.browser.support import browser

__all__ = ["browser"]
