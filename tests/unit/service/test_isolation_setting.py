"""fair_isolation as the server resolves it (`isolation_for`): `auto` lends room
beyond an engine that preempts, except beside staggered prefill, where the lent
room ran every worker's KV full (issue #33, session 21)."""

from __future__ import annotations

import pytest

from scheduler.rules import Isolation
from service.admission_setup import isolation_for
from service.engines.protocol import EngineCapacity
from service.settings import Settings


def _cap(preempts: bool) -> EngineCapacity:
    return EngineCapacity(16, 16_000, 32_768, 32_000, 10 if preempts else None)


@pytest.mark.parametrize(
    ("setting", "stagger", "preempts", "expected"),
    [
        ("auto", 0, True, Isolation.PREEMPT),
        ("auto", 1024, True, Isolation.RESERVE),
        ("auto", 0, False, Isolation.RESERVE),
        ("preempt", 1024, True, Isolation.PREEMPT),
        ("reserve", 0, True, Isolation.RESERVE),
    ],
)
def test_auto_keeps_the_reserve_beside_staggered_prefill(
    setting: str, stagger: int, preempts: bool, expected: Isolation
) -> None:
    s = Settings.model_construct(fair_isolation=setting, sglang_stagger_prefill_tokens=stagger)
    assert isolation_for(s, _cap(preempts)) is expected


def test_preempt_needs_an_engine_that_preempts() -> None:
    s = Settings.model_construct(fair_isolation="preempt")
    with pytest.raises(ValueError, match="needs an engine that preempts"):
        isolation_for(s, _cap(False))
