"""What /metrics exposes: bounded tenant labels, no empty labels, no scope
labels, GenAI attributes, process metrics, buckets for minutes-long waits."""

from __future__ import annotations

import asyncio
import random
import re
import string

import aiohttp
import grpc
import pytest
from fairgate import AsyncClient, FairgateError
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc

from service.app import App
from service.settings import Settings
from service.telemetry.setup import build_telemetry
from service.telemetry.telemetry import Telemetry
from tests.conftest import StartServer

SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?) ")


async def _scrape(telemetry: Telemetry) -> str:
    assert telemetry.metrics_endpoint is not None
    async with aiohttp.ClientSession() as http, http.get(telemetry.metrics_endpoint.url) as resp:
        assert resp.status == 200
        return await resp.text()


def _series(text: str) -> set[str]:
    """Every series (name and labels) in an exposition, without values."""
    out = set()
    for line in text.splitlines():
        m = SERIES.match(line)
        if m and not line.startswith("#"):
            out.add(m.group(1))
    return out


async def _refused_burst(app: App, count: int, concurrency: int = 50) -> None:
    rng = random.Random(7)
    async with grpc.aio.insecure_channel(app.address) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        req = pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(max_tokens=1))

        async def one() -> None:
            tenant = "".join(rng.choices(string.ascii_lowercase + string.digits, k=24))
            call = stub.Generate(req, metadata=(("x-fairgate-tenant", tenant),))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call:
                    pass
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED

        for start in range(0, count, concurrency):
            await asyncio.gather(*(one() for _ in range(min(concurrency, count - start))))


async def test_unauthenticated_requests_do_not_grow_metrics(start_server: StartServer) -> None:
    telemetry = build_telemetry(Settings(metrics_listen="127.0.0.1:0"), {})
    app = await start_server(telemetry=telemetry, auth_mode="api-key")
    await _refused_burst(app, 10)
    before = await _scrape(telemetry)
    await _refused_burst(app, 2_500)
    after = await _scrape(telemetry)
    assert _series(after) == _series(before)
    assert 'fairgate_tenant="_unauthenticated"' in after
    # Counted, under the one fixed label.
    rejected = [
        line
        for line in after.splitlines()
        if line.startswith("fairgate_rejections_total{")
        and 'fairgate_tenant="_unauthenticated"' in line
        and 'fairgate_rejection_reason="API_KEY_REQUIRED"' in line
    ]
    assert len(rejected) == 1 and rejected[0].endswith(" 2510.0"), rejected


TENANTS = """
tenants:
  - id: team-p
  - id: capped
    quotas: {max_prompt_tokens: 4}
"""


async def test_exposition_labels(start_server: StartServer, tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "tenants.yaml"
    path.write_text(TENANTS)
    telemetry = build_telemetry(Settings(metrics_listen="127.0.0.1:0"), {})
    app = await start_server(telemetry=telemetry, tenants_file=str(path))
    async with AsyncClient(app.address, tenant="team-p") as client:
        await client.complete("hello", max_tokens=7, ignore_eos=True)
    # Refusals beside successes in the same metrics (rejected in the queue,
    # refused before it, unknown tenant).
    async with AsyncClient(app.address, tenant="capped") as capped:
        with pytest.raises(FairgateError):
            await capped.complete("word " * 50, max_tokens=2)
    async with AsyncClient(app.address, tenant="somebody-else") as other:
        with pytest.raises(FairgateError):
            await other.complete("hi", max_tokens=2)
    text = await _scrape(telemetry)
    series = _series(text)
    assert not [s for s in series if '=""' in s], "empty labels"
    assert "otel_scope" not in text
    assert "somebody-else" not in text
    durations = [s for s in series if s.startswith("gen_ai_server_request_duration_seconds_count")]
    assert any('rpc_response_status_code="OK"' in s for s in durations), durations
    assert any('fairgate_outcome="rejected"' in s for s in durations), durations
    for s in durations:
        assert 'gen_ai_operation_name="text_completion"' in s
        assert 'gen_ai_provider_name="fairgate"' in s
    usage = [s for s in series if s.startswith("gen_ai_server_token_usage_sum")]
    assert any('fairgate_tenant="team-p"' in s and "output" in s for s in usage), usage
    # Buckets that hold minutes-long queue waits.
    for name in (
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_server_request_duration_seconds_bucket",
        "fairgate_queue_wait_seconds_bucket",
    ):
        bounds = {
            float(m.group(1))
            for s in series
            if s.startswith(name + "{")
            for m in [re.search(r'le="([0-9.e+]+)"', s)]
            if m
        }
        assert bounds and max(bounds) >= 300.0, (name, bounds)
    # Process metrics from prometheus_client's collectors.
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes"):
        assert any(s.startswith(name) for s in series), name
