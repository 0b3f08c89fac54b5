"""Telemetry configuration from the OTEL_* environment, and JSON logs with trace ids."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider

from service.settings import Settings
from service.telemetry.logs import JsonFormatter
from service.telemetry.setup import build_telemetry


def test_nothing_configured_means_nothing_installed() -> None:
    assert not build_telemetry(Settings(), {}).enabled
    assert not build_telemetry(Settings(), {"OTEL_TRACES_EXPORTER": "none"}).enabled
    env = {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    assert not build_telemetry(Settings(metrics_listen="127.0.0.1:0"), env).enabled


def test_an_endpoint_turns_otlp_on_and_unknown_exporters_fail() -> None:
    tel = build_telemetry(Settings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"})
    assert tel.enabled and len(tel.interceptors()) == 1
    tel.shutdown_now()
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER"):
        build_telemetry(Settings(), {"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="protocol"):
        build_telemetry(
            Settings(), {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}
        )


def test_prometheus_exporter_name_opens_the_default_port() -> None:
    tel = build_telemetry(Settings(), {"OTEL_METRICS_EXPORTER": "prometheus"})
    assert tel.metrics_endpoint is not None and tel.metrics_endpoint.port == 9464
    tel.shutdown_now()


def test_the_sdk_exporters_read_their_own_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    # Endpoint and signal path are the SDK's to read, not ours.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    tel = build_telemetry(Settings())
    (processor,) = tel.tracer.span_processor._span_processors  # type: ignore[attr-defined]
    exporter = processor.span_exporter
    assert type(exporter).__module__.startswith("opentelemetry.exporter.otlp.proto.http")
    assert exporter._endpoint == "http://c:4318/v1/traces"
    tel.shutdown_now()


def test_json_logs_carry_trace_and_span_ids() -> None:
    tracer = TracerProvider().get_tracer("t")
    record = logging.LogRecord("fairgate.x", logging.INFO, __file__, 1, "hello %s", ("a",), None)
    record.tenant = "team-a"
    with tracer.start_as_current_span("s") as span:
        line = json.loads(JsonFormatter().format(record))
    ctx = span.get_span_context()
    assert line["message"] == "hello a" and line["level"] == "INFO"
    assert line["trace_id"] == format(ctx.trace_id, "032x")
    assert line["span_id"] == format(ctx.span_id, "016x")
    assert line["tenant"] == "team-a"
    assert "trace_id" not in json.loads(JsonFormatter().format(record))


def test_exemplars_are_off_unless_asked_for() -> None:
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, TraceBasedExemplarFilter

    from service.telemetry.setup import exemplar_filter

    assert isinstance(exemplar_filter({}), AlwaysOffExemplarFilter)
    on = exemplar_filter({"OTEL_METRICS_EXEMPLAR_FILTER": "trace_based"})
    assert isinstance(on, TraceBasedExemplarFilter)
    with pytest.raises(ValueError, match="OTEL_METRICS_EXEMPLAR_FILTER"):
        exemplar_filter({"OTEL_METRICS_EXEMPLAR_FILTER": "sometimes"})
