"""A replay's plan is out of the collector's sight for the replay only."""

from __future__ import annotations

import gc

from fairgate.bench.collector import plan_frozen


def test_the_plan_is_frozen_during_the_replay_only() -> None:
    gc.unfreeze()
    plan = [[i] for i in range(1000)]
    with plan_frozen():
        assert gc.get_freeze_count() >= len(plan)
    assert gc.get_freeze_count() == 0


def test_an_error_in_the_replay_unfreezes_too() -> None:
    gc.unfreeze()
    try:
        with plan_frozen():
            raise RuntimeError("the gateway went away")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0
