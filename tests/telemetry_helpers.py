"""In-memory OpenTelemetry for tests: the server's own providers, and the
process-wide provider the Python client reports to (set once per process)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.telemetry.telemetry import Telemetry

_CLIENT_SPANS = InMemorySpanExporter()
_client_provider: TracerProvider | None = None


@dataclass
class Captured:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    telemetry: Telemetry

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, data point) of every point of `metric`, collected now."""
        data = self.reader.get_metrics_data()
        out: list[tuple[dict[str, Any], Any]] = []
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == metric:
                        out.extend((dict(p.attributes or {}), p) for p in m.data.data_points)
        return out

    def value(self, metric: str, attrs: dict[str, Any] | None = None, field: str = "") -> float:
        """Sum of `field` ("value" of counters and gauges, "count" or "sum" of
        histograms; default value or count) over the points of `metric` whose
        attributes include `attrs`."""
        total = 0.0
        for point_attrs, p in self.points(metric):
            if all(point_attrs.get(k) == v for k, v in (attrs or {}).items()):
                total += getattr(p, field or ("count" if hasattr(p, "count") else "value"))
        return total


def make_captured(
    *, capture_content: bool = False, telemetry_cls: type[Telemetry] = Telemetry
) -> Captured:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = telemetry_cls(
        tracer_provider,
        meter_provider,
        capture_content=capture_content,
        shutdown=[tracer_provider.shutdown, meter_provider.shutdown],
    )
    return Captured(spans, reader, telemetry)


@pytest.fixture
def captured() -> Captured:
    return make_captured()


@pytest.fixture
def client_spans() -> InMemorySpanExporter:
    """The Python client's spans (a global TracerProvider, installed on first use)."""
    global _client_provider
    if _client_provider is None:
        _client_provider = TracerProvider()
        _client_provider.add_span_processor(SimpleSpanProcessor(_CLIENT_SPANS))
        trace.set_tracer_provider(_client_provider)
    _CLIENT_SPANS.clear()
    return _CLIENT_SPANS
