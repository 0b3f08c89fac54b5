"""`gate.stats()` is the same whichever dispatcher runs: one sequence of events
(admissions, refusals at arrival, output charges, a cancel while queued, a queue
timeout, finishes) fed to `Dispatcher` and to `SharedDispatcher` over a MemoryStore
and over a real Redis, then every per-tenant and global number compared."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable

import pytest

from scheduler.budget import AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.errors import QueueTimeout, QuotaExceeded, RequestTooLarge
from scheduler.gate import AdmissionGate
from scheduler.gate_stats import GateStats, TenantStats
from scheduler.request import QueuedRequest
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore
from scheduler.state.store import Store
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas, TenantRegistry
from scheduler.timers import ManualTimers
from tests.unit.scheduler.gates import Held, open_gate, until, until_quiet

# Slow refills (0.001 / s): Redis refills on its own clock, so its levels may run
# ahead of the fake clock's by a few thousandths over the test.
TENANTS = TenantRegistry(
    [
        TenantConfig(
            "a",
            quotas=TenantQuotas(
                requests_per_s=0.001,
                requests_burst=3,
                tokens_per_min=1.0,
                tokens_burst=1000,
                max_prompt_tokens=500,
            ),
        ),
        TenantConfig(
            "b",
            weight=2.0,
            over_quota="wait",
            quotas=TenantQuotas(tokens_per_min=1.0, tokens_burst=400, max_queued=1),
        ),
        TenantConfig("c"),
        TenantConfig("d", quotas=TenantQuotas(max_queue_wait_s=5.0)),
    ]
)
LIMITS = AdmissionLimits(max_requests=2, max_kv_tokens=10_000)


class Twins:
    """The same events on both gates, in lockstep."""

    def __init__(self, local: AdmissionGate, shared: AdmissionGate, clock: FakeClock) -> None:
        self.gates = (local, shared)
        self.clock = clock
        self.timers: tuple[ManualTimers, ManualTimers] | None = None
        self.held: dict[str, tuple[Held, Held]] = {}

    async def arrive(self, rid: str, tenant: str, prompt: int = 10, max_tokens: int = 20) -> None:
        pair = tuple(Held(g, QueuedRequest(rid, tenant, prompt, max_tokens)) for g in self.gates)
        self.held[rid] = (pair[0], pair[1])
        await self.settle()

    async def refused(self, rid: str, tenant: str, exc: type[Exception], prompt: int = 10) -> None:
        await self.arrive(rid, tenant, prompt)
        for h in self.held[rid]:
            (outcome,) = await asyncio.gather(h.task, return_exceptions=True)
            assert isinstance(outcome, exc), outcome
            assert h.state == "rejected"

    def charge(self, rid: str, tokens: int) -> None:
        for h in self.held[rid]:
            h.charge(tokens)

    async def leave(self, rid: str) -> None:
        for h in self.held[rid]:
            await h.leave()
        await self.settle()

    async def cancel(self, rid: str) -> None:
        for h in self.held[rid]:
            await h.cancel()
        await self.settle()

    async def settle(self) -> None:
        """Let the shared gate catch up with the local one (which decides at once)."""
        local, shared = self.gates
        await asyncio.sleep(0)  # the tasks just created run to their first wait
        await until(
            lambda: (
                (shared.stats().in_flight, shared.stats().queued)
                == (local.stats().in_flight, local.stats().queued)
            ),
            "the shared gate admits what the local one did",
        )
        await until_quiet(shared)
        await until(
            lambda: all(a.state == b.state for a, b in self.held.values()),
            "every request's task has seen its fate on both gates",
        )

    def states(self, rid: str) -> tuple[str, str]:
        a, b = self.held[rid]
        return a.state, b.state


def comparable(s: GateStats) -> GateStats:
    """Everything but the store's name ("memory" for one replica, "ok" when shared)."""
    return dataclasses.replace(s, store="memory")


def tenants_approx(stats: GateStats) -> dict[str, object]:
    out: dict[str, object] = {}
    for t in stats.tenants:
        fields = dataclasses.asdict(t)
        for bucket in ("request_bucket", "token_bucket"):
            if fields[bucket] is not None:
                fields[bucket]["level"] = pytest.approx(fields[bucket]["level"], abs=0.5)
        fields["rejections"] = dict(t.rejections)
        out[t.tenant_id] = fields
    return out


MakeStore = Callable[[FakeClock], Store]


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> MakeStore:
    if request.param == "memory":
        return lambda clock: MemoryStore(clock, lease_ttl_s=3600, backlog_ttl_s=3600)
    url = request.getfixturevalue("redis_url")
    return lambda clock: RedisStore.from_url(
        url, domain="gate-stats", lease_ttl_s=3600, backlog_ttl_s=3600
    )


@pytest.fixture
async def twins(make_store: MakeStore) -> AsyncIterator[Twins]:
    clock = FakeClock(1000.0)
    t_local, t_shared = ManualTimers(clock), ManualTimers(clock)
    async with (
        open_gate("local", TENANTS, LIMITS, clock, t_local) as local,
        open_gate("shared", TENANTS, LIMITS, clock, t_shared, make_store(clock)) as shared,
    ):
        tw = Twins(local, shared, clock)
        tw.timers = (t_local, t_shared)
        yield tw
        for pair in tw.held.values():
            for h in pair:
                await h.cancel()


async def test_stats_are_the_same_from_both_dispatchers(twins: Twins) -> None:
    tw = twins
    await tw.arrive("a1", "a")
    await tw.arrive("b1", "b")
    assert tw.states("a1") == tw.states("b1") == ("admitted", "admitted")
    await tw.refused("a-big", "a", RequestTooLarge, prompt=600)  # max_prompt_tokens
    await tw.arrive("c1", "c")  # the engine is full: queued from here on
    await tw.arrive("a2", "a")
    await tw.arrive("a3", "a")
    await tw.refused("a4", "a", QuotaExceeded)  # requests_per_s: a1..a3 took the burst
    await tw.arrive("b2", "b")
    await tw.refused("b3", "b", QuotaExceeded)  # max_queued
    tw.charge("a1", 5)
    tw.charge("b1", 7)
    await tw.cancel("a3")  # withdrawn while queued: its reservation comes back
    assert tw.states("a3") == ("cancelled", "cancelled")
    await tw.leave("a1")  # c (counter 0) goes before b (12) and a (20)
    assert tw.states("c1") == ("admitted", "admitted")
    tw.charge("b1", 3)
    await tw.leave("b1")  # b2 (15) before a2 (20)
    assert tw.states("b2") == ("admitted", "admitted")
    await tw.arrive("d1", "d")
    tw.clock.advance(5.0)  # d1's max_queue_wait_s
    assert tw.timers is not None
    for timers in tw.timers:
        timers.run_due()
    for h in tw.held["d1"]:
        (outcome,) = await asyncio.gather(h.task, return_exceptions=True)
        assert isinstance(outcome, QueueTimeout) and h.state == "expired"
    await tw.settle()

    local, shared = tw.gates
    await shared.refresh_stats()
    want, got = local.stats(), shared.stats()
    assert got.store == "ok" and want.store == "memory"
    assert comparable(dataclasses.replace(got, tenants=())) == comparable(
        dataclasses.replace(want, tenants=())
    )
    assert tenants_approx(got) == tenants_approx(want)

    # And the numbers are the ones the events imply, not just equal.
    assert (want.in_flight, want.queued, want.admitted_total, want.expired_total) == (2, 1, 4, 1)
    a = want.tenant("a")
    assert a == TenantStats(
        tenant_id="a",
        weight=1.0,
        virtual_counter=20.0,  # prompt 10 + 2 x 5 output tokens
        queued=1,
        in_flight=0,
        request_bucket=a.request_bucket if a else None,
        token_bucket=a.token_bucket if a else None,
        charged_requests=2.0,  # a1 and the queued a2 (a3's came back)
        charged_tokens=15.0 + 30.0,  # a1 kept 10 + 5, a2 holds 30
        rejected_total=2,
        rejections={"max_prompt_tokens": 1, "requests_per_s": 1},
        finished_total=2,  # a1, and a3 withdrawn
        paused=False,
    )
    assert a.request_bucket is not None and a.token_bucket is not None
    assert a.request_bucket.level == pytest.approx(1.0, abs=0.05)  # 3 - 3 + a3's refund
    assert a.token_bucket.level == pytest.approx(1000 - 45, abs=0.5)  # refills 1/60 per s
    b = want.tenant("b")
    assert b is not None and b.token_bucket is not None
    assert b.virtual_counter == pytest.approx((10 + 20 + 10) / 2)
    assert (b.in_flight, b.charged_tokens, b.finished_total, b.rejected_total) == (1, 50.0, 1, 1)
    assert b.token_bucket.level == pytest.approx(400 - 50, abs=0.5)
    d = want.tenant("d")
    assert d is not None and (d.finished_total, d.queued, d.virtual_counter) == (1, 0, 20.0)


async def test_an_idle_tenant_reads_full_buckets_from_both(twins: Twins) -> None:
    local, shared = twins.gates
    await shared.refresh_stats()
    got, want = shared.stats(include=["a"]), local.stats(include=["a"])
    assert tenants_approx(got) == tenants_approx(want)
    a = want.tenant("a")
    assert a is not None and a.token_bucket is not None and a.token_bucket.level == 1000
