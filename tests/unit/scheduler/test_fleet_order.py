"""Fleet order across replicas (`rules.behind`), on both stores.

Each replica offers its own tenants only. A candidate more than the allowance
behind a tenant backlogged (and eligible) on another replica is not admitted:
the round stops with `turn`, and that replica's step admits its tenant. A
tenant held by its own limits elsewhere (a negative queue length) does not
stop anyone; neither does a tenant backlogged on the stepping replica itself.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest

from scheduler.budget import AdmissionLimits
from scheduler.clock import MonotonicClock
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore
from scheduler.state.store import Candidate, Step, Store

LIMITS = AdmissionLimits(max_requests=4, max_kv_tokens=10_000)


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore(MonotonicClock())
        return
    s = RedisStore.from_url(request.getfixturevalue("redis_url"), domain="fleet-order")
    yield s
    await s.aclose()


def step(allowance: float, **kw: object) -> Step:
    return Step(LIMITS, allowance=allowance, **kw)  # type: ignore[arg-type]


def offer(lease: str, tenant: str) -> Candidate:
    # Two queued: a tenant's last offered one admitted ends the step (its next may
    # come first), so each step below admits at most one.
    return Candidate(lease, tenant, 1.0, prompt_tokens=1000, kv_tokens=1100, queued=2)


async def backlog(store: Store, replica: str, tenant: str, counter: float, queued: int) -> None:
    await store.step(replica, step(math.inf, charges={tenant: counter}))
    await store.step(replica, step(math.inf, announce=[tenant], queued={tenant: queued}))


async def test_a_candidate_far_behind_another_replicas_tenant_waits_its_turn(store: Store) -> None:
    await backlog(store, "r1", "conv", 0.0, 3)
    await store.step("r2", step(math.inf, charges={"rag": 50_000.0}))
    # rag (on r2) is 50 k weighted tokens ahead of conv (backlogged on r1).
    out = await store.step("r2", step(4096.0, announce=["rag"], candidates=[offer("x", "rag")]))
    assert (out.admitted, out.turn, out.full) == ([], True, False)
    # Without the fleet order (inf), r2 would have admitted it: what lost fairness.
    out = await store.step("r2", step(math.inf, candidates=[offer("x", "rag")]))
    assert (out.admitted, out.turn) == ([0], False)


async def test_within_the_allowance_it_is_admitted(store: Store) -> None:
    await backlog(store, "r1", "conv", 0.0, 3)
    await store.step("r2", step(math.inf, charges={"rag": 3_000.0}))
    out = await store.step("r2", step(4096.0, announce=["rag"], candidates=[offer("x", "rag")]))
    assert (out.admitted, out.turn) == ([0], False)
    # Its admission charged 1 000 more: now 4 000 ahead, still within; the next is not.
    out = await store.step("r2", step(4096.0, candidates=[offer("y", "rag")]))
    assert (out.admitted, out.turn) == ([0], False)
    out = await store.step("r2", step(4096.0, candidates=[offer("z", "rag")]))
    assert (out.admitted, out.turn) == ([], True)


async def test_the_other_replica_admits_its_tenant_meanwhile(store: Store) -> None:
    await backlog(store, "r1", "conv", 0.0, 3)
    await store.step("r2", step(math.inf, charges={"rag": 50_000.0}))
    await store.step("r2", step(4096.0, announce=["rag"], queued={"rag": 3}))
    out = await store.step("r1", step(4096.0, candidates=[offer("c", "conv")]))
    assert (out.admitted, out.turn) == ([0], False)


async def test_held_or_local_tenants_do_not_stop_the_round(store: Store) -> None:
    # Held by its own limits on r1 (negative length): no turn to wait for.
    await backlog(store, "r1", "conv", 0.0, -3)
    await store.step("r2", step(math.inf, charges={"rag": 50_000.0}))
    out = await store.step("r2", step(4096.0, announce=["rag"], candidates=[offer("x", "rag")]))
    assert (out.admitted, out.turn) == ([0], False)
    # Backlogged on the stepping replica itself: that replica offers its own first.
    await backlog(store, "r2", "chat", 0.0, 3)
    out = await store.step("r2", step(4096.0, candidates=[offer("y", "rag")]))
    assert (out.admitted, out.turn) == ([0], False)
