"""Worker faults with real `fairgate sim-server` processes (issue #14, item 9):
a worker that answers /health but garbles or stalls its streams is ejected,
comes back only after an ejection that doubles each time (no flapping), and
least-load routing does not favour it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from fairgate import AsyncClient, FairgateError

from service.engines.breaker import BreakerPolicy
from service.engines.pool import FAILURE_LOAD, Worker, WorkerPool
from service.engines.protocol import EngineCapacity, EngineRequest, SamplingOptions
from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine
from tests.conftest import StartServer
from tests.helpers import eventually

SimProcess = Callable[..., Awaitable[str]]


@pytest.fixture
async def sim_process() -> AsyncIterator[SimProcess]:
    """`fairgate sim-server` child processes; each exits when its stdin closes."""
    procs: list[asyncio.subprocess.Process] = []

    async def _start(*flags: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fairgate.cli.main", "sim-server", "--port", "0",
            "--time-scale", "0", *flags,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("sim-server on http://"), line
        return line.split(" on ", 1)[1].strip()

    yield _start
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.terminate()
    for p in procs:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(p.wait(), 10)


def _pool(app: object) -> WorkerPool:
    engine = getattr(app, "engine", None)
    assert isinstance(engine, WorkerPool)
    return engine


async def _outcome(c: AsyncClient, i: int) -> bool:
    """True if the request completed normally."""
    try:
        done = await c.complete(f"prompt {i}", max_tokens=16, ignore_eos=True, timeout_s=20)
    except FairgateError:
        return False
    return done.result.finish_reason == "length"


async def test_a_worker_that_garbles_its_streams_is_ejected(
    start_server: StartServer, sim_process: SimProcess
) -> None:
    good = await sim_process()
    # Every stream garbled from its first event: a short reply that fits in the
    # first chunks would otherwise succeed there now and then (the stand-in merges
    # tokens when its reader lags), resetting the breaker's count of failures in a
    # row, and the ejection would come late.
    bad = await sim_process("--fault-garble-after-chunks", "0")
    app = await start_server(
        engine="sglang-http",
        sglang_urls=f"{good},{bad}",
        # By load alone: each batch splits between the two workers. (Locality would
        # follow the prompts' shared prefix to where it was served, and the bad
        # worker's share of the traffic would depend on timing.)
        sglang_routing="least_full",
        sglang_health_interval_s=0.05,
        sglang_eject_after_failures=3,
        sglang_ejection_base_s=300.0,  # no re-admission during this test
    )
    pool = _pool(app)
    for w in pool.workers:
        # Forget failures for routing at once, so the bad worker keeps getting
        # traffic here (routing is tested below) and only the breaker decides.
        w.breaker.policy = dataclasses.replace(w.breaker.policy, failure_memory_s=0.0)
    concurrency = 4
    outcomes: list[bool] = []
    async with AsyncClient(app.address) as c:
        for start in range(0, 40, concurrency):
            batch = range(start, start + concurrency)
            outcomes += await asyncio.gather(*(_outcome(c, i) for i in batch))
    bad_worker = pool.workers[1]
    # /health stayed fine, yet the stream failures ejected it...
    assert not bad_worker.healthy and pool.workers[0].healthy
    # ... after `eject_after_failures` failures, plus streams already running there.
    assert bad_worker.stream_failures_total <= 3 + concurrency
    assert outcomes.count(False) == bad_worker.stream_failures_total
    assert outcomes[-20:] == [True] * 20


async def test_a_stalling_worker_comes_back_ever_more_rarely(
    start_server: StartServer, sim_process: SimProcess
) -> None:
    good = await sim_process()
    bad = await sim_process("--fault-stall-after-chunks", "2")
    base_s = 0.2
    app = await start_server(
        engine="sglang-http",
        sglang_urls=f"{good},{bad}",
        sglang_read_timeout_s=0.2,
        sglang_health_interval_s=0.02,
        sglang_ejection_base_s=base_s,
        sglang_ejection_max_s=60.0,
    )
    bad_worker = _pool(app).workers[1]

    def ejections() -> list[tuple[float, str, float]]:
        return [h for h in bad_worker.history if h[1] == "ejected"]

    async def traffic(c: AsyncClient) -> None:
        i = 0
        while True:
            await _outcome(c, i)
            i += 1

    async with AsyncClient(app.address) as c:
        loops = [asyncio.create_task(traffic(c)) for _ in range(2)]
        try:
            await eventually(lambda: len(ejections()) >= 3, timeout_s=30, what="3 ejections")
        finally:
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
    history = list(bad_worker.history)
    durations = [d for _, kind, d in history if kind == "ejected"]
    assert durations[:3] == [base_s, 2 * base_s, 4 * base_s]
    # Every re-admission came after the ejection before it had run its course.
    for (t_ej, kind, d), (t_next, next_kind, _) in itertools.pairwise(history):
        if kind == "ejected" and next_kind == "admitted":
            assert t_next >= t_ej + d
    assert _pool(app).workers[0].healthy


def _request(i: int) -> EngineRequest:
    return EngineRequest(
        request_id=f"r{i}",
        prompt_token_ids=[1, 2, 3],
        prompt_text=None,
        max_tokens=4,
        sampling=SamplingOptions(),
    )


def _pick(pool: WorkerPool, req: EngineRequest) -> Worker:
    keys = pool.placement.prefix_keys(req.prompt_token_ids)
    placed = pool.placement.place(req, keys, set())
    assert placed is not None
    pool.placement.released(placed)  # only the choice is asked here
    return pool.workers[placed.worker]


def test_least_load_routing_discounts_recent_failures() -> None:
    engines = [SglangHttpEngine(SglangHttpConfig(url=f"http://127.0.0.1:{p}")) for p in (1, 2)]
    for e in engines:  # as its first /server_info read would (a healthy worker has one)
        e._capacity = EngineCapacity(16, 1_000_000, 4096, 32000)
    now = [100.0]
    pool = WorkerPool(engines, breaker=BreakerPolicy(consecutive_failures=3), clock=lambda: now[0])
    busy, failing = pool.workers
    busy.healthy = failing.healthy = True
    in_flight = pool.placement.in_flight  # [busy, failing]
    in_flight[:] = [2, 0]
    assert _pick(pool, _request(0)) is failing  # idle and clean: least load
    failing.breaker.on_failure(now[0])  # its streams die fast: it only *looks* idle
    assert _pick(pool, _request(1)) is busy
    in_flight[0] = FAILURE_LOAD + 1
    assert _pick(pool, _request(2)) is failing  # still used when others are loaded
    in_flight[0] = 2
    now[0] += failing.breaker.policy.failure_memory_s  # a failure long ago weighs nothing
    assert _pick(pool, _request(3)) is failing
    assert failing.breaker.failures == 1  # but still counts towards ejection
    failing.breaker.on_success(now[0])
    assert failing.breaker.failures == 0
