"""One contract for every `Store`: the in-memory store and Redis (a real server)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable

import pytest
import redis as redis_lib

from scheduler import rules
from scheduler.budget import AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.quotas import BucketLimits
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore
from scheduler.state.store import (
    BucketReader,
    Candidate,
    Lease,
    Settlement,
    Step,
    StepOutcome,
    Store,
)
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas
from tests.unit.scheduler.store_time import STEP_S, StoreTime

LIMITS = AdmissionLimits(max_requests=2, max_kv_tokens=1000)
# Long enough that nothing expires while a test runs, unless it asks for less.
TTL = {"lease_ttl_s": 60.0, "backlog_ttl_s": 60.0}

MakeStore = Callable[..., Store]


@pytest.fixture(params=["memory", "redis"])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[MakeStore]:
    """A store of the kind under test; `ttls` override TTL. The memory store reads a
    FakeClock the test moves (store_time.py)."""
    made: list[Store] = []

    def make(**ttls: float) -> Store:
        if request.param == "memory":
            s: Store = MemoryStore(FakeClock(), **(TTL | ttls))
        else:
            url = request.getfixturevalue("redis_url")
            s = RedisStore.from_url(url, domain="contract", **(TTL | ttls))
        made.append(s)
        return s

    yield make
    for s in made:
        await s.aclose()


@pytest.fixture
def store(make_store: MakeStore) -> Store:
    return make_store()


def cand(lease: str, tenant: str, prompt: int = 10, kv: int = 100, **kw: object) -> Candidate:
    return Candidate(lease, tenant, float(kw.pop("weight", 1.0)), prompt, kv, **kw)  # type: ignore[arg-type]


async def admit(store: Store, *cands: Candidate, replica: str = "r1", **kw: object) -> list[int]:
    out = await store.step(replica, Step(LIMITS, candidates=list(cands), **kw))  # type: ignore[arg-type]
    return out.admitted


async def test_admits_the_smallest_counter_and_charges_its_prompt(store: Store) -> None:
    out = await store.step("r1", Step(LIMITS, charges={"a": 50.0, "b": 20.0}))
    assert out.admitted == []
    # Each has more queued than offered: one admission, then the step stops.
    step = Step(LIMITS, candidates=[cand("1", "a", queued=2), cand("2", "b", 30, queued=2)])
    out = await store.step("r1", step)
    assert out.admitted == [1]
    assert out.counters == {"a": 50.0, "b": pytest.approx(50.0)}  # 20 + 30 / 1
    # Weight 2 halves the charge; ties go to the earlier candidate.
    cands = [cand("3", "a", 10, weight=2.0, queued=2), cand("4", "b", queued=2)]
    out = await store.step("r1", Step(LIMITS, w_in=2.0, candidates=cands))
    assert out.admitted == [0]
    assert out.counters["a"] == pytest.approx(60.0)


async def test_one_step_admits_in_counter_order_until_the_engine_is_full(store: Store) -> None:
    limits = AdmissionLimits(max_requests=4, max_kv_tokens=1000)
    await store.step("r1", Step(limits, charges={"a": 10.0, "b": 25.0}))
    # a's next three and b's next two, as the pump offers them.
    cands = [cand(f"a{j}", "a", 10, queued=3 - j) for j in range(3)]
    cands += [cand(f"b{j}", "b", 10, queued=2 - j) for j in range(2)]
    out = await store.step("r1", Step(limits, candidates=cands))
    # a 10 -> 20 -> 30; b at 25 comes before a's third; then the room is full.
    assert out.admitted == [0, 1, 3, 2] and out.full
    assert out.counters == {"a": pytest.approx(40.0), "b": pytest.approx(35.0)}
    assert (await store.snapshot()).in_flight == 4


async def test_a_step_stops_where_a_tenants_next_request_was_not_offered(store: Store) -> None:
    # a has four queued and offers two: after both, its third might come before b.
    cands = [cand("a0", "a", queued=4), cand("a1", "a", queued=3), cand("b0", "b", 50)]
    await store.step("r1", Step(LIMITS, charges={"b": 15.0}))
    limits = AdmissionLimits(max_requests=8, max_kv_tokens=10_000)
    out = await store.step("r1", Step(limits, candidates=cands))
    assert out.admitted == [0, 1] and not out.full


async def test_fleet_room_requests_and_kv(store: Store) -> None:
    assert await admit(store, cand("1", "a", kv=900)) == [0]
    out = await store.step("r2", Step(LIMITS, candidates=[cand("2", "b", kv=200)]))
    assert out.admitted == [] and out.full  # 900 + 200 > 1000 KV tokens
    assert await admit(store, cand("3", "b", kv=100), replica="r2") == [0]
    out = await store.step("r3", Step(LIMITS, candidates=[cand("4", "c", kv=1)]))
    assert out.full and out.in_flight == 2  # max_requests
    # An idle engine takes any size.
    for lease, tenant in (("1", "a"), ("3", "b")):
        await store.step("r1", Step(LIMITS, settlements=[Settlement(lease, tenant)]))
    assert await admit(store, cand("5", "c", kv=5000)) == [0]


async def test_settlement_is_idempotent_and_frees_room(store: Store) -> None:
    assert await admit(store, cand("1", "a")) == [0]
    s = Settlement("1", "a")
    first = await store.step("r1", Step(LIMITS, settlements=[s]))
    again = await store.step("r2", Step(LIMITS, settlements=[s, s]))
    assert (first.settled, again.settled) == (1, 0)
    snap = await store.snapshot()
    assert snap.in_flight == 0 and snap.in_flight_kv_tokens == 0 and not snap.leases
    assert snap.concurrency == {}


async def test_a_retried_decision_does_not_admit_twice(store: Store) -> None:
    assert await admit(store, cand("1", "a")) == [0]
    assert await admit(store, cand("1", "a")) == [0]
    assert (await store.snapshot()).in_flight == 1


async def test_reserve_takes_buckets_and_settlement_refunds(store: Store) -> None:
    b = BucketLimits(requests_per_s=0.01, requests_burst=2, tokens_per_s=1.0, tokens_burst=100)
    assert await store.reserve("1", "a", 60, b) == ("", 0.0)
    limit, wait_s = await store.reserve("2", "a", 60, b)
    assert limit == "tokens_per_min" and 15 < wait_s <= 20  # 20 missing at 1 token/s
    assert await store.reserve("3", "a", 30, b) == ("", 0.0)
    limit, wait_s = await store.reserve("4", "a", 1, b)
    assert limit == "requests_per_s" and 99 < wait_s <= 100
    # A queued cancel refunds all it took; a finished request its unused tokens.
    await store.step("r1", Step(LIMITS, settlements=[Settlement("3", "a", 1.0, 30.0, b)]))
    assert await store.reserve("5", "a", 40, b) == ("", 0.0)
    limit, wait_s = await store.reserve("6", "a", 200, b)
    assert limit == "tokens_per_min" and math.isinf(wait_s)  # above the burst: never


async def test_bucket_levels_read_one_tenant_now(store: Store) -> None:
    """What the rate-limit headers read (BucketReader): both stores, the same levels."""
    assert isinstance(store, BucketReader)
    b = BucketLimits(requests_per_s=0.01, requests_burst=5, tokens_per_s=1.0, tokens_burst=100)
    assert await store.bucket_levels("a") == {}  # never written: full
    assert await store.reserve("1", "a", 60, b) == ("", 0.0)
    seen = await store.bucket_levels("a")
    assert seen["r"].level == pytest.approx(4.0) and seen["t"].level == pytest.approx(40.0)
    assert 0.0 <= seen["r"].age_s < 5.0
    assert await store.bucket_levels("b") == {}


async def test_wait_mode_candidates_are_blocked_until_their_buckets_allow(store: Store) -> None:
    b = BucketLimits(tokens_per_s=100.0, tokens_burst=100)
    slow = cand("1", "slow", kv=80, take_buckets=True, buckets=b)
    assert await admit(store, slow) == [0]
    out = await store.step(
        "r1", Step(LIMITS, candidates=[cand("2", "slow", kv=80, take_buckets=True, buckets=b)])
    )
    assert out.admitted == [] and not out.full
    wait_s = out.blocked[0]
    assert 0.4 < wait_s <= 0.61  # 60 missing at 100 tokens/s

    async def admitted() -> bool:
        return await admit(store, cand("2", "slow", kv=80, take_buckets=True, buckets=b)) == [0]

    t = StoreTime(store)
    waited_s = await t.until(admitted, "the bucket lets it in")
    if t.fake is not None:  # blocked until the instant it said, not after
        assert wait_s <= waited_s < wait_s + STEP_S


async def test_max_concurrent_is_fleet_wide(store: Store) -> None:
    assert await admit(store, cand("1", "a", max_concurrent=1), replica="r1") == [0]
    out = await store.step(
        "r2",
        Step(
            LIMITS,
            charges={"b": 100.0},
            candidates=[cand("2", "a", max_concurrent=1), cand("3", "b")],
        ),
    )
    assert out.blocked == {0: math.inf} and out.admitted == [1]


async def test_newly_backlogged_tenants_are_lifted_unless_backlogged_elsewhere(
    store: Store,
) -> None:
    await store.step("r1", Step(LIMITS, charges={"a": 100.0, "b": 40.0}, backlogged=["a", "b"]))
    out = await store.step("r1", Step(LIMITS, announce=["c"]))
    assert out.counters["c"] == pytest.approx(40.0)  # the smallest backlogged counter
    # "a" is already backlogged on r1: announcing it on r2 does not move it.
    await store.step("r1", Step(LIMITS, charges={"a": -90.0}))
    out = await store.step("r2", Step(LIMITS, announce=["a"]))
    assert out.counters["a"] == pytest.approx(10.0)
    snap = await store.snapshot()
    assert snap.backlog["a"] == {"r1", "r2"}
    await store.step("r1", Step(LIMITS, withdraw=["a", "b", "c"]))
    assert (await store.snapshot()).backlog == {"a": {"r2"}}


async def test_light_or_heavy_by_what_a_tenant_has_queued_across_the_fleet(store: Store) -> None:
    """A tenant with 3 queued here and 3 on another replica is heavy (6 > LIGHT_QUEUE):
    no light credit on either replica. Judged by its length here alone, it went
    `light_credit` ahead of a tenant with a smaller counter on every replica (the
    three-replica fairness test's weight-1 tenant, 10 % off its share)."""
    await store.step("r2", Step(LIMITS, announce=["spread"], queued={"spread": 3}))
    await store.step("r1", Step(LIMITS, announce=["spread", "other"]))
    await store.step("r1", Step(LIMITS, charges={"spread": 100.0, "other": 60.0}))
    offered = [cand("s", "spread", queued=3), cand("o", "other", queued=9)]
    out = await store.step("r1", Step(LIMITS, candidates=offered, light_credit=1000.0))
    assert out.admitted == [1] and out.light == []
    # With nothing queued on r2 it is light (3 in all): it goes first, and its
    # request is marked light (the engine priority's `light`).
    await store.step("r2", Step(LIMITS, withdraw=["spread"]))
    step = Step(LIMITS, candidates=[cand("s", "spread", queued=3)], light_credit=1000.0)
    out = await store.step("r1", step)
    assert out.admitted == [0] and out.light == [0]


async def test_nobody_backlogged_lifts_to_the_last_served_counter(store: Store) -> None:
    await store.step("r1", Step(LIMITS, charges={"a": 70.0}))
    assert await admit(store, cand("1", "a", prompt=5)) == [0]  # floor = 70
    out = await store.step("r1", Step(LIMITS, announce=["z"]))
    assert out.counters["z"] == pytest.approx(70.0)


async def test_forget_drops_a_tenant_idle_fleet_wide_and_keeps_a_busy_one(store: Store) -> None:
    await store.step("r1", Step(LIMITS, charges={"gone": 50.0, "busy": 5.0, "queued": 7.0}))
    assert await admit(store, cand("1", "busy")) == [0]  # in flight
    await store.step("r2", Step(LIMITS, announce=["queued"]))  # backlogged on another replica
    none = BucketLimits()
    forget = {"gone": none, "busy": none, "queued": none}
    await store.step("r1", Step(LIMITS, forget=forget))
    counters = (await store.snapshot()).counters
    assert "gone" not in counters and {"busy", "queued"} <= set(counters)
    # Forgotten, it returns as a newcomer does: lifted to the floor (VTC).
    await store.step("r1", Step(LIMITS, withdraw=[], backlogged=["queued"]))
    out = await store.step("r1", Step(LIMITS, announce=["gone"]))
    assert out.counters["gone"] == pytest.approx(counters["queued"])


async def test_forget_keeps_a_bucket_until_full_unless_it_is_written_again(
    store: Store,
) -> None:
    b = BucketLimits(tokens_per_s=250.0, tokens_burst=100)
    assert await store.reserve("1", "a", 100, b) == ("", 0.0)  # empty: full in 0.4 s
    assert await store.reserve("2", "b", 40, b) == ("", 0.0)  # 60 left: full in 0.16 s
    await store.step("r1", Step(LIMITS, settlements=[Settlement("1", "a"), Settlement("2", "b")]))
    await store.step("r1", Step(LIMITS, forget={"a": b, "b": b}))
    assert {"a", "b"} <= set((await store.snapshot()).bucket_levels)  # not full yet: kept
    assert await store.reserve("3", "b", 1, b) == ("", 0.0)  # b is back: written again

    async def a_gone() -> bool:
        return "a" not in (await store.snapshot()).bucket_levels

    t = StoreTime(store)
    waited_s = await t.until(a_gone, "a's bucket goes once full")
    if t.fake is not None:
        assert 0.4 <= waited_s < 0.4 + STEP_S
    # b has been full for a while (forgotten, it would have gone at 0.16 s), but it
    # is live again: kept (a full bucket reads as an absent one).
    assert "b" in (await store.snapshot()).bucket_levels


async def test_a_dead_replicas_leases_and_backlog_expire(make_store: MakeStore) -> None:
    ttl_s = 0.25
    store = make_store(lease_ttl_s=ttl_s, backlog_ttl_s=ttl_s)
    assert await admit(store, cand("1", "a"), replica="dead", announce=["a"]) == [0]
    assert await admit(store, cand("2", "b"), replica="alive") == [0]

    async def only_the_live_replicas_left() -> bool:
        # "alive" heartbeats (renews its lease) as often as the test looks.
        await store.step("alive", Step(LIMITS, renew=[Lease("2", "b", 100)]))
        snap = await store.snapshot()
        assert "2" in snap.leases
        return snap.leases == {"2"} and snap.in_flight == 1 and snap.backlog == {}

    t = StoreTime(store)
    waited_s = await t.until(only_the_live_replicas_left, "the dead replica's state expires")
    if t.fake is not None:  # gone at its TTL, not before
        assert ttl_s <= waited_s < ttl_s + STEP_S


async def test_renew_adopts_missing_leases_but_not_settled_ones(store: Store) -> None:
    await store.step("r1", Step(LIMITS, settlements=[Settlement("9", "a")]))
    out = await store.step("r1", Step(LIMITS, renew=[Lease("8", "a", 300), Lease("9", "a", 300)]))
    assert out.in_flight == 1
    snap = await store.snapshot()
    assert snap.leases == {"8"} and snap.in_flight_kv_tokens == 300
    assert snap.concurrency == {"a": 1}


async def test_tenant_config_is_published(store: Store) -> None:
    cfg = TenantConfig("t1", weight=2.0, quotas=TenantQuotas(tokens_per_min=600))
    await store.put_tenant(cfg)
    if isinstance(store, RedisStore):  # read back as an operator would
        raw = await store._r.hgetall(store._tenant_key("t1"))
        got = {k.decode(): v.decode() for k, v in raw.items()}
    else:
        assert isinstance(store, MemoryStore)
        got = store.tenants["t1"]
    assert got["weight"] == "2.0"
    assert got["quotas.tokens_per_min"] == "600"


# -- the fair-share reserve (the rule of reserve.py, fleet-wide) -------------------
ROOM = AdmissionLimits(max_requests=8, max_kv_tokens=100_000)


async def fill(
    store: Store, tenant: str, n: int, limits: AdmissionLimits = ROOM, **kw: object
) -> None:
    for k in range(n):
        step = Step(limits, reserve_fraction=0.125, candidates=[cand(f"{tenant}{k}", tenant, **kw)])
        assert (await store.step("r1", step)).admitted == [0]


async def offer(
    store: Store,
    *cands: Candidate,
    replica: str = "r1",
    limits: AdmissionLimits = ROOM,
    **kw: object,
) -> StepOutcome:
    step = Step(limits, reserve_fraction=0.125, candidates=list(cands), **kw)  # type: ignore[arg-type]
    return await store.step(replica, step)


async def test_reserve_holds_an_over_share_tenant_while_a_light_one_is_below_its_share(
    store: Store,
) -> None:
    await fill(store, "flood", 6)
    await store.step("r2", Step(ROOM, announce=["victim"]))  # backlogged on another replica
    assert (await offer(store, cand("f6", "flood"))).admitted == [0]  # 7th of 8: not the reserve
    # The 8th slot is the reserve, the flood is over its half (7 >= 8 / 2), but the
    # victim's queue length on r2 is unknown: heavy, no room is kept for it.
    out = await offer(store, cand("f7", "flood"))
    assert out.admitted == [0] and out.held == []
    await store.step("r1", Step(ROOM, settlements=[Settlement("f7", "flood")]))
    # r2 tells the store the victim has one request queued there: light, so r1's
    # flood is held out of the reserve although the victim is none of r1's candidates.
    await store.step("r2", Step(ROOM, queued={"victim": 1}))
    out = await offer(store, cand("f8", "flood"))
    assert out.admitted == [] and out.held == [0]
    # The victim's request is queued behind the held flood (its counter is larger,
    # and both have the light credit): the reserve kept for it goes to it, not idle
    # until the flood's counter passes its own (decision.handover).
    step = {"charges": {"victim": 100.0}, "replica": "r2"}
    out = await offer(store, cand("f8", "flood"), cand("v0", "victim", queued=1), **step)
    assert out.counters["victim"] > out.counters["flood"]
    assert out.admitted == [1] and out.held == [] and out.full  # and then the engine is full
    assert (await store.snapshot()).in_flight == 8


async def test_the_held_flood_keeps_the_reserve_from_a_heavy_tenant_behind_it(
    store: Store,
) -> None:
    # The reserve is handed over only to a light tenant: a heavy one behind the held
    # flood (more than LIGHT_QUEUE queued) keeps counter order and waits with it.
    await fill(store, "flood", 6)
    await store.step("r2", Step(ROOM, announce=["victim"]))
    await store.step("r2", Step(ROOM, queued={"victim": 1}))
    assert (await offer(store, cand("f6", "flood"))).admitted == [0]
    step = {"charges": {"heavy": 100.0}, "replica": "r2"}
    heavy = cand("h0", "heavy", queued=rules.LIGHT_QUEUE + 1)
    out = await offer(store, cand("f7", "flood"), heavy, **step)
    assert out.counters["heavy"] > out.counters["flood"]
    assert out.admitted == [] and out.held == [0]


KV_FULL = AdmissionLimits(max_requests=8, max_kv_tokens=1000)


async def test_a_head_that_does_not_fit_hands_the_room_to_a_light_request_that_does(
    store: Store,
) -> None:
    # A long prompt at the head of fair order on a KV-full engine, a chat request
    # behind it that fits (decision.handover, FULL): the chat request goes now,
    # the long one waits for its room as before.
    await fill(store, "code", 2, KV_FULL, kv=400)
    step = {"charges": {"light": 100.0}, "limits": KV_FULL}  # light's counter is larger
    docs, light = cand("d0", "docs", kv=300, queued=2), cand("l0", "light", kv=50, queued=1)
    out = await offer(store, docs, light, **step)
    assert out.counters["light"] > out.counters["docs"]
    assert out.admitted == [1] and out.full and out.held == []
    assert (await store.snapshot()).in_flight == 3


async def test_a_full_head_keeps_its_room_from_a_request_past_its_tenants_share(
    store: Store,
) -> None:
    # Only within its share: the light tenant already holds 300 of the 1000 KV tokens
    # (a third is its share among three), so 50 more would take it past it.
    await fill(store, "code", 2, KV_FULL, kv=300)
    await fill(store, "light", 1, KV_FULL, kv=300)
    step = {"charges": {"light": 100.0}, "limits": KV_FULL}
    docs, light = cand("d0", "docs", kv=200, queued=2), cand("l1", "light", kv=50, queued=1)
    out = await offer(store, docs, light, **step)
    assert out.admitted == [] and out.full


async def test_a_full_head_stops_the_round_without_the_reserve(store: Store) -> None:
    # The reserve off (0): the isolation levers are off, FULL stops the round.
    await fill(store, "code", 2, KV_FULL, kv=400)
    cands = [cand("d0", "docs", kv=300, queued=2), cand("l0", "light", kv=50, queued=1)]
    step = Step(KV_FULL, charges={"light": 100.0}, candidates=cands)
    out = await store.step("r1", step)
    assert out.admitted == [] and out.full


async def test_reserve_never_holds_a_tenant_alone(store: Store) -> None:
    await fill(store, "flood", 8)
    out = await offer(store, cand("f8", "flood"))
    assert out.full and out.held == []


async def test_reserve_counts_tenants_in_flight_elsewhere_as_active(store: Store) -> None:
    await fill(store, "flood", 6)
    assert (await offer(store, cand("v0", "victim"), replica="r2")).admitted == [0]  # in flight
    out = await offer(store, cand("f6", "flood"))
    assert out.admitted == [] and out.held == [0]
    # The victim's request ends: the flood is alone again and takes the reserve.
    await store.step("r2", Step(ROOM, settlements=[Settlement("v0", "victim")]))
    assert (await offer(store, cand("f6", "flood"))).admitted == [0]


async def test_reserve_shares_follow_weights_and_kv(store: Store) -> None:
    room = AdmissionLimits(max_requests=100, max_kv_tokens=1000)
    await fill(store, "big", 8, limits=room, weight=3.0)  # 800 KV
    # small: one request in flight on r2, nothing queued (light): 900 KV, the next
    # 100 is the reserve.
    assert (await offer(store, cand("s0", "small"), replica="r2", limits=room)).admitted == [0]
    # big's share is 3 / 4 of 1000 KV tokens: over it, held; small is below.
    out = await offer(store, cand("b9", "big", weight=3.0), limits=room)
    assert out.held == [0] and out.admitted == []
    # small's request ends (no activity window here): big is alone.
    await store.step("r2", Step(room, settlements=[Settlement("s0", "small")]))
    assert (await offer(store, cand("b9", "big", weight=3.0), limits=room)).admitted == [0]


async def test_reserve_never_holds_a_tenant_with_nothing_in_flight(store: Store) -> None:
    room = AdmissionLimits(max_requests=8, max_kv_tokens=1000)
    await fill(store, "a", 1, limits=room, kv=300)
    await store.step("r2", Step(room, announce=["b"]))
    # 600 KV tokens is above b's half of the engine, but b has nothing in flight.
    assert (await offer(store, cand("b0", "b", kv=600), limits=room)).admitted == [0]


async def test_reserve_fraction_zero_holds_nobody(store: Store) -> None:
    await fill(store, "flood", 7)
    await store.step("r2", Step(ROOM, announce=["victim"]))
    out = await store.step("r1", Step(ROOM, candidates=[cand("f7", "flood")]))
    assert out.admitted == [0] and out.held == []


# -- Redis only ----------------------------------------------------------------
async def test_redis_survives_script_flush(redis_url: str) -> None:
    store = RedisStore.from_url(redis_url, domain="noscript")
    assert await admit(store, cand("1", "a")) == [0]
    r = redis_lib.Redis.from_url(redis_url)
    r.script_flush()
    r.close()
    before, reloads = store.round_trips, store.noscript_reloads
    assert await admit(store, cand("2", "a")) == [0]
    assert store.noscript_reloads == reloads + 1 and store.round_trips == before + 2
    assert await admit(store, cand("3", "b"), replica="r2") == []  # full, back to EVALSHA
    assert store.round_trips == before + 3
    await store.aclose()


async def test_redis_reports_a_wiped_state(redis_url: str) -> None:
    store = RedisStore.from_url(redis_url, domain="wipe")
    assert (await store.step("r1", Step(LIMITS))).state_lost  # nothing there yet
    assert not (await store.step("r1", Step(LIMITS))).state_lost
    r = redis_lib.Redis.from_url(redis_url)
    r.flushall()
    r.close()
    assert (await store.step("r1", Step(LIMITS))).state_lost
    await store.aclose()


async def test_redis_down_is_store_unavailable() -> None:
    from scheduler.errors import StoreUnavailable
    from tests.redis_server import free_port

    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    with pytest.raises(StoreUnavailable):
        await store.step("r1", Step(LIMITS))
    with pytest.raises(StoreUnavailable):
        await store.ping()
    await store.aclose()
