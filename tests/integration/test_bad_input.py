"""Bad input gets INVALID_ARGUMENT with BadRequest details, and loses nothing."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from fairgate import AsyncClient, FairgateError
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.app import App
from tests.helpers import assert_no_leaks, sim

CASES: list[tuple[str, Any, dict[str, Any], str]] = [
    # (case id, prompt, options, field expected in BadRequest)
    ("empty prompt", "", {}, "text"),
    ("blank prompt", "   \n", {}, "text"),
    ("empty token ids", [], {}, "token_ids.ids"),
    ("token id out of vocabulary", [5, 10**9], {}, "token_ids.ids[1]"),
    ("max_tokens zero", "hi", {"max_tokens": 0}, "sampling.max_tokens"),
    ("max_tokens negative", "hi", {"max_tokens": -5}, "sampling.max_tokens"),
    ("max_tokens beyond output cap", "hi", {"max_tokens": 10**6}, "sampling.max_tokens"),
    ("unknown model", "hi", {"model": "gpt-17"}, "model"),
    ("temperature too high", "hi", {"temperature": 3.5}, "sampling.temperature"),
    ("temperature negative", "hi", {"temperature": -0.1}, "sampling.temperature"),
    ("top_p zero", "hi", {"top_p": 0.0}, "sampling.top_p"),
    ("top_p above one", "hi", {"top_p": 1.5}, "sampling.top_p"),
    ("top_k zero", "hi", {"top_k": 0}, "sampling.top_k"),
    ("top_k below -1", "hi", {"top_k": -7}, "sampling.top_k"),
    ("empty stop string", "hi", {"stop": [""]}, "sampling.stop[0]"),
    ("too many stop strings", "hi", {"stop": [f"s{i}" for i in range(17)]}, "sampling.stop"),
    ("request id not printable", "hi", {"request_id": "bad\nid"}, "request_id"),
    ("request id too long", "hi", {"request_id": "x" * 200}, "request_id"),
]


@pytest.mark.parametrize(
    ("prompt", "options", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_rejected_with_field_violation(
    client: AsyncClient, server: App, prompt: Any, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(FairgateError) as err:
        await client.complete(prompt, **options)
    exc = err.value
    assert exc.code == grpc.StatusCode.INVALID_ARGUMENT
    # An unknown model has its own reason (HTTP maps it to 404 model_not_found).
    assert exc.reason == ("MODEL_NOT_FOUND" if field == "model" else "INVALID_ARGUMENT")
    assert field in [f for f, _ in exc.field_violations], exc.field_violations
    assert all(desc for _, desc in exc.field_violations)
    # Nothing reached the engine, nothing is held, and the server still serves.
    assert sim(server).stats.started == 0
    await assert_no_leaks(server)
    ok = await client.complete("still healthy?", max_tokens=2)
    assert ok.result.finish_reason == "length"


async def test_count_tokens_refuses_an_unknown_model_as_generate_does(
    client: AsyncClient,
) -> None:
    with pytest.raises(FairgateError) as err:
        await client.count_tokens("hi", model="gpt-17")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.reason == "MODEL_NOT_FOUND"
    assert [f for f, _ in err.value.field_violations] == ["model"]


async def test_prompt_plus_max_tokens_beyond_context(client: AsyncClient, server: App) -> None:
    ctx = (await client.list_models())[0].max_context_tokens
    prompt = [17] * (ctx - 10)
    with pytest.raises(FairgateError) as err:
        await client.complete(prompt, max_tokens=100)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    (violation,) = err.value.field_violations
    assert violation[0] == "sampling.max_tokens"
    assert "context" in violation[1]
    await assert_no_leaks(server)


async def test_prompt_filling_the_context_is_refused(client: AsyncClient) -> None:
    ctx = (await client.list_models())[0].max_context_tokens
    with pytest.raises(FairgateError) as err:
        await client.complete([17] * ctx)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.field_violations[0][0] == "token_ids"


async def test_all_violations_reported_at_once(client: AsyncClient) -> None:
    with pytest.raises(FairgateError) as err:
        await client.complete("hi", max_tokens=0, temperature=9.0, top_k=0)
    fields = {f for f, _ in err.value.field_violations}
    assert fields == {"sampling.max_tokens", "sampling.temperature", "sampling.top_k"}


async def test_oversized_message_gets_invalid_argument(start_server) -> None:  # type: ignore[no-untyped-def]
    app = await start_server(max_request_bytes=64 * 1024, max_receive_message_bytes=1 << 20)
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete("word " * 20_000, max_tokens=4)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "limit" in err.value.field_violations[0][1]
    await assert_no_leaks(app)


async def test_beyond_transport_limit_is_refused_and_server_survives(start_server) -> None:  # type: ignore[no-untyped-def]
    app = await start_server(max_request_bytes=64 * 1024, max_receive_message_bytes=128 * 1024)
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete("word " * 60_000, max_tokens=4)
        # gRPC refuses it before our code sees it; the server keeps serving.
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (await c.complete("small", max_tokens=2)).result.usage.completion_tokens == 2
    await assert_no_leaks(app)


async def test_unknown_priority_enum_value(server: App) -> None:
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)
        req = pb.GenerateRequest(text="hi", priority=42)  # type: ignore[arg-type]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.Generate(req):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        health = health_pb2_grpc.HealthStub(ch)
        resp = await health.Check(health_pb2.HealthCheckRequest())
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_count_tokens_unknown_model(client: AsyncClient) -> None:
    with pytest.raises(FairgateError) as err:
        await client.count_tokens("hello", model="nope")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.field_violations[0][0] == "model"
