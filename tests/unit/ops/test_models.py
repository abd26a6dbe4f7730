"""Which model a send picks for an instance (``ops.models.pick_model``), and a task's next
model past the ones its runs failed on (``choose_model``'s ``avoid``)."""

from __future__ import annotations

from dataclasses import replace

from tests.unit.ops.planner_support import A, config
from xaf_hub.config.load import ModelsConfig
from xaf_hub.ops.models import pick_model

FREE, GO, PAID, DEFAULT = "opencode/big-pickle", "opencode-go/x", "anthropic/sonnet", "openai/gpt"
CFG = replace(config(A), models=ModelsConfig(default_dispatch_model=DEFAULT,
                                             chain=(FREE, GO, PAID)))


def test_the_chain_s_first_model_not_resting_and_not_avoided() -> None:
    assert pick_model(CFG, A, None, set()) == FREE
    assert pick_model(CFG, A, None, set(), avoid=[FREE]) == GO
    assert pick_model(CFG, A, None, {"opencode"}, avoid=[PAID]) == DEFAULT  # a family rests


def test_the_default_when_the_chain_is_spent_and_none_when_it_was_tried_too() -> None:
    assert pick_model(CFG, A, None, {GO}, avoid=[FREE, PAID]) == DEFAULT
    assert pick_model(CFG, A, None, set(), avoid=[FREE, GO, PAID, DEFAULT]) is None
    assert pick_model(CFG, A, None, {DEFAULT}, avoid=[FREE, GO, PAID]) is None
