"""The fast OTLP span encoder writes exactly the bytes of the SDK's encoder."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from service.telemetry.otlp import encode_request, encode_spans


def _spans() -> list[ReadableSpan]:
    out = InMemorySpanExporter()
    resource = Resource.create({"service.name": "fairgate", "deployment": "test"})
    providers = [TracerProvider(resource=resource), TracerProvider(resource=Resource({}))]
    for p in providers:
        p.add_span_processor(SimpleSpanProcessor(out))
    tracer = providers[0].get_tracer("fairgate.service", "1.2", schema_url="https://x/s")
    other = providers[1].get_tracer("other")
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1"), ("k", "x")]),
    )
    parent_ctx = set_span_in_context(NonRecordingSpan(remote))
    attrs = {
        "rpc.system": "grpc",
        "fairgate.tenant": "team-ä",
        "n": 12,
        "neg": -5,
        "zero": 0,
        "big": 2**62,
        "f": 0.25,
        "t": True,
        "no": False,
        "empty": "",
        "reasons": ("length",),
        "ints": [1, 2, 3],
        "long": "x" * 300,
        "bytes": b"\x00\x01",
    }
    server = tracer.start_span("fairgate.v1.InferenceService/Generate", parent_ctx, SpanKind.SERVER)
    server.set_attributes(attrs)
    server.add_event("gen_ai.first_token")
    server.add_event("gen_ai.content.prompt", {"gen_ai.prompt": "hi"})
    child = tracer.start_span(
        "text_completion m",
        set_span_in_context(server),
        SpanKind.CLIENT,
        {"gen_ai.request.model": "m"},
        links=[Link(remote, {"why": "retry"})],
    )
    child.set_status(Status(StatusCode.ERROR, "engine failed"))
    child.end()
    server.set_status(Status(StatusCode.OK))
    server.end()
    for kind in SpanKind:
        s = other.start_span(f"k-{kind.name}", kind=kind)
        s.end()
    tracer.start_span("").end()
    return list(out.get_finished_spans())


def test_same_bytes_as_the_sdk_encoder() -> None:
    spans = _spans()
    assert encode_spans(spans) == sdk_encode(spans).SerializeToString()
    # Twice: the second time from the key-value cache.
    assert encode_spans(spans) == sdk_encode(spans).SerializeToString()
    assert encode_request(spans) == sdk_encode(spans)
    assert encode_spans([]) == sdk_encode([]).SerializeToString()


def test_interleaved_resources_keep_the_sdk_order() -> None:
    spans = _spans()
    mixed = [spans[0], spans[3], spans[1], spans[4], spans[-1]]
    assert encode_spans(mixed) == sdk_encode(mixed).SerializeToString()
