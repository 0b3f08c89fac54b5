"""The light slot (service/engines/stagger.py, `Stagger.slot_kept`): while a light
tenant is active, no other request takes the last free slot of the worker a
light request would go to (a free slot, the least prefill pending), while
another worker has room."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from scheduler.request import QueuedRequest
from service.engines.engine_request import engine_request
from service.engines.placement import Placement
from service.engines.protocol import EngineRequest, SamplingOptions
from service.engines.stagger import Stagger

SLOTS, KV = 4, 100_000


@dataclass
class _Target:
    url: str
    healthy: bool = True

    def slots(self) -> int:
        return SLOTS

    def kv_capacity(self) -> int:
        return KV

    def penalty(self, now_s: float) -> int:
        return 0


def _request(prompt_tokens: int, *, light: bool) -> EngineRequest:
    q = QueuedRequest("r", "t", prompt_tokens, 16, light=light)
    return engine_request(q, "r", list(range(1, prompt_tokens + 1)), SamplingOptions(), None, False)


def _pool(light_slot: bool = True, light_seen_s: float = 4.0) -> Placement:
    p = Placement([_Target(f"w{i}") for i in range(3)], clock=lambda: 5.0)
    p.stagger = Stagger(min_tokens=1024, light_window_s=10.0, light_slot=light_slot)
    p.stagger.light_seen_s = light_seen_s
    # w0: one slot free and no prefill pending (where a light request goes now);
    # w1 full; w2 with room, but the most prefill pending.
    p.in_flight[:] = [SLOTS - 1, SLOTS, 1]
    p.pending_prefill[:] = [0, 0, 900]
    return p


def test_a_short_request_leaves_the_light_requests_last_slot() -> None:
    p = _pool()
    short = p.place(_request(200, light=False), [], set())
    assert short is not None and short.worker == 2 and p.stagger.slots_kept == 1
    light = p.place(_request(40, light=True), [], set())
    assert light is not None and light.worker == 0


@pytest.mark.parametrize("why", ["off", "light quiet", "light request", "no room elsewhere"])
def test_the_last_slot_is_taken_where_the_rule_does_not_apply(why: str) -> None:
    p = _pool(light_slot=why != "off", light_seen_s=-100.0 if why == "light quiet" else 4.0)
    if why == "no room elsewhere":
        p.in_flight[2] = SLOTS  # nowhere else to go: it is not stranded
    req = _request(40 if why == "light request" else 200, light=why == "light request")
    placed = p.place(req, [], set())
    assert placed is not None and placed.worker == 0 and p.stagger.slots_kept == 0


def test_a_worker_with_two_free_slots_takes_any_request() -> None:
    p = _pool()
    p.in_flight[0] = SLOTS - 2
    placed = p.place(_request(200, light=False), [], set())
    assert placed is not None and placed.worker == 0 and p.stagger.slots_kept == 0
