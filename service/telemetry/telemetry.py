"""The service's telemetry: instruments, gauges over live state, and the wiring.

`Telemetry` is built once (`service/telemetry/setup.py` from the OTEL_*
environment, or by tests with in-memory providers) and handed to the server:
its interceptor opens each RPC's server span, `observers` watch each
generation's lifecycle (service/lifecycle.py), and its gauges read the
dispatchers' `stats()` on the metric reader's thread.
`Telemetry.disabled()` installs nothing: no interceptor, no observer, no
per-request work.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from service.engines.isolation_stats import isolation_counts, unsent_requests
from service.telemetry import names as n
from service.telemetry.instruments import Instruments
from service.telemetry.interceptor import TelemetryInterceptor
from service.telemetry.observation import RPC_SCOPE, GenerateObservation

if TYPE_CHECKING:
    import grpc

    from scheduler.gate_stats import GateStats
    from scheduler.request import QueuedRequest
    from scheduler.tenancy.tenants import TenantRegistry
    from service.budget_check import BudgetCheck
    from service.lifecycle import ObserverFactory
    from service.models import ServedModel
    from service.telemetry.prometheus import MetricsEndpoint


class Telemetry(Instruments):
    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        capture_content: bool = False,
        shutdown: Sequence[Callable[[], None]] = (),
        metrics_endpoint: MetricsEndpoint | None = None,
    ) -> None:
        super().__init__(tracer_provider, meter_provider, capture_content=capture_content)
        self._shutdown = list(shutdown)
        self._models: list[ServedModel] = []
        self.metrics_endpoint = metrics_endpoint
        self._budgets: BudgetCheck | None = None
        self._create_gauges()

    @classmethod
    def disabled(cls) -> Telemetry:
        return cls()

    def _create_gauges(self) -> None:
        m = self.meter
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
            "Requests admitted to the engine (and the admission limit; a pool's admitted "
            "requests no worker has yet: unsent)",
        )
        m.create_observable_counter(
            "fairgate.engine.lent_admissions",
            [self._lent_admissions],
            "{request}",
            "Admissions beyond the engine's room for light tenants (fair_isolation=preempt): "
            "the engine retracts a running request for each that finds it full",
        )
        m.create_observable_counter(
            "fairgate.engine.isolation_events",
            [self._isolation_events],
            "{event}",
            "What the isolation levers did (staggered prefill, the cold-start hold, staged "
            "prefill), by event",
        )
        m.create_observable_gauge(
            "fairgate.engine.kv_tokens",
            [self._engine_kv_tokens],
            "{token}",
            "KV tokens reserved in the engine (prompt + max output), the limit and capacity",
        )
        m.create_observable_gauge(
            "fairgate.budget.spent",
            [self._budget_spent],
            "1",
            "Fraction of each budget spent in its window, as last checked (tokens or requests, "
            "the larger)",
        )
        m.create_observable_gauge(
            "fairgate.budget.warning",
            [self._budget_warning],
            "1",
            "1 while a budget's spend is at or above its warn_at, else 0",
        )

    # -- wiring -----------------------------------------------------------------
    def watch_model(self, model: ServedModel) -> None:
        """Report this model's dispatcher and engine in the gauges."""
        self._models.append(model)

    def watch_budgets(self, budgets: BudgetCheck) -> None:
        """Report the budgets' spend as `budgets` last saw it (service/budget_check.py)."""
        self._budgets = budgets

    def watch_tenants(self, registry: Callable[[], TenantRegistry]) -> None:
        """Tenant labels are judged against `registry()` (the live registry)."""
        self.tenant_labels.watch(registry)

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [TelemetryInterceptor(self)] if self.enabled else []

    @property
    def observers(self) -> tuple[ObserverFactory, ...]:
        """What watches each generation (none when disabled)."""
        return (self.observe_generate,) if self.enabled else ()

    def observe_generate(
        self, req: QueuedRequest, model: ServedModel, prompt: str | None
    ) -> GenerateObservation | None:
        """The observer of one Generate call, inside its RPC's scope (None outside one)."""
        scope = RPC_SCOPE.get()
        if scope is None:  # called outside the interceptor (or the HTTP front's scope)
            return None
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
    def _per_tenant(self, field: str) -> Iterable[Observation]:
        # Bounded labels: tenants that share one ("_other") are summed under it.
        totals: dict[str, int] = {}
        for model in list(self._models):
            for t in model.dispatcher.stats().tenants:
                label = self.tenant_labels.of(t.tenant_id)
                totals[label] = totals.get(label, 0) + int(getattr(t, field))
        for label, value in totals.items():
            yield Observation(value, {n.TENANT: label})

    def _budget_points(self) -> Iterable[tuple[dict[str, str], float, bool]]:
        seen = self._budgets.seen if self._budgets is not None else {}
        for (tenant_id, key_id, period), state in list(seen.items()):
            attrs = {n.TENANT: self.tenant_labels.of(tenant_id), n.BUDGET_PERIOD: period}
            if key_id:
                attrs[n.API_KEY_ID] = key_id
            yield attrs, state.fraction, state.warning

    def _budget_spent(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(f, attrs) for attrs, f, _ in self._budget_points()]

    def _budget_warning(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(int(w), attrs) for attrs, _, w in self._budget_points()]

    def _queue_depth(self, _: CallbackOptions) -> Iterable[Observation]:
        return self._per_tenant("queued")

    def _tenant_in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        return self._per_tenant("in_flight")

    def _per_model(self) -> Iterator[tuple[ServedModel, GateStats, dict[str, str]]]:
        """Each served model, its admission stats and its gauges' attributes."""
        for model in list(self._models):
            yield model, model.dispatcher.stats(), _model_attrs(model)

    def _engine_in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        for model, stats, attrs in self._per_model():
            yield Observation(stats.in_flight, {**attrs, "fairgate.kind": "used"})
            yield Observation(stats.limits.max_requests, {**attrs, "fairgate.kind": "limit"})
            if (unsent := unsent_requests(model.engine)) is not None:
                yield Observation(unsent, {**attrs, "fairgate.kind": "unsent"})

    def _lent_admissions(self, _: CallbackOptions) -> Iterable[Observation]:
        for _model, stats, attrs in self._per_model():
            yield Observation(stats.lent_total, attrs)

    def _isolation_events(self, _: CallbackOptions) -> Iterable[Observation]:
        for model in list(self._models):  # the engine's counts: no admission stats needed
            attrs = _model_attrs(model)
            for event, count in isolation_counts(model.engine).items():
                yield Observation(count, {**attrs, n.ISOLATION_EVENT: event})

    def _engine_kv_tokens(self, _: CallbackOptions) -> Iterable[Observation]:
        for model, stats, attrs in self._per_model():
            yield Observation(stats.in_flight_kv_tokens, {**attrs, "fairgate.kind": "used"})
            yield Observation(stats.limits.max_kv_tokens, {**attrs, "fairgate.kind": "limit"})
            capacity = model.engine.capacity().max_total_tokens
            yield Observation(capacity, {**attrs, "fairgate.kind": "capacity"})


def _model_attrs(model: ServedModel) -> dict[str, str]:
    """A served model's gauges' attributes."""
    return {n.GEN_AI_REQUEST_MODEL: model.name, n.ENGINE_KIND: model.engine.kind}
