"""Traces and metrics end to end: Python client → server → scheduler → engine
(→ the SGLang stand-in over HTTP), with in-memory exporters and readers."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import aiohttp
import grpc
import pytest
from fairgate import AsyncClient, Client, FairgateError
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from service.engines.isolation_stats import EVENTS
from service.settings import Settings
from service.telemetry.setup import build_telemetry
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, eventually
from tests.sglang_helpers import StartSim, assert_no_sglang_leaks, sglang_settings, start_sim
from tests.telemetry_helpers import Captured, captured, client_spans, make_captured

__all__ = ["captured", "client_spans", "start_sim"]

GENERATE = "fairgate.v1.InferenceService/Generate"
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
PROMPT = "a secret prompt about fair queueing"


def _hex(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def _child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    assert span.context is not None and parent.context is not None and span.parent is not None
    return (
        span.context.trace_id == parent.context.trace_id
        and span.parent.span_id == parent.context.span_id
    )


async def test_one_trace_from_the_client_through_sglang_http(
    start_server: StartServer,
    start_sim: StartSim,
    captured: Captured,
    client_spans: InMemorySpanExporter,
) -> None:
    stand_in = await start_sim()
    app = await start_server(telemetry=captured.telemetry, **sglang_settings(stand_in))
    async with AsyncClient(app.address, tenant="team-a") as client:
        done = await client.complete(PROMPT, max_tokens=12, ignore_eos=True, request_id="r-1")
    usage = done.result.usage
    assert usage.completion_tokens == 12

    (client_span,) = [s for s in client_spans.get_finished_spans() if s.name == GENERATE]
    assert client_span.kind is SpanKind.CLIENT
    assert client_span.attributes is not None
    assert client_span.attributes["gen_ai.usage.output_tokens"] == 12
    await eventually(lambda: len(captured.finished(GENERATE)) == 1, what="server span")
    spans = captured.finished()
    server = _one(spans, GENERATE)
    queue = _one(spans, "fairgate.queue")
    engine = _one(spans, f"text_completion {stand_in.model_name}")
    assert server.kind is SpanKind.SERVER and _child_of(server, client_span)
    assert _child_of(queue, server) and _child_of(engine, server)
    assert engine.kind is SpanKind.CLIENT
    # Into SGLang: the stand-in got the engine span's traceparent.
    assert engine.context is not None
    want = f"00-{_hex(engine.context.trace_id, 32)}-{_hex(engine.context.span_id, 16)}-"
    (got,) = stand_in.record.traceparents
    assert got.startswith(want) and int(got[-2:], 16) & 1  # sampled

    attrs = server.attributes or {}
    assert attrs["fairgate.tenant"] == "team-a"
    assert attrs["fairgate.request.id"] == "r-1"
    assert attrs["gen_ai.request.model"] == stand_in.model_name
    assert attrs["fairgate.priority"] == "interactive"
    assert attrs["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == 12
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    assert attrs["rpc.grpc.status_code"] == 0
    assert 0 <= attrs["fairgate.queue.wait_s"] <= attrs["fairgate.time_to_first_token_s"]
    assert server.status.status_code is StatusCode.UNSET
    assert [e.name for e in server.events] == ["gen_ai.first_token"]
    queue_attrs = queue.attributes or {}
    assert queue_attrs["fairgate.quota.result"] == "ok"
    assert queue_attrs["fairgate.admission.in_flight_requests"] == 1
    assert queue.end_time is not None and engine.start_time is not None
    assert queue.end_time <= engine.start_time
    assert (engine.attributes or {})["gen_ai.usage.output_tokens"] == 12
    # Prompts and outputs are not recorded by default.
    for span in spans:
        values = [*(span.attributes or {}).values()]
        values += [v for e in span.events for v in (e.attributes or {}).values()]
        assert not any(isinstance(v, str) and ("secret" in v or done.text in v) for v in values)

    # Metrics match what was done.
    assert (
        captured.value(
            "gen_ai.server.token.usage",
            {"fairgate.tenant": "team-a", "gen_ai.token.type": "output"},
            "sum",
        )
        == 12
    )
    assert (
        captured.value(
            "gen_ai.server.token.usage",
            {"fairgate.tenant": "team-a", "gen_ai.token.type": "input"},
            "sum",
        )
        == usage.prompt_tokens
    )
    assert captured.value("fairgate.admissions", {"fairgate.tenant": "team-a"}) == 1
    assert (
        captured.value(
            "gen_ai.server.request.duration",
            {"fairgate.tenant": "team-a", "fairgate.outcome": "ok"},
        )
        == 1
    )
    assert captured.value("gen_ai.server.time_to_first_token", {"fairgate.tenant": "team-a"}) == 1
    assert captured.value("gen_ai.server.time_per_output_token", {"fairgate.tenant": "team-a"}) == 1
    assert captured.value("gen_ai.server.token.usage", {"gen_ai.token.type": "output"}) == 1
    assert captured.value("fairgate.queue.wait", {"fairgate.tenant": "team-a"}) == 1
    assert captured.value("fairgate.engine.kv_tokens", {"fairgate.kind": "capacity"}) == (
        stand_in.engine.core.capacity
    )


async def test_a_lent_admission_and_the_retraction_it_costs(
    start_server: StartServer, start_sim: StartSim, captured: Captured
) -> None:
    """fair_isolation=preempt over a stand-in that preempts by priority: a flood
    fills the 4 slots, a light tenant's request is lent room beyond them, and the
    engine retracts one flood request for it (recomputed; it still finishes in
    full). Both show up: the lent admission, and the retraction on the retracted
    request's span and in `fairgate.engine.retractions` by its tenant."""
    stand_in = await start_sim(
        time_scale=1.0, enable_priority_scheduling=True, max_running_requests=4
    )
    app = await start_server(
        telemetry=captured.telemetry, **sglang_settings(stand_in, fair_isolation="preempt")
    )
    model = app.models.resolve("")
    assert model is not None
    async with (
        AsyncClient(app.address, tenant="flood") as flood,
        AsyncClient(app.address, tenant="light") as light,
    ):
        floods = [
            asyncio.create_task(flood.complete(PROMPT, max_tokens=300, ignore_eos=True))
            for _ in range(4)
        ]
        await eventually(lambda: len(stand_in.engine.core.running) == 4, what="the flood runs")
        done = await light.complete("hi", max_tokens=4, ignore_eos=True)
        assert done.result.finish_reason == "length"
        assert model.dispatcher.stats().lent_total == 1
        flooded = await asyncio.gather(*floods)
    assert all(d.result.usage.completion_tokens == 300 for d in flooded)
    assert stand_in.engine.core.preemptions == 1
    await eventually(lambda: len(captured.finished(GENERATE)) == 5, what="server spans")
    retracted = [
        s
        for s in captured.finished(GENERATE)
        if (s.attributes or {}).get("fairgate.engine.retractions")
    ]
    assert len(retracted) == 1 and (retracted[0].attributes or {})["fairgate.tenant"] == "flood"
    assert captured.value("fairgate.engine.retractions", {"fairgate.tenant": "flood"}) == 1
    assert captured.value("fairgate.engine.lent_admissions") == 1
    await assert_no_sglang_leaks(app, stand_in)


async def test_sync_client_and_in_process_engine(
    start_server: StartServer, client_spans: InMemorySpanExporter
) -> None:
    cap = make_captured(capture_content=True)
    app = await start_server(telemetry=cap.telemetry)

    def call() -> str:
        with Client(app.address) as c:
            return c.complete(PROMPT, max_tokens=5).text

    text = await asyncio.to_thread(call)
    (client_span,) = [s for s in client_spans.get_finished_spans() if s.name == GENERATE]
    await eventually(lambda: len(cap.finished(GENERATE)) == 1, what="server span")
    server = _one(cap.finished(), GENERATE)
    engine = _one(cap.finished(), f"text_completion {app.models.default}")
    assert _child_of(server, client_span) and _child_of(engine, server)
    assert (engine.attributes or {})["fairgate.engine.kind"] == "simulator"
    assert (server.attributes or {})["fairgate.tenant"] == "default"  # resolved
    # Opted in: prompt and completion are on the span.
    events = {e.name: dict(e.attributes or {}) for e in server.events}
    assert events["gen_ai.content.prompt"]["gen_ai.prompt"] == PROMPT
    assert events["gen_ai.content.completion"]["gen_ai.completion"] == text


TENANTS = """
default_tenant: slow
tenants:
  - id: slow
    over_quota: reject
    quotas: {requests_per_s: 0.001, requests_burst: 1, max_prompt_tokens: 64}
  - id: one-at-a-time
    over_quota: wait
    quotas: {max_concurrent: 1}
"""


async def test_rejections_by_reason_and_queue_depth(
    start_server: StartServer, captured: Captured, tmp_path: Path
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    app = await start_server(
        telemetry=captured.telemetry, tenants_file=str(path), sim_time_scale=1.0
    )
    async with AsyncClient(app.address, tenant="slow") as slow:
        await slow.complete("hi", max_tokens=2)
        with pytest.raises(FairgateError) as rate:
            await slow.complete("hi", max_tokens=2)
        assert rate.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(FairgateError) as big:
            await slow.complete("word " * 200, max_tokens=2)
        assert big.value.code == grpc.StatusCode.INVALID_ARGUMENT
    async with AsyncClient(app.address, tenant="nobody") as nobody:
        with pytest.raises(FairgateError):
            await nobody.complete("hi", max_tokens=2)
    assert (
        captured.value(
            "fairgate.rejections",
            {
                "fairgate.tenant": "slow",
                "fairgate.rejection.reason": "QUOTA_EXCEEDED",
                "fairgate.rejection.limit": "requests_per_s",
            },
        )
        == 1
    )
    assert (
        captured.value(
            "fairgate.rejections",
            {
                "fairgate.tenant": "slow",
                "fairgate.rejection.reason": "REQUEST_TOO_LARGE",
                "fairgate.rejection.limit": "max_prompt_tokens",
            },
        )
        == 1
    )
    assert (
        captured.value(
            "fairgate.rejections",
            # An unknown tenant's id is not a label (callers choose it).
            {"fairgate.tenant": "_unknown", "fairgate.rejection.reason": "TENANT_UNKNOWN"},
        )
        == 1
    )
    assert captured.value("gen_ai.server.request.duration", {"fairgate.outcome": "rejected"}) == 3
    # A quota rejection is not a server error on the span.
    rejected = [
        s
        for s in captured.finished(GENERATE)
        if (s.attributes or {}).get("rpc.grpc.status_code") == RESOURCE_EXHAUSTED
    ]
    assert len(rejected) == 1
    assert rejected[0].status.status_code is StatusCode.UNSET
    assert (rejected[0].attributes or {})["error.type"] == "QUOTA_EXCEEDED"
    assert all(s.status.status_code is not StatusCode.ERROR for s in captured.finished())

    # Queue depth: one tenant at max_concurrent 1, three requests.
    async with AsyncClient(app.address, tenant="one-at-a-time") as c:
        calls = [
            asyncio.create_task(c.complete("hi", max_tokens=60, ignore_eos=True)) for _ in range(3)
        ]
        await eventually(
            lambda: (
                captured.value("fairgate.queue.depth", {"fairgate.tenant": "one-at-a-time"}) == 2
            ),
            what="two queued",
        )
        assert (
            captured.value("fairgate.tenant.in_flight", {"fairgate.tenant": "one-at-a-time"}) == 1
        )
        assert captured.value("fairgate.engine.in_flight", {"fairgate.kind": "used"}) == 1
        await asyncio.gather(*calls)
    assert captured.value("fairgate.queue.depth", {"fairgate.tenant": "one-at-a-time"}) == 0
    assert captured.value("fairgate.admissions", {"fairgate.tenant": "one-at-a-time"}) == 3
    await assert_no_leaks(app)


async def test_telemetry_off_exports_nothing_and_serves(
    start_server: StartServer, start_sim: StartSim, client_spans: InMemorySpanExporter
) -> None:
    settings = Settings(metrics_listen="")
    assert not build_telemetry(settings, {}).enabled  # no exporter configured
    off = build_telemetry(
        settings, {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}
    )
    assert not off.enabled and off.interceptors() == []
    stand_in = await start_sim()
    app = await start_server(telemetry=off, **sglang_settings(stand_in))
    async with AsyncClient(app.address) as client:
        done = await client.complete("hello", max_tokens=4)
    assert done.result.usage.completion_tokens == 4
    # The client still traces (its own provider); the server adds nothing.
    assert stand_in.record.traceparents == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_otlp_collector_neither_slows_nor_fails_requests(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK's exporters and processors read these from the process environment.
    for key, value in {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{_closed_port()}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        "OTEL_BSP_SCHEDULE_DELAY": "20",
        "OTEL_METRIC_EXPORT_INTERVAL": "50",
    }.items():
        monkeypatch.setenv(key, value)
    telemetry = build_telemetry(Settings())
    assert telemetry.enabled
    app = await start_server(telemetry=telemetry)
    async with AsyncClient(app.address) as client:
        await client.complete("warm up", max_tokens=4)
        t0 = time.perf_counter()
        for _ in range(20):
            done = await client.complete("hello", max_tokens=8)
            assert done.result.finish_reason == "length"
        per_request_s = (time.perf_counter() - t0) / 20
    assert per_request_s < 0.25, per_request_s
    t0 = time.perf_counter()
    await app.stop(grace_s=0.1)
    assert time.perf_counter() - t0 < 7.0


async def test_prometheus_scrape_endpoint(start_server: StartServer) -> None:
    telemetry = build_telemetry(Settings(metrics_listen="127.0.0.1:0"), {})
    app = await start_server(telemetry=telemetry)
    async with AsyncClient(app.address, tenant="team-p") as client:
        await client.complete("hello", max_tokens=7, ignore_eos=True)
    assert telemetry.metrics_endpoint is not None
    async with aiohttp.ClientSession() as http, http.get(telemetry.metrics_endpoint.url) as resp:
        assert resp.status == 200
        text = await resp.text()
    lines = text.splitlines()
    assert any(
        line.startswith("gen_ai_server_token_usage_sum{")
        and 'fairgate_tenant="team-p"' in line
        and 'gen_ai_token_type="output"' in line
        and line.endswith(" 7.0")
        for line in lines
    ), text
    ttft = "gen_ai_server_time_to_first_token_seconds_bucket{"
    assert any(line.startswith(ttft) for line in lines)
    assert any(line.startswith("fairgate_queue_depth{") for line in lines)


async def test_isolation_events_count_what_the_levers_did(
    start_server: StartServer, captured: Captured
) -> None:
    """`fairgate.engine.isolation_events` reports the staged prefill's stages (and
    zeros for the levers a single engine has not got), from the engine's own counts."""
    app = await start_server(
        telemetry=captured.telemetry,
        engine="simulator",
        sim_time_scale=0.0,
        staged_prefill_min_tokens=256,
        staged_prefill_stage_tokens=128,
    )
    model = app.models.resolve("")
    assert model is not None
    async with AsyncClient(app.address, tenant="team-a") as client:
        done = await client.complete(list(range(300, 900)), max_tokens=2, ignore_eos=True)
    assert done.result.usage.prompt_tokens == 600
    stages = model.engine.staging.stages  # type: ignore[attr-defined]
    assert stages == 4  # 128, 256, 384 and 512; the request adds the rest
    event = "fairgate.isolation.event"
    assert captured.value("fairgate.engine.isolation_events", {event: "stages"}) == stages
    assert captured.value("fairgate.engine.isolation_events", {event: "staged_requests"}) == 1
    points = captured.points("fairgate.engine.isolation_events")
    assert {a[event] for a, _ in points} == set(EVENTS)  # every event, zeros included
    assert captured.value("fairgate.engine.isolation_events", {event: "kept_free"}) == 0
    await assert_no_leaks(app)
