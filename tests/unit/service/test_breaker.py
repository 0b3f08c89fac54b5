"""The pool's circuit breaker: eject after failures in a row, back off, forgive."""

from __future__ import annotations

import pytest

from service.engines.breaker import Breaker, BreakerPolicy


def test_ejections_double_up_to_the_max_and_are_forgiven_after_good_service() -> None:
    b = Breaker(BreakerPolicy(consecutive_failures=2, base_ejection_s=1.0, max_ejection_s=5.0))
    assert not b.on_failure(0.0)
    assert b.on_failure(0.0)  # second in a row
    durations = []
    now = 0.0
    for _ in range(5):
        durations.append(b.eject(now))
        assert not b.may_readmit(now + durations[-1] - 0.01)
        now += durations[-1]
        assert b.may_readmit(now)
        b.readmitted(now)
        assert b.failures == 0
        b.on_success(now + 0.1)  # too soon to forgive the ejections
    assert durations == [1.0, 2.0, 4.0, 5.0, 5.0]
    b.on_success(now + 5.0)  # served as long as the last ejection lasted
    assert b.ejections == 0
    assert b.eject(now + 6.0) == 1.0


def test_a_success_resets_the_failures_in_a_row() -> None:
    b = Breaker(BreakerPolicy(consecutive_failures=3))
    b.on_failure(0.0)
    b.on_failure(0.0)
    b.on_success(0.0)
    assert not b.on_failure(0.0)


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        BreakerPolicy(consecutive_failures=0)
    with pytest.raises(ValueError):
        BreakerPolicy(base_ejection_s=10.0, max_ejection_s=1.0)
