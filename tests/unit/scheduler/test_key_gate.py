"""The per-key gate, on both key states: this process's and Redis (a real server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis as redis_lib

from scheduler.clock import FakeClock
from scheduler.errors import KeyPriorityNotAllowed, KeyQuotaExceeded, RequestTooLarge
from scheduler.key_gate import (
    EffectiveKeyLimits,
    KeyGate,
    KeyHold,
    KeyState,
    MemoryKeyState,
    effective_limits,
)
from scheduler.request import Priority, QueuedRequest
from scheduler.state.redis_key_state import RedisKeyState
from scheduler.tenancy.key_limits import KeyLimits
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas

TENANT = TenantConfig("t")
# Slow refills: nothing comes back while a test runs (Redis reads its own clock).
SLOW = TenantQuotas(requests_per_s=0.001, requests_burst=2.0, tokens_per_min=0.06, tokens_burst=100)
_n = 0


def req(
    prompt: int = 10, max_tokens: int = 20, priority: Priority = Priority.INTERACTIVE
) -> QueuedRequest:
    global _n
    _n += 1
    return QueuedRequest(f"r{_n}", "t", prompt, max_tokens, priority=priority)


def limits(
    quotas: TenantQuotas, priorities: frozenset[Priority] | None = None
) -> EffectiveKeyLimits:
    return effective_limits(KeyLimits(quotas, priorities), TENANT)


@pytest.fixture(params=["memory", "redis"])
async def state(request: pytest.FixtureRequest) -> AsyncIterator[KeyState]:
    if request.param == "memory":
        yield MemoryKeyState(FakeClock())
        return
    url = request.getfixturevalue("redis_url")
    s = RedisKeyState.from_url(url, prefix="kt", lease_ttl_s=60.0)
    yield s
    await s.aclose()


async def settled(gate: KeyGate, hold: KeyHold | None, started: bool, output: int) -> None:
    gate.settle(hold, started, output)
    if isinstance(gate.state, RedisKeyState):
        await gate.state.flush()


async def test_a_key_over_its_bucket_is_refused_with_the_real_delay(state: KeyState) -> None:
    gate = KeyGate(state)
    lim = limits(SLOW)
    first = await gate.open("k1", lim, req())
    second = await gate.open("k1", lim, req())
    assert first is not None and second is not None
    with pytest.raises(KeyQuotaExceeded) as refused:
        await gate.open("k1", lim, req())
    exc = refused.value
    assert exc.subject == "key:k1" and exc.limit == "requests_per_s"
    assert exc.metadata() == {"tenant": "t", "limit": "requests_per_s", "key_id": "k1"}
    # One request back at 0.001/s: about 1000 s (Redis's clock moved a little).
    assert exc.retry_after_s is not None and 990 < exc.retry_after_s <= 1000
    # Another key of the same tenant has its own buckets.
    assert await gate.open("k2", lim, req()) is not None


async def test_settlement_refunds_what_rules_refund_says(state: KeyState) -> None:
    gate = KeyGate(state)
    lim = limits(TenantQuotas(tokens_per_min=0.06, tokens_burst=100))
    # 30 + 30 tokens reserved, 40 left: a third of 30 does not fit.
    a = await gate.open("k", lim, req(10, 20))
    b = await gate.open("k", lim, req(10, 20))
    with pytest.raises(KeyQuotaExceeded) as refused:
        await gate.open("k", lim, req(20, 30))
    assert refused.value.limit == "tokens_per_min"
    # `a` streamed 5 of its 20: 15 come back; `b` never started: all 30 come back.
    await settled(gate, a, True, 5)
    await settled(gate, b, False, 0)
    _, tokens = await gate.buckets("k", lim)
    assert tokens is not None and tokens.level == pytest.approx(85, abs=0.1)
    await settled(gate, a, True, 5)  # a second settlement gives nothing more
    _, again = await gate.buckets("k", lim)
    assert again is not None and again.level == pytest.approx(85, abs=0.1)
    assert await gate.open("k", lim, req(20, 30)) is not None


async def test_max_concurrent_counts_open_requests_until_settled(state: KeyState) -> None:
    gate = KeyGate(state)
    lim = limits(TenantQuotas(max_concurrent=2))
    holds = [await gate.open("k", lim, req()) for _ in range(2)]
    with pytest.raises(KeyQuotaExceeded) as refused:
        await gate.open("k", lim, req())
    assert refused.value.limit == "max_concurrent"
    assert refused.value.retry_after_s is None  # it passes when one of them ends
    await settled(gate, holds[0], True, 3)
    assert await gate.open("k", lim, req()) is not None


async def test_priorities_and_the_burst_cap(state: KeyState) -> None:
    gate = KeyGate(state)
    batch_only = limits(SLOW, frozenset({Priority.BATCH}))
    with pytest.raises(KeyPriorityNotAllowed) as refused:
        await gate.open("k", batch_only, req())
    assert refused.value.metadata() == {"tenant": "t", "key_id": "k"}
    assert await gate.open("k", batch_only, req(priority=Priority.BATCH)) is not None
    with pytest.raises(RequestTooLarge) as too_large:
        await gate.open("k", batch_only, req(60, 50, Priority.BATCH))  # 110 > burst 100
    assert too_large.value.limit == "tokens_burst"
    # A refused request took nothing: the slow bucket still has its second request.
    assert await gate.open("k", batch_only, req(priority=Priority.BATCH)) is not None


async def test_a_key_without_limits_takes_nothing(state: KeyState) -> None:
    gate = KeyGate(state)
    assert await gate.open("k", limits(TenantQuotas()), req()) is None
    assert await gate.buckets("k", limits(TenantQuotas())) == (None, None)


def test_memory_state_forgets_a_key_once_full_and_idle() -> None:
    clock = FakeClock()
    state = MemoryKeyState(clock)
    gate = KeyGate(state)
    lim = limits(TenantQuotas(requests_per_s=1.0, requests_burst=1.0, max_concurrent=1))

    async def run() -> None:
        hold = await gate.open("k", lim, req())
        assert list(state.tracked()) == ["k"]
        gate.settle(hold, True, 0)
        assert list(state.tracked()) == ["k"]  # its bucket is not full yet
        clock.advance(1.0)
        await gate.buckets("k", lim)
        assert list(state.tracked()) == []

    asyncio.run(run())


async def test_redis_leases_live_while_renewed_and_end_with_their_replica(redis_url: str) -> None:
    """Nothing outlives its use: a full bucket's hash expires, an open request's lease
    lives while its replica renews it and runs out when that replica is gone."""
    state = RedisKeyState.from_url(redis_url, prefix="kx", lease_ttl_s=0.3)
    gate = KeyGate(state)
    lim = limits(TenantQuotas(requests_per_s=10.0, requests_burst=1.0, max_concurrent=1))
    r = redis_lib.Redis.from_url(redis_url)
    renewing = asyncio.create_task(state.run(0.05))
    try:
        assert await gate.open("k", lim, req()) is not None
        assert 0 < r.pttl("kx:{k:k}:b:k") <= 1100  # refills in 0.1 s, + 1 s of slack
        await asyncio.sleep(0.6)  # two leases long: still open, renewed
        with pytest.raises(KeyQuotaExceeded):
            await gate.open("k", lim, req())
        renewing.cancel()  # the replica dies with its request open
        await asyncio.sleep(0.4)
        assert await gate.open("k", lim, req()) is not None
    finally:
        renewing.cancel()
        r.close()
        await state.aclose()
