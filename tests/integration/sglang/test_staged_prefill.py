"""Staged prefill through the whole gateway, in front of SGLang stand-ins.

A long prompt goes to one worker as prefill-only stages, then whole; the client
sees the final request's usage, the fair counter charges the stages as prompt
tokens, and a client that leaves during a stage leaves nothing behind.
(tests/sglang/test_staged_prefill.py holds the stand-in to the real SGLang.)
"""

from __future__ import annotations

import asyncio

import pytest
from fairgate import AsyncClient

from scheduler.dispatcher import Dispatcher
from scheduler.local_admission import LocalAdmission
from scheduler.ordering.vtc import VtcPolicy
from service.engines.isolation_stats import isolation_counts
from service.engines.pool import WorkerPool
from tests.conftest import StartServer
from tests.helpers import eventually
from tests.sglang_helpers import (
    StartSim,
    assert_no_sglang_leaks,
    sent_lengths,
    sglang_settings,
)

STAGED = {"staged_prefill_min_tokens": 1000, "staged_prefill_stage_tokens": 512}


async def test_a_long_prompt_goes_in_stages_to_one_worker_and_is_charged_in_full(
    start_server: StartServer, start_sim: StartSim
) -> None:
    workers = [await start_sim(time_scale=0.0) for _ in range(2)]
    app = await start_server(**sglang_settings(*workers, vtc_w_cached=0.1, **STAGED))
    assert isinstance(app.engine, WorkerPool)
    model = app.models.resolve("")
    assert model is not None
    d = model.dispatcher
    assert isinstance(d, Dispatcher) and isinstance(d.state, LocalAdmission)
    policy = d.state.policy
    assert isinstance(policy, VtcPolicy)
    prompt = [5, *range(200, 2199)]  # 2000 tokens
    async with AsyncClient(app.address, tenant="t") as c:
        before = policy.counter("t")
        done = await c.complete(prompt, max_tokens=4, ignore_eos=True)
        charged = policy.counter("t") - before - 4 * policy.w_out
        short = await c.complete([5, 6, 7], max_tokens=2, ignore_eos=True)
    assert done.result.finish_reason == "length"
    assert done.result.usage.completion_tokens == 4
    # The final request found its three stages cached, but they were its own work:
    # the client's usage says none of it was cached, as it was charged.
    assert done.result.usage.prompt_tokens == 2000
    assert done.result.usage.cached_tokens == 0
    # Those were the tenant's own prefill: charged as prompt tokens, not at 0.1.
    assert charged == pytest.approx(2000)
    # Stages 512, 1024, 1536 (prefill only), then the request, all on one worker.
    used = [w for w in workers if w.record.requests]
    assert len(used) in (1, 2)
    staged_on = next(w for w in workers if any(n == 2000 for n, _ in sent_lengths(w)))
    assert [s for s in sent_lengths(staged_on) if s[0] >= 512] == [
        (512, 0),
        (1024, 0),
        (1536, 0),
        (2000, 4),
    ]
    other = next(w for w in workers if w is not staged_on)
    assert all(n < 512 for n, _ in sent_lengths(other))
    # A short prompt is never staged.
    assert short.result.usage.prompt_tokens == 3
    assert (3, 2) in sent_lengths(workers[0]) + sent_lengths(workers[1])
    await assert_no_sglang_leaks(app, *workers)


async def test_a_client_leaving_during_a_stage_aborts_it_and_sends_no_more(
    start_server: StartServer, start_sim: StartSim
) -> None:
    # Slowed down: the stage's first 2048-token chunk takes seconds in the engine.
    stand_in = await start_sim(time_scale=8.0)
    settings = {**STAGED, "staged_prefill_stage_tokens": 4096}
    app = await start_server(**sglang_settings(stand_in, **settings))
    prompt = [5, *range(200, 5199)]  # 5000 tokens: a stage of 4096, then whole
    async with AsyncClient(app.address) as c:
        task = asyncio.create_task(c.complete(prompt, max_tokens=4, ignore_eos=True))
        await eventually(lambda: sent_lengths(stand_in) == [(4096, 0)], what="the stage sent")
        await eventually(lambda: stand_in.engine.active_requests == 1, what="it in the engine")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    rid = stand_in.record.requests[0]["rid"]
    await eventually(
        lambda: rid in stand_in.record.aborted or rid in stand_in.record.disconnected,
        what="the stage aborted",
    )
    await assert_no_sglang_leaks(app, stand_in)
    assert sent_lengths(stand_in) == [(4096, 0)]  # no final request


@pytest.mark.parametrize("one_at_a_time", [True, False])
async def test_one_staged_prompt_at_a_time_per_engine(
    start_server: StartServer, start_sim: StartSim, one_at_a_time: bool
) -> None:
    """With the lane, a second long prompt's stages start once the first one has
    its first token: the engine's steps carry one stage, not one from each."""
    stand_in = await start_sim(time_scale=0.5)
    settings = {**STAGED, "staged_prefill_one_at_a_time": one_at_a_time}
    app = await start_server(**sglang_settings(stand_in, **settings))
    a, b = [5, *range(200, 2199)], [6, *range(200, 2199)]  # 2000 tokens each, no shared prefix
    pool = app.engine
    assert isinstance(pool, WorkerPool)
    unsent: list[int] = []  # the pool's unsent requests, watched (the second one in the lane)

    async def watch() -> None:
        while True:
            unsent.append(pool.unsent())
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    async with AsyncClient(app.address) as c:
        done = await asyncio.gather(
            c.complete(a, max_tokens=4, ignore_eos=True),
            c.complete(b, max_tokens=4, ignore_eos=True),
        )
    watcher.cancel()
    assert max(unsent) == (1 if one_at_a_time else 0)
    assert pool.unsent() == 0
    assert [d.result.usage.cached_tokens for d in done] == [0, 0]  # their own stages
    firsts = [body["input_ids"][0] for body in stand_in.record.requests]
    assert sorted(firsts) == [5] * 4 + [6] * 4
    grouped = firsts in ([5] * 4 + [6] * 4, [6] * 4 + [5] * 4)
    assert grouped is one_at_a_time
    await assert_no_sglang_leaks(app, stand_in)


async def test_cold_only_stages_a_document_once_then_sends_it_whole_where_it_is_cached(
    start_server: StartServer, start_sim: StartSim
) -> None:
    """`staged_prefill_cold_only`: the pool's placement counts the document cached
    on the worker it routes the second prompt to, so that prompt goes whole; the
    rest above the document is short of the length to stage."""
    workers = [await start_sim(time_scale=0.0) for _ in range(2)]
    settings = {**STAGED}  # staged_prefill_cold_only: on by default
    app = await start_server(**sglang_settings(*workers, **settings))
    doc = [5, *range(200, 2199)]  # 2000 tokens
    async with AsyncClient(app.address, tenant="t") as c:
        first = await c.complete(doc, max_tokens=4, ignore_eos=True)
        second = await c.complete([*doc, *range(3000, 3300)], max_tokens=4, ignore_eos=True)
        # Cold: 1500 tokens past the document's 2000 (staged from above them).
        third = await c.complete([*doc, *range(4000, 5500)], max_tokens=4, ignore_eos=True)
    assert first.result.usage.cached_tokens == 0  # its own stages: reported uncached
    on = next(w for w in workers if any(n == 2000 for n, _ in sent_lengths(w)))
    long_sent = [s for s in sent_lengths(on) if s[0] >= 512]
    assert long_sent[:4] == [(512, 0), (1024, 0), (1536, 0), (2000, 4)]
    # The second prompt went whole, to the worker holding the document.
    assert long_sent[4] == (2300, 4)
    assert second.result.usage.cached_tokens >= 1536
    # The third's stages start above what the worker holds.
    assert long_sent[5:] == [(2048, 0), (2560, 0), (3072, 0), (3500, 4)]
    assert third.result.usage.cached_tokens == 2000  # the document, held before its stages
    other = next(w for w in workers if w is not on)
    assert all(n < 512 for n, _ in sent_lengths(other))
    await assert_no_sglang_leaks(app, *workers)


async def test_a_sheltered_worker_takes_wide_stages_while_a_light_tenant_is_active(
    start_server: StartServer, start_sim: StartSim
) -> None:
    """Three workers, staggered prefill on: once a light tenant is active and
    another worker is on short steps, a long prompt's stages are wide
    (`staged_prefill_sheltered_stage_tokens`): 1024, then the rest whole."""
    workers = [await start_sim(time_scale=0.0) for _ in range(3)]
    settings = {
        **STAGED,
        "staged_prefill_sheltered_stage_tokens": 1024,
        "sglang_stagger_prefill_tokens": 1000,
    }
    app = await start_server(**sglang_settings(*workers, **settings))
    pool = app.engine
    assert isinstance(pool, WorkerPool)
    long = [5, *range(200, 2199)]  # 2000 tokens
    async with AsyncClient(app.address, tenant="batch") as batch:
        await batch.complete(long, max_tokens=4, ignore_eos=True)  # no light tenant yet
        async with AsyncClient(app.address, tenant="chat") as chat:
            await chat.complete([7, 8, 9], max_tokens=2, ignore_eos=True)
        assert pool.placement.stagger.light_active(pool.placement.clock())
        await batch.complete([6, *long[1:]], max_tokens=4, ignore_eos=True)
    sent = sorted(s for w in workers for s in sent_lengths(w) if s[0] >= 512)
    assert sent == [(512, 0), (1024, 0), (1024, 0), (1536, 0), (2000, 4), (2000, 4)]
    counts = isolation_counts(pool)
    assert (counts["staged_requests"], counts["stages"], counts["stages_wide"]) == (2, 4, 1)
    await assert_no_sglang_leaks(app, *workers)


@pytest.mark.parametrize("short_first", [True, False])
async def test_a_short_prompt_takes_the_lane_between_a_long_ones_stages(
    start_server: StartServer, start_sim: StartSim, short_first: bool
) -> None:
    """`staged_prefill_short_first`: a 1 200-token prompt (staged, but below the
    stagger's long mark of 1 500) that arrives during a 4 000-token prompt's stages
    goes in before the rest of them, not after its first token."""
    stand_in = await start_sim(time_scale=0.5)
    settings = {
        **STAGED,
        "sglang_stagger_prefill_tokens": 1500,
        "staged_prefill_short_first": short_first,
    }
    app = await start_server(**sglang_settings(stand_in, **settings))
    pool = app.engine
    assert isinstance(pool, WorkerPool)
    long, short = [5, *range(200, 4199)], [6, *range(5000, 6199)]
    async with AsyncClient(app.address) as c:
        first = asyncio.create_task(c.complete(long, max_tokens=4, ignore_eos=True))
        await eventually(lambda: len(stand_in.record.requests) >= 1, what="its first stage")
        await c.complete(short, max_tokens=4, ignore_eos=True)
        await first
    sent = [
        (body["input_ids"][0], n)
        for body, (n, _) in zip(stand_in.record.requests, sent_lengths(stand_in), strict=True)
    ]
    short_sent = [(6, 512), (6, 1024), (6, 1200)]
    assert [s for s in sent if s[0] == 5] == [(5, n) for n in (*range(512, 4000, 512), 4000)]
    assert [s for s in sent if s[0] == 6] == short_sent
    if short_first:  # its stages and itself before the long one's last stage
        assert sent.index((6, 1200)) < sent.index((5, 3584))
    else:
        assert sent[-3:] == short_sent
    assert isolation_counts(pool)["lane_yielded"] == (1 if short_first else 0)
    await assert_no_sglang_leaks(app, stand_in)
