"""fairgate's worker pool over real SGLang servers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import grpc
import pytest
from fairgate import AsyncClient, Delta, FairgateError, Result
from fairgate.bench.sglang_cpu import RealSglang, SglangUnavailable

from service.engines.pool import WorkerPool
from tests.conftest import StartServer
from tests.helpers import eventually
from tests.sglang.helpers import assert_sglang_idle, reference
from tests.sglang.test_grpc_service import assert_drained, settings

PROMPT = "Once upon a time"


def _pool(app: object) -> WorkerPool:
    engine = getattr(app, "engine", None)
    assert isinstance(engine, WorkerPool)
    return engine


@pytest.fixture
def victim() -> Iterator[RealSglang]:
    """A server of its own, for the test that kills it (sglang_a's size, so that
    routing, which fills workers in proportion to their size, ties between them)."""
    try:
        server = RealSglang.start()
    except SglangUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


async def test_two_workers_share_the_load_and_the_capacity(
    start_server: StartServer, sglang_a: RealSglang, sglang_b: RealSglang
) -> None:
    app = await start_server(**settings(sglang_a, sglang_b, sglang_health_interval_s=0.3))
    pool = _pool(app)
    model = app.models.resolve("")
    assert model is not None
    cap = pool.capacity()
    assert (cap.max_running_requests, cap.max_total_tokens) == (16 + 4, 2 * 16384)
    assert model.dispatcher.budget.limits.max_requests <= 20
    want = await reference(sglang_a.url, PROMPT, 64)
    async with AsyncClient(app.address) as c:
        tasks = [
            asyncio.create_task(c.complete(PROMPT, max_tokens=64, temperature=0.0))
            for _ in range(8)
        ]
        await eventually(
            lambda: all(n > 0 for n in pool.placement.in_flight), timeout_s=30, what="both busy"
        )
        done = await asyncio.gather(*tasks)
    # Greedy: the same answer from the cumulative and the incremental worker.
    assert {d.text for d in done} == {want["text"]}
    assert all(d.result.usage.completion_tokens == 64 for d in done)
    # SGLang's /health (a generation, >= 1 s) under load never ejected a worker.
    assert [(w.healthy, w.failures) for w in pool.workers] == [(True, 0), (True, 0)]
    await assert_drained(app, sglang_a, sglang_b)


async def test_worker_killed_mid_stream(
    start_server: StartServer, sglang_a: RealSglang, victim: RealSglang
) -> None:
    app = await start_server(**settings(victim, sglang_a, sglang_health_interval_s=0.5))
    pool = _pool(app)
    model = app.models.resolve("")
    assert model is not None
    assert pool.capacity().max_running_requests == 16 + 16
    async with AsyncClient(app.address) as c:
        # Both idle and of one size: routing picks the first worker, the victim.
        deltas, result = 0, None
        with pytest.raises(FairgateError) as err:
            async for ev in c.generate(PROMPT, max_tokens=1500, ignore_eos=True):
                if isinstance(ev, Delta):
                    deltas += 1
                    if deltas == 5:
                        assert pool.placement.in_flight[0] == 1
                        victim.kill()
                elif isinstance(ev, Result):
                    result = ev
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert result is not None and result.finish_reason == "error"
        assert 5 <= result.usage.completion_tokens < 1500
        await eventually(lambda: not pool.workers[0].healthy, timeout_s=10, what="ejection")
        # Capacity and fairgate's limits shrink to the survivor; new requests go there.
        assert pool.capacity().max_running_requests == 16
        await eventually(
            lambda: model.dispatcher.budget.limits.max_requests <= 16, what="limits shrink"
        )
        after = await c.complete(PROMPT, max_tokens=8, ignore_eos=True)
        assert after.result.finish_reason == "length"
    await assert_sglang_idle(sglang_a.url)
    await assert_drained(app, sglang_a)


async def test_a_conversations_later_turns_land_where_its_history_is(
    start_server: StartServer, sglang_a: RealSglang, sglang_b: RealSglang, tiny_tokenizer: str
) -> None:
    """Four conversations of three turns at once over two real SGLang servers;
    each turn re-sends the history (prompt and reply, as token ids). Locality
    routing sends every later turn to the server that holds its history, and
    SGLang reports that history as cached_tokens."""
    app = await start_server(**settings(sglang_a, sglang_b, tokenizer=tiny_tokenizer))
    pool = _pool(app)

    async def conversation(c: AsyncClient, k: int) -> list[tuple[int, int]]:
        # Its own opening, then some context (ids within the tiny model's vocabulary).
        prompt = [100 + k, *((37 * j + 11 * k) % 400 + 20 for j in range(300))]
        seen = []
        for turn in range(3):
            done = await c.complete(
                prompt, max_tokens=16, ignore_eos=True, temperature=0.0, return_token_ids=True
            )
            seen.append((len(prompt), done.result.usage.cached_tokens))
            prompt = [*prompt, *done.token_ids, *((13 * j + turn) % 400 + 20 for j in range(30))]
        return seen

    async with AsyncClient(app.address) as c:
        turns = await asyncio.gather(*(conversation(c, k) for k in range(4)))
    for k, seen in enumerate(turns):
        # Every later turn found the whole previous turn's prompt cached: it went
        # to the server that ran that turn (the two share no cache).
        for (before, _), (_, cached) in itertools.pairwise(seen):
            assert cached >= before, f"conversation {k}: {seen}"
    assert pool.placement.cached_tokens_total >= sum(s[0][0] + s[1][0] for s in turns)
    await assert_drained(app, sglang_a, sglang_b)
