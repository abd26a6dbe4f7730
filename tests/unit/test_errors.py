from __future__ import annotations

import pytest

from xaf_hub.errors import ExitCode


@pytest.mark.parametrize(
    ("codes", "worst"),
    [
        ([], 0),
        ([0, 0], 0),
        ([0, 3], 3),
        ([3, 5], 3),
        ([5, 3], 5),
        ([3, 2], 2),
        ([2, 4], 4),
        ([4, 1, 3], 1),
        ([1, 0], 1),
    ],
)
def test_worst_is_one_order_for_every_command(codes: list[int], worst: int) -> None:
    """Internal before config, config before unreachable, unreachable before busy; a tie keeps
    the first."""
    assert ExitCode.worst(codes) == worst
