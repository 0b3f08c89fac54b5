"""fairgate's SGLang HTTP adapter against the real SGLang server (no fairgate server)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from contextlib import aclosing

import aiohttp
import pytest
from fairgate.bench.sglang_cpu import RealSglang

from service.engines.protocol import EngineError, EngineRequest, FinishKind, SamplingOptions
from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine
from tests.sglang.helpers import (
    GREEDY,
    assert_sglang_idle,
    collect,
    joined,
    pick_stop,
    reference,
    wait_running,
)

PROMPT = "hello"


async def _engine(server: RealSglang) -> SglangHttpEngine:
    engine = SglangHttpEngine(SglangHttpConfig(url=server.url))
    await engine.start()
    return engine


def _req(rid: str, max_tokens: int, sampling: SamplingOptions = GREEDY) -> EngineRequest:
    return EngineRequest(rid, [], max_tokens=max_tokens, prompt_text=PROMPT, sampling=sampling)


async def test_capacity_and_options_come_from_server_info(
    sglang_a: RealSglang, sglang_b: RealSglang
) -> None:
    a, b = await _engine(sglang_a), await _engine(sglang_b)
    try:
        cap = a.capacity()
        # start.sh: --max-total-tokens 16384 --max-running-requests 16; the model's
        # 2048-token context leaves max_req_input_len = 2042 (see the gRPC test).
        assert (cap.max_total_tokens, cap.max_running_requests) == (16384, 16)
        assert cap.max_context_tokens == 2042
        assert b.capacity().max_running_requests == 4
        assert (a.incremental, b.incremental) == (False, True)
        assert (a.send_priority, b.send_priority) == (False, True)
        assert a.served_model_name.endswith("tiny-llama")
    finally:
        await a.aclose()
        await b.aclose()


@pytest.mark.parametrize("which", ["cumulative", "incremental"])
async def test_stream_reassembles_to_sglangs_own_answer(
    sglang_a: RealSglang, sglang_b: RealSglang, which: str
) -> None:
    server = sglang_a if which == "cumulative" else sglang_b
    engine = await _engine(server)
    try:
        want = await reference(server.url, PROMPT, 48)
        chunks = await collect(engine, _req(f"re-{which}", 48))
        text, ids = joined(chunks)
        assert (text, ids) == (want["text"], want["output_ids"])
        last = chunks[-1]
        assert last.finish is FinishKind.LENGTH and last.completion_tokens == 48
        assert last.prompt_tokens == want["meta_info"]["prompt_tokens"]
        # Byte-level BPE: tokens whose bytes are not yet valid UTF-8 come with no text
        # (SGLang holds them back), and still count.
        held = [c for c in chunks if c.token_ids and not c.text]
        assert held, "expected tokens held back for incomplete UTF-8"
        assert sum(len(c.token_ids) for c in chunks) == 48
    finally:
        await engine.aclose()


async def test_stop_string_and_stop_token_id(sglang_a: RealSglang) -> None:
    engine = await _engine(sglang_a)
    try:
        probe = await reference(sglang_a.url, PROMPT, 24)
        stop = pick_stop(probe["text"])
        chunks = await collect(
            engine, _req("stop-str", 24, dataclasses.replace(GREEDY, stop=(stop,)))
        )
        want = await reference(sglang_a.url, PROMPT, 24, stop=[stop])
        text, _ = joined(chunks)
        assert chunks[-1].finish is FinishKind.STOP and chunks[-1].stop_matched == stop
        assert text == want["text"] and stop not in text

        stop_id = probe["output_ids"][5]
        first = probe["output_ids"].index(stop_id)
        sampling = dataclasses.replace(GREEDY, stop_token_ids=(stop_id,))
        chunks = await collect(engine, _req("stop-id", 24, sampling))
        assert chunks[-1].finish is FinishKind.STOP and chunks[-1].stop_matched == str(stop_id)
        assert chunks[-1].completion_tokens == first + 1
    finally:
        await engine.aclose()
    await assert_sglang_idle(sglang_a.url)


async def test_abort_by_sglang_ends_with_partial_output(sglang_a: RealSglang) -> None:
    engine = await _engine(sglang_a)
    try:
        chunks = []
        async with aclosing(engine.generate(_req("to-abort", 1500))) as stream:
            async for chunk in stream:
                chunks.append(chunk)
                if len(chunks) == 3:
                    # Engine.abort by request id: POST /abort_request with its rid.
                    await engine.abort("to-abort")
        assert chunks[-1].finish is FinishKind.ABORT and chunks[-1].message == "Aborted"
        assert 3 <= chunks[-1].completion_tokens < 1500
        await engine.abort("to-abort")  # ended: unknown now, and harmless
    finally:
        await engine.aclose()
    await assert_sglang_idle(sglang_a.url)


@pytest.mark.parametrize("which", ["cumulative", "incremental"])
async def test_consumer_leaving_mid_stream_frees_the_request_in_sglang(
    sglang_a: RealSglang, sglang_b: RealSglang, which: str
) -> None:
    server = sglang_a if which == "cumulative" else sglang_b
    engine = await _engine(server)
    try:
        async with aclosing(engine.generate(_req(f"leave-{which}", 1500))) as stream:
            async for _ in stream:
                await wait_running(server.url, 1)
                break
        await assert_sglang_idle(server.url)
        assert engine.in_flight == 0
    finally:
        await engine.aclose()


@pytest.mark.parametrize(
    ("sampling", "prompt_ids", "message"),
    [
        (dataclasses.replace(GREEDY, temperature=-1.0), None, "temperature"),
        (GREEDY, [5] * 2100, "context length"),
        (dataclasses.replace(GREEDY, top_p=0.0), None, "top_p"),
        # Under the context but at max_req_input_len: an abort chunk with status 400
        # (and one junk output token), which must not reach a client as output.
        (GREEDY, [5] * 2042, "maximum allowed length"),
    ],
    ids=["temperature", "too-long", "top_p", "input-limit"],
)
async def test_invalid_parameters_are_final_errors_with_sglangs_message(
    sglang_a: RealSglang,
    sampling: SamplingOptions,
    prompt_ids: list[int] | None,
    message: str,
) -> None:
    # fairgate's validation never lets these through; the adapter must still
    # turn SGLang's in-stream error event (HTTP 200, then data: {"error": ...}) into
    # a non-retryable EngineError, not a hang or a retry.
    engine = await _engine(sglang_a)
    try:
        req = EngineRequest(
            "bad",
            prompt_ids or [],
            max_tokens=4,
            prompt_text=None if prompt_ids else PROMPT,
            sampling=sampling,
        )
        with pytest.raises(EngineError) as err:
            await collect(engine, req)
        assert not err.value.retryable and message in str(err.value)
    finally:
        await engine.aclose()
    await assert_sglang_idle(sglang_a.url)


async def test_live_load_from_v1_loads(sglang_a: RealSglang) -> None:
    engine = await _engine(sglang_a)
    try:
        assert (await engine.load()).running_requests == 0
        async with aclosing(engine.generate(_req("load", 1500))) as stream:
            async for _ in stream:
                await wait_running(sglang_a.url, 1)
                load = await engine.load()
                assert load.running_requests == 1 and load.used_kv_tokens > 0
                break
        await assert_sglang_idle(sglang_a.url)
        assert (await engine.load()).used_kv_tokens == 0
    finally:
        await engine.aclose()


async def test_health_takes_a_generation_and_fits_the_default_timeout(
    sglang_a: RealSglang,
) -> None:
    # SGLang's /health runs a one-token generation and sleeps 1 s: a health
    # timeout below that would eject every healthy worker.
    engine = await _engine(sglang_a)
    try:
        assert await engine.health()
        assert not await engine.health(timeout_s=0.2)
        results = await asyncio.gather(*(engine.health() for _ in range(3)))
        assert all(results)
    finally:
        await engine.aclose()


async def test_trace_headers_are_accepted(sglang_a: RealSglang) -> None:
    # SGLang reads traceparent/tracestate only with --enable-trace, which needs the
    # OpenTelemetry SDK that the CPU install lacks: here we check it takes them.
    engine = await _engine(sglang_a)
    try:
        req = _req("traced", 4)
        req.trace_headers = {
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tracestate": "fg=1",
        }
        chunks = await collect(engine, req)
        assert chunks[-1].finish is FinishKind.LENGTH
    finally:
        await engine.aclose()


async def test_sglang_aborts_a_reused_rid_within_two_seconds(sglang_a: RealSglang) -> None:
    # Why the adapter makes up a fresh rid per attempt: the hazard, shown directly.
    body: dict[str, object] = {
        "rid": f"reused-{uuid.uuid4().hex}",
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 2, "temperature": 0.0},
        "stream": True,
    }
    async with aiohttp.ClientSession() as s:
        async with s.post(sglang_a.url + "/generate", json=body) as r:
            await r.read()
        body["sampling_params"] = {"max_new_tokens": 1900, "ignore_eos": True}
        async with s.post(sglang_a.url + "/generate", json=body) as r:
            events = [line async for line in r.content if line.startswith(b"data: {")]
    last = json.loads(events[-1][5:])["meta_info"]
    assert last["finish_reason"]["type"] == "abort" and last["completion_tokens"] < 1900
    await assert_sglang_idle(sglang_a.url)
