"""One RPC's telemetry: the server span (`RpcScope`) and, for Generate, its
children and metrics (`GenerateObservation`).

Span tree of one Generate call:

    fairgate.v1.InferenceService/Generate   SERVER  (parent: the caller's traceparent)
      fairgate.queue                         INTERNAL  events quota.checked, admitted
      text_completion <model>                CLIENT    the engine call; its context is
                                                       sent on (traceparent to SGLang)
    events on the server span: gen_ai.first_token, gen_ai.finish

Quota rejections and client errors leave the status unset with
`error.type` / `fairgate.rejection.reason` attributes; ERROR is for server
faults only (the gRPC server-span rule of the RPC conventions).
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import TYPE_CHECKING

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from service.telemetry import names as n

if TYPE_CHECKING:
    from scheduler.budget import AdmissionBudget
    from scheduler.request import QueuedRequest
    from service.engines.protocol import EngineRequest
    from service.models import ServedModel
    from service.telemetry.telemetry import Telemetry

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
        "code",
        "error",
        "generate",
        "is_generate",
        "span",
        "start_s",
        "telemetry",
        "tenant_hint",
    )

    def __init__(
        self, telemetry: Telemetry, span: trace.Span, tenant_hint: str, *, is_generate: bool
    ) -> None:
        self.telemetry = telemetry
        self.is_generate = is_generate
        self.span = span
        self.start_s = time.monotonic()
        self.tenant_hint = tenant_hint
        self.code: grpc.StatusCode | None = None
        self.error: Exception | None = None
        self.generate: GenerateObservation | None = None

    def aborted(self, exc: Exception, code: grpc.StatusCode) -> None:
        """The servicer ends the RPC with `code` because of `exc` (service/errors.py)."""
        self.code, self.error = code, exc
        reason = str(getattr(exc, "reason", "") or type(exc).__name__)
        self.span.set_attribute(n.ERROR_TYPE, reason)
        if code in REJECTION_CODES:
            limit = str(getattr(exc, "limit", "") or "")
            self.span.set_attribute(n.REJECTION_REASON, reason)
            if limit:
                self.span.set_attribute(n.REJECTION_LIMIT, limit)
            if self.generate is not None:
                self.generate.rejected(reason, limit)
            elif self.is_generate:  # refused before it was queued (validation, tenant)
                attrs = {n.TENANT: self.tenant_hint, n.REJECTION_REASON: reason}
                if limit:
                    attrs[n.REJECTION_LIMIT] = limit
                self.telemetry.rejections.add(1, attrs)
        elif code not in CLIENT_CODES:
            self.span.set_status(Status(StatusCode.ERROR, f"{code.name}: {exc}"))

    def close(self, code: grpc.StatusCode, exc: BaseException | None) -> None:
        code = self.code or code
        self.span.set_attribute(n.RPC_GRPC_STATUS_CODE, code.value[0])
        # Not through errors.abort: an unexpected failure.
        if self.code is None and code not in CLIENT_CODES and code is not grpc.StatusCode.OK:
            self.span.set_attribute(n.ERROR_TYPE, type(exc).__name__ if exc else code.name)
            self.span.set_status(Status(StatusCode.ERROR, code.name))
        if self.generate is not None:
            self.generate.close(code)
        elif self.is_generate:
            outcome = "ok" if code is grpc.StatusCode.OK else "error"
            if code in REJECTION_CODES:
                outcome = "rejected"
            elif code is grpc.StatusCode.CANCELLED:
                outcome = "cancelled"
            self.telemetry.requests.add(1, {n.TENANT: self.tenant_hint, n.OUTCOME: outcome})
        self.span.end()


RPC_SCOPE: ContextVar[RpcScope | None] = ContextVar("fairgate_rpc_scope", default=None)


class NoopObservation:
    """What the servicer calls when telemetry is off: nothing happens."""

    __slots__ = ()
    capture_content = False

    def admitted(self, engine_req: EngineRequest, budget: AdmissionBudget) -> None:
        pass

    def first_token(self) -> None:
        pass

    def output_text(self, text: str) -> None:
        pass

    def engine_ended(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> None:
        pass

    def finished(self, finish_reason: str, failure: Exception | None) -> None:
        pass


NOOP_OBSERVATION = NoopObservation()


class GenerateObservation(NoopObservation):
    __slots__ = (
        "_attrs",
        "_completion",
        "_engine_kind",
        "_engine_span",
        "_first_token_s",
        "_model",
        "_outcome",
        "_output_tokens",
        "_queue_span",
        "_queued_ns",
        "_req",
        "_scope",
        "_span",
        "_start_s",
        "_tel",
        "capture_content",
    )

    def __init__(
        self, tel: Telemetry, req: QueuedRequest, model: ServedModel, prompt: str | None
    ) -> None:
        self._tel = tel
        self._req = req
        self._model = model.name
        self._engine_kind = model.engine.kind
        scope = RPC_SCOPE.get()
        self._scope = scope
        if scope is not None:
            scope.generate = self
            self._span = scope.span
            self._start_s = scope.start_s
        else:
            self._span = trace.get_current_span()
            self._start_s = time.monotonic()
        self.capture_content = tel.capture_content
        self._completion: list[str] = []
        self._engine_span: trace.Span | None = None
        self._first_token_s: float | None = None
        self._output_tokens = 0
        self._outcome = ""
        priority = req.priority.name.lower()
        self._span.set_attributes(
            {
                n.GEN_AI_OPERATION: n.OPERATION_TEXT_COMPLETION,
                n.GEN_AI_REQUEST_MODEL: model.name,
                n.GEN_AI_REQUEST_MAX_TOKENS: req.max_tokens,
                n.REQUEST_ID: req.request_id,
                n.PRIORITY: priority,
                n.TENANT: req.tenant_id,
            }
        )
        if prompt is not None and tel.capture_content:
            self._span.add_event("gen_ai.content.prompt", {n.PROMPT_CONTENT: prompt})
        self._queued_ns = time.time_ns()
        parent = trace.set_span_in_context(self._span)
        self._queue_span: trace.Span | None = tel.tracer.start_span(
            "fairgate.queue",
            parent,
            SpanKind.INTERNAL,
            {n.TENANT: req.tenant_id, n.PRIORITY: priority, n.REQUEST_ID: req.request_id},
            start_time=self._queued_ns,
        )
        self._attrs = {n.TENANT: req.tenant_id, n.GEN_AI_REQUEST_MODEL: model.name}

    def _resolved_tenant(self) -> None:
        # The dispatcher resolves "" to the default tenant when it queues the request.
        tenant = self._req.tenant_id
        if self._attrs[n.TENANT] != tenant:
            self._attrs = {**self._attrs, n.TENANT: tenant}
            self._span.set_attribute(n.TENANT, tenant)

    # -- scheduler ----------------------------------------------------------------
    def admitted(self, engine_req: EngineRequest, budget: AdmissionBudget) -> None:
        """Admitted into the engine: close the queue span, open the engine span."""
        self._resolved_tenant()
        wait_s = time.monotonic() - self._start_s
        tel, attrs = self._tel, self._attrs
        priority = self._req.priority.name.lower()
        tel.admissions.add(1, {**attrs, n.PRIORITY: priority})
        tel.queue_wait.record(wait_s, {n.TENANT: attrs[n.TENANT], n.PRIORITY: priority})
        self._span.set_attribute(n.QUEUE_WAIT_S, wait_s)
        if self._queue_span is not None:
            q = self._queue_span
            q.add_event("quota.checked", {"fairgate.quota.result": "ok"}, self._queued_ns)
            q.add_event(
                "admitted",
                {
                    n.IN_FLIGHT_REQUESTS: budget.in_flight_requests,
                    n.IN_FLIGHT_KV_TOKENS: budget.in_flight_kv_tokens,
                },
            )
            q.set_attributes({n.TENANT: attrs[n.TENANT], n.QUEUE_WAIT_S: wait_s})
            q.end()
            self._queue_span = None
        engine = tel.tracer.start_span(
            f"{n.OPERATION_TEXT_COMPLETION} {self._model}",
            trace.set_span_in_context(self._span),
            SpanKind.CLIENT,
            {
                n.GEN_AI_OPERATION: n.OPERATION_TEXT_COMPLETION,
                n.GEN_AI_PROVIDER: "sglang",
                n.GEN_AI_REQUEST_MODEL: self._model,
                n.GEN_AI_REQUEST_MAX_TOKENS: engine_req.max_tokens,
                n.REQUEST_ID: engine_req.request_id,
                n.ENGINE_KIND: self._engine_kind,
            },
        )
        self._engine_span = engine
        # W3C context for the engine: SGLang's HTTP headers, the in-process engine.
        propagate.inject(engine_req.trace_headers, trace.set_span_in_context(engine))

    def rejected(self, reason: str, limit: str) -> None:
        self._resolved_tenant()
        self._outcome = "rejected"
        attrs = {n.TENANT: self._attrs[n.TENANT], n.REJECTION_REASON: reason}
        if limit:
            attrs[n.REJECTION_LIMIT] = limit
        self._tel.rejections.add(1, attrs)
        if self._queue_span is not None:
            q = self._queue_span
            q.add_event("quota.checked", {"fairgate.quota.result": reason}, self._queued_ns)
            q.set_attributes(attrs)
            q.end()
            self._queue_span = None

    # -- engine ---------------------------------------------------------------------
    def first_token(self) -> None:
        now_s = time.monotonic()
        self._first_token_s = now_s
        ttft_s = now_s - self._start_s
        self._tel.ttft.record(ttft_s, self._attrs)
        self._span.set_attribute(n.TTFT_S, ttft_s)
        self._span.add_event("gen_ai.first_token", {n.TTFT_S: ttft_s})

    def output_text(self, text: str) -> None:
        if self.capture_content:
            self._completion.append(text)

    def engine_ended(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> None:
        """The engine stream is over (finished, failed or cancelled): usage is final."""
        self._output_tokens = completion_tokens
        usage = {
            n.GEN_AI_INPUT_TOKENS: prompt_tokens,
            n.GEN_AI_OUTPUT_TOKENS: completion_tokens,
            n.CACHED_TOKENS: cached_tokens,
        }
        self._span.set_attributes(usage)
        tel, attrs = self._tel, self._attrs
        for kind, count in (("input", prompt_tokens), ("output", completion_tokens)):
            typed = {**attrs, n.GEN_AI_TOKEN_TYPE: kind}
            tel.tokens.add(count, typed)
            tel.token_usage.record(
                count, {**typed, n.GEN_AI_OPERATION: n.OPERATION_TEXT_COMPLETION}
            )
        if self._engine_span is not None:
            self._engine_span.set_attributes(usage)

    def finished(self, finish_reason: str, failure: Exception | None) -> None:
        """The final result is about to be sent (`failure`: the engine failed mid-stream)."""
        now_s = time.monotonic()
        reasons = (finish_reason,)
        self._span.set_attribute(n.GEN_AI_FINISH_REASONS, reasons)
        self._span.add_event("gen_ai.finish", {n.GEN_AI_FINISH_REASONS: reasons})
        if self._completion:
            self._span.add_event(
                "gen_ai.content.completion", {n.COMPLETION_CONTENT: "".join(self._completion)}
            )
        if self._first_token_s is not None and self._output_tokens > 1:
            per_token_s = (now_s - self._first_token_s) / (self._output_tokens - 1)
            self._tel.tpot.record(per_token_s, self._attrs)
        engine = self._engine_span
        if engine is not None:
            engine.set_attribute(n.GEN_AI_FINISH_REASONS, reasons)
            if failure is not None:
                engine.set_attribute(n.ERROR_TYPE, type(failure).__name__)
                engine.set_status(Status(StatusCode.ERROR, str(failure)))
            engine.end()
            self._engine_span = None

    def close(self, code: grpc.StatusCode) -> None:
        """The RPC is over (called by the server span's scope)."""
        if code is grpc.StatusCode.OK:
            outcome = "ok"
        elif code is grpc.StatusCode.CANCELLED:
            outcome = "cancelled"
        else:
            outcome = self._outcome or "error"
        for span in (self._queue_span, self._engine_span):
            if span is not None:
                span.set_attribute(n.OUTCOME, outcome)
                span.end()
        self._queue_span = self._engine_span = None
        self._span.set_attribute(n.OUTCOME, outcome)
        attrs = {**self._attrs, n.OUTCOME: outcome}
        self._tel.requests.add(1, attrs)
        duration_attrs = dict(self._attrs)
        if outcome != "ok":
            duration_attrs[n.ERROR_TYPE] = code.name
        self._tel.duration.record(time.monotonic() - self._start_s, duration_attrs)
