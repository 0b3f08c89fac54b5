"""One SGLang URL is a pool of one (issue #33): the live one-engine server runs
the placement the virtual fleet measures, so staging is cold-only and the
cold-start hold applies, while a failing lone worker keeps serving (never
ejected) and its errors reach the client as before."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from fairgate import AsyncClient, FairgateError

from service.app import App
from service.engines.pool import WorkerPool
from service.engines.simulator.sim_server import SimServer
from tests.conftest import StartServer
from tests.helpers import eventually
from tests.sglang_helpers import (
    StartSim,
    assert_no_sglang_leaks,
    sent_lengths,
    sglang_settings,
)


async def _pool_of_one(
    start_server: StartServer, worker: SimServer, **settings: Any
) -> tuple[App, WorkerPool]:
    app = await start_server(**sglang_settings(worker, **settings))
    assert isinstance(app.engine, WorkerPool) and len(app.engine.workers) == 1
    return app, app.engine


async def test_one_url_stages_only_the_prompts_cold_on_its_worker(
    start_server: StartServer, start_sim: StartSim
) -> None:
    worker = await start_sim(time_scale=0.0)
    app, _ = await _pool_of_one(
        start_server, worker, staged_prefill_min_tokens=1000, staged_prefill_stage_tokens=512
    )
    doc = [5, *range(200, 2199)]  # 2000 tokens
    async with AsyncClient(app.address, tenant="t") as c:
        first = await c.complete(doc, max_tokens=4, ignore_eos=True)
        # The document is held: 300 new tokens are short of the length to stage.
        second = await c.complete([*doc, *range(3000, 3300)], max_tokens=4, ignore_eos=True)
    assert first.result.usage.cached_tokens == 0  # its own stages: reported uncached
    assert sent_lengths(worker) == [(512, 0), (1024, 0), (1536, 0), (2000, 4), (2300, 4)]
    assert second.result.usage.cached_tokens >= 1536
    await assert_no_sglang_leaks(app, worker)


async def test_one_url_holds_a_cold_long_prompt_while_its_worker_is_mid_prefill(
    start_server: StartServer, start_sim: StartSim
) -> None:
    worker = await start_sim(time_scale=0.1, max_running_requests=8)
    app, pool = await _pool_of_one(
        start_server, worker, sglang_stagger_prefill_tokens=1024, sglang_cold_start_hold_s=30.0
    )
    async with AsyncClient(app.address) as c:
        light = await c.complete([7, 7, 7], max_tokens=2)  # the light tenant is active
        assert light.result.finish_reason == "length"
        worker.faults.first_chunk_delay_s = 30.0  # the long prefill's first chunk held back
        busy = asyncio.create_task(c.complete([5] * 3000, max_tokens=4, ignore_eos=True))
        await eventually(lambda: pool.placement.pending_prefill == [3000], what="mid-prefill")
        cold = asyncio.create_task(c.complete([6] * 3000, max_tokens=4, ignore_eos=True))
        await eventually(lambda: pool.placement.stagger.held == 1, what="held")
        await asyncio.sleep(0.2)
        assert 6 not in _first_ids(worker)  # still unsent
        worker.faults.first_chunk_delay_s = 0.0
        busy.cancel()  # the worker's prefill ends: the held prompt goes
        done = await cold
        assert done.result.finish_reason == "length"
        assert pool.placement.stagger.held_to_bound == 0
        await asyncio.gather(busy, return_exceptions=True)
    await eventually(lambda: pool.in_flight == 0, what="all ended")
    assert pool.placement.pending_prefill == [0]
    await assert_no_sglang_leaks(app, worker)


def _first_ids(worker: SimServer) -> list[int]:
    """The first prompt token of each /generate the worker received."""
    return [b["input_ids"][0] for b in worker.record.requests if b.get("input_ids")]


async def test_a_lone_worker_failing_is_never_ejected_and_its_errors_reach_the_client(
    start_server: StartServer, start_sim: StartSim
) -> None:
    worker = await start_sim(time_scale=0.0)
    app, pool = await _pool_of_one(
        start_server,
        worker,
        sglang_read_timeout_s=0.3,
        sglang_health_interval_s=0.05,
        sglang_eject_after_failures=1,
        sglang_ejection_base_s=300.0,  # an ejection would outlast the test
    )
    lone = pool.workers[0]
    capacity = pool.capacity()
    worker.faults.unhealthy = True
    await eventually(lambda: lone.last_error == "health check failed", what="a failed check")
    worker.faults.stall_after_chunks = 0  # silent before the first token
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete("never answers", max_tokens=5)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert len(worker.record.requests) == 2  # its own retry: nowhere to move it
        # Still in: the admission limits keep its capacity, and it serves at once.
        assert lone.healthy and pool.capacity() == capacity
        assert [kind for _, kind, _ in lone.history] == ["admitted"]
        worker.faults.unhealthy = False
        worker.faults.stall_after_chunks = None
        done = await c.complete("answers", max_tokens=5, ignore_eos=True)
    assert done.result.finish_reason == "length"
    await assert_no_sglang_leaks(app, worker)
