"""Staged prefill on the real SGLang and on the stand-in, told the same story.

What staged prefill (service/engines/staged_prefill.py) relies on: a request
with `max_new_tokens: 0` is prefill only and leaves its whole prompt in the
radix cache, so the next, longer stage and the final request report it as
`cached_tokens`; a stage evicted in between is found missing, and the staged
stream then sends the rest in one request, with the same answer.
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import aiohttp
from fairgate.bench.sglang_cpu import RealSglang

from service.engines.protocol import EngineChunk, EngineRequest, FinishKind, SamplingOptions
from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine
from service.engines.staged_prefill import StagedPrefill, staged
from tests.sglang.test_conformance import _cached, _flush
from tests.sglang.wire import call
from tests.sglang_helpers import StartSim

GREEDY = SamplingOptions(temperature=0.0, ignore_eos=True)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 400) for _ in range(n)]  # below the tiny model's 474


async def _stage(s: aiohttp.ClientSession, url: str, ids: list[int]) -> dict[str, Any]:
    """One prefill-only request, streamed: its events' meta_info."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "stream": True}
    answer = await call(s, "POST", url + "/generate", body=body)
    assert answer.status == 200, answer
    *events, done = answer.body
    assert done == "[DONE]" and len(events) == 1, answer.body
    (event,) = events
    assert event["text"] == "" and event["output_ids"] == []
    meta: dict[str, Any] = event["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    assert meta["completion_tokens"] == 0 and meta["prompt_tokens"] == len(ids)
    return meta


async def _flood(s: aiohttp.ClientSession, url: str, rng: random.Random) -> None:
    for _ in range(24):  # 24 x 1002 tokens: past the 16384 KV tokens of both
        await _cached(s, url, _ids(rng, 1000), n=2)


async def staging_story(s: aiohttp.ClientSession, url: str) -> dict[str, int]:
    rng = random.Random(41)
    await _flush(s, url)
    seen: dict[str, int] = {}
    p = _ids(rng, 1600)
    seen["stage 1 (500)"] = (await _stage(s, url, p[:500]))["cached_tokens"]
    seen["stage 2 (1000)"] = (await _stage(s, url, p[:1000]))["cached_tokens"]
    seen["final (1600)"] = (await _cached(s, url, p))[0]
    q = _ids(rng, 800)
    await _stage(s, url, q[:400])
    seen["stage (400) again"] = (await _stage(s, url, q[:400]))["cached_tokens"]
    await _flood(s, url, rng)
    seen["stage 2 after a flood"] = (await _stage(s, url, q))["cached_tokens"]
    return seen


async def test_prefill_only_stages_are_cached_as_sglang(
    sglang_a: RealSglang, start_sim: StartSim
) -> None:
    stand_in = await start_sim(time_scale=1.0, kv_capacity_tokens=16384)
    async with aiohttp.ClientSession() as s:
        real = await staging_story(s, sglang_a.url)
        sim = await staging_story(s, stand_in.url)
    assert sim == real
    # A prefill-only stage leaves all of its prompt (no match stops short of it
    # for a longer request); the same stage again recomputes its last token;
    # an evicted stage is found missing.
    assert real == {
        "stage 1 (500)": 0,
        "stage 2 (1000)": 500,
        "final (1600)": 1000,
        "stage (400) again": 399,
        "stage 2 after a flood": 0,
    }


async def _reference(url: str, ids: list[int], max_new: int) -> list[int]:
    async with aiohttp.ClientSession() as s:
        await _flush(s, url)
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True},
        }
        answer = await call(s, "POST", url + "/generate", body=body)
        await _flush(s, url)
    assert answer.status == 200, answer
    out: list[int] = answer.body["output_ids"]
    return out


async def _collect(stream: AsyncGenerator[EngineChunk, None]) -> list[EngineChunk]:
    async with aclosing(stream) as chunks:
        return [c async for c in chunks]


async def staged_through_the_adapter(url: str) -> dict[str, Any]:
    """A 1600-token prompt staged by 500 through the HTTP adapter, then the same with
    the cache flooded after the first stage: (counts, outputs vs SGLang's own)."""
    rng = random.Random(43)
    prompt = _ids(rng, 1600)
    want = await _reference(url, prompt, 8)
    engine = SglangHttpEngine(
        SglangHttpConfig(url=url, staged_prefill=StagedPrefill(min_tokens=1000, stage_tokens=500))
    )
    await engine.start()
    seen: dict[str, Any] = {}
    try:
        req = EngineRequest("staged", prompt, 8, GREEDY)
        chunks = await _collect(engine.generate(req))
        last = chunks[-1]
        seen["same output"] = [t for c in chunks for t in c.token_ids] == want
        seen["finish"] = last.finish
        seen["cached"], seen["staged"] = last.cached_tokens, last.staged_tokens
        seen["stages"] = engine.staging.stages

        async with aiohttp.ClientSession() as s:
            await _flush(s, url)
            flooded = 0

            async def flooding(r: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
                # The first stage, then other traffic that evicts it.
                nonlocal flooded
                async with aclosing(engine._generate_one(r)) as stream:
                    async for chunk in stream:
                        yield chunk
                if flooded == 0:
                    flooded = 1
                    await _flood(s, url, rng)

            req = EngineRequest("evicted", prompt, 8, GREEDY)
            chunks = await _collect(staged(flooding, req, StagedPrefill(1000, 500), engine.staging))
        last = chunks[-1]
        seen["evicted: same output"] = [t for c in chunks for t in c.token_ids] == want
        seen["evicted: finish"] = last.finish
        # Stage 2 found stage 1 gone: no third stage, the rest in one request,
        # which finds stage 2's 1000 tokens (charged as the tenant's work).
        seen["evicted: cached"], seen["evicted: staged"] = last.cached_tokens, last.staged_tokens
        seen["evicted: stages"] = engine.staging.stages - seen["stages"]
        seen["evicted"] = engine.staging.evicted
    finally:
        await engine.aclose()
    return seen


async def test_staged_stream_and_its_fallback_as_sglang(
    sglang_a: RealSglang, start_sim: StartSim
) -> None:
    stand_in = await start_sim(time_scale=1.0, kv_capacity_tokens=16384)
    real = await staged_through_the_adapter(sglang_a.url)
    sim = await staged_through_the_adapter(stand_in.url)
    assert real == sim
    assert real == {
        "same output": True,
        "finish": FinishKind.LENGTH,
        "cached": 1500,
        "staged": 1500,
        "stages": 3,
        "evicted: same output": True,
        "evicted: finish": FinishKind.LENGTH,
        "evicted: cached": 1000,
        "evicted: staged": 1000,
        "evicted: stages": 2,
        "evicted": 1,
    }
