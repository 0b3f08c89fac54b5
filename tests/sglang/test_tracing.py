"""Trace context reaches SGLang: its spans join the trace fairgate passed on.

SGLang (with `--enable-trace`) exports its spans by OTLP/HTTP to a receiver in
this test; they must carry the trace id of the `traceparent` fairgate sent,
with SGLang's request span a child of the span named there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass

import pytest
from aiohttp import web
from fairgate import AsyncClient
from fairgate.bench.sglang_cpu import (
    RealSglang,
    SglangUnavailable,
    free_port,
    otel_overlay,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from service.engines.protocol import EngineRequest, SamplingOptions
from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine
from tests.conftest import StartServer
from tests.sglang.test_grpc_service import settings
from tests.telemetry_helpers import make_captured

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN_ID = "b7ad6b7169203331"


@dataclass(frozen=True, slots=True)
class Span:
    trace_id: str
    parent_span_id: str
    name: str


@dataclass(slots=True)
class TracedSglang:
    server: RealSglang
    otlp_port: int


@pytest.fixture(scope="module")
def traced_sglang() -> Iterator[TracedSglang]:
    port = free_port()
    try:
        overlay = otel_overlay()
        server = RealSglang.start(
            "--enable-trace",
            "--otlp-traces-endpoint",
            f"http://127.0.0.1:{port}/v1/traces",
            env={"PYTHONPATH": str(overlay), "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
        )
    except SglangUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield TracedSglang(server, port)
    finally:
        server.stop()


@asynccontextmanager
async def otlp_receiver(port: int) -> AsyncIterator[list[Span]]:
    """An OTLP/HTTP trace endpoint on 127.0.0.1:port collecting spans."""
    spans: list[Span] = []

    async def export(request: web.Request) -> web.Response:
        msg = ExportTraceServiceRequest.FromString(await request.read())
        spans.extend(
            Span(s.trace_id.hex(), s.parent_span_id.hex(), s.name)
            for rs in msg.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        )
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield spans
    finally:
        await runner.cleanup()


async def _spans_of(spans: list[Span], trace_id: str) -> list[Span]:
    """SGLang's spans of one trace, once both its tokenizer process (the request
    span) and its scheduler process (the forward passes) have exported them:
    each exports in batches every 0.5 s."""
    for _ in range(150):
        mine = [s for s in spans if s.trace_id == trace_id]
        names = {s.name.strip().split(" ")[0] for s in mine}
        if {"Req", "prefill_forward"} <= names:
            break
        await asyncio.sleep(0.1)
    return mine


async def test_sglang_spans_join_the_trace_the_adapter_passes(
    traced_sglang: TracedSglang,
) -> None:
    async with otlp_receiver(traced_sglang.otlp_port) as spans:
        engine = SglangHttpEngine(SglangHttpConfig(url=traced_sglang.server.url))
        await engine.start()
        # ignore_eos: the tiny random model may sample its EOS token early.
        req = EngineRequest(
            "traced",
            [],
            max_tokens=4,
            prompt_text="hello",
            sampling=SamplingOptions(ignore_eos=True),
        )
        req.trace_headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"}
        async with aclosing(engine.generate(req)) as stream:
            assert [c async for c in stream][-1].completion_tokens == 4
        await engine.aclose()
        mine = await _spans_of(spans, TRACE_ID)
    (root,) = [s for s in mine if s.name.strip().startswith("Req")]
    assert root.parent_span_id == PARENT_SPAN_ID
    names = {s.name for s in mine}
    assert {"tokenize", "prefill_forward", "decode_loop"} <= names


async def test_one_trace_from_the_client_through_fairgate_into_sglang(
    start_server: StartServer, traced_sglang: TracedSglang
) -> None:
    captured = make_captured()
    app = await start_server(telemetry=captured.telemetry, **settings(traced_sglang.server))
    async with otlp_receiver(traced_sglang.otlp_port) as spans:
        async with AsyncClient(app.address) as c:
            done = await c.complete("hello", max_tokens=4, ignore_eos=True)
        assert done.result.finish_reason == "length"
        (engine_span,) = [s for s in captured.finished() if s.name.startswith("text_completion")]
        context = engine_span.get_span_context()
        mine = await _spans_of(spans, f"{context.trace_id:032x}")
    (root,) = [s for s in mine if s.name.strip().startswith("Req")]
    # SGLang's request span hangs under fairgate's engine-call span.
    assert root.parent_span_id == f"{context.span_id:016x}"
