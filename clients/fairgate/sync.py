"""Thin blocking client over the generated (sync) stubs, for scripts and notebooks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from fairgate._convert import (
    CompletionBuilder,
    Prompt,
    build_request,
    call_metadata,
    convert_model,
    convert_response,
)
from fairgate._tracing import CallSpan
from fairgate.errors import from_rpc_error
from fairgate.tls import TlsArg, sync_channel
from fairgate.types import Completion, Delta, ModelInfo, Result
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc


class Client:
    """Blocking twin of `AsyncClient`; same options and errors."""

    def __init__(
        self,
        target: str,
        *,
        tenant: str | None = None,
        api_key: str | None = None,
        tls: TlsArg = None,
        timeout_s: float | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self._channel = sync_channel(target, tls, options)
        self._stub = pb_grpc.InferenceServiceStub(self._channel)
        self._metadata = call_metadata(tenant, api_key)
        self._timeout_s = timeout_s

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def generate(
        self, prompt: Prompt, *, timeout_s: float | None = None, **options: Any
    ) -> Iterator[Delta | Result]:
        request = build_request(prompt, **options)
        span = CallSpan("Generate", request.model)
        call = self._stub.Generate(
            request,
            metadata=span.metadata(self._metadata),
            timeout=timeout_s if timeout_s is not None else self._timeout_s,
        )
        try:
            for resp in call:
                event = convert_response(resp)
                if isinstance(event, Result):
                    span.result(event)
                yield event
        except grpc.RpcError as exc:
            error = from_rpc_error(exc)
            span.failed(error)
            raise error from None
        finally:
            call.cancel()
            span.end()

    def complete(self, prompt: Prompt, **options: Any) -> Completion:
        builder = CompletionBuilder()
        for ev in self.generate(prompt, **options):
            builder.add(ev)
        return builder.build()

    def list_models(self) -> list[ModelInfo]:
        try:
            resp = self._stub.ListModels(
                pb.ListModelsRequest(), metadata=self._metadata, timeout=self._timeout_s
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return [convert_model(m) for m in resp.models]

    def count_tokens(self, text: str, *, model: str = "") -> tuple[int, bool]:
        try:
            resp = self._stub.CountTokens(
                pb.CountTokensRequest(model=model, text=text),
                metadata=self._metadata,
                timeout=self._timeout_s,
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return resp.token_count, resp.exact
