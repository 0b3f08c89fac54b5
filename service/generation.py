"""One generation, transport-neutral: admission → engine stream → settlement.

Both fronts (the gRPC servicer, the OpenAI-compatible HTTP server) run a
request through `Generation.stream()`, which yields `Delta`s and then one
`Outcome`, or raises a domain error (service/errors.py, scheduler/errors.py,
EngineError) before the first token. Admission happens here and only here,
through the gate's one front door: `async with gate.admitted(req) as ticket`
around the engine stream, `ticket.charge(n)` per chunk; leaving the block
settles exactly once and closing the stream aborts the engine request —
whatever ends it: completion, client cancel/disconnect, deadline, engine error.

Telemetry is not a step of it: observers (service/lifecycle.py) are told the
request's transitions (admitted, first token, engine end, settled) and a
failing one is dropped, never failing the request.

Shutdown (service/drain.py) hooks in here too, so both fronts drain alike: the
admission wait runs inside `drain.queued()` (refused or failed with
ServerDraining once the drain begins), and an admitted stream is registered
with the drain so that `Drain.cut` can abort it in its engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass

from scheduler.errors import (
    DeadlineExpired,
    RequestRejected,
    RequestTooLarge,
    StoreUnavailable,
)
from scheduler.request import QueuedRequest
from scheduler.rules import Isolation
from service.budget_check import BudgetCheck
from service.drain import Drain, ServerDraining
from service.engines.engine_request import engine_request
from service.engines.protocol import EngineError, FinishKind
from service.key_limiter import KeyCheck
from service.lifecycle import Lifecycle, ObserverFactory
from service.validation import GenerateParams

log = logging.getLogger(__name__)

FINISH_NAMES = {
    FinishKind.STOP: "stop",
    FinishKind.LENGTH: "length",
    FinishKind.ABORT: "cancelled",
    FinishKind.ERROR: "error",
}


# Refused at admission, counted as refusals: the request was valid and may be
# retried (not a bad request, nor a tenant that may not send it at all).
_REFUSALS = (RequestRejected, DeadlineExpired, StoreUnavailable, ServerDraining)


@dataclass(slots=True)
class Delta:
    """New output: the text (incremental) and ids of tokens from `index` on."""

    text: str
    token_ids: list[int]
    index: int


@dataclass(slots=True)
class Outcome:
    """The end of a generation that produced a result (possibly partial).

    `failure` is set (and `finish` is ERROR) when the engine failed after
    tokens had reached the client: the usage counts what was produced.
    """

    request_id: str
    model: str
    finish: FinishKind
    stop_matched: str
    message: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    queue_wait_s: float
    ttft_s: float | None
    total_s: float
    failure: Exception | None = None


class Generation:
    """One admitted-or-refused request. Construction applies the tenant's output
    cap to a defaulted max_tokens (raises SchedulingError for a refused tenant)."""

    def __init__(
        self,
        params: GenerateParams,
        *,
        request_id: str,
        tenant_id: str,
        received_s: float,
        deadline_s: float | None,
        max_tokens_set: bool,
        prompt_field: str,
        observers: Sequence[ObserverFactory],
        drain: Drain,
        key: KeyCheck | None = None,
        key_id: str = "",
        budgets: BudgetCheck | None = None,
    ) -> None:
        self.params = params
        # The calling API key's own limits, passed before its tenant's queue.
        self.key = key
        self.request_id = request_id
        self.received_s = received_s
        self.prompt_field = prompt_field
        self.observers = observers
        self.drain = drain
        self.budgets = budgets
        registry = params.model.dispatcher.quotas.tenants
        # The default tenant by name, so that its spend is counted and checked as its own.
        tenant_id = tenant_id or registry.default_tenant_id or ""
        if not max_tokens_set:
            # The server's default must not trip the tenant's own output cap.
            tenant = registry.resolve(tenant_id, params.priority)
            cap = tenant.quotas.output_cap_tokens(params.priority)
            if cap is not None:
                params.max_tokens = max(1, min(params.max_tokens, cap))
        self.queued = QueuedRequest(
            request_id=request_id,
            tenant_id=tenant_id,
            prompt_tokens=len(params.prompt_ids),
            max_tokens=params.max_tokens,
            priority=params.priority,
            deadline_s=deadline_s,
            key_id=key_id,
            prefix_keys=(
                params.model.prefix_keys(params.prompt_ids) if params.model.prefix_keys else ()
            ),
        )

    async def _check_budgets(self, budgets: BudgetCheck) -> None:
        tenant = self.params.model.dispatcher.quotas.tenants.get(self.queued.tenant_id)
        own = self.key.budgets if self.key is not None else ()
        if tenant is not None and (tenant.budgets or own):
            await budgets.check(tenant, self.queued.key_id, own)

    async def stream(self) -> AsyncGenerator[Delta | Outcome, None]:
        """Deltas, then one Outcome. Consume it inside `aclosing` so that a
        consumer that stops early settles at once. Raises ServerDraining when
        the server is shutting down (refused, failed in the queue, or cut
        before its first token)."""
        params, queued = self.params, self.queued
        dispatcher = params.model.dispatcher
        # Telemetry and any other observer watch; none of them is a step of the path.
        lifecycle = Lifecycle.start(self.observers, queued, params.model, params.prompt_text)
        sent_tokens = 0
        first_token_s: float | None = None
        prompt_tokens = len(params.prompt_ids)
        cached_tokens = retractions = 0
        failure: Exception | None = None
        finish: FinishKind | None = None
        stop_matched = message = ""
        own, key_hold = self.key, None
        started = False
        try:
            # Leaving this block settles the admission exactly once, however it is left.
            async with AsyncExitStack() as admission:
                try:
                    if self.budgets is not None:
                        await self._check_budgets(self.budgets)
                    # The key's own limits next: a key over them never reaches its
                    # tenant's queue (nothing is taken from a spent budget's key).
                    if own is not None:
                        key_hold = await own.gate.open(own.key_id, own.limits, queued)
                    async with self.drain.queued():
                        ticket = await admission.enter_async_context(dispatcher.admitted(queued))
                    started = True
                except RequestTooLarge as exc:
                    if exc.field == "prompt":
                        exc.field = self.prompt_field
                    raise
                except _REFUSALS as exc:
                    lifecycle.refused(exc.reason)  # in the usage log and the period's refusals
                    raise
                admitted_s = time.monotonic()

                engine_req = engine_request(
                    queued,
                    self.request_id,
                    params.prompt_ids,
                    params.sampling,
                    params.model.preempt_threshold,
                    params.model.isolation is Isolation.PREEMPT,
                    params.prompt_text,
                    takes_slot=params.model.isolation is Isolation.RESERVE_SLOTS,
                )
                lifecycle.admitted(engine_req, dispatcher.budget)
                drain, key = self.drain, id(queued)
                drain.stream_started(key, self.request_id, params.model.engine)
                try:
                    async with aclosing(params.model.engine.generate(engine_req)) as chunks:
                        async for chunk in chunks:
                            new_tokens = chunk.completion_tokens - sent_tokens
                            if new_tokens > 0:
                                ticket.charge(new_tokens)
                            prompt_tokens = chunk.prompt_tokens or prompt_tokens
                            # What the engine held before this request: its own stages'
                            # prefill is its work (staged_prefill.py), charged in full and
                            # reported uncached, so the usage says what was charged.
                            cached_tokens = chunk.cached_tokens - chunk.staged_tokens
                            if first_token_s is None and (chunk.text or chunk.token_ids):
                                # Admission charged an estimate: the engine's count corrects it.
                                ticket.cached(cached_tokens)
                            retractions = max(retractions, chunk.retractions)
                            if chunk.text or chunk.token_ids:
                                if first_token_s is None:
                                    first_token_s = time.monotonic()
                                    lifecycle.first_token()
                                if lifecycle.wants_text:
                                    lifecycle.text(chunk.text)
                                yield Delta(chunk.text, chunk.token_ids, sent_tokens)
                            sent_tokens = max(sent_tokens, chunk.completion_tokens)
                            if chunk.finish is not None:
                                message = chunk.message
                                cut = chunk.finish is FinishKind.ABORT and drain.draining
                                if cut:
                                    message = "the server is shutting down"  # by Drain.cut
                                if chunk.finish is FinishKind.ABORT and sent_tokens == 0:
                                    failure = (
                                        ServerDraining()
                                        if cut
                                        else EngineError(message or "aborted", retryable=True)
                                    )
                                    break
                                finish = chunk.finish
                                stop_matched = chunk.stop_matched
                                break
                except EngineError as exc:
                    failure = exc
                finally:
                    drain.stream_ended(key)
                    lifecycle.engine_ended(prompt_tokens, sent_tokens, cached_tokens, retractions)
        finally:
            # Exactly once, however the stream is left (GeneratorExit included: sync).
            if own is not None:
                own.gate.settle(key_hold, started, sent_tokens)
        if finish is None:
            if failure is None:
                failure = EngineError("the engine ended the stream without a finish reason")
            if sent_tokens == 0:
                raise failure
            log.warning(
                "request %s failed after %d tokens: %s", self.request_id, sent_tokens, failure
            )
            finish, message = FinishKind.ERROR, str(failure)
        done_s = time.monotonic()
        lifecycle.settled(FINISH_NAMES[finish], failure)
        yield Outcome(
            request_id=self.request_id,
            model=params.model.name,
            finish=finish,
            stop_matched=stop_matched,
            message=message,
            prompt_tokens=prompt_tokens,
            completion_tokens=sent_tokens,
            cached_tokens=cached_tokens,
            queue_wait_s=admitted_s - self.received_s,
            ttft_s=None if first_token_s is None else first_token_s - self.received_s,
            total_s=done_s - self.received_s,
            failure=failure,
        )
