"""Staged prefill on the simulated engine: the plan, prefill-only requests, an abort
during a stage, and a refused stage (the real server's side: tests/sglang)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing

import pytest

from service.engines.protocol import (
    EngineChunk,
    EngineError,
    EngineRequest,
    FinishKind,
    SamplingOptions,
)
from service.engines.simulator.core import SimConfig, SimCore
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.hardware import preset
from service.engines.staged_prefill import Send, StagedPrefill, StagingStats, staged
from tests.helpers import eventually

IGNORE_EOS = SamplingOptions(ignore_eos=True)


def _req(n: int, max_tokens: int = 4, text: str | None = None) -> EngineRequest:
    return EngineRequest("r", list(range(300, 300 + n)), max_tokens, IGNORE_EOS, prompt_text=text)


def test_which_prompts_are_staged_and_where_stages_end() -> None:
    plan = StagedPrefill(min_tokens=1000, stage_tokens=512)
    assert plan.stage_ends(_req(999)) == []
    assert plan.stage_ends(_req(1000)) == [512]
    assert plan.stage_ends(_req(1024)) == [512]  # the request itself adds the last 512
    assert plan.stage_ends(_req(1025)) == [512, 1024]
    assert plan.stage_ends(_req(2000, max_tokens=0)) == []  # prefill only already
    assert StagedPrefill().stage_ends(_req(5000)) == []  # off by default
    # A text prompt's stages go as ids: only where fairgate's ids are the engine's.
    assert StagedPrefill(1000, 512, exact_ids=False).stage_ends(_req(2000, text="x")) == []
    assert StagedPrefill(1000, 512, exact_ids=False).stage_ends(_req(2000)) == [512, 1024, 1536]
    with pytest.raises(ValueError):
        StagedPrefill(min_tokens=10, stage_tokens=0)


def test_cold_only_stages_what_is_uncached_where_the_request_goes() -> None:
    plan = StagedPrefill(min_tokens=1000, stage_tokens=512, cold_only=True)
    # Nothing known held (no pool placed it): as without cold_only.
    assert plan.stage_ends(_req(2000)) == [512, 1024, 1536]
    # 1500 of 2000 held: 500 uncached, short of 1000: whole.
    held = EngineRequest("r", list(range(300, 2300)), 4, IGNORE_EOS, held_tokens=1500)
    assert plan.stage_ends(held) == []
    # 600 held: 1400 uncached, staged from above the held part.
    assert plan.ends(2000, 4, held_tokens=600) == [1024, 1536]
    assert plan.ends(2000, 4, held_tokens=1024) == []  # 976 uncached
    assert plan.ends(2000, 4, held_tokens=999) == [1024, 1536]  # 1001 uncached
    # Without cold_only what is held does not matter.
    every = StagedPrefill(1000, 512, cold_only=False)
    assert every.ends(2000, 4, held_tokens=1500) == [512, 1024, 1536]
    assert StagedPrefill(1000, 512).cold_only  # the default


def test_a_prefill_only_request_ends_with_its_prompt_cached_and_no_token() -> None:
    core = SimCore(SimConfig(cost=preset(), chunked_prefill_size=512))
    stage = core.make_request("s", list(range(300, 1300)), 0, IGNORE_EOS)
    core.add(stage)
    steps = [core.step() for _ in range(2)]
    assert [s.prefill_tokens for s in steps] == [512, 488]
    assert steps[0].emissions == []
    (end,) = steps[1].emissions
    assert (end.finish, end.generated, end.text) == (FinishKind.LENGTH, 0, "")
    assert core.idle and core.used_kv == 0
    whole = core.make_request("w", list(range(300, 1400)), 2, IGNORE_EOS)
    core.add(whole)
    core.step()
    assert whole.cached_tokens == 1000  # all of the stage, not one short


async def _collect(stream: AsyncGenerator[EngineChunk, None]) -> list[EngineChunk]:
    async with aclosing(stream) as chunks:
        return [c async for c in chunks]


async def test_an_abort_during_a_stage_ends_the_request_there() -> None:
    # Slowed down: a 2048-token chunk takes ~3 s.
    engine = SimulatedEngine(
        SimConfig(cost=preset()), time_scale=8.0, staged_prefill=StagedPrefill(1000, 4096)
    )
    await engine.start()
    try:
        req = EngineRequest("long", list(range(300, 5300)), 4, IGNORE_EOS)
        task = asyncio.create_task(_collect(engine.generate(req)))
        await eventually(lambda: engine.active_requests == 1, what="the stage in the engine")
        await engine.abort("long")
        chunks = await task
        assert chunks[-1].finish is FinishKind.ABORT
        assert [c.completion_tokens for c in chunks] == [0]
        assert chunks[-1].prompt_tokens == 5000
        assert engine.staging.stages == 1  # the aborted one; no final request
        assert engine.active_requests == 0 and engine.core.used_kv == 0
    finally:
        await engine.aclose()


async def test_a_refused_stage_sends_the_rest_whole_and_a_failed_worker_fails_it() -> None:
    engine = SimulatedEngine(SimConfig(cost=preset()), time_scale=0.0)
    await engine.start()
    sent: list[int] = []

    def refusing(retryable: bool) -> Send:
        async def send(r: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
            sent.append(r.max_tokens)
            if r.max_tokens == 0 and len(sent) == 2:  # the second stage
                raise EngineError("refused", retryable=retryable)
            async with aclosing(engine._generate_one(r)) as stream:
                async for chunk in stream:
                    yield chunk

        return send

    try:
        req = _req(2000)
        plan = StagedPrefill(1000, 512)
        stats = StagingStats()
        chunks = await _collect(staged(refusing(False), req, plan, stats))
        assert sent == [0, 0, 4]  # stage 1, stage 2 refused, then whole
        assert (stats.stages, stats.refused) == (1, 1)
        assert chunks[-1].finish is FinishKind.LENGTH
        assert (chunks[-1].cached_tokens, chunks[-1].staged_tokens) == (512, 512)
        assert engine.core.flush_cache()
        sent.clear()
        with pytest.raises(EngineError):
            await _collect(staged(refusing(True), req, plan, stats))
        assert sent == [0, 0]
    finally:
        await engine.aclose()


async def test_the_stages_are_planned_when_the_lane_is_held() -> None:
    """A request placed where its prefix was held waits for the worker's lane
    behind a staged one; evicted meanwhile (its `held_now` says so), it is staged
    from what is held then, not sent whole into a long prefill."""
    engine = SimulatedEngine(
        SimConfig(cost=preset()),
        time_scale=0.01,
        staged_prefill=StagedPrefill(1000, 512, cold_only=True),
    )
    await engine.start()
    held = [2000]
    try:
        first = EngineRequest("first", list(range(300, 2300)), 4, IGNORE_EOS, held_tokens=0)
        second = EngineRequest(
            "second",
            list(range(5000, 7000)),
            4,
            IGNORE_EOS,
            held_tokens=2000,
            held_now=lambda: held[0],
        )
        assert engine.staged_prefill.stage_ends(second) == []  # as placed: whole
        one = asyncio.create_task(_collect(engine.generate(first)))
        await eventually(lambda: engine.staging.stages >= 1, what="the first one's stages")
        two = asyncio.create_task(_collect(engine.generate(second)))
        held[0] = 0  # evicted while it waits for the lane
        await one
        chunks = await two
        assert chunks[-1].finish is FinishKind.LENGTH
        assert engine.staging.staged_requests == 2 and engine.staging.stages == 6
        assert chunks[-1].staged_tokens == 1536
    finally:
        await engine.aclose()
