"""Locality routing over SGLang stand-ins that have SGLang's prefix cache."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest
from fairgate import AsyncClient, Completion

from scheduler import rules
from scheduler.dispatcher import Dispatcher
from scheduler.local_admission import LocalAdmission
from scheduler.ordering.vtc import VtcPolicy
from scheduler.rules import LIGHT_QUEUE
from service.app import App
from service.engines.pool import WorkerPool
from service.engines.simulator.sim_server import SimServer
from tests.conftest import StartServer
from tests.helpers import eventually
from tests.sglang_helpers import StartSim, assert_no_sglang_leaks, sglang_settings


def _pool(app: object) -> WorkerPool:
    engine = getattr(app, "engine", None)
    assert isinstance(engine, WorkerPool)
    return engine


def _where(workers: list[SimServer], first_token: int) -> set[int]:
    """The workers that were sent a prompt starting with `first_token`."""
    return {
        i
        for i, w in enumerate(workers)
        for r in w.record.requests
        if r.get("input_ids", [None])[0] == first_token
    }


async def test_a_conversations_later_turns_land_where_its_history_is(
    start_server: StartServer, start_sim: StartSim
) -> None:
    """Six conversations of four turns at once over two workers: each turn
    re-sends the history, which only its own worker holds. Every later turn goes
    there (its cached tokens cover the whole previous turn), and both workers
    serve conversations."""
    workers = [await start_sim(time_scale=0.2, max_running_requests=16) for _ in range(2)]
    app = await start_server(**sglang_settings(*workers))
    pool = _pool(app)
    rng = random.Random(7)

    async def conversation(c: AsyncClient, k: int) -> list[tuple[int, int]]:
        # Its own first token, then 600 tokens of context.
        prompt = [1000 + k, *(rng.randrange(2000, 30000) for _ in range(600))]
        seen = []
        for _turn in range(4):
            done = await c.complete(prompt, max_tokens=20, ignore_eos=True, return_token_ids=True)
            seen.append((len(prompt), done.result.usage.cached_tokens))
            prompt = [*prompt, *done.token_ids, *(rng.randrange(2000, 30000) for _ in range(40))]
        return seen

    async with AsyncClient(app.address) as c:
        turns = await asyncio.gather(*(conversation(c, k) for k in range(6)))
    for k, seen in enumerate(turns):
        assert len(_where(workers, 1000 + k)) == 1, f"conversation {k} moved"
        for (before, _), (_, cached) in itertools.pairwise(seen):
            assert cached >= before, f"conversation {k}: {seen}"
    assert set().union(*(_where(workers, 1000 + k) for k in range(6))) == {0, 1}
    assert pool.placement.cached_tokens_total > 0
    await assert_no_sglang_leaks(app, *workers)


async def _prefill_on_0_decoding_on_1(
    pool: WorkerPool, workers: list[SimServer], c: AsyncClient, max_tokens: int
) -> list[asyncio.Task[Completion]]:
    """Worker 0 holds a 3 000-token prompt's first chunk back (as a long prefill
    would); worker 1 then takes two requests that decode `max_tokens` each."""
    workers[0].faults.first_chunk_delay_s = 30.0
    long = asyncio.create_task(c.complete([5] * 3000, max_tokens=10, ignore_eos=True))
    await eventually(lambda: pool.placement.pending_prefill[0] == 3000, what="long routed")
    workers[0].faults.first_chunk_delay_s = 0.0
    decoding = [
        asyncio.create_task(c.complete([9, i], max_tokens=max_tokens, ignore_eos=True))
        for i in range(2)
    ]
    await eventually(lambda: pool.placement.in_flight[1] == 2, what="decoders on worker 1")
    await eventually(lambda: pool.placement.pending_prefill[1] == 0, what="decoding")
    return [long, *decoding]


async def _cancel(tasks: list[asyncio.Task[Completion]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _all_ended(app: App, pool: WorkerPool, workers: list[SimServer]) -> None:
    await eventually(lambda: pool.in_flight == 0, what="all ended")
    assert pool.placement.pending_prefill == [0, 0]
    await assert_no_sglang_leaks(app, *workers)


async def test_a_short_request_avoids_the_worker_in_a_long_prefill(
    start_server: StartServer, start_sim: StartSim
) -> None:
    """Worker 0 holds a long prompt's first chunk back (as a long prefill would);
    worker 1 runs more requests, which are decoding. The light tenant's short
    request goes to worker 1, where it starts at once; by load alone it would
    wait behind the prefill on worker 0."""
    workers = [await start_sim(time_scale=1.0, max_running_requests=8) for _ in range(2)]
    app = await start_server(**sglang_settings(*workers))
    pool = _pool(app)
    async with AsyncClient(app.address) as c:
        busy = await _prefill_on_0_decoding_on_1(pool, workers, c, 400)
        short = await c.complete([7, 7, 7], max_tokens=2)
        assert short.result.finish_reason == "length"
        assert _where(workers, 7) == {1}
        await _cancel(busy)
    await _all_ended(app, pool, workers)


async def test_a_light_request_is_lent_a_full_workers_slot_rather_than_wait_behind_a_prefill(
    start_server: StartServer, start_sim: StartSim
) -> None:
    """Two workers of two slots that preempt above 10 (SGLang's default). Worker 0
    has a free slot but a 3 000-token prefill ahead; worker 1 is full, decoding.
    Admission has room (3 of 4 slots), so it lends nothing; the pool sends the
    light tenant's short request to worker 1 with the priority of a lent request,
    and that engine retracts a decoding request for it: it starts at the next
    step instead of behind the prefill or a slot."""
    workers = [
        await start_sim(enable_priority_scheduling=True, time_scale=1.0, max_running_requests=2)
        for _ in range(2)
    ]
    app = await start_server(**sglang_settings(*workers))
    pool = _pool(app)
    model = app.models.resolve("")
    assert model is not None and model.preempt_threshold == 10
    async with (
        AsyncClient(app.address, tenant="flood") as f,
        AsyncClient(app.address, tenant="light") as v,
    ):
        busy = await _prefill_on_0_decoding_on_1(pool, workers, f, 2000)
        short = await v.complete([7, 7, 7], max_tokens=2)
        assert short.result.finish_reason == "length"
        assert _where(workers, 7) == {1}
        assert workers[1].engine.core.preemptions == 1
        assert model.dispatcher.stats().lent_total == 0
        lent_p = rules.engine_priority(False, True, 10, lent=True, prompt_tokens=3)
        assert [b["priority"] for b in workers[1].record.requests][-1] == lent_p
        await _cancel(busy)
    await _all_ended(app, pool, workers)


async def test_a_worker_that_loses_its_cache_is_corrected_by_what_it_reports(
    start_server: StartServer, start_sim: StartSim
) -> None:
    """The index thinks worker 0 holds two prefixes; the worker flushes its cache
    (a restart would too) and then reports cached_tokens 0 for the newer one: the
    index forgets as much of what it believed, the older prefix first, and learns
    the newer one again from the request that re-computed it."""
    workers = [await start_sim(time_scale=0.0) for _ in range(2)]
    app = await start_server(**sglang_settings(*workers))
    pool = _pool(app)
    old, new = [3, *range(100, 900)], [4, *range(1100, 1900)]
    block = pool.placement.index.block
    async with AsyncClient(app.address) as c:
        await c.complete([*old, 1], max_tokens=2)
        await c.complete([*new, 1], max_tokens=2)
        assert pool.placement.index.match(0, pool.placement.index.chain(old)) >= len(old) - block
        again = await c.complete([*new, 2], max_tokens=2)
        assert again.result.usage.cached_tokens >= len(new) - block
        assert workers[0].engine.core.flush_cache()
        lost = await c.complete([*new, 3], max_tokens=2)
        assert lost.result.usage.cached_tokens == 0
        assert pool.placement.index.match(0, pool.placement.index.chain(old)) < len(old) // 2
        relearned = await c.complete([*new, 4], max_tokens=2)
        assert relearned.result.usage.cached_tokens >= len(new) - block
    await assert_no_sglang_leaks(app, *workers)


@pytest.mark.parametrize("allowance", [0.0, 4096.0])
async def test_admission_lets_a_cached_request_into_the_worker_that_holds_it(
    start_server: StartServer, start_sim: StartSim, allowance: float
) -> None:
    """Two workers of one slot each, both busy; tenant a's requests (first in fair
    order, nothing cached, more than a light tenant's) and tenant b's (its prefix
    on worker 0) wait. Worker 0
    frees first: b's request, within the allowance of a, goes in there and skips
    its prefill; a takes the next slot. With no allowance the fair order holds."""
    workers = [await start_sim(time_scale=1.0, max_running_requests=1) for _ in range(2)]
    # No light credit: b (one request queued) is not ordered ahead of a for it.
    app = await start_server(
        **sglang_settings(*workers, fair_allowance_tokens=allowance, fair_light_credit=0)
    )
    pool = _pool(app)
    model = app.models.resolve("")
    assert model is not None
    d = model.dispatcher
    assert isinstance(d, Dispatcher) and isinstance(d.state, LocalAdmission)
    prefix = [11, *range(3000, 3800)]
    clients = {t: AsyncClient(app.address, tenant=t) for t in "abxy"}

    def send(tenant: str, prompt: list[int], n: int) -> asyncio.Task[Completion]:
        return asyncio.create_task(clients[tenant].complete(prompt, max_tokens=n, ignore_eos=True))

    await send("b", [*prefix, 1], 2)
    short = send("x", [21, 22], 4000)  # worker 0 (a tie: the first)
    await eventually(lambda: pool.placement.in_flight[0] == 1, what="worker 0 busy")
    long = send("y", [31, 32], 4000)
    await eventually(lambda: pool.placement.in_flight[1] == 1, what="worker 1 busy")
    # a has more than LIGHT_QUEUE queued (heavy: locality may pass it).
    a = [send("a", [41, 42, i], 2) for i in range(LIGHT_QUEUE + 1)]
    await eventually(lambda: len(d.state.policy) == LIGHT_QUEUE + 1, what="a queued")
    b = send("b", [*prefix, 2], 2)
    await eventually(lambda: len(d.state.policy) == LIGHT_QUEUE + 2, what="b queued")
    short.cancel()  # worker 0 frees first
    await asyncio.gather(short, return_exceptions=True)
    done_a, done_b = await a[0], await b
    await asyncio.gather(*a)
    long.cancel()
    await asyncio.gather(long, return_exceptions=True)
    for client in clients.values():
        await client.close()
    order = [r["input_ids"][0] for r in workers[0].record.requests][2:]
    n = LIGHT_QUEUE + 1
    if allowance:
        assert order == [11] + [41] * n
        assert done_b.result.usage.cached_tokens >= len(prefix) - pool.placement.index.block
        assert d.state.locality_picks_total == 1
    else:
        assert order == [41] * n + [11]
        assert d.state.locality_picks_total == 0
    assert done_a.result.finish_reason == "length"
    await eventually(lambda: pool.in_flight == 0, what="all ended")
    await assert_no_sglang_leaks(app, *workers)


async def test_a_cache_hit_is_charged_at_the_cached_rate_and_a_miss_in_full(
    start_server: StartServer, start_sim: StartSim
) -> None:
    """The fair counter charges the prefix a worker holds at vtc_w_cached, to the
    token (the index sees 800 of its 801 tokens, in whole blocks: the estimate
    counts the partial block as held and the engine's report settles it); when
    the worker turns out not to have it (flushed, restarted, or it says so), the
    shortfall is charged at the first token: never less than the engine did."""
    workers = [await start_sim(time_scale=0.0) for _ in range(2)]
    app = await start_server(**sglang_settings(*workers, vtc_w_cached=0.1))
    model = app.models.resolve("")
    assert model is not None
    d = model.dispatcher
    assert isinstance(d, Dispatcher) and isinstance(d.state, LocalAdmission)
    policy = d.state.policy
    assert isinstance(policy, VtcPolicy)
    prefix = [5, *range(200, 1000)]  # 801 tokens: 800 in whole blocks
    async with AsyncClient(app.address, tenant="t") as c:

        async def charged(last: int) -> float:
            before = policy.counter("t")
            done = await c.complete([*prefix, last], max_tokens=1, ignore_eos=True)
            assert done.result.usage.completion_tokens == 1
            return policy.counter("t") - before - policy.w_out  # the prompt's part

        assert await charged(1) == 802  # cold: every prompt token
        assert await charged(2) == pytest.approx(1 + 0.1 * 801)
        for w in workers:
            assert w.engine.core.flush_cache()
        assert await charged(3) == pytest.approx(802)  # estimated 801 cached, had 0
    await assert_no_sglang_leaks(app, *workers)


@pytest.mark.parametrize("share", [True, False])
async def test_two_replicas_send_a_conversation_where_its_history_is(
    start_server: StartServer, start_sim: StartSim, redis_url: str, share: bool
) -> None:
    """Two fairgate replicas over Redis, two workers; six conversations at once
    whose turns alternate between the replicas. Each replica learns where the
    other routed (prefix_share.py), so every later turn finds its history
    cached. Without the share, a turn routed by the replica that has not seen
    its conversation lands by load alone, and some miss."""
    workers = [await start_sim(time_scale=0.2, max_running_requests=16) for _ in range(2)]
    apps = [
        await start_server(**sglang_settings(*workers, store="redis", redis_url=redis_url))
        for _ in range(2)
    ]
    pools = [_pool(app) for app in apps]
    if not share:
        for p in pools:
            p.placement.on_routed = None
    rng = random.Random(11)
    clients = [AsyncClient(app.address) for app in apps]

    async def conversation(k: int) -> list[tuple[int, int]]:
        prompt = [1000 + k, *(rng.randrange(2000, 30000) for _ in range(600))]
        seen = []
        for turn in range(4):
            done = await clients[(k + turn) % 2].complete(
                prompt, max_tokens=20, ignore_eos=True, return_token_ids=True
            )
            seen.append((len(prompt), done.result.usage.cached_tokens))
            prompt = [*prompt, *done.token_ids]
            if share:  # the other replica has heard of it (no timing assumed)
                index = pools[(k + turn + 1) % 2].placement.index
                keys = index.chain(prompt)
                full = len(keys) * index.block
                await eventually(
                    lambda ix=index, ks=keys, n=full: max(ix.match(i, ks) for i in (0, 1)) == n,
                    what="the route shared",
                )
            prompt += [rng.randrange(2000, 30000) for _ in range(40)]
        return seen

    try:
        turns = await asyncio.gather(*(conversation(k) for k in range(6)))
    finally:
        for c in clients:
            await c.close()
    misses = [
        (k, seen)
        for k, seen in enumerate(turns)
        for (before, _), (_, cached) in itertools.pairwise(seen)
        if cached < before
    ]
    if share:
        assert misses == []
    else:
        assert misses
    for app in apps:
        await assert_no_sglang_leaks(app, *workers)


async def test_a_replica_counts_the_long_prefill_the_other_sent(
    start_server: StartServer, start_sim: StartSim, redis_url: str
) -> None:
    """Two replicas over Redis in front of the same two workers: a long prompt
    replica A sends to a worker counts as that worker's prefill on replica B too
    (prefix_share.py carries it) until it ends (here: its caller leaves), so B's
    light requests and its staggered long prompts see the worker busy."""
    workers = [await start_sim(time_scale=0.0) for _ in range(2)]
    apps = [
        await start_server(
            **sglang_settings(
                *workers, store="redis", redis_url=redis_url, sglang_stagger_prefill_tokens=1024
            )
        )
        for _ in range(2)
    ]
    a, b = (_pool(app).placement for app in apps)
    for w in workers:
        w.faults.first_chunk_delay_s = 30.0
    async with AsyncClient(apps[0].address) as c:
        long = asyncio.create_task(c.complete([5] * 3000, max_tokens=4, ignore_eos=True))
        await eventually(lambda: sum(a.pending_prefill) == 3000, what="long routed on A")
        i = a.pending_prefill.index(3000)
        await eventually(lambda: b.prefill_pending(i) == 3000, what="B counts it")
        assert b.pending_prefill == [0, 0]  # B's own count is untouched
        await _cancel([long])
    await eventually(lambda: b.prefill_pending(i) == 0, what="B hears it is over")
    for app, p in zip(apps, (a, b), strict=True):
        await _all_ended(app, _pool(app), workers)
        assert p.remote_prefill == [{}, {}]


async def test_a_replica_weighs_the_requests_the_other_has_in_flight(
    start_server: StartServer, start_sim: StartSim, redis_url: str
) -> None:
    """Two replicas over Redis in front of the same two workers: the requests
    replica A has in flight on a worker weigh on replica B's routing there
    (prefix_share.py carries A's counts), and stop weighing once they end."""
    workers = [await start_sim(time_scale=0.0) for _ in range(2)]
    apps = [
        await start_server(**sglang_settings(*workers, store="redis", redis_url=redis_url))
        for _ in range(2)
    ]
    a, b = (_pool(app).placement for app in apps)
    for w in workers:
        w.faults.first_chunk_delay_s = 30.0
    async with AsyncClient(apps[0].address) as c:
        calls = [
            asyncio.create_task(c.complete([5, 6, 7], max_tokens=4, ignore_eos=True))
            for _ in range(3)
        ]
        await eventually(lambda: sum(a.in_flight) == 3, what="three in flight on A")
        for i in range(2):
            await eventually(
                lambda i=i: b.remote_load.of(i, b.clock())[0] == a.in_flight[i],
                what=f"B weighs A's requests on worker {i}",
            )
        assert b.in_flight == [0, 0]  # B's own counts are untouched
        busiest = max(range(2), key=lambda i: a.in_flight[i])
        assert b.load(busiest, b.clock()) > b.load(1 - busiest, b.clock())
        await _cancel(calls)
    for i in range(2):
        await eventually(
            lambda i=i: b.remote_load.of(i, b.clock()) == (0, 0), what="B hears they ended"
        )
    for app in apps:
        await _all_ended(app, _pool(app), workers)


async def test_a_replica_hears_the_light_tenant_the_other_placed(
    start_server: StartServer, start_sim: StartSim, redis_url: str
) -> None:
    """Staggered prefill on two replicas: a light tenant's short request replica A
    places makes the light tenant active on replica B too."""
    workers = [await start_sim(time_scale=0.0) for _ in range(2)]
    settings = sglang_settings(
        *workers, store="redis", redis_url=redis_url, sglang_stagger_prefill_tokens=1024
    )
    apps = [await start_server(**settings) for _ in range(2)]
    a, b = (_pool(app).placement for app in apps)
    assert not b.stagger.light_active(b.clock())
    async with AsyncClient(apps[0].address, tenant="chat") as c:
        await c.complete([5, 6, 7], max_tokens=2, ignore_eos=True)
    assert a.stagger.light_active(a.clock())
    await eventually(lambda: b.stagger.light_active(b.clock()), what="B hears the light tenant")
    for app in apps:
        await _all_ended(app, _pool(app), workers)
