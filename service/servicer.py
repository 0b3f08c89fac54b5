"""InferenceService: validate, queue for admission, stream the engine's tokens.

Whatever ends the stream (completion, client cancel, deadline, engine error),
the `finally` blocks give back the admission slot and the engine request.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import grpc
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc
from google.protobuf import duration_pb2

from scheduler.errors import RequestTooLarge, SchedulingError
from scheduler.request import QueuedRequest
from service import errors
from service.auth import current_identity
from service.engines.protocol import EngineError, EngineRequest, FinishKind
from service.models import ModelRegistry
from service.settings import Settings
from service.telemetry import Telemetry
from service.validation import validate_generate

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[pb.GenerateRequest, pb.GenerateResponse]

_FINISH = {
    FinishKind.STOP: pb.FINISH_REASON_STOP,
    FinishKind.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishKind.ABORT: pb.FINISH_REASON_CANCELLED,
    FinishKind.ERROR: pb.FINISH_REASON_ERROR,
}


_FINISH_NAMES = {
    pb.FINISH_REASON_UNSPECIFIED: "unspecified",
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CANCELLED: "cancelled",
    pb.FINISH_REASON_ERROR: "error",
}


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(max(seconds, 0.0) * 1e9))
    return d


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    def __init__(
        self, settings: Settings, models: ModelRegistry, telemetry: Telemetry | None = None
    ) -> None:
        self.settings = settings
        self.models = models
        self.telemetry = telemetry or Telemetry.disabled()

    def _tenant(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        # Set by service/auth.py's interceptor (API key, or the header in open
        # and dev modes); "" is resolved by the registry (default tenant or refusal).
        identity = current_identity.get()
        return identity.tenant_id if identity is not None else ""

    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        received_s = time.monotonic()
        try:
            params = validate_generate(request, self.models, self.settings.max_request_bytes)
        except errors.ServiceError as exc:
            await errors.abort(context, exc)
        request_id = request.request_id or uuid.uuid4().hex
        dispatcher = params.model.dispatcher
        tenant_id = self._tenant(context)
        if not request.sampling.HasField("max_tokens"):
            # The server's default must not trip the tenant's own output cap.
            try:
                tenant = dispatcher.quotas.tenants.resolve(tenant_id, params.priority)
            except SchedulingError as exc:
                await errors.abort(context, exc)
            cap = tenant.quotas.output_cap_tokens(params.priority)
            if cap is not None:
                params.max_tokens = max(1, min(params.max_tokens, cap))
        await context.send_initial_metadata((("x-request-id", request_id),))
        remaining_s = context.time_remaining()
        queued = QueuedRequest(
            request_id=request_id,
            tenant_id=tenant_id,
            prompt_tokens=len(params.prompt_ids),
            max_tokens=params.max_tokens,
            priority=params.priority,
            deadline_s=received_s + remaining_s if remaining_s is not None else None,
        )
        obs = self.telemetry.start_generate(queued, params.model, prompt=params.prompt_text)
        sent_tokens = 0
        first_token_s: float | None = None
        prompt_tokens = len(params.prompt_ids)
        cached_tokens = 0
        failure: Exception | None = None
        final: pb.GenerateResult | None = None
        try:
            # Leaving this block settles the admission exactly once, however it is left.
            async with dispatcher.admitted(queued) as ticket:
                admitted_s = time.monotonic()
                engine_req = EngineRequest(
                    request_id=request_id,
                    prompt_token_ids=params.prompt_ids,
                    prompt_text=params.prompt_text,
                    max_tokens=params.max_tokens,
                    sampling=params.sampling,
                    # SGLang: larger is more urgent.
                    priority=1 - int(params.priority),
                )
                obs.admitted(engine_req, dispatcher.budget)
                try:
                    async with aclosing(params.model.engine.generate(engine_req)) as stream:
                        async for chunk in stream:
                            new_tokens = chunk.completion_tokens - sent_tokens
                            if new_tokens > 0:
                                ticket.charge(new_tokens)
                            prompt_tokens = chunk.prompt_tokens or prompt_tokens
                            cached_tokens = chunk.cached_tokens
                            if chunk.text or chunk.token_ids:
                                if first_token_s is None:
                                    first_token_s = time.monotonic()
                                    obs.first_token()
                                if obs.capture_content:
                                    obs.output_text(chunk.text)
                                delta = pb.TokenDelta(text=chunk.text, index=sent_tokens)
                                if request.return_token_ids:
                                    delta.token_ids.extend(chunk.token_ids)
                                yield pb.GenerateResponse(delta=delta)
                            sent_tokens = max(sent_tokens, chunk.completion_tokens)
                            if chunk.finish is not None:
                                if chunk.finish is FinishKind.ABORT and sent_tokens == 0:
                                    failure = EngineError(
                                        chunk.message or "aborted", retryable=True
                                    )
                                    break
                                final = pb.GenerateResult(
                                    finish_reason=_FINISH[chunk.finish],
                                    stop_matched=chunk.stop_matched,
                                    message=chunk.message,
                                )
                                break
                except EngineError as exc:
                    failure = exc
                finally:
                    obs.engine_ended(prompt_tokens, sent_tokens, cached_tokens)
        # Only admission raises these: the block above raises none of its own.
        except RequestTooLarge as exc:
            if exc.field == "prompt":
                exc.field = request.WhichOneof("input") or "text"
            await errors.abort(context, exc)
        except SchedulingError as exc:
            await errors.abort(context, exc)
        if final is None:
            if failure is None:
                failure = EngineError("the engine ended the stream without a finish reason")
            if sent_tokens == 0:
                await errors.abort(context, failure)
            log.warning("request %s failed after %d tokens: %s", request_id, sent_tokens, failure)
            final = pb.GenerateResult(finish_reason=pb.FINISH_REASON_ERROR, message=str(failure))
        done_s = time.monotonic()
        final.request_id = request_id
        final.model = params.model.name
        final.usage.CopyFrom(
            pb.Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=sent_tokens,
                cached_tokens=cached_tokens,
                total_tokens=prompt_tokens + sent_tokens,
            )
        )
        final.timings.queue_wait.CopyFrom(_duration(admitted_s - received_s))
        if first_token_s is not None:
            final.timings.time_to_first_token.CopyFrom(_duration(first_token_s - received_s))
        final.timings.total.CopyFrom(_duration(done_s - received_s))
        obs.finished(_FINISH_NAMES[final.finish_reason], failure)
        yield pb.GenerateResponse(result=final)
        if final.finish_reason == pb.FINISH_REASON_ERROR and failure is not None:
            # The partial result above carries the usage; the status says it failed.
            await errors.abort(context, failure)

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(
            models=[
                pb.ModelInfo(
                    name=m.name,
                    max_context_tokens=m.max_context_tokens,
                    max_output_tokens=m.max_output_tokens,
                    engine=m.engine.kind,
                    exact_token_counts=m.tokenizer.exact,
                    vocab_size=m.vocab_size,
                    is_default=m.name == self.models.default,
                )
                for m in self.models
            ]
        )

    async def CountTokens(
        self, request: pb.CountTokensRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CountTokensResponse:
        model = self.models.resolve(request.model)
        if model is None:
            await errors.abort(
                context,
                errors.InvalidRequest(
                    [
                        errors.FieldViolation(
                            "model",
                            f"unknown model {request.model!r}; available: "
                            f"{', '.join(self.models.names())}",
                        )
                    ]
                ),
            )
        if request.ByteSize() > self.settings.max_request_bytes:
            await errors.abort(
                context,
                errors.InvalidRequest(
                    [
                        errors.FieldViolation(
                            "text",
                            f"request is {request.ByteSize()} bytes; the limit is "
                            f"{self.settings.max_request_bytes} bytes",
                        )
                    ]
                ),
            )
        ids = model.tokenizer.encode(request.text)
        resp = pb.CountTokensResponse(token_count=len(ids), exact=model.tokenizer.exact)
        if request.return_token_ids:
            resp.token_ids.extend(ids)
        return resp
