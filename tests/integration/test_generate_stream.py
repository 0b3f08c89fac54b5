"""Streaming generation over a real grpc.aio server with the real stubs."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from fairgate import AsyncClient, Client, Delta, FairgateError, Result
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc

from service.app import App
from tests.helpers import assert_no_leaks, eventually, sim


async def test_streams_deltas_then_one_result_with_usage(client: AsyncClient, server: App) -> None:
    events = [ev async for ev in client.generate("Tell me about fair queueing.", max_tokens=40)]
    deltas = [e for e in events if isinstance(e, Delta)]
    results = [e for e in events if isinstance(e, Result)]
    assert len(results) == 1 and events[-1] is results[0]
    result = results[0]
    assert result.finish_reason == "length"
    prompt_tokens, _ = await client.count_tokens("Tell me about fair queueing.")
    assert result.usage.prompt_tokens == prompt_tokens
    assert result.usage.completion_tokens == 40
    assert result.usage.total_tokens == prompt_tokens + 40
    # Indices are contiguous token offsets into the completion.
    assert deltas[0].index == 0
    text = "".join(d.text for d in deltas)
    assert text.strip()
    assert result.timings.time_to_first_token_s is not None
    assert 0 <= result.timings.queue_wait_s <= result.timings.total_s
    assert result.model == server.models.default
    await assert_no_leaks(server)


async def test_token_ids_in_and_out(client: AsyncClient, server: App) -> None:
    comp = await client.complete([17, 18, 19, 20], max_tokens=25, return_token_ids=True)
    assert comp.result.usage.prompt_tokens == 4
    assert len(comp.token_ids) == comp.result.usage.completion_tokens == 25


async def test_a_repeated_prompt_reports_the_engine_cached_tokens(client: AsyncClient) -> None:
    # The simulator's prefix cache matches all but the last prompt token, as SGLang.
    prompt = [4000 + 7 * i for i in range(64)]
    first = await client.complete(prompt, max_tokens=3)
    again = await client.complete(prompt, max_tokens=3)
    assert first.result.usage.cached_tokens == 0
    assert again.result.usage.cached_tokens == 63


async def test_request_id_is_echoed(client: AsyncClient) -> None:
    comp = await client.complete("hello", max_tokens=3, request_id="req-abc_1")
    assert comp.result.request_id == "req-abc_1"
    auto = await client.complete("hello", max_tokens=3)
    assert len(auto.result.request_id) >= 16


async def test_stop_string_ends_stream_and_is_not_emitted(client: AsyncClient) -> None:
    # Greedy decoding is deterministic per prompt: find a word it emits, then stop on it.
    probe = await client.complete("a stop probe", max_tokens=30, temperature=0.0)
    words = probe.text.split()
    stop = " " + words[len(words) // 2].strip(".,;:!?")
    comp = await client.complete("a stop probe", max_tokens=30, temperature=0.0, stop=[stop])
    assert comp.result.finish_reason == "stop"
    assert comp.result.stop_matched == stop
    assert stop not in comp.text
    assert probe.text.startswith(comp.text)


async def test_same_seed_same_text(client: AsyncClient) -> None:
    a = await client.complete("seeded", max_tokens=20, seed=7)
    b = await client.complete("seeded", max_tokens=20, seed=7)
    assert a.text == b.text


async def test_many_concurrent_streams_all_complete(client: AsyncClient, server: App) -> None:
    async def one(i: int) -> int:
        comp = await client.complete(f"prompt {i}", max_tokens=16 + i % 7)
        return comp.result.usage.completion_tokens

    got = await asyncio.gather(*(one(i) for i in range(64)))
    assert got == [16 + i % 7 for i in range(64)]
    await assert_no_leaks(server)


async def test_cancel_mid_stream_aborts_engine_request(start_server) -> None:  # type: ignore[no-untyped-def]
    app = await start_server(sim_time_scale=1.0)
    async with AsyncClient(app.address) as c:
        stream = c.generate("cancel me", max_tokens=2000)
        seen = 0
        async for ev in stream:
            if isinstance(ev, Delta):
                seen += 1
            if seen == 2:
                break
        await stream.aclose()  # cancels the RPC
    await eventually(lambda: sim(app).stats.aborted == 1, what="engine abort")
    await assert_no_leaks(app)


async def test_deadline_while_running(start_server) -> None:  # type: ignore[no-untyped-def]
    app = await start_server(sim_time_scale=1.0)
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete("slow", max_tokens=2000, timeout_s=0.3)
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    await eventually(lambda: sim(app).stats.aborted == 1, what="engine abort")
    await assert_no_leaks(app)


async def test_deadline_while_queued_never_reaches_engine(start_server) -> None:  # type: ignore[no-untyped-def]
    # One engine slot: the second request waits in the gateway queue.
    app = await start_server(sim_time_scale=1.0, sim_max_running_requests=1)
    async with AsyncClient(app.address) as c:
        hog = asyncio.create_task(c.complete("hog", max_tokens=2000))
        await eventually(lambda: sim(app).stats.started == 1, what="hog admitted")
        with pytest.raises(FairgateError) as err:
            await c.complete("queued", max_tokens=5, timeout_s=0.3)
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        model = app.models.resolve("")
        assert model is not None
        await eventually(lambda: model.dispatcher.queued == 0, what="dequeue")
        assert sim(app).stats.started == 1  # the queued one never reached the engine
        hog.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hog
    await assert_no_leaks(app)


async def test_sync_client(server: App) -> None:
    def run() -> tuple[str, str]:
        with Client(server.address) as c:
            comp = c.complete("sync hello", max_tokens=5)
            models = c.list_models()
            return comp.result.finish_reason, models[0].name

    finish, name = await asyncio.to_thread(run)
    assert finish == "length"
    assert name == server.models.default


async def test_raw_stub_from_generated_code(server: App) -> None:
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)
        req = pb.GenerateRequest(text="raw stub", sampling=pb.SamplingParams(max_tokens=4))
        call = stub.Generate(req)
        msgs = [m async for m in call]
        md = await call.initial_metadata()
    assert msgs[-1].HasField("result")
    assert msgs[-1].result.usage.completion_tokens == 4
    assert dict(md)["x-request-id"] == msgs[-1].result.request_id
