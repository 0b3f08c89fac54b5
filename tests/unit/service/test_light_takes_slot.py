"""fair_light_takes_slot: beside the reserve (RESERVE_SLOTS: a slot lent, no KV), a
light request may still take a full worker's slot by priority preemption, where its
engine preempts."""

from __future__ import annotations

import pytest

from scheduler.request import QueuedRequest
from service.engines.engine_request import engine_request
from service.engines.protocol import SamplingOptions
from service.engines.sglang_chunks import SGLANG_PREEMPTION_THRESHOLD

THRESHOLD = SGLANG_PREEMPTION_THRESHOLD


def _req(light: bool, threshold: int | None, takes_slot: bool, prompt: int = 40) -> int | None:
    q = QueuedRequest("r", "t", prompt, 16, light=light)
    ids = list(range(1, prompt + 1))
    e = engine_request(q, "r", ids, SamplingOptions(), threshold, False, takes_slot=takes_slot)
    return e.preempt_priority


def test_a_light_request_carries_the_lent_priority_under_the_reserve() -> None:
    lent = _req(True, THRESHOLD, True)
    assert lent is not None and lent > THRESHOLD


@pytest.mark.parametrize(
    ("light", "threshold", "takes_slot", "prompt"),
    [
        (True, THRESHOLD, False, 40),  # the setting off: the reserve as before
        (True, None, True, 40),  # an engine that never preempts
        (False, THRESHOLD, True, 40),  # a heavy tenant's request
        (True, THRESHOLD, True, 4000),  # a light tenant's long prompt is no light request
    ],
)
def test_no_slot_is_taken_otherwise(
    light: bool, threshold: int | None, takes_slot: bool, prompt: int
) -> None:
    assert _req(light, threshold, takes_slot, prompt) is None
