"""The OpenAI-compatible HTTP front, driven by the official `openai` SDK against a
real fairgate server (simulated engine) on loopback."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import httpx2
import openai
import pytest
from fairgate import AsyncClient
from fairgate.types import Delta
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import admin_pb2_grpc as apb_grpc
from opentelemetry.trace import SpanKind, StatusCode

from scheduler.quotas import TenantUsage
from service.app import App
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, eventually, sim
from tests.redis_server import RedisServer, find_redis_server
from tests.telemetry_helpers import make_captured
from tests.tls_certs import make_certs

ADMIN_TOKEN = "test-admin-token-0123456789"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TENANTS = """
default_tenant: free
tenants:
  - id: free
  - id: limited
    quotas: {requests_per_s: 2, requests_burst: 1}
  - id: metered
    quotas: {tokens_per_min: 60, tokens_burst: 100000}
  - id: metered2
    quotas: {tokens_per_min: 60, tokens_burst: 100000}
  - id: solo
    quotas: {max_concurrent: 1, tokens_per_min: 60, tokens_burst: 100000}
  - id: interactive-only
    priorities: [interactive]
"""


@pytest.fixture
async def http_app(start_server: StartServer, tmp_path: Path) -> App:
    (tmp_path / "chat.jinja").write_text(CHATML)
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    return await start_server(
        http_listen="127.0.0.1:0",
        chat_template_path=str(tmp_path / "chat.jinja"),
        tenants_file=str(tmp_path / "tenants.yaml"),
        sim_time_scale=0.05,
    )


def client(app: App, *, key: str = "unused", tenant: str = "", **kw: Any) -> openai.AsyncOpenAI:
    assert app.http is not None
    headers = {"x-fairgate-tenant": tenant} if tenant else None
    return openai.AsyncOpenAI(base_url=app.http.url, api_key=key, default_headers=headers, **kw)


def usage_of(app: App, tenant: str) -> TenantUsage:
    model = app.models.resolve("")
    assert model is not None
    usage = model.dispatcher.quotas.usage(tenant)
    assert usage is not None
    return usage


async def issue_key(app: App, tenant: str) -> str:
    async with grpc.aio.insecure_channel(app.address) as ch:
        resp = await apb_grpc.AdminServiceStub(ch).IssueApiKey(
            apb.IssueApiKeyRequest(tenant_id=tenant),
            metadata=(("authorization", f"Bearer {ADMIN_TOKEN}"),),
        )
    return str(resp.secret)


async def test_chat_streams_with_usage_and_matches_the_grpc_prompt(http_app: App) -> None:
    messages: Any = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
    ]
    async with client(http_app) as oai:
        stream = await oai.chat.completions.create(
            model=http_app.models.default,
            messages=messages,
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 7
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    # The template rendered the conversation: the same prompt over gRPC counts the same.
    rendered = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello there<|im_end|>\n"
    async with AsyncClient(http_app.address) as c:
        count, _ = await c.count_tokens(rendered + "<|im_start|>assistant\n")
    assert last.usage.prompt_tokens == count
    await assert_no_leaks(http_app)


async def test_non_streaming_chat_and_completion(http_app: App) -> None:
    async with client(http_app) as oai:
        chat = await oai.chat.completions.create(
            model=http_app.models.default,
            messages=[{"role": "user", "content": "hi"}],
            max_completion_tokens=5,
            temperature=0.5,
            top_p=0.9,
            seed=3,
            stop=["never-matches"],
            user="someone",
        )
        comp = await oai.completions.create(
            model=http_app.models.default, prompt="once upon a time", max_tokens=4
        )
        models = await oai.models.list()
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    assert comp.object == "text_completion" and comp.choices[0].text
    assert comp.usage is not None and comp.usage.completion_tokens == 4
    assert [m.id for m in models.data] == [http_app.models.default]
    await assert_no_leaks(http_app)


async def test_a_repeated_prompt_reports_cached_prompt_tokens(http_app: App) -> None:
    prompt = "a prompt the prefix cache keeps for the second time it is sent"
    async with client(http_app) as oai:
        first, again = [
            await oai.completions.create(model=http_app.models.default, prompt=prompt, max_tokens=2)
            for _ in range(2)
        ]
    assert first.usage is not None and again.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": 3.5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 2}, "n"),
        ({"stop": [""]}, "stop"),
        ({"extra_body": {"priority": "urgent"}}, "priority"),
        ({"messages": []}, "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
    ],
)
async def test_bad_requests_are_400_with_the_param(
    http_app: App, kwargs: dict[str, Any], param: str
) -> None:
    args: dict[str, Any] = {
        "model": http_app.models.default,
        "messages": [{"role": "user", "content": "hi"}],
        **kwargs,
    }
    async with client(http_app, max_retries=0) as oai:
        with pytest.raises(openai.BadRequestError) as err:
            await oai.chat.completions.create(**args)
    body: Any = err.value.body
    assert body["param"] == param and body["type"] == "invalid_request_error"
    assert sim(http_app).stats.started == 0
    await assert_no_leaks(http_app)


async def test_unknown_model_is_404_and_bad_json_is_400(http_app: App) -> None:
    async with client(http_app, max_retries=0) as oai:
        with pytest.raises(openai.NotFoundError) as err:
            await oai.completions.create(model="gpt-17", prompt="hi")
    body: Any = err.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert http_app.http is not None
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{http_app.http.url}/completions", data=b"{not json") as r:
            assert r.status == 400
            assert (await r.json())["error"]["param"] == "body"
        async with s.get(f"{http_app.http.url}/nothing-here") as r:
            assert r.status == 404 and "error" in await r.json()
        async with s.get(http_app.http.url.removesuffix("/v1") + "/health") as r:
            assert r.status == 200


async def test_quota_429_carries_retry_after_and_the_sdk_retries(http_app: App) -> None:
    async with client(http_app, tenant="limited", max_retries=0) as oai:
        await oai.completions.create(model=http_app.models.default, prompt="a", max_tokens=1)
        with pytest.raises(openai.RateLimitError) as err:
            await oai.completions.create(
                model=http_app.models.default, prompt="b", max_tokens=1, stream=True
            )
    headers = err.value.response.headers
    # 2 requests/s: the bucket refills within half a second.
    assert headers["retry-after"] == "1" and 0 < int(headers["retry-after-ms"]) <= 500
    body: Any = err.value.body
    assert body["code"] == "quota_exceeded" and body["type"] == "rate_limit_error"
    rejected = usage_of(http_app, "limited").rejected_total
    async with client(http_app, tenant="limited", max_retries=3) as oai:
        raw = await oai.completions.with_raw_response.create(
            model=http_app.models.default, prompt="c", max_tokens=1
        )
    # The SDK waited as told and succeeded on a retry; the server refused the first try.
    assert raw.retries_taken >= 1
    assert usage_of(http_app, "limited").rejected_total == rejected + raw.retries_taken
    assert raw.parse().choices[0].finish_reason == "length"
    await assert_no_leaks(http_app)


async def test_keys_401_and_tenant_refusals_403(start_server: StartServer, tmp_path: Path) -> None:
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    app = await start_server(
        http_listen="127.0.0.1:0",
        tenants_file=str(tmp_path / "tenants.yaml"),
        admin_token=ADMIN_TOKEN,
    )
    key = await issue_key(app, "interactive-only")
    model = app.models.default
    async with client(app, key="fg_not-a-real-key", max_retries=0) as oai:
        with pytest.raises(openai.AuthenticationError) as err:
            await oai.models.list()
        assert err.value.code == "api_key_invalid"
    async with client(app, key=key, tenant="free", max_retries=0) as oai:
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await oai.completions.create(model=model, prompt="hi", max_tokens=1)
        assert denied.value.code == "tenant_mismatch"
    async with client(app, key=key, max_retries=0) as oai:
        with pytest.raises(openai.PermissionDeniedError) as prio:
            await oai.completions.create(
                model=model,
                prompt="hi",
                max_tokens=1,
                extra_headers={"x-fairgate-priority": "batch"},
            )
        assert prio.value.code == "priority_not_allowed"
        ok = await oai.completions.create(model=model, prompt="hi", max_tokens=1)
    assert ok.usage is not None and ok.usage.completion_tokens == 1
    assert usage_of(app, "interactive-only").finished_total == 1
    # No key at all, now that keys exist: 401 before anything else.
    assert app.http is not None
    async with aiohttp.ClientSession() as s, s.get(f"{app.http.url}/models") as r:
        assert r.status == 401 and (await r.json())["error"]["code"] == "api_key_required"
    await assert_no_leaks(app)


def _settled_after_cancel(usage: TenantUsage, prompt_tokens: int, max_tokens: int) -> None:
    """What a cancel mid-stream leaves: one settled request, nothing open, and
    only the tokens produced charged (the rest of max_tokens refunded); nothing
    in flight (`assert_no_leaks`)."""
    assert usage.open_reservations == 0 and usage.queued == 0
    assert usage.finished_total == 1
    produced = usage.charged_tokens - prompt_tokens
    assert 1 <= produced < max_tokens


async def test_disconnect_mid_stream_aborts_and_settles_like_a_grpc_cancel(
    http_app: App,
) -> None:
    max_tokens = 5000
    async with client(http_app, tenant="metered") as oai:
        stream = await oai.completions.create(
            model=http_app.models.default, prompt=[17] * 8, max_tokens=max_tokens, stream=True
        )
        got = 0
        async for _ in stream:
            got += 1
            if got == 3:
                break
        await stream.close()  # closes the connection
    await eventually(lambda: sim(http_app).stats.aborted == 1, what="engine abort")
    await assert_no_leaks(http_app)
    _settled_after_cancel(usage_of(http_app, "metered"), 8, max_tokens)
    # The gRPC cancel of the same request leaves the same state.
    async with AsyncClient(http_app.address, tenant="metered2") as c:
        events = c.generate([17] * 8, max_tokens=max_tokens)
        async for ev in events:
            if isinstance(ev, Delta) and ev.index >= 2:
                break
        await events.aclose()
    await eventually(lambda: sim(http_app).stats.aborted == 2, what="engine abort")
    await assert_no_leaks(http_app)
    _settled_after_cancel(usage_of(http_app, "metered2"), 8, max_tokens)


async def test_disconnect_while_queued_dequeues_and_charges_nothing(http_app: App) -> None:
    model = http_app.models.resolve("")
    assert model is not None
    d = model.dispatcher
    async with AsyncClient(http_app.address, tenant="solo") as c:
        hog = asyncio.create_task(c.complete([17] * 8, max_tokens=5000))
        await eventually(lambda: d.in_flight == 1, what="the hog running")
        charged = usage_of(http_app, "solo").charged_tokens
        async with client(http_app, tenant="solo", max_retries=0, timeout=0.5) as oai:
            with pytest.raises(openai.APITimeoutError):
                await oai.completions.create(
                    model=http_app.models.default, prompt="queued", max_tokens=10, stream=True
                )
        await eventually(lambda: d.queued == 0, what="the queued request dequeued")
        usage = usage_of(http_app, "solo")
        assert usage.queued == 0 and usage.open_reservations == 1  # the hog's
        assert usage.charged_tokens == charged
        hog.cancel()
    await assert_no_leaks(http_app)
    assert usage_of(http_app, "solo").open_reservations == 0


async def test_store_down_closed_is_503_with_retry_after(start_server: StartServer) -> None:
    binary = find_redis_server()
    assert binary is not None
    redis = RedisServer(binary)
    redis.start()
    try:
        app = await start_server(
            http_listen="127.0.0.1:0",
            store="redis",
            redis_url=redis.url,
            redis_failure_mode="closed",
            redis_retry_s=0.1,
            redis_timeout_s=0.3,
        )
        async with client(app, max_retries=0) as oai:
            ok = await oai.completions.create(model=app.models.default, prompt="hi", max_tokens=1)
            assert ok.choices[0].finish_reason == "length"
            redis.kill()
            with pytest.raises(openai.InternalServerError) as err:
                await oai.completions.create(model=app.models.default, prompt="hi", max_tokens=1)
    finally:
        redis.stop()
    assert err.value.status_code == 503
    assert err.value.response.headers.get("retry-after")
    body: Any = err.value.body
    assert body["type"] == "service_unavailable_error" and body["code"] == "store_unavailable"


async def test_traceparent_parents_the_server_span_and_429_is_not_a_span_error(
    start_server: StartServer, tmp_path: Path
) -> None:
    cap = make_captured()
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    app = await start_server(
        telemetry=cap.telemetry,
        http_listen="127.0.0.1:0",
        tenants_file=str(tmp_path / "tenants.yaml"),
    )
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    parent = f"00-{trace_id}-b7ad6b7169203331-01"
    async with client(app, tenant="limited", max_retries=0) as oai:
        await oai.completions.create(
            model=app.models.default,
            prompt="hi",
            max_tokens=2,
            extra_headers={"traceparent": parent},
        )
        with pytest.raises(openai.RateLimitError):
            await oai.completions.create(model=app.models.default, prompt="hi", max_tokens=2)
    name = "POST /v1/completions"
    await eventually(lambda: len(cap.finished(name)) == 2, what="server spans")
    ok, refused = cap.finished(name)
    assert f"{ok.context.trace_id:032x}" == trace_id and ok.kind is SpanKind.SERVER
    engine = [s for s in cap.finished() if s.name.startswith("text_completion")]
    assert len(engine) == 1 and engine[0].parent is not None
    assert engine[0].parent.span_id == ok.context.span_id
    assert ok.attributes is not None and ok.attributes["fairgate.tenant"] == "limited"
    assert refused.status.status_code is not StatusCode.ERROR
    assert refused.attributes is not None
    assert refused.attributes["fairgate.rejection.reason"] == "QUOTA_EXCEEDED"
    assert cap.value("fairgate.rejections", {"fairgate.tenant": "limited"}) == 1


async def test_oversized_body_is_400_not_413(http_app: App) -> None:
    assert http_app.http is not None
    limit = http_app.settings.max_request_bytes
    big = b'{"prompt": "' + b"a" * limit + b'"}'
    huge = b'{"prompt": "' + b"a" * http_app.settings.max_receive_message_bytes + b'"}'
    async with aiohttp.ClientSession() as s:
        for body in (big, huge):
            async with s.post(f"{http_app.http.url}/completions", data=body) as r:
                assert r.status == 400
                err = (await r.json())["error"]
                assert err["param"] == "body" and f"the limit is {limit}" in err["message"]
    assert sim(http_app).stats.started == 0


async def test_stop_lets_streams_in_flight_finish(start_server: StartServer) -> None:
    app = await start_server(http_listen="127.0.0.1:0", sim_time_scale=0.2, shutdown_grace_s=10.0)
    async with client(app, max_retries=0) as oai:
        stream = await oai.completions.create(
            model=app.models.default,
            prompt="drain me",
            max_tokens=60,
            stream=True,
            stream_options={"include_usage": True},
        )
        first = await anext(aiter(stream))
        stopping = asyncio.create_task(app.stop())
        rest = [c async for c in stream]
        await stopping
    assert rest[-2].choices[0].finish_reason == "length"
    assert rest[-1].usage is not None and rest[-1].usage.completion_tokens == 60
    assert first.choices[0].text
    assert sim(app).stats.aborted == 0


async def test_tls_and_mutual_tls_on_the_http_port(
    start_server: StartServer, tmp_path: Path
) -> None:
    certs = make_certs(tmp_path)
    app = await start_server(
        http_listen="localhost:0",
        tls_cert_file=certs.server_cert,
        tls_key_file=certs.server_key,
        tls_client_ca_file=certs.ca,
    )
    assert app.http is not None and app.http.url.startswith("https://")
    trusted = ssl.create_default_context(cafile=certs.ca)
    with_cert = ssl.create_default_context(cafile=certs.ca)
    with_cert.load_cert_chain(certs.client_cert, certs.client_key)
    async with (
        httpx2.AsyncClient(verify=with_cert) as http,
        client(app, max_retries=0, http_client=http) as oai,
    ):
        done = await oai.completions.create(model=app.models.default, prompt="hi", max_tokens=2)
    assert done.usage is not None and done.usage.completion_tokens == 2
    # No client certificate: the handshake fails, nothing reaches the engine.
    async with (
        httpx2.AsyncClient(verify=trusted) as http,
        client(app, max_retries=0, http_client=http) as oai,
    ):
        with pytest.raises(openai.APIConnectionError):
            await oai.completions.create(model=app.models.default, prompt="hi", max_tokens=2)
    assert sim(app).stats.started == 1
