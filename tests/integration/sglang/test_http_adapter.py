"""fairgate → SGLang HTTP adapter → the SGLang stand-in, all real, on loopback."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import grpc
import pytest
from fairgate import AsyncClient, Delta, FairgateError, Result

from scheduler import rules
from service.engines.protocol import EngineError, EngineRequest, SamplingOptions
from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine
from service.engines.simulator.sglang_wire import INPUT_MARGIN_TOKENS
from tests.conftest import StartServer
from tests.helpers import eventually
from tests.sglang_helpers import StartSim, assert_no_sglang_leaks, sglang_settings


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
async def test_same_tokens_and_text_as_the_inprocess_simulator(
    start_server: StartServer, start_sim: StartSim, incremental: bool
) -> None:
    stand_in = await start_sim(incremental_output=incremental)
    via_http = await start_server(**sglang_settings(stand_in))
    inproc = await start_server()
    cases = [
        dict(max_tokens=40, seed=7),
        dict(max_tokens=25, temperature=0.0),
        dict(max_tokens=30, seed=3, top_k=5, ignore_eos=True),
    ]
    async with AsyncClient(via_http.address) as a, AsyncClient(inproc.address) as b:
        for opts in cases:
            got = await a.complete("fair queueing is", return_token_ids=True, **opts)
            want = await b.complete("fair queueing is", return_token_ids=True, **opts)
            assert got.text == want.text and got.token_ids == want.token_ids, opts
            assert got.result.finish_reason == want.result.finish_reason
            assert got.result.stop_matched == want.result.stop_matched
            assert got.result.usage == want.result.usage
        # Stop strings: never partly streamed, trimmed like the simulator does.
        probe = await b.complete("a stop probe", max_tokens=30, temperature=0.0)
        stop = " " + probe.text.split()[len(probe.text.split()) // 2].strip(".,;:!?")
        got = await a.complete("a stop probe", max_tokens=30, temperature=0.0, stop=[stop])
        want = await b.complete("a stop probe", max_tokens=30, temperature=0.0, stop=[stop])
        assert (got.text, got.result.stop_matched) == (want.text, want.result.stop_matched)
        assert got.result.finish_reason == "stop" and stop not in got.text
        (model,) = await a.list_models()
        assert model.engine == "sglang-http" and model.name == stand_in.model_name
        # SGLang's max_req_input_len: the window where prompts are taken and served in full.
    assert model.max_context_tokens == stand_in.engine.core.max_context - INPUT_MARGIN_TOKENS
    assert via_http.engine.capacity().max_total_tokens == stand_in.engine.core.capacity
    await assert_no_sglang_leaks(via_http, stand_in)


async def test_request_id_priority_and_trace_headers_reach_sglang(start_sim: StartSim) -> None:
    stand_in = await start_sim(enable_priority_scheduling=True)
    engine = SglangHttpEngine(SglangHttpConfig(url=stand_in.url))
    await engine.start()
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    req = EngineRequest(
        request_id="rid-42",
        prompt_token_ids=[300, 301, 302],
        max_tokens=5,
        priority=1,
        trace_headers={"traceparent": traceparent, "tracestate": "fg=1"},
    )
    async with aclosing(engine.generate(req)) as stream:
        chunks = [c async for c in stream]
    assert chunks[-1].completion_tokens == 5 and chunks[-1].prompt_tokens == 3
    body = stand_in.record.requests[-1]
    # A fresh rid, not the client's request id: SGLang aborts by rid, so a client
    # must not be able to name (or collide with) another request's.
    assert body["rid"] != "rid-42" and len(body["rid"]) == 32 and body["priority"] == 1
    assert body["input_ids"] == [300, 301, 302] and body["stream"] is True
    assert stand_in.record.traceparents == [traceparent]
    load = await engine.load()
    assert load.running_requests == 0 and load.used_kv_tokens == 0
    await engine.aclose()


async def test_cancel_mid_stream_aborts_in_sglang(
    start_server: StartServer, start_sim: StartSim
) -> None:
    stand_in = await start_sim(time_scale=1.0)
    app = await start_server(**sglang_settings(stand_in))
    async with AsyncClient(app.address) as c:
        stream = c.generate("cancel me", max_tokens=2000, request_id="cancel-1")
        seen = 0
        async for ev in stream:
            seen += isinstance(ev, Delta)
            if seen == 2:
                break
        await stream.aclose()
    rid = stand_in.record.requests[-1]["rid"]
    await eventually(lambda: rid in stand_in.record.aborted, what="abort_request")
    await assert_no_sglang_leaks(app, stand_in)


async def test_deadline_while_running_aborts_in_sglang(
    start_server: StartServer, start_sim: StartSim
) -> None:
    stand_in = await start_sim(time_scale=1.0)
    app = await start_server(**sglang_settings(stand_in))
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            # Long enough to reach the engine on a loaded machine, far shorter than 2000 tokens.
            await c.complete("slow", max_tokens=2000, timeout_s=2.0, request_id="late-1")
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    rid = stand_in.record.requests[-1]["rid"]
    await eventually(lambda: rid in stand_in.record.aborted, what="abort_request")
    await assert_no_sglang_leaks(app, stand_in)


async def _partial_then_unavailable(app_address: str, **opts: object) -> tuple[int, Result]:
    """Stream until the server fails it: (deltas seen, the partial result)."""
    deltas, result = 0, None
    async with AsyncClient(app_address) as c:
        with pytest.raises(FairgateError) as err:
            async for ev in c.generate("fail me", **opts):  # type: ignore[arg-type]
                if isinstance(ev, Delta):
                    deltas += 1
                else:
                    result = ev
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert result is not None and result.finish_reason == "error"
    assert result.usage.completion_tokens >= deltas > 0
    return deltas, result


async def test_worker_killed_mid_stream(start_server: StartServer, start_sim: StartSim) -> None:
    stand_in = await start_sim(time_scale=1.0)
    app = await start_server(**sglang_settings(stand_in))

    async def kill_after_tokens() -> None:
        await eventually(lambda: stand_in.engine.stats.started == 1, what="request started")
        await eventually(
            lambda: any(r.generated >= 3 for r in stand_in.engine.core.running), what="tokens"
        )
        await stand_in.kill()

    killer = asyncio.create_task(kill_after_tokens())
    _, result = await _partial_then_unavailable(app.address, max_tokens=2000)
    await killer
    assert "connection lost" in result.message or "without [DONE]" in result.message
    await assert_no_sglang_leaks(app)


async def test_stalled_worker_hits_the_read_timeout(
    start_server: StartServer, start_sim: StartSim
) -> None:
    stand_in = await start_sim(time_scale=0.0)
    stand_in.faults.stall_after_chunks = 3
    # One message per SSE event, so the count is exact (coalescing may merge them).
    settings = sglang_settings(stand_in, sglang_read_timeout_s=0.3, stream_coalesce=False)
    app = await start_server(**settings)
    deltas, result = await _partial_then_unavailable(app.address, max_tokens=50)
    assert deltas == 3 and "no data" in result.message
    await assert_no_sglang_leaks(app, stand_in)
    await eventually(lambda: bool(stand_in.record.aborted), what="abort_request")


async def test_silent_before_first_token_is_retried_then_unavailable(
    start_server: StartServer, start_sim: StartSim
) -> None:
    stand_in = await start_sim(time_scale=0.0)
    stand_in.faults.stall_after_chunks = 0
    app = await start_server(**sglang_settings(stand_in, sglang_read_timeout_s=0.3))
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete("never answers", max_tokens=5)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert err.value.retry_after_s is not None
    assert len(stand_in.record.requests) == 2  # one retry before the first token
    await assert_no_sglang_leaks(app, stand_in)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("garble_after_chunks", "malformed JSON"),
        ("truncate_after_chunks", "without [DONE]"),
    ],
)
async def test_malformed_or_truncated_stream_fails_cleanly(
    start_server: StartServer, start_sim: StartSim, fault: str, message: str
) -> None:
    stand_in = await start_sim(time_scale=0.0)
    setattr(stand_in.faults, fault, 4)
    # One message per SSE event, so the count is exact (coalescing may merge them).
    app = await start_server(**sglang_settings(stand_in, stream_coalesce=False))
    deltas, result = await _partial_then_unavailable(app.address, max_tokens=50)
    assert deltas == 4 and message in result.message
    await assert_no_sglang_leaks(app, stand_in)


async def test_chunks_without_meta_info_are_rejected(
    start_server: StartServer, start_sim: StartSim
) -> None:
    stand_in = await start_sim(time_scale=0.0)
    stand_in.faults.drop_meta_info = True
    app = await start_server(**sglang_settings(stand_in))
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete("no meta", max_tokens=5)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert "malformed SGLang chunk" in str(err.value)
    await assert_no_sglang_leaks(app, stand_in)


async def test_full_sglang_queue_is_a_retryable_unavailable(
    start_server: StartServer, start_sim: StartSim
) -> None:
    # --max-queued-requests 0: SGLang refuses every request with an abort chunk, 503.
    stand_in = await start_sim(max_queued_requests=0)
    app = await start_server(**sglang_settings(stand_in))
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete("no room", max_tokens=5)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert err.value.retry_after_s is not None and "503" in str(err.value)
    assert len(stand_in.record.requests) == 2
    await assert_no_sglang_leaks(app, stand_in)


async def test_validation_error_object_is_not_retried(start_sim: StartSim) -> None:
    stand_in = await start_sim()
    engine = SglangHttpEngine(SglangHttpConfig(url=stand_in.url))
    await engine.start()
    too_long = stand_in.engine.core.max_context + 5
    req = EngineRequest("bad-1", [300] * too_long, max_tokens=4, sampling=SamplingOptions())
    with pytest.raises(EngineError) as err:
        async with aclosing(engine.generate(req)) as stream:
            async for _ in stream:
                pass
    assert not err.value.retryable and "context length" in str(err.value)
    assert len(stand_in.record.requests) == 1
    await engine.aclose()


async def test_unreachable_sglang_fails_fast_at_start() -> None:
    engine = SglangHttpEngine(SglangHttpConfig(url="http://127.0.0.1:9", connect_timeout_s=1))
    with pytest.raises(EngineError):
        await engine.start()
    await engine.aclose()


async def test_stand_in_keeps_sglangs_input_limit_and_silent_cap(start_sim: StartSim) -> None:
    # As SGLang 0.5.23 (tests/sglang checks the real one): a prompt of
    # max_req_input_len tokens is refused by the scheduler (an abort chunk with
    # 400 in a stream), and prompt + max_new_tokens is capped at context - 2.
    stand_in = await start_sim()
    engine = SglangHttpEngine(SglangHttpConfig(url=stand_in.url))
    await engine.start()
    window = engine.capacity().max_context_tokens
    assert window == stand_in.engine.core.max_context - INPUT_MARGIN_TOKENS
    req = EngineRequest("limit", [300] * window, max_tokens=1)
    with pytest.raises(EngineError) as err:
        async with aclosing(engine.generate(req)) as stream:
            async for _ in stream:
                pass
    assert not err.value.retryable and "maximum allowed length" in str(err.value)
    context = stand_in.engine.core.max_context
    req = EngineRequest("cap", [300] * (window - 1), max_tokens=context - window + 1)
    req.sampling = SamplingOptions(ignore_eos=True)
    async with aclosing(engine.generate(req)) as stream:
        chunks = [c async for c in stream]
    assert chunks[-1].finish is not None
    assert chunks[-1].completion_tokens == context - 2 - (window - 1)
    await engine.aclose()


@pytest.mark.parametrize("policy", ["vtc", "fcfs"])
async def test_light_tenants_requests_reach_sglang_with_a_higher_priority(
    start_server: StartServer, start_sim: StartSim, policy: str
) -> None:
    # One engine slot: the tenant's first request is admitted at once (its tenant
    # light), the next ones while 6 and 5 are queued (heavy), the rest while at
    # most rules.LIGHT_QUEUE = 4 are (light again). The baselines mark nothing light.
    # fair_isolation=reserve: priorities within the stand-in's preemption threshold.
    stand_in = await start_sim(
        enable_priority_scheduling=True, time_scale=0.2, max_running_requests=1
    )
    app = await start_server(**sglang_settings(stand_in), policy=policy, fair_isolation="reserve")
    async with AsyncClient(app.address, tenant="t") as c:
        # Long enough (~1 s) for the others to queue behind it.
        first = asyncio.create_task(c.complete([300] * 4, max_tokens=600, ignore_eos=True))
        await eventually(lambda: len(stand_in.record.requests) == 1, what="the first request")
        rest = [
            asyncio.create_task(c.complete([300] * 4, max_tokens=4, ignore_eos=True))
            for _ in range(6)
        ]
        model = app.models.resolve("")
        assert model is not None
        await eventually(lambda: model.dispatcher.stats().queued == 6, what="6 queued")
        await asyncio.gather(first, *rest)
    sent = [body["priority"] for body in stand_in.record.requests]
    light, heavy = rules.engine_priority(False, True, 10), rules.engine_priority(False, False, 10)
    if policy == "vtc":
        assert sent == [light, heavy, heavy, light, light, light, light]
    else:
        assert sent == [heavy] * 7


async def test_a_light_tenant_goes_beyond_a_full_engine_which_retracts_a_flood_request(
    start_server: StartServer, start_sim: StartSim
) -> None:
    # fair_isolation=auto with a stand-in that preempts above 10 (SGLang's
    # default): a flood fills both slots and queues more; a light tenant's
    # request is admitted beyond the room (1/8 of 2 slots lent: 1) with a
    # priority above the threshold, and the engine retracts a flood request.
    stand_in = await start_sim(
        enable_priority_scheduling=True, time_scale=0.2, max_running_requests=2
    )
    app = await start_server(**sglang_settings(stand_in))
    model = app.models.resolve("")
    assert model is not None and model.preempt_threshold == 10
    async with (
        AsyncClient(app.address, tenant="flood") as f,
        AsyncClient(app.address, tenant="light") as v,
    ):
        flood = [
            asyncio.create_task(f.complete([300] * 4, max_tokens=2000, ignore_eos=True))
            for _ in range(8)
        ]
        await eventually(lambda: model.dispatcher.stats().queued == 6, what="the flood queued")
        await eventually(lambda: len(stand_in.engine.core.running) == 2, what="flood running")
        light = await v.complete([300] * 4, max_tokens=4, ignore_eos=True)
        # It ran while both flood requests still held their slots in fairgate.
        assert model.dispatcher.stats().queued == 6
        assert stand_in.engine.core.preemptions == 1
        assert model.dispatcher.stats().lent_total == 1
        assert light.result.usage.completion_tokens == 4
        for task in flood:  # what follows is the flood's (and SGLang's) business
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
    # The flood's first two went light (its queue was short then), within the
    # threshold; the light tenant's went lent, above it.
    sent = [body["priority"] for body in stand_in.record.requests]
    light_p = rules.engine_priority(False, True, 10, prompt_tokens=4)
    lent_p = rules.engine_priority(False, True, 10, lent=True, prompt_tokens=4)
    assert sent == [light_p, light_p, lent_p]
    await assert_no_sglang_leaks(app, stand_in)
