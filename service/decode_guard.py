"""Undecodable requests: INVALID_ARGUMENT with a BadRequest, not UNKNOWN and a traceback.

grpc.aio deserializes a request before the handler runs; a `DecodeError` there
ends the call with UNKNOWN and logs an ERROR traceback per request (issue #14:
1 000 garbage requests wrote 816 KB of logs). This interceptor swaps the
deserializer of every unary-request method for one that turns a decode failure
into a marker, and the behaviour for one that answers the marker with
INVALID_ARGUMENT. It sits after the auth interceptor, so an unauthenticated
caller is refused before its bytes are parsed (see `auth._refusal`). One
warning per `log_interval_s` counts the refusals instead of one per request.
A bidirectional stream (reflection) is checked message by message: a bad one
ends the call the same way, after the answers to the good ones before it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import DecodeError

from service import errors

log = logging.getLogger(__name__)

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Stands in for a request whose bytes did not parse."""

    reason: str


class ThrottledLog:
    """At most one warning per interval; the next one counts what was held back."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.held_back = 0
        self._last_s: float | None = None

    def warn(self, message: str, *args: object) -> None:
        now_s = self.clock()
        if self._last_s is not None and now_s - self._last_s < self.interval_s:
            self.held_back += 1
            return
        self._last_s = now_s
        if self.held_back:
            message += " (and %d more in the last %gs)"
            args = (*args, self.held_back, self.interval_s)
            self.held_back = 0
        log.warning(message, *args)


def _invalid(reason: str) -> errors.InvalidRequest:
    return errors.InvalidRequest(
        [errors.FieldViolation("request", f"the request message could not be decoded: {reason}")]
    )


class DecodeGuardInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, log_interval_s: float = 60.0) -> None:
        self.refusals = ThrottledLog(log_interval_s)

    def _deserializer(self, parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
        def deserialize(raw: bytes) -> Any:
            if parse is None:
                return raw
            try:
                return parse(raw)
            except DecodeError as exc:
                return Undecodable(str(exc))

        return deserialize

    def _wrap(
        self, method: str, handler: grpc.RpcMethodHandler[_Req, _Resp]
    ) -> grpc.RpcMethodHandler[_Req, _Resp]:
        refusals = self.refusals

        async def refuse(context: grpc.aio.ServicerContext[Any, Any], bad: Undecodable) -> None:
            refusals.warn("undecodable %s request refused: %s", method, bad.reason)
            await errors.abort(context, _invalid(bad.reason))

        kwargs: dict[str, Any] = {
            "request_deserializer": self._deserializer(handler.request_deserializer),
            "response_serializer": handler.response_serializer,
        }
        out: Any
        if handler.unary_unary is not None:
            inner_uu = cast("Callable[..., Any]", handler.unary_unary)

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if isinstance(request, Undecodable):
                    await refuse(context, request)
                return await inner_uu(request, context)

            out = grpc.unary_unary_rpc_method_handler(unary, **kwargs)
        elif handler.unary_stream is not None:
            inner_us = cast("Callable[..., Any]", handler.unary_stream)

            async def stream(
                request: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                if isinstance(request, Undecodable):
                    await refuse(context, request)
                async for item in cast("AsyncIterator[Any]", inner_us(request, context)):
                    yield item

            out = grpc.unary_stream_rpc_method_handler(stream, **kwargs)
        elif handler.stream_stream is not None:
            inner_ss = cast("Callable[..., Any]", handler.stream_stream)

            async def checked(
                requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                # The stream is decoded message by message, as the handler reads it.
                async for request in requests:
                    if isinstance(request, Undecodable):
                        await refuse(context, request)
                    yield request

            async def streams(
                requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                async for item in inner_ss(checked(requests, context), context):
                    yield item

            out = grpc.stream_stream_rpc_method_handler(streams, **kwargs)
        else:
            return handler  # stream-unary: none is served
        return cast("grpc.RpcMethodHandler[_Req, _Resp]", out)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return self._wrap(handler_call_details.method, handler)
