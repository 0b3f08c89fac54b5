"""The service's telemetry: a tracer, the metric instruments, and gauges over live state.

`Telemetry` is built once (`service/telemetry/setup.py` from the OTEL_*
environment, or by tests with in-memory providers) and handed to the server.
`Telemetry.disabled()` installs nothing: no interceptor, no per-request work.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from service.telemetry import names as n
from service.telemetry.observation import MetricAttrs
from service.telemetry.tenant_labels import TenantLabels

if TYPE_CHECKING:
    import grpc

    from scheduler.request import QueuedRequest
    from scheduler.tenancy.tenants import TenantRegistry
    from service.models import ServedModel
    from service.telemetry.observation import GenerateObservation, NoopObservation
    from service.telemetry.prometheus import MetricsEndpoint

INSTRUMENTATION_NAME = "fairgate.service"
# Cached metric attribute sets (tenants x models); past this, start over.
_MAX_ATTR_SETS = 10_000


class Telemetry:
    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        capture_content: bool = False,
        shutdown: Sequence[Callable[[], None]] = (),
        metrics_endpoint: MetricsEndpoint | None = None,
    ) -> None:
        self.enabled = tracer_provider is not None or meter_provider is not None
        self.capture_content = capture_content
        self._shutdown = list(shutdown)
        self._models: list[ServedModel] = []
        # Admissions by (tenant, priority): counted here, read by the
        # observable counter on the metric reader's thread (an SDK record per
        # request costs ~10 µs; this costs a dict update).
        self._admissions: dict[tuple[str, str], int] = {}
        self._metric_attrs: dict[tuple[str, str], MetricAttrs] = {}
        self._caller_attrs: dict[str, MetricAttrs] = {}
        self.tenant_labels = TenantLabels()
        self._store_mode: Callable[[], str] | None = None
        self.metrics_endpoint = metrics_endpoint
        self.tracer = (tracer_provider or trace.NoOpTracerProvider()).get_tracer(
            INSTRUMENTATION_NAME
        )
        self.meter = (meter_provider or metrics.NoOpMeterProvider()).get_meter(INSTRUMENTATION_NAME)
        self._create_instruments()

    @classmethod
    def disabled(cls) -> Telemetry:
        return cls()

    # -- instruments ----------------------------------------------------------
    def _create_instruments(self) -> None:
        m = self.meter
        m.create_observable_counter(
            "fairgate.admissions",
            [self._admissions_counter],
            "{request}",
            "Requests admitted to the engine",
        )
        self.rejections = m.create_counter(
            "fairgate.rejections", "{request}", "Requests refused before streaming, by reason"
        )
        self.queue_wait = m.create_histogram(
            "fairgate.queue.wait",
            "s",
            "Time from arrival to admission into the engine",
            explicit_bucket_boundaries_advisory=n.QUEUE_WAIT_BUCKETS_S,
        )
        self.ttft = m.create_histogram(
            "gen_ai.server.time_to_first_token",
            "s",
            "Time from arrival to the first output token",
            explicit_bucket_boundaries_advisory=n.TTFT_BUCKETS_S,
        )
        self.tpot = m.create_histogram(
            "gen_ai.server.time_per_output_token",
            "s",
            "Time per output token after the first",
            explicit_bucket_boundaries_advisory=n.TPOT_BUCKETS_S,
        )
        self.duration = m.create_histogram(
            "gen_ai.server.request.duration",
            "s",
            "Generate call duration, by tenant and outcome (ok, rejected, error, cancelled)",
            explicit_bucket_boundaries_advisory=n.DURATION_BUCKETS_S,
        )
        # The GenAI conventions name only a client-side token histogram
        # (gen_ai.client.token.usage); this is the server's, under the
        # server namespace, with the same attributes.
        self.token_usage = m.create_histogram(
            "gen_ai.server.token.usage",
            "{token}",
            "Tokens per request by tenant and type (input, output); _sum: tokens per tenant",
            explicit_bucket_boundaries_advisory=n.TOKEN_BUCKETS,
        )
        m.create_observable_gauge(
            "fairgate.queue.depth", [self._queue_depth], "{request}", "Queued requests per tenant"
        )
        m.create_observable_gauge(
            "fairgate.tenant.in_flight",
            [self._tenant_in_flight],
            "{request}",
            "Requests in the engine per tenant",
        )
        m.create_observable_gauge(
            "fairgate.engine.in_flight",
            [self._engine_in_flight],
            "{request}",
            "Requests admitted to the engine (and the admission limit)",
        )
        self.retractions = m.create_counter(
            "fairgate.engine.retractions",
            "{retraction}",
            "Times the engine retracted a running request to make room for one of higher "
            "priority (a lent admission, fair_isolation=preempt): its KV freed, its prompt "
            "and output so far prefilled again; by the retracted request's tenant",
        )
        m.create_observable_counter(
            "fairgate.engine.lent_admissions",
            [self._lent_admissions],
            "{request}",
            "Admissions beyond the engine's room for light tenants (fair_isolation=preempt): "
            "the engine retracts a running request for each that finds it full",
        )
        m.create_observable_gauge(
            "fairgate.engine.kv_tokens",
            [self._engine_kv_tokens],
            "{token}",
            "KV tokens reserved in the engine (prompt + max output), the limit and capacity",
        )
        m.create_observable_gauge(
            "fairgate.store.mode",
            [self._store_mode_gauge],
            "1",
            "1 for the state store's current failure mode (normal, fail-open, fail-closed)",
        )

    # -- per-request helpers (GenerateObservation) ------------------------------
    def admitted(self, attrs: MetricAttrs, priority: str) -> None:
        key = (attrs.label, priority)
        self._admissions[key] = self._admissions.get(key, 0) + 1

    def metric_attrs(self, tenant: str, model: str) -> MetricAttrs:
        """The metric attribute sets of (tenant, model), built once; the
        tenant's label is bounded (`TenantLabels`)."""
        if self.tenant_labels.changed():  # a tenant created or deleted: judge again
            self._metric_attrs.clear()
        attrs = self._metric_attrs.get((tenant, model))
        if attrs is None:
            if len(self._metric_attrs) >= _MAX_ATTR_SETS:
                self._metric_attrs.clear()
            label = self.tenant_labels.of(tenant)
            attrs = self._metric_attrs[(tenant, model)] = MetricAttrs(tenant, label, model)
        return attrs

    # -- wiring -----------------------------------------------------------------
    def watch_model(self, model: ServedModel) -> None:
        """Report this model's dispatcher and engine in the gauges."""
        self._models.append(model)

    def caller_attrs(self, label: str) -> MetricAttrs:
        """Attribute sets of a call refused before it named a model (`label`: bounded)."""
        attrs = self._caller_attrs.get(label)
        if attrs is None:
            attrs = self._caller_attrs[label] = MetricAttrs(label, label, n.NO_MODEL)
        return attrs

    def watch_tenants(self, registry: Callable[[], TenantRegistry]) -> None:
        """Tenant labels are judged against `registry()` (the live registry)."""
        self.tenant_labels.watch(registry)

    def watch_store(self, mode: Callable[[], str]) -> None:
        """Hook for the state store: `mode()` names its current failure mode."""
        self._store_mode = mode

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        if not self.enabled:
            return []
        from service.telemetry.interceptor import TelemetryInterceptor

        return [TelemetryInterceptor(self)]

    def start_generate(
        self, req: QueuedRequest, model: ServedModel, *, prompt: str | None = None
    ) -> GenerateObservation | NoopObservation:
        """Observe one Generate call from queueing to the end (no-op when disabled)."""
        from service.telemetry.observation import (
            NOOP_OBSERVATION,
            RPC_SCOPE,
            GenerateObservation,
        )

        scope = RPC_SCOPE.get()
        if scope is None:  # telemetry off, or called outside the interceptor
            return NOOP_OBSERVATION
        return GenerateObservation(self, scope, req, model, prompt)

    async def start(self) -> None:
        """Start serving the Prometheus endpoint, when configured."""
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.start()

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Stop the endpoint, then flush and stop the providers this object built.

        Flushing waits for exporters (an OTLP collector that is down retries
        with backoff), so it runs on a daemon thread and is abandoned after
        `timeout_s`: stopping the server never hangs on telemetry.
        """
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.stop()
        hooks, self._shutdown = self._shutdown, []
        if not hooks:
            return
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def run() -> None:
            try:
                for hook in hooks:
                    hook()
            finally:
                with contextlib.suppress(RuntimeError):  # the loop may be gone by then
                    loop.call_soon_threadsafe(done.set)

        threading.Thread(target=run, name="telemetry-shutdown", daemon=True).start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout_s)

    def shutdown_now(self) -> None:
        """Blocking shutdown of the providers this object built (no endpoint to stop)."""
        hooks, self._shutdown = self._shutdown, []
        for hook in hooks:
            hook()

    # -- gauge callbacks (run on the metric reader's thread) ---------------------
    def _admissions_counter(self, _: CallbackOptions) -> Iterable[Observation]:
        for (tenant, priority), count in self._admissions.copy().items():
            yield Observation(count, {n.TENANT: tenant, n.PRIORITY: priority})

    def _per_tenant(self, field: str) -> Iterable[Observation]:
        # Bounded labels: tenants that share one ("_other") are summed under it.
        totals: dict[str, int] = {}
        for model in list(self._models):
            for t in model.dispatcher.stats().tenants:
                label = self.tenant_labels.of(t.tenant_id)
                totals[label] = totals.get(label, 0) + int(getattr(t, field))
        for label, value in totals.items():
            yield Observation(value, {n.TENANT: label})

    def _queue_depth(self, _: CallbackOptions) -> Iterable[Observation]:
        return self._per_tenant("queued")

    def _tenant_in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        return self._per_tenant("in_flight")

    def _engine_in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        for model in list(self._models):
            stats = model.dispatcher.stats()
            attrs = {n.GEN_AI_REQUEST_MODEL: model.name, n.ENGINE_KIND: model.engine.kind}
            yield Observation(stats.in_flight, {**attrs, "fairgate.kind": "used"})
            yield Observation(stats.limits.max_requests, {**attrs, "fairgate.kind": "limit"})

    def _lent_admissions(self, _: CallbackOptions) -> Iterable[Observation]:
        for model in list(self._models):
            attrs = {n.GEN_AI_REQUEST_MODEL: model.name, n.ENGINE_KIND: model.engine.kind}
            yield Observation(model.dispatcher.stats().lent_total, attrs)

    def _engine_kv_tokens(self, _: CallbackOptions) -> Iterable[Observation]:
        for model in list(self._models):
            stats = model.dispatcher.stats()
            attrs = {n.GEN_AI_REQUEST_MODEL: model.name, n.ENGINE_KIND: model.engine.kind}
            yield Observation(stats.in_flight_kv_tokens, {**attrs, "fairgate.kind": "used"})
            yield Observation(stats.limits.max_kv_tokens, {**attrs, "fairgate.kind": "limit"})
            capacity = model.engine.capacity().max_total_tokens
            yield Observation(capacity, {**attrs, "fairgate.kind": "capacity"})

    def _store_mode_gauge(self, _: CallbackOptions) -> Iterable[Observation]:
        if self._store_mode is None:
            return
        current = self._store_mode()
        for mode in ("normal", "fail-open", "fail-closed"):
            yield Observation(1 if mode == current else 0, {"fairgate.store.mode": mode})
