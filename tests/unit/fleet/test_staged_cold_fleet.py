"""Staged prefill of cold prompts only (issue #33, lever 2 refined) on the virtual
fleet: the server's placement on simulated engines and a fake clock. A document
is staged the first time it reaches an engine; a later prompt on it, routed to
the engine holding it, goes whole (its uncached rest is short) in its turn in
the engine's lane, or is staged from above the held part when its rest is long."""

from __future__ import annotations

import pytest
from fairgate.bench.event_driver import Arrival
from fairgate.bench.stagger import fleet

from service.engines.staged_prefill import StagedPrefill

DOC = tuple(range(1000, 4000))  # 3000 tokens


def _ask(at_s: float, rest: range) -> Arrival:
    ids = (*DOC, *rest)
    return Arrival(at_s, "docs", len(ids), 16, prompt_ids=ids)


def _trace() -> list[Arrival]:
    return [
        _ask(0.0, range(5000, 5100)),  # cold: staged
        _ask(3.0, range(6000, 6100)),  # the document held: 100 uncached
        _ask(6.0, range(7000, 9500)),  # 2500 uncached above the document
    ]


@pytest.mark.parametrize("engines", [1, 2])
def test_only_prompts_cold_where_they_go_are_staged(engines: int) -> None:
    plan = StagedPrefill(min_tokens=2049, stage_tokens=512, cold_only=True)
    drv = fleet(_trace(), engines, None, plan)
    cold, warm, long_rest = drv.calls
    assert all(c.state == "done" for c in drv.calls)
    assert warm.worker == long_rest.worker == cold.worker  # locality: where DOC is
    assert cold.staging is not None and cold.staging.computed == 3072
    # Whole, in its turn in the lane (no stages computed anything).
    assert warm.staging is not None and warm.staging.computed == 0
    assert warm.cached_tokens >= 2900
    # Staged from the first stage end above the document (3072, ..., 5120): the
    # stages computed the rest above the 3000 tokens the engine held.
    assert long_rest.staging is not None and long_rest.staging.computed == 5120 - 3000
    assert long_rest.cached_tokens == 5120


def test_without_cold_only_every_long_prompt_is_staged() -> None:
    plan = StagedPrefill(min_tokens=2049, stage_tokens=512, cold_only=False)
    drv = fleet(_trace(), 2, None, plan)
    assert all(c.staging is not None for c in drv.calls)
    # The warm one's stages found the document cached: only its last one computed.
    warm = drv.calls[1]
    assert warm.staging is not None and warm.staging.computed < 512


def test_a_prompt_on_a_document_still_being_computed_waits_its_turn_then_finds_it() -> None:
    """The placement counts the document held as soon as the first prompt is routed;
    the second, sent at once, goes whole but after the first's stages (the lane),
    so it finds the document cached instead of prefilling it a second time."""
    plan = StagedPrefill(min_tokens=2049, stage_tokens=512, cold_only=True)
    drv = fleet([_ask(0.0, range(5000, 5100)), _ask(0.01, range(6000, 6100))], 1, None, plan)
    first, second = drv.calls
    assert first.staging is not None and first.staging.computed == 3072
    assert second.staging is not None and second.staging.computed == 0
    assert second.placed is not None and second.placed.matched >= 2900
    assert first.first_token_s is not None and second.first_token_s is not None
    assert second.first_token_s > first.first_token_s
    assert second.cached_tokens == 3000
