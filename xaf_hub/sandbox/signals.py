"""Signals of the processes the tests and the benchmark start."""

from __future__ import annotations

import signal


def let_children_see_ctrl_c() -> None:
    """Give SIGINT its default meaning again in this process, hence in the ones it starts.

    A shell without job control starts a background command (``pytest &``, a CI step run in
    the background) with SIGINT ignored, and an ignored signal stays ignored across exec:
    Ctrl+C (SIGINT) sent to a `watch` or `serve` started from there would do nothing. The
    tests and the benchmark stop those processes with SIGINT, as a person does.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
