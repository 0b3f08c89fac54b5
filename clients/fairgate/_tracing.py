"""Client spans: when the application configured OpenTelemetry, each call gets a
CLIENT span and its W3C context travels in the call's metadata (traceparent),
so a trace starts at the caller. Without a configured SDK this costs a no-op span.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from fairgate.errors import FairgateError
from fairgate.types import Result

SERVICE = "fairgate.v1.InferenceService"
_TRACER = trace.get_tracer("fairgate.client")
# Codes the caller caused (or a quota): the span is not an error.
_CALLER_CODES = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
    }
)

Metadata = Sequence[tuple[str, str]]


class CallSpan:
    __slots__ = ("span",)

    def __init__(self, method: str, model: str = "") -> None:
        attributes: dict[str, str] = {
            "rpc.system": "grpc",
            "rpc.service": SERVICE,
            "rpc.method": method,
        }
        if method == "Generate":
            attributes["gen_ai.operation.name"] = "text_completion"
            attributes["gen_ai.request.model"] = model
        self.span = _TRACER.start_span(
            f"{SERVICE}/{method}", kind=SpanKind.CLIENT, attributes=attributes
        )

    def metadata(self, base: Metadata) -> tuple[tuple[str, str], ...]:
        """`base` plus traceparent/tracestate for this span (nothing added when not traced)."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier, trace.set_span_in_context(self.span))
        return (*base, *carrier.items())

    def result(self, result: Result) -> None:
        if not self.span.is_recording():
            return
        self.span.set_attributes(
            {
                "gen_ai.response.id": result.request_id,
                "gen_ai.response.model": result.model,
                "gen_ai.response.finish_reasons": (result.finish_reason,),
                "gen_ai.usage.input_tokens": result.usage.prompt_tokens,
                "gen_ai.usage.output_tokens": result.usage.completion_tokens,
            }
        )

    def failed(self, error: FairgateError) -> None:
        self.span.set_attribute("rpc.grpc.status_code", error.code.value[0])
        self.span.set_attribute("error.type", error.reason or error.code.name)
        if error.code not in _CALLER_CODES:
            self.span.set_status(Status(StatusCode.ERROR, error.message))

    def end(self) -> None:
        self.span.end()
