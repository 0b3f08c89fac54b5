"""Server interceptor: one SERVER span per RPC, parented on the caller's W3C context.

The span is the current span while the handler runs (so child spans and log
lines carry its trace id); an `RpcScope` in a context variable lets the
servicer and the error mapping add to it. Health checks and reflection are
not traced (probes every few seconds would drown the traces that matter).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry import propagate
from opentelemetry.trace import SpanKind

from service.telemetry import names as n
from service.telemetry.observation import RpcScope

if TYPE_CHECKING:
    from service.telemetry.instruments import Instruments

UNTRACED_PREFIXES = ("/grpc.health.", "/grpc.reflection.")
GENERATE_METHOD = "/fairgate.v1.InferenceService/Generate"

Metadata = tuple[tuple[str, str | bytes], ...]


def _carrier(metadata: Metadata | None) -> dict[str, str]:
    return {
        k: v if isinstance(v, str) else v.decode("latin-1")
        for k, v in metadata or ()
        if not k.endswith("-bin")
    }


class TelemetryInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, telemetry: Instruments) -> None:
        self.telemetry = telemetry

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(UNTRACED_PREFIXES):
            return handler
        metadata: Metadata | None = handler_call_details.invocation_metadata
        h: Any = handler
        if h.unary_stream is not None and inspect.isasyncgenfunction(h.unary_stream):
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(h.unary_stream, method, metadata),
                request_deserializer=h.request_deserializer,
                response_serializer=h.response_serializer,
            )
        if h.unary_unary is not None and inspect.iscoroutinefunction(h.unary_unary):
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(h.unary_unary, method, metadata),
                request_deserializer=h.request_deserializer,
                response_serializer=h.response_serializer,
            )
        return handler

    def _open(self, method: str, metadata: Metadata | None) -> RpcScope:
        carrier = _carrier(metadata)
        parent = propagate.extract(carrier)
        service, _, name = method.lstrip("/").partition("/")
        span = self.telemetry.tracer.start_span(
            method.lstrip("/"),
            parent,
            SpanKind.SERVER,
            {n.RPC_SYSTEM: "grpc", n.RPC_SERVICE: service, n.RPC_METHOD: name},
        )
        return RpcScope(self.telemetry, span, is_generate=method == GENERATE_METHOD)

    def _wrap_stream(
        self, behavior: Callable[..., AsyncIterator[Any]], method: str, metadata: Metadata | None
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
        async def traced(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with self._open(method, metadata).current():
                async for response in behavior(request, context):
                    yield response

        return traced

    def _wrap_unary(
        self, behavior: Callable[..., Awaitable[Any]], method: str, metadata: Metadata | None
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        async def traced(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with self._open(method, metadata).current():
                return await behavior(request, context)

        return traced
