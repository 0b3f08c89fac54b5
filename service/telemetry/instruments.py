"""The per-request side of telemetry: tracer, instruments and cached attribute sets.

`Instruments` is what one RPC's telemetry (`observation.py`: `RpcScope`,
`GenerateObservation`) records into; `Telemetry` (telemetry.py) extends it
with the gauges over live state and the wiring. Split so that the modules of
this package import one way only: instruments ← observation ← interceptor ←
telemetry.

Cost matters (every request pays it): metric attribute sets are built once
per (tenant, model) (`MetricAttrs`), admissions are a dict update read by an
observable counter (an SDK record per request costs ~10 µs).
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.util.types import AttributeValue

from service.telemetry import names as n
from service.telemetry.tenant_labels import TenantLabels

INSTRUMENTATION_NAME = "fairgate.service"
# Cached metric attribute sets (tenants x models); past this, start over.
_MAX_ATTR_SETS = 10_000


class Instruments:
    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        capture_content: bool = False,
    ) -> None:
        self.enabled = tracer_provider is not None or meter_provider is not None
        self.capture_content = capture_content
        # Admissions by (tenant, priority): counted here, read by the
        # observable counter on the metric reader's thread (an SDK record per
        # request costs ~10 µs; this costs a dict update).
        self._admissions: dict[tuple[str, str], int] = {}
        self._metric_attrs: dict[tuple[str, str], MetricAttrs] = {}
        self._caller_attrs: dict[str, MetricAttrs] = {}
        self.tenant_labels = TenantLabels()
        self.tracer = (tracer_provider or trace.NoOpTracerProvider()).get_tracer(
            INSTRUMENTATION_NAME
        )
        self.meter = (meter_provider or metrics.NoOpMeterProvider()).get_meter(INSTRUMENTATION_NAME)
        self._create_instruments()

    def _create_instruments(self) -> None:
        """The per-request instruments (the gauges over live state are `Telemetry`'s)."""
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
        self.retractions = m.create_counter(
            "fairgate.engine.retractions",
            "{retraction}",
            "Times the engine retracted a running request to make room for one of higher "
            "priority (a lent admission, fair_isolation=preempt): its KV freed, its prompt "
            "and output so far prefilled again; by the retracted request's tenant",
        )

    # -- per-request helpers (RpcScope, GenerateObservation) ----------------------
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

    def caller_attrs(self, label: str) -> MetricAttrs:
        """Attribute sets of a call refused before it named a model (`label`: bounded)."""
        attrs = self._caller_attrs.get(label)
        if attrs is None:
            attrs = self._caller_attrs[label] = MetricAttrs(label, label, n.NO_MODEL)
        return attrs

    def _admissions_counter(self, _: CallbackOptions) -> Iterable[Observation]:
        for (tenant, priority), count in self._admissions.copy().items():
            yield Observation(count, {n.TENANT: tenant, n.PRIORITY: priority})


class MetricAttrs:
    """Metric attribute sets of one (tenant, model), built once and shared
    (`Telemetry.metric_attrs`); the SDK copies what it keeps.

    Every point of a metric carries the same keys, none empty (the Prometheus
    exposition fills a key missing from one point with "" in every other
    series). `tenant` is the id; `label`, its bounded metric label."""

    __slots__ = ("_by_class", "_outcomes", "base", "input", "label", "output", "tenant")

    def __init__(self, tenant: str, label: str, model: str) -> None:
        self.tenant = tenant
        self.label = label
        self.base: dict[str, AttributeValue] = {
            n.TENANT: label,
            n.GEN_AI_OPERATION: n.OPERATION_TEXT_COMPLETION,
            n.GEN_AI_PROVIDER: n.PROVIDER_FAIRGATE,
            n.GEN_AI_REQUEST_MODEL: model,
        }
        self.input = {**self.base, n.GEN_AI_TOKEN_TYPE: "input"}
        self.output = {**self.base, n.GEN_AI_TOKEN_TYPE: "output"}
        self._by_class: dict[str, dict[str, AttributeValue]] = {}
        self._outcomes: dict[tuple[str, grpc.StatusCode], dict[str, AttributeValue]] = {}

    def by_class(self, priority: str) -> dict[str, AttributeValue]:
        attrs = self._by_class.get(priority)
        if attrs is None:
            attrs = self._by_class[priority] = {n.TENANT: self.label, n.PRIORITY: priority}
        return attrs

    def outcome(self, outcome: str, code: grpc.StatusCode) -> dict[str, AttributeValue]:
        attrs = self._outcomes.get((outcome, code))
        if attrs is None:
            attrs = {**self.base, n.OUTCOME: outcome, n.RPC_RESPONSE_STATUS_CODE: code.name}
            self._outcomes[(outcome, code)] = attrs
        return attrs
