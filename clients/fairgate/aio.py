"""Typed asyncio client over the generated grpc.aio stubs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
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
from fairgate.tls import TlsArg, aio_channel
from fairgate.types import Completion, Delta, ModelInfo, Result
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc


class AsyncClient:
    """`async with AsyncClient("127.0.0.1:50051") as c: async for ev in c.generate("hi"): ...`

    `generate` options: model, max_tokens, temperature, top_p, top_k, stop,
    seed, ignore_eos, priority ("interactive" | "batch"), request_id,
    return_token_ids. Errors raise `FairgateError` with decoded details.
    `api_key` is sent as `authorization: Bearer`; `tls=True` (system roots) or
    `tls=TlsConfig(ca_file=..., cert_file=..., key_file=...)` for TLS / mTLS.
    """

    def __init__(
        self,
        target: str,
        *,
        tenant: str | None = None,
        api_key: str | None = None,
        tls: TlsArg = None,
        timeout_s: float | None = None,
        channel: grpc.aio.Channel | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self._owns_channel = channel is None
        self._channel = channel or aio_channel(target, tls, options)
        self._stub = pb_grpc.InferenceServiceStub(self._channel)
        self._metadata = call_metadata(tenant, api_key)
        self._timeout_s = timeout_s

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_channel:
            await self._channel.close()

    async def generate(
        self, prompt: Prompt, *, timeout_s: float | None = None, **options: Any
    ) -> AsyncIterator[Delta | Result]:
        """Stream token deltas, then one `Result`."""
        request = build_request(prompt, **options)
        span = CallSpan("Generate", request.model)
        call = self._stub.Generate(
            request,
            metadata=span.metadata(self._metadata),
            timeout=timeout_s if timeout_s is not None else self._timeout_s,
        )
        try:
            async for resp in call:
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

    async def complete(self, prompt: Prompt, **options: Any) -> Completion:
        """Generate and collect the whole completion."""
        builder = CompletionBuilder()
        async for ev in self.generate(prompt, **options):
            builder.add(ev)
        return builder.build()

    async def list_models(self) -> list[ModelInfo]:
        try:
            resp = await self._stub.ListModels(
                pb.ListModelsRequest(), metadata=self._metadata, timeout=self._timeout_s
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return [convert_model(m) for m in resp.models]

    async def count_tokens(self, text: str, *, model: str = "") -> tuple[int, bool]:
        """Return (token count, exact?)."""
        try:
            resp = await self._stub.CountTokens(
                pb.CountTokensRequest(model=model, text=text),
                metadata=self._metadata,
                timeout=self._timeout_s,
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return resp.token_count, resp.exact
