from __future__ import annotations

import math

import pytest

from scheduler.clock import FakeClock
from scheduler.quotas import BucketLimits
from scheduler.rules import bucket_added, bucket_level, refill_s
from scheduler.state.memory_buckets import StoredBuckets
from scheduler.token_bucket import TokenBucket


def test_starts_full_and_takes_until_empty() -> None:
    clock = FakeClock()
    b = TokenBucket(rate_per_s=2.0, burst=3.0, clock=clock)
    assert [b.try_take(1) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.try_take(1) == pytest.approx(0.5)
    assert b.level() == pytest.approx(0.0)


def test_wait_is_exact_and_waiting_it_passes() -> None:
    clock = FakeClock()
    b = TokenBucket(rate_per_s=3.0, burst=10.0, clock=clock, level=0.1)
    wait_s = b.try_take(7.3)
    assert wait_s == pytest.approx((7.3 - 0.1) / 3.0)
    assert b.level() == pytest.approx(0.1)  # a failed try takes nothing
    clock.advance(wait_s * 0.999)
    assert b.try_take(7.3) > 0
    clock.set(wait_s)
    assert b.try_take(7.3) == 0.0


def test_more_than_burst_never_passes() -> None:
    b = TokenBucket(rate_per_s=1.0, burst=5.0, clock=FakeClock())
    assert b.try_take(6) == math.inf
    assert b.level() == 5.0


def test_take_goes_into_debt_and_debt_delays_next() -> None:
    clock = FakeClock()
    b = TokenBucket(rate_per_s=10.0, burst=10.0, clock=clock)
    b.take(25)
    assert b.level() == pytest.approx(-15.0)
    assert b.try_take(1) == pytest.approx(1.6)
    clock.advance(1.6)
    assert b.try_take(1) == 0.0


def test_refill_caps_at_burst_and_refund_too() -> None:
    clock = FakeClock()
    b = TokenBucket(rate_per_s=100.0, burst=10.0, clock=clock)
    b.take(4)
    clock.advance(100)
    assert b.level() == 10.0
    b.refund(50)
    assert b.level() == 10.0
    b.take(8)
    b.refund(3)
    assert b.level() == pytest.approx(5.0)


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (1, 0), (math.inf, 1)])
def test_rejects_bad_parameters(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        TokenBucket(rate, burst, FakeClock())


def test_reconfigure_keeps_level() -> None:
    clock = FakeClock()
    b = TokenBucket(rate_per_s=1.0, burst=10.0, clock=clock)
    b.take(7)
    b.reconfigure(rate_per_s=2.0, burst=2.0)
    assert b.level() == pytest.approx(2.0)
    b.take(4)
    assert b.try_take(1) == pytest.approx(1.5)


def test_a_read_writes_nothing_and_levels_round_as_the_store_does() -> None:
    clock = FakeClock()
    b = TokenBucket(rate_per_s=0.1, burst=10.0, clock=clock)
    b.take(10)
    for _ in range(7):  # reads in between: each computes from the last add
        clock.advance(0.3)
        b.level()
        b.wait_s(5)
    b.take(0.5)
    # The store's buckets (MemoryStore, Lua): the level at the add, from the last add only.
    stored = bucket_added(bucket_level(0.0, 0.0, clock.now_s(), 0.1, 10.0), -0.5, 10.0)
    assert b.level() == stored
    clock.advance(1000)
    assert b.level() == 10.0


def test_full_is_judged_as_the_stores_judge_it() -> None:
    # When a bucket may be forgotten (rules.refill_s): the ledger, the key gate
    # and the rate-limit baseline ask `full`, the stores the same wait for a
    # whole burst, so a level within the wait's slack of the burst is full in both.
    clock = FakeClock()
    b = TokenBucket(rate_per_s=1.0, burst=1000.0, clock=clock, level=1000.0 - 1e-9)
    assert b.full
    stored = StoredBuckets()
    stored.seed({("t", "t"): b.level()}, clock.now_s())
    stored.forget("t", BucketLimits(tokens_per_s=1.0, tokens_burst=1000.0), clock.now_s())
    assert not stored.levels  # full: gone now
    b.take(1.0)
    assert not b.full
    assert refill_s(b.level(), b.rate_per_s, b.burst) == pytest.approx(1.0)
    clock.advance(1.0)
    assert b.full
