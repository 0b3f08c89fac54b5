"""Worker pools: several SGLang stand-ins behind one fairgate, workers failing."""

from __future__ import annotations

import asyncio

import pytest
from fairgate import AsyncClient

from service.engines.pool import WorkerPool
from tests.conftest import StartServer
from tests.helpers import eventually
from tests.sglang_helpers import StartSim, assert_no_sglang_leaks, sglang_settings


def _pool(app: object) -> WorkerPool:
    engine = getattr(app, "engine", None)
    assert isinstance(engine, WorkerPool)
    return engine


async def test_failover_when_one_of_three_workers_dies(
    start_server: StartServer, start_sim: StartSim
) -> None:
    workers = [await start_sim(time_scale=1.0, max_running_requests=8) for _ in range(3)]
    # Worker 0 holds its first chunks back: its requests have not started streaming.
    workers[0].faults.first_chunk_delay_s = 30.0
    app = await start_server(**sglang_settings(*workers, sglang_health_interval_s=0.1))
    pool = _pool(app)
    model = app.models.resolve("")
    assert model is not None
    assert model.dispatcher.budget.limits.max_requests == 24  # 3 workers x 8
    async with AsyncClient(app.address) as c:
        tasks = [
            asyncio.create_task(c.complete(f"prompt {i}", max_tokens=60, ignore_eos=True))
            for i in range(9)
        ]
        await eventually(lambda: pool.placement.in_flight == [3, 3, 3], what="spread")
        await eventually(lambda: workers[0].engine.stats.started == 3, what="worker 0 busy")
        await workers[0].kill()
        done = await asyncio.gather(*tasks)
    # No request that had not started streaming was lost: all moved and finished.
    assert [d.result.finish_reason for d in done] == ["length"] * 9
    assert all(d.result.usage.completion_tokens == 60 for d in done)
    assert pool.moved_requests == 3
    assert [w.healthy for w in pool.workers] == [False, True, True]
    # Capacity (and the gateway's admission limits) follow the healthy workers.
    assert pool.capacity().max_running_requests == 16
    await eventually(lambda: model.dispatcher.budget.limits.max_requests == 16, what="limits")
    await assert_no_sglang_leaks(app, workers[1], workers[2])
    assert pool.in_flight == 0


async def test_unhealthy_worker_is_ejected_then_readmitted(
    start_server: StartServer, start_sim: StartSim
) -> None:
    workers = [await start_sim(max_running_requests=4) for _ in range(2)]
    app = await start_server(
        **sglang_settings(*workers, sglang_health_interval_s=0.05, sglang_ejection_base_s=0.2)
    )
    pool = _pool(app)
    model = app.models.resolve("")
    assert model is not None
    workers[1].faults.unhealthy = True
    await eventually(lambda: not pool.workers[1].healthy, what="ejection")
    await eventually(lambda: model.dispatcher.budget.limits.max_requests == 4, what="shrink")
    async with AsyncClient(app.address) as c:
        done = await asyncio.gather(*(c.complete(f"p{i}", max_tokens=5) for i in range(6)))
    assert all(d.result.finish_reason == "length" for d in done)
    assert workers[1].engine.stats.started == 0  # nothing routed to the ejected worker
    workers[1].faults.unhealthy = False
    await eventually(lambda: pool.workers[1].healthy, what="re-admission")
    await eventually(lambda: model.dispatcher.budget.limits.max_requests == 8, what="grow")
    await assert_no_sglang_leaks(app, *workers)


async def test_least_loaded_routing_and_prefix_affinity(
    start_server: StartServer, start_sim: StartSim
) -> None:
    workers = [await start_sim(time_scale=1.0) for _ in range(2)]
    app = await start_server(
        **sglang_settings(*workers, sglang_routing="least_full", sglang_prefix_affinity_tokens=4)
    )
    pool = _pool(app)
    async with AsyncClient(app.address) as c:
        # The same long prefix goes to the same worker while loads are close.
        prompt = "shared system prompt words here then a question"
        for i in range(4):
            await c.complete(f"{prompt} {i}", max_tokens=2)
        counts = [w.engine.stats.started for w in workers]
        assert sorted(counts) == [0, 4]
        # Short prompts (below the affinity length) spread by load.
        tasks = [asyncio.create_task(c.complete("hi", max_tokens=40)) for _ in range(6)]
        await eventually(lambda: pool.in_flight == 6, what="all running")
        assert pool.placement.in_flight == [3, 3]
        await asyncio.gather(*tasks)
    load = await pool.load()
    assert load.running_requests == 0
    await assert_no_sglang_leaks(app, *workers)


async def test_routing_counts_kv_so_a_large_request_goes_where_it_fits(
    start_server: StartServer, start_sim: StartSim
) -> None:
    """Two workers of 4 000 KV tokens and 8 slots. A 3 000-token request fills the
    first's KV to 3/4, so three small ones go to the second; a 2 000-token request
    then fits only the second. Counting requests alone would send the smalls
    round the two and the large one to the first (fewer requests), where the
    engine could not hold it."""
    workers = [
        await start_sim(time_scale=1.0, kv_capacity_tokens=4000, max_running_requests=8)
        for _ in range(2)
    ]
    # Prompts of one repeated token share prefixes: without locality, every
    # request counts its whole prompt (locality counts a held prefix once).
    app = await start_server(**sglang_settings(*workers, sglang_routing="least_full"))
    pool = _pool(app)
    async with AsyncClient(app.address) as c:

        def send(prompt: int, output: int) -> asyncio.Task[object]:
            return asyncio.create_task(c.complete([7] * prompt, max_tokens=output, ignore_eos=True))

        tasks = [send(2500, 500)]
        await eventually(lambda: pool.in_flight == 1, what="the large one routed")
        for k in range(3):
            tasks.append(send(50, 50))
            await eventually(lambda k=k: pool.in_flight == 2 + k, what="a small one routed")
        assert pool.placement.kv_in_flight == [3000, 300]
        assert pool.placement.in_flight == [1, 3]
        tasks.append(send(1500, 500))
        await eventually(lambda: pool.in_flight == 5, what="the 2 000-token one routed")
        assert pool.placement.kv_in_flight == [3000, 2300]
        # Both engines run everything they were sent; nothing waits for KV there.
        await eventually(
            lambda: [len(s.engine.core.running) for s in workers] == [1, 4], what="all running"
        )
        assert [len(s.engine.core.waiting) for s in workers] == [0, 0]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await eventually(lambda: pool.in_flight == 0, what="all ended")
    assert pool.placement.kv_in_flight == [0, 0]
    await assert_no_sglang_leaks(app, *workers)


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_pool_admits_every_workers_slots_without_queueing(
    start_server: StartServer, start_sim: StartSim, store: str, request: pytest.FixtureRequest
) -> None:
    """Two workers of 6 slots: 12 streams all run at once (the gateway's limit is the
    pool's, not one worker's); the 13th waits in the gateway, not on a worker."""
    workers = [await start_sim(time_scale=1.0, max_running_requests=6) for _ in range(2)]
    shared: dict[str, str] = {}
    if store == "redis":
        shared = {"store": "redis", "redis_url": request.getfixturevalue("redis_url")}
    app = await start_server(**sglang_settings(*workers, **shared))
    pool = _pool(app)
    model = app.models.resolve("")
    assert model is not None
    d = model.dispatcher
    assert d.budget.limits.max_requests == 12
    async with AsyncClient(app.address) as c:
        tasks = [
            asyncio.create_task(c.complete(f"p{i}", max_tokens=2000, ignore_eos=True))
            for i in range(12)
        ]
        await eventually(lambda: d.stats().in_flight == 12, what="12 admitted")
        stats = d.stats()
        assert (stats.queued, stats.in_flight, stats.admitted_total) == (0, 12, 12)
        # Each worker runs its 6 (after their prefill); none waits for a slot there.
        await eventually(
            lambda: [len(s.engine.core.running) for s in workers] == [6, 6], what="6 per worker"
        )
        assert pool.placement.in_flight == [6, 6]
        load = await pool.load()
        assert (load.running_requests, load.waiting_requests) == (12, 0)
        extra = asyncio.create_task(c.complete("p12", max_tokens=2, ignore_eos=True))
        await eventually(lambda: d.stats().queued == 1, what="the 13th queued in the gateway")
        assert d.stats().in_flight == 12
        assert sum(s.engine.stats.started for s in workers) == 12
        for t in [*tasks, extra]:
            t.cancel()
        await asyncio.gather(*tasks, extra, return_exceptions=True)
    await assert_no_sglang_leaks(app, *workers)


@pytest.mark.parametrize(
    ("thresholds", "expected"), [((10, 10), 10), ((10, 3), 10), ((10, None), None)]
)
async def test_a_pool_preempts_by_priority_only_if_every_worker_does(
    start_server: StartServer,
    start_sim: StartSim,
    thresholds: tuple[int | None, int | None],
    expected: int | None,
) -> None:
    # A lent request's priority must clear the largest threshold; one worker that
    # cannot preempt makes the pool keep the reserve (fair_isolation=auto).
    workers = [
        await start_sim(enable_priority_scheduling=True, priority_preemption_threshold=t)
        for t in thresholds
    ]
    app = await start_server(**sglang_settings(*workers))
    model = app.models.resolve("")
    assert model is not None
    assert _pool(app).capacity().preempt_threshold == expected == model.preempt_threshold
