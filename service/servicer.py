"""InferenceService over gRPC: validate, then run service/generation.py's
transport-neutral generation and turn its events into stream messages.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

import grpc
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc
from google.protobuf import duration_pb2

from scheduler.errors import SchedulingError
from service import errors
from service.auth import Identity, current_identity
from service.budget_check import BudgetCheck
from service.drain import Drain
from service.engines.protocol import EngineError, FinishKind
from service.generation import Delta, Generation, Outcome
from service.key_limiter import KeyLimiter
from service.lifecycle import ObserverFactory
from service.models import ModelRegistry
from service.ratelimit_headers import tenant_headers
from service.settings import Settings
from service.telemetry.telemetry import Telemetry
from service.validation import validate_count_tokens, validate_generate

Context = grpc.aio.ServicerContext[pb.GenerateRequest, pb.GenerateResponse]

_FINISH = {
    FinishKind.STOP: pb.FINISH_REASON_STOP,
    FinishKind.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishKind.ABORT: pb.FINISH_REASON_CANCELLED,
    FinishKind.ERROR: pb.FINISH_REASON_ERROR,
}


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(max(seconds, 0.0) * 1e9))
    return d


def _result(o: Outcome) -> pb.GenerateResult:
    result = pb.GenerateResult(
        request_id=o.request_id,
        model=o.model,
        finish_reason=_FINISH[o.finish],
        stop_matched=o.stop_matched,
        message=o.message,
        usage=pb.Usage(
            prompt_tokens=o.prompt_tokens,
            completion_tokens=o.completion_tokens,
            cached_tokens=o.cached_tokens,
            total_tokens=o.prompt_tokens + o.completion_tokens,
        ),
    )
    result.timings.queue_wait.CopyFrom(_duration(o.queue_wait_s))
    if o.ttft_s is not None:
        result.timings.time_to_first_token.CopyFrom(_duration(o.ttft_s))
    result.timings.total.CopyFrom(_duration(o.total_s))
    return result


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    def __init__(
        self,
        settings: Settings,
        models: ModelRegistry,
        telemetry: Telemetry | None = None,
        drain: Drain | None = None,
        observers: Sequence[ObserverFactory] | None = None,
        keys: KeyLimiter | None = None,
        budgets: BudgetCheck | None = None,
    ) -> None:
        self.settings = settings
        # API keys' own limits (service/key_limiter.py); None: not enforced (tests).
        self.keys = keys
        self.budgets = budgets  # checked before queueing (service/budget_check.py)
        self.models = models
        self.telemetry = telemetry or Telemetry.disabled()
        # What watches each generation: telemetry's, and the usage log's (app.py).
        self.observers = self.telemetry.observers if observers is None else tuple(observers)
        # Shutdown (service/drain.py, applied in service/generation.py): fails
        # queued requests, cuts streams.
        self.drain = drain or Drain()

    def _identity(self, context: grpc.aio.ServicerContext[Any, Any]) -> Identity:
        # Set by service/auth.py's interceptor (API key, or the header in open
        # and dev modes); "" is resolved by the registry (default tenant or refusal).
        return current_identity.get() or Identity("", "anonymous")

    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        received_s = time.monotonic()
        request_id = request.request_id or uuid.uuid4().hex
        remaining_s = context.time_remaining()
        try:
            params = validate_generate(request, self.models, self.settings.max_request_bytes)
            identity = self._identity(context)
            tenant_id = identity.tenant_id
            key = self.keys.check(identity) if self.keys else None
            generation = Generation(
                params,
                request_id=request_id,
                tenant_id=identity.tenant_id,
                key_id=identity.key_id,
                budgets=self.budgets,
                received_s=received_s,
                deadline_s=received_s + remaining_s if remaining_s is not None else None,
                max_tokens_set=request.sampling.HasField("max_tokens"),
                prompt_field=request.WhichOneof("input") or "text",
                observers=self.observers,
                drain=self.drain,
                key=key,
            )
        except (errors.ServiceError, SchedulingError) as exc:
            await errors.abort(context, exc)
        await context.send_initial_metadata((("x-request-id", request_id),))
        outcome: Outcome | None = None
        return_ids = request.return_token_ids
        try:
            async with aclosing(generation.stream()) as events:
                async for event in events:
                    if isinstance(event, Delta):
                        # Filled in place: a TokenDelta passed to the constructor is copied.
                        response = pb.GenerateResponse()
                        delta = response.delta
                        delta.text, delta.index = event.text, event.index
                        if return_ids:
                            delta.token_ids.extend(event.token_ids)
                        yield response
                    else:
                        outcome = event
        except (errors.ServiceError, SchedulingError, EngineError) as exc:
            # ServiceError: ServerDraining (refused, failed in the queue, cut early).
            limits = await tenant_headers(params.model.dispatcher, tenant_id, key)
            await errors.abort(context, exc, limits)
        assert outcome is not None  # the stream ends with an Outcome or raises
        # The tenant's buckets after this request, for its next one (OpenAI's headers).
        limits = await tenant_headers(params.model.dispatcher, tenant_id, key)
        context.set_trailing_metadata(limits)
        yield pb.GenerateResponse(result=_result(outcome))
        if outcome.failure is not None:
            # The partial result above carries the usage; the status says it failed.
            await errors.abort(context, outcome.failure, limits)

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
        try:
            model = validate_count_tokens(request, self.models, self.settings.max_request_bytes)
        except errors.ServiceError as exc:
            await errors.abort(context, exc)
        ids = model.tokenizer.encode(request.text)
        resp = pb.CountTokensResponse(token_count=len(ids), exact=model.tokenizer.exact)
        if request.return_token_ids:
            resp.token_ids.extend(ids)
        return resp
