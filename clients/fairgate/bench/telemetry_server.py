"""Telemetry for the benchmark servers: off, or fully on with exporters that
discard what they receive (so spans and metrics are built, batched, encoded
and handed over, as with a real collector, minus the network).

"on" is `build_telemetry`'s default OTLP/gRPC set-up with the exporters'
network call left out: the same span encoder, batch processor settings,
exemplar filter and metric export interval (1 s here, so encoding metrics is
counted more often than production's 60 s)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from service.settings import Settings
from service.telemetry.setup import build_telemetry
from service.telemetry.telemetry import Telemetry


def bench_telemetry(mode: str, settings: Settings) -> tuple[Telemetry | None, Callable[[], None]]:
    """(telemetry for App.start, a function printing what was exported to stderr)."""
    if mode == "off":
        return Telemetry.disabled(), lambda: None
    if mode == "env":
        return build_telemetry(settings), lambda: None
    if mode != "on":
        raise ValueError(f"telemetry must be off, on or env, not {mode!r}")
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        MetricExporter,
        MetricExportResult,
        MetricsData,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from service.telemetry.setup import exemplar_filter

    counts = {"spans": 0, "span_bytes": 0, "metric_exports": 0}

    class EncodingSpanExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            counts["spans"] += len(spans)
            # What the SDK's OTLPSpanExporter hands gRPC, serialized as gRPC would.
            counts["span_bytes"] += len(encode_spans(spans).SerializeToString())
            return SpanExportResult.SUCCESS

    class EncodingMetricExporter(MetricExporter):
        def export(
            self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
        ) -> MetricExportResult:
            encode_metrics(metrics_data).SerializeToString()
            counts["metric_exports"] += 1
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            pass

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(EncodingSpanExporter()))
    reader = PeriodicExportingMetricReader(EncodingMetricExporter(), export_interval_millis=1000)
    meter_provider = MeterProvider(
        metric_readers=[reader], exemplar_filter=exemplar_filter(os.environ)
    )
    telemetry = Telemetry(
        tracer_provider,
        meter_provider,
        shutdown=[tracer_provider.shutdown, meter_provider.shutdown],
    )

    def report() -> None:
        print(
            f"  telemetry server: exported {counts['spans']} spans "
            f"({counts['span_bytes'] / 1e6:.1f} MB OTLP), "
            f"{counts['metric_exports']} metric exports",
            file=sys.stderr,
            flush=True,
        )

    return telemetry, report
