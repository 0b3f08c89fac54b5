"""One RPC's telemetry: the server span (`RpcScope`) and, for Generate, its
children and metrics (`GenerateObservation`).

Span tree of one Generate call:

    fairgate.v1.InferenceService/Generate   SERVER  (parent: the caller's traceparent)
      fairgate.queue                         INTERNAL  quota check → queue wait → admission
      text_completion <model>                CLIENT    the engine call; its context is
                                                       sent on (traceparent to SGLang)
    events on the server span: gen_ai.first_token (and, opted in, the content)

Cost matters (every request pays it, ~0.2 ms of CPU; docs/observability.md "Cost"):
attributes are gathered in dicts and set once per span, metric attribute
sets are built once per (tenant, model) (`MetricAttrs`), admissions are
counted in a dict read by an observable counter, and nothing runs per token.

Quota rejections and client errors leave the status unset with
`error.type` / `fairgate.rejection.reason` attributes; ERROR is for server
faults only (the gRPC server-span rule of the RPC conventions).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from service.telemetry import names as n

if TYPE_CHECKING:
    from scheduler.budget import AdmissionBudget
    from scheduler.request import QueuedRequest
    from service.engines.protocol import EngineRequest
    from service.models import ServedModel
    from service.telemetry.instruments import Instruments

# Codes the caller caused (or a quota): not a server error on the span.
CLIENT_CODES = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)
REJECTION_CODES = CLIENT_CODES - {grpc.StatusCode.CANCELLED}


class RpcScope:
    """The server span of one RPC; set in a context variable by the interceptor."""

    __slots__ = (
        "attrs",
        "code",
        "ctx",
        "generate",
        "is_generate",
        "span",
        "start_s",
        "telemetry",
    )

    def __init__(self, telemetry: Instruments, span: trace.Span, *, is_generate: bool) -> None:
        self.telemetry = telemetry
        self.is_generate = is_generate
        self.span = span
        # The context with this span current: the parent of the child spans.
        self.ctx = trace.set_span_in_context(span)
        self.start_s = time.monotonic()
        # Span attributes, set once when the RPC ends.
        self.attrs: dict[str, AttributeValue] = {}
        self.code: grpc.StatusCode | None = None
        self.generate: GenerateObservation | None = None

    def aborted(self, exc: Exception, code: grpc.StatusCode) -> None:
        """The servicer ends the RPC with `code` because of `exc` (service/errors.py)."""
        self.code = code
        reason = str(getattr(exc, "reason", "") or type(exc).__name__)
        self.attrs[n.ERROR_TYPE] = reason
        if code in REJECTION_CODES:
            limit = str(getattr(exc, "limit", "") or "")
            self.attrs[n.REJECTION_REASON] = reason
            if limit:
                self.attrs[n.REJECTION_LIMIT] = limit
            if self.generate is not None:
                self.generate.rejected(reason, limit)
            elif self.is_generate:  # refused before it was queued (auth, validation)
                self.telemetry.rejections.add(
                    1, rejection_attrs(self.telemetry.tenant_labels.of_caller(), reason, limit)
                )
        elif code not in CLIENT_CODES:
            self.span.set_status(Status(StatusCode.ERROR, f"{code.name}: {exc}"))

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """This scope current while the handler runs (in RPC_SCOPE, its span the
        current span), then closed with the handler's outcome: the status the error
        mapping recorded, else OK, CANCELLED or UNKNOWN. For gRPC and HTTP alike."""
        scope_token = RPC_SCOPE.set(self)
        ctx_token = otel_context.attach(self.ctx)
        failure: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self.close(_code_of(failure), failure)
            otel_context.detach(ctx_token)
            RPC_SCOPE.reset(scope_token)

    def close(self, code: grpc.StatusCode, exc: BaseException | None) -> None:
        code = self.code or code
        self.attrs[n.RPC_GRPC_STATUS_CODE] = code.value[0]
        # Not through errors.abort: an unexpected failure.
        if self.code is None and code not in CLIENT_CODES and code is not grpc.StatusCode.OK:
            self.attrs[n.ERROR_TYPE] = type(exc).__name__ if exc else code.name
            self.span.set_status(Status(StatusCode.ERROR, code.name))
        if self.generate is not None:
            self.generate.close(code)
        elif self.is_generate:
            outcome = _outcome(code, "rejected" if code in REJECTION_CODES else "error")
            self.attrs[n.OUTCOME] = outcome
            tel = self.telemetry
            attrs = tel.caller_attrs(tel.tenant_labels.of_caller())
            tel.duration.record(time.monotonic() - self.start_s, attrs.outcome(outcome, code))
        self.span.set_attributes(self.attrs)
        self.span.end()


def _code_of(exc: BaseException | None) -> grpc.StatusCode:
    if exc is None:
        return grpc.StatusCode.OK
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


def rejection_attrs(tenant_label: str, reason: str, limit: str) -> dict[str, AttributeValue]:
    # Every point has every key ("none": no single limit), so no label is empty.
    return {
        n.TENANT: tenant_label,
        n.REJECTION_REASON: reason,
        n.REJECTION_LIMIT: limit or "none",
    }


def _outcome(code: grpc.StatusCode, otherwise: str) -> str:
    if code is grpc.StatusCode.OK:
        return "ok"
    if code is grpc.StatusCode.CANCELLED:
        return "cancelled"
    return otherwise


RPC_SCOPE: ContextVar[RpcScope | None] = ContextVar("fairgate_rpc_scope", default=None)


class GenerateObservation:
    """One Generate call's spans and metrics: a lifecycle observer (service/lifecycle.py)."""

    __slots__ = (
        "_completion",
        "_engine_attrs",
        "_engine_span",
        "_first_token_s",
        "_metric",
        "_model",
        "_outcome",
        "_output_tokens",
        "_priority",
        "_queue_span",
        "_req",
        "_scope",
        "_tel",
        "wants_text",
    )

    def __init__(
        self,
        tel: Instruments,
        scope: RpcScope,
        req: QueuedRequest,
        model: ServedModel,
        prompt: str | None,
    ) -> None:
        self._tel = tel
        self._scope = scope
        scope.generate = self
        self._req = req
        self._model = model
        self.wants_text = tel.capture_content
        self._completion: list[str] = []
        self._engine_span: trace.Span | None = None
        self._engine_attrs: dict[str, AttributeValue] = {}
        self._first_token_s: float | None = None
        self._output_tokens = 0
        self._outcome = ""
        self._priority = req.priority.name.lower()
        self._metric = tel.metric_attrs(req.tenant_id, model.name)
        attrs = scope.attrs
        attrs[n.GEN_AI_OPERATION] = n.OPERATION_TEXT_COMPLETION
        attrs[n.GEN_AI_REQUEST_MODEL] = model.name
        attrs[n.GEN_AI_REQUEST_MAX_TOKENS] = req.max_tokens
        attrs[n.REQUEST_ID] = req.request_id
        attrs[n.PRIORITY] = self._priority
        attrs[n.TENANT] = req.tenant_id
        if prompt is not None and tel.capture_content:
            scope.span.add_event("gen_ai.content.prompt", {n.PROMPT_CONTENT: prompt})
        self._queue_span: trace.Span | None = tel.tracer.start_span(
            "fairgate.queue", scope.ctx, SpanKind.INTERNAL
        )

    def _resolved_tenant(self) -> str:
        # The dispatcher resolves "" to the default tenant when it queues the request.
        tenant = self._req.tenant_id
        if self._metric.tenant != tenant:
            self._metric = self._tel.metric_attrs(tenant, self._model.name)
            self._scope.attrs[n.TENANT] = tenant
        return tenant

    # -- scheduler ----------------------------------------------------------------
    def admitted(self, engine_req: EngineRequest, budget: AdmissionBudget) -> None:
        """Admitted into the engine: close the queue span, open the engine span."""
        self._resolved_tenant()
        wait_s = time.monotonic() - self._scope.start_s
        tel = self._tel
        tel.admitted(self._metric, self._priority)
        tel.queue_wait.record(wait_s, self._metric.by_class(self._priority))
        self._scope.attrs[n.QUEUE_WAIT_S] = wait_s
        queue = self._queue_span
        if queue is not None:
            queue.set_attributes(
                {
                    n.QUOTA_RESULT: "ok",
                    n.QUEUE_WAIT_S: wait_s,
                    n.IN_FLIGHT_REQUESTS: budget.engine.requests,
                    n.IN_FLIGHT_KV_TOKENS: budget.engine.kv_tokens,
                }
            )
            queue.end()
            self._queue_span = None
        model = self._model
        engine = tel.tracer.start_span(
            f"{n.OPERATION_TEXT_COMPLETION} {model.name}",
            self._scope.ctx,
            SpanKind.CLIENT,
            {
                n.GEN_AI_OPERATION: n.OPERATION_TEXT_COMPLETION,
                n.GEN_AI_REQUEST_MODEL: model.name,
                n.ENGINE_KIND: model.engine.kind,
            },
        )
        self._engine_span = engine
        # W3C context for the engine: SGLang's HTTP headers, the in-process engine.
        propagate.inject(engine_req.trace_headers, trace.set_span_in_context(engine))

    def rejected(self, reason: str, limit: str) -> None:
        tenant = self._resolved_tenant()
        self._outcome = "rejected"
        self._tel.rejections.add(1, rejection_attrs(self._metric.label, reason, limit))
        if self._queue_span is not None:
            attrs: dict[str, AttributeValue] = {n.TENANT: tenant, n.REJECTION_REASON: reason}
            if limit:
                attrs[n.REJECTION_LIMIT] = limit
            self._queue_span.set_attributes({**attrs, n.QUOTA_RESULT: reason})
            self._queue_span.end()
            self._queue_span = None

    # -- engine ---------------------------------------------------------------------
    def first_token(self) -> None:
        now_s = time.monotonic()
        self._first_token_s = now_s
        ttft_s = now_s - self._scope.start_s
        self._tel.ttft.record(ttft_s, self._metric.base)
        self._scope.attrs[n.TTFT_S] = ttft_s
        self._scope.span.add_event("gen_ai.first_token")

    def text(self, text: str) -> None:
        self._completion.append(text)  # called only with content capture on (wants_text)

    def engine_ended(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, retractions: int
    ) -> None:
        """The engine stream is over (finished, failed or cancelled): usage is final."""
        self._output_tokens = completion_tokens
        usage = {
            n.GEN_AI_INPUT_TOKENS: prompt_tokens,
            n.GEN_AI_OUTPUT_TOKENS: completion_tokens,
            n.CACHED_TOKENS: cached_tokens,
        }
        if retractions:
            usage[n.RETRACTIONS] = retractions
            # The cost of lending room beyond the engine's (fair_isolation=preempt),
            # by the tenant whose work was recomputed.
            self._tel.retractions.add(retractions, self._metric.base)
        self._scope.attrs.update(usage)
        self._engine_attrs.update(usage)
        record = self._tel.token_usage.record
        record(prompt_tokens, self._metric.input)
        record(completion_tokens, self._metric.output)

    def settled(self, finish_reason: str, failure: Exception | None) -> None:
        """The final result is about to be sent (`failure`: the engine failed mid-stream)."""
        now_s = time.monotonic()
        reasons = (finish_reason,)
        self._scope.attrs[n.GEN_AI_FINISH_REASONS] = reasons
        if self._completion:
            self._scope.span.add_event(
                "gen_ai.content.completion", {n.COMPLETION_CONTENT: "".join(self._completion)}
            )
        if self._first_token_s is not None and self._output_tokens > 1:
            per_token_s = (now_s - self._first_token_s) / (self._output_tokens - 1)
            self._tel.tpot.record(per_token_s, self._metric.base)
        engine = self._engine_span
        if engine is not None:
            self._engine_attrs[n.GEN_AI_FINISH_REASONS] = reasons
            if failure is not None:
                self._engine_attrs[n.ERROR_TYPE] = type(failure).__name__
                engine.set_status(Status(StatusCode.ERROR, str(failure)))
            engine.set_attributes(self._engine_attrs)
            engine.end()
            self._engine_span = None

    def refused(self, reason: str) -> None:
        """Nothing to add: the refusal is the RPC's status (`close`, errors.abort)."""

    def close(self, code: grpc.StatusCode) -> None:
        """The RPC is over (called by the server span's scope)."""
        outcome = _outcome(code, self._outcome or "error")
        for span in (self._queue_span, self._engine_span):
            if span is not None:  # cancelled while queued or streaming
                span.set_attribute(n.OUTCOME, outcome)
                span.end()
        self._queue_span = self._engine_span = None
        self._scope.attrs[n.OUTCOME] = outcome
        attrs = self._metric.outcome(outcome, code)
        self._tel.duration.record(time.monotonic() - self._scope.start_s, attrs)
