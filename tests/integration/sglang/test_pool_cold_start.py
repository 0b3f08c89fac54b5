"""The pool's cold-start hold (issue #33, lever 4) over HTTP, against two SGLang
stand-ins: with both workers mid-prefill (their first chunks held back, as a
long prefill would) and a light tenant active, a cold long prompt is not sent
until a worker's prefill ends, or until the bound."""

from __future__ import annotations

import asyncio

from fairgate import AsyncClient, Completion

from service.app import App
from service.engines.pool import WorkerPool
from service.engines.simulator.sim_server import SimServer
from service.telemetry.telemetry import Telemetry
from tests.conftest import StartServer
from tests.helpers import eventually
from tests.sglang_helpers import StartSim, assert_no_sglang_leaks, sglang_settings
from tests.telemetry_helpers import Captured


def _sent(workers: list[SimServer], first_token: int) -> bool:
    return any(
        r.get("input_ids", [None])[0] == first_token for w in workers for r in w.record.requests
    )


def _release_first_chunks(workers: list[SimServer]) -> None:
    """Chunks from now on go out at once (those held back stay held)."""
    for w in workers:
        w.faults.first_chunk_delay_s = 0.0


async def _both_mid_prefill(
    pool: WorkerPool, workers: list[SimServer], c: AsyncClient
) -> list[asyncio.Task[Completion]]:
    """The light tenant seen; worker 0 in a 3 000-token prefill, worker 1 in two of
    600 (each too short to be kept off it, together past the threshold): their
    first chunks are held back until they are cancelled."""
    light = await c.complete([7, 7, 7], max_tokens=2)
    assert light.result.finish_reason == "length"
    for w in workers:
        w.faults.first_chunk_delay_s = 30.0
    busy = [asyncio.create_task(c.complete([5] * 3000, max_tokens=4, ignore_eos=True))]
    await eventually(lambda: pool.placement.pending_prefill == [3000, 0], what="long on 0")
    for i in range(2):
        busy.append(asyncio.create_task(c.complete([8 + i] * 600, max_tokens=4, ignore_eos=True)))
    await eventually(lambda: pool.placement.pending_prefill == [3000, 1200], what="mid-prefill")
    await asyncio.sleep(0.2)  # their prefills are done: their first chunks are held back
    return busy


async def _pool_of_two(
    start_server: StartServer,
    start_sim: StartSim,
    hold_s: float,
    telemetry: Telemetry | None = None,
) -> tuple[App, WorkerPool, list[SimServer]]:
    workers = [await start_sim(time_scale=0.1, max_running_requests=8) for _ in range(2)]
    settings = sglang_settings(
        *workers, sglang_stagger_prefill_tokens=1024, sglang_cold_start_hold_s=hold_s
    )
    app = await start_server(**settings, telemetry=telemetry)
    assert isinstance(app.engine, WorkerPool)
    return app, app.engine, workers


async def _held(pool: WorkerPool, c: AsyncClient) -> asyncio.Task[Completion]:
    """A cold 3 000-token prompt, once the pool holds it."""
    cold = asyncio.create_task(c.complete([6] * 3000, max_tokens=4, ignore_eos=True))
    await eventually(lambda: pool.placement.stagger.held == 1, what="held")
    return cold


async def _end(
    app: App, pool: WorkerPool, workers: list[SimServer], busy: list[asyncio.Task[Completion]]
) -> None:
    for t in busy:
        t.cancel()
    await asyncio.gather(*busy, return_exceptions=True)
    await eventually(lambda: pool.in_flight == 0, what="all ended")
    assert pool.placement.pending_prefill == [0, 0]
    assert pool.unsent() == 0
    await assert_no_sglang_leaks(app, *workers)


async def test_a_cold_long_prompt_waits_until_a_workers_prefill_ends(
    start_server: StartServer, start_sim: StartSim, captured: Captured
) -> None:
    app, pool, workers = await _pool_of_two(start_server, start_sim, 30.0, captured.telemetry)
    async with AsyncClient(app.address) as c:
        busy = await _both_mid_prefill(pool, workers, c)
        cold = await _held(pool, c)
        await asyncio.sleep(0.2)
        assert not _sent(workers, 6)  # still held: both workers mid-prefill
        assert pool.unsent() == 1  # admitted, no worker has it (a light tenant may have its slot)
        assert captured.value("fairgate.engine.in_flight", {"fairgate.kind": "unsent"}) == 1
        _release_first_chunks(workers)
        for t in busy[1:]:  # worker 1's prefills end (they leave)
            t.cancel()
        done = await cold
        assert done.result.finish_reason == "length"
        assert pool.placement.stagger.held_to_bound == 0
        await _end(app, pool, workers, busy)


async def test_the_bound_sends_a_held_prompt_while_the_workers_stay_busy(
    start_server: StartServer, start_sim: StartSim
) -> None:
    app, pool, workers = await _pool_of_two(start_server, start_sim, 1.0)
    async with AsyncClient(app.address) as c:
        busy = await _both_mid_prefill(pool, workers, c)
        cold = await _held(pool, c)
        _release_first_chunks(workers)
        done = await cold
        assert done.result.finish_reason == "length"
        assert pool.placement.stagger.held_to_bound == 1
        assert pool.placement.pending_prefill == [3000, 1200]  # the others still mid-prefill
        await _end(app, pool, workers, busy)
