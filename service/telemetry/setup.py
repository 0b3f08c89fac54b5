"""Build `Telemetry` from the standard OTEL_* environment and fairgate's settings.

- `OTEL_SDK_DISABLED=true`: nothing is installed (no interceptor, no work).
- `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER`: comma-separated among
  `otlp`, `console`, `none` (metrics also `prometheus`). Unset, they are
  `otlp` when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
  the per-signal variable) and `none` otherwise, so a bare `fairgate serve`
  does not retry against a collector that is not there.
- OTLP is sent over gRPC, or HTTP with `OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`,
  by the SDK's own exporters, which read the endpoint (general or per
  signal, with the /v1/<signal> path for HTTP), headers, timeout,
  compression and certificates from the process environment, as do its
  batch span processor (`OTEL_BSP_*`) and metric reader
  (`OTEL_METRIC_EXPORT_INTERVAL`). `environ` (tests) decides only what is
  fairgate's: which exporters, the protocol, the exemplar filter.
- The Prometheus scrape endpoint is on when `FAIRGATE_METRICS_LISTEN` is set
  (or `prometheus` is among the metrics exporters: then on 127.0.0.1:9464).

Exports run on the SDK's background threads: a collector that is down or
slow never delays a request.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from service.settings import Settings
from service.telemetry.prometheus import MetricsEndpoint
from service.telemetry.telemetry import Telemetry

DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"
TRACE_EXPORTERS = ("otlp", "console", "none")
METRIC_EXPORTERS = ("otlp", "console", "prometheus", "none")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _exporters(env: Mapping[str, str], signal: str, allowed: tuple[str, ...]) -> list[str]:
    raw = env.get(f"OTEL_{signal.upper()}_EXPORTER")
    if raw is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
            f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    names = [x.strip().lower() for x in raw.split(",") if x.strip()]
    unknown = [x for x in names if x not in allowed]
    if unknown:
        raise ValueError(
            f"OTEL_{signal.upper()}_EXPORTER: unsupported {', '.join(unknown)} "
            f"(supported: {', '.join(allowed)})"
        )
    return [x for x in names if x != "none"]


def _protocol(env: Mapping[str, str], signal: str) -> str:
    proto = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
    )
    proto = proto.strip().lower()
    if proto not in ("grpc", "http/protobuf"):
        raise ValueError(f"OTLP protocol {proto!r} is not supported (grpc, http/protobuf)")
    return proto


# Each signal's exporter classes ("module:class"), imported only when chosen: the
# OTLP exporters pull in their transports.
_EXPORTERS = {
    "traces": (
        "opentelemetry.sdk.trace.export:ConsoleSpanExporter",
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter:OTLPSpanExporter",
        "opentelemetry.exporter.otlp.proto.http.trace_exporter:OTLPSpanExporter",
    ),
    "metrics": (
        "opentelemetry.sdk.metrics.export:ConsoleMetricExporter",
        "opentelemetry.exporter.otlp.proto.grpc.metric_exporter:OTLPMetricExporter",
        "opentelemetry.exporter.otlp.proto.http.metric_exporter:OTLPMetricExporter",
    ),
}


def _exporter(signal: str, name: str, env: Mapping[str, str]) -> Any:
    """The `signal`'s exporter `name` (console or otlp, over the configured protocol)."""
    console, otlp_grpc, otlp_http = _EXPORTERS[signal]
    if name == "console":
        chosen = console
    else:
        chosen = otlp_grpc if _protocol(env, signal) == "grpc" else otlp_http
    module, _, cls = chosen.partition(":")
    return getattr(importlib.import_module(module), cls)()


def exemplar_filter(env: Mapping[str, str]) -> Any:
    """`OTEL_METRICS_EXEMPLAR_FILTER`, default `always_off` (the SDK's is `trace_based`).

    Trace-based exemplars copy the current span's ids into every histogram
    record made while a span is current (all of this service's records): a
    measurable share of the per-request telemetry cost, for a link from a
    metric point to one trace that Prometheus scrapes do not carry anyway.
    """
    from opentelemetry.sdk.metrics import (
        AlwaysOffExemplarFilter,
        AlwaysOnExemplarFilter,
        ExemplarFilter,
        TraceBasedExemplarFilter,
    )

    name = (env.get("OTEL_METRICS_EXEMPLAR_FILTER") or "always_off").strip().lower()
    filters: dict[str, Callable[[], ExemplarFilter]] = {
        "always_off": AlwaysOffExemplarFilter,
        "always_on": AlwaysOnExemplarFilter,
        "trace_based": TraceBasedExemplarFilter,
    }
    if name not in filters:
        raise ValueError(
            f"OTEL_METRICS_EXEMPLAR_FILTER: unsupported {name} (supported: {', '.join(filters)})"
        )
    return filters[name]()


def prometheus_listen(settings: Settings, environ: Mapping[str, str] | None = None) -> str:
    """Where `/metrics` is served: `metrics_listen`, else the default port when
    OTEL_METRICS_EXPORTER names prometheus; "" for nowhere."""
    env = os.environ if environ is None else environ
    if settings.metrics_listen or _truthy(env.get("OTEL_SDK_DISABLED")):
        return settings.metrics_listen
    names = _exporters(env, "metrics", METRIC_EXPORTERS)
    return DEFAULT_METRICS_LISTEN if "prometheus" in names else ""


def build_telemetry(settings: Settings, environ: Mapping[str, str] | None = None) -> Telemetry:
    env = os.environ if environ is None else environ
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return Telemetry.disabled()
    trace_names = _exporters(env, "traces", TRACE_EXPORTERS)
    metric_names = _exporters(env, "metrics", METRIC_EXPORTERS)
    metrics_listen = prometheus_listen(settings, env)
    metric_names = [name for name in metric_names if name != "prometheus"]
    if not trace_names and not metric_names and not metrics_listen:
        return Telemetry.disabled()

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "fairgate"})
    shutdown: list[Callable[[], None]] = []
    tracer_provider = None
    if trace_names:
        tracer_provider = TracerProvider(resource=resource)
        for name in trace_names:
            tracer_provider.add_span_processor(BatchSpanProcessor(_exporter("traces", name, env)))
        shutdown.append(tracer_provider.shutdown)
    readers: list[MetricReader] = [
        PeriodicExportingMetricReader(_exporter("metrics", name, env)) for name in metric_names
    ]
    endpoint = None
    if metrics_listen:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import (
            CollectorRegistry,
            GCCollector,
            PlatformCollector,
            ProcessCollector,
        )

        registry = CollectorRegistry(auto_describe=True)
        # No otel_scope_* labels: one scope, and they double every series' labels.
        readers.append(PrometheusMetricReader(registry=registry, scope_info_enabled=False))
        # process_* (CPU, RSS, fds, start time), python_gc_*, python_info.
        ProcessCollector(registry=registry)
        GCCollector(registry=registry)
        PlatformCollector(registry=registry)
        endpoint = MetricsEndpoint(metrics_listen, registry)
    meter_provider = None
    if readers:
        meter_provider = MeterProvider(
            metric_readers=readers, resource=resource, exemplar_filter=exemplar_filter(env)
        )
        shutdown.append(meter_provider.shutdown)
    return Telemetry(
        tracer_provider,
        meter_provider,
        capture_content=settings.telemetry_capture_content,
        shutdown=shutdown,
        metrics_endpoint=endpoint,
    )
