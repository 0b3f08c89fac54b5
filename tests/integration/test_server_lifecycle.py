"""Health checking, reflection, models, token counting and graceful shutdown."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from fairgate import AsyncClient, Delta, FairgateError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from service.app import App
from service.grpc_server import SERVICE_NAME
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, eventually, sim

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _health(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2
        )
        return int(resp.status)


async def test_health_serving_for_server_and_service(server: App) -> None:
    assert await _health(server.address) == SERVING
    assert await _health(server.address, SERVICE_NAME) == SERVING


async def test_reflection_lists_services(server: App) -> None:
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)

        async def reqs():  # type: ignore[no-untyped-def]
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        services: list[str] = []
        async for resp in stub.ServerReflectionInfo(reqs()):
            services = [s.name for s in resp.list_services_response.service]
            break
    assert SERVICE_NAME in services
    assert "grpc.health.v1.Health" in services


async def test_list_models_and_count_tokens(client: AsyncClient, server: App) -> None:
    (model,) = await client.list_models()
    assert model.is_default and model.engine == "simulator"
    assert model.max_context_tokens == sim(server).core.max_context
    assert model.max_output_tokens < model.max_context_tokens
    n, exact = await client.count_tokens("one two three four")
    assert (n, exact) == (4, False)


async def test_graceful_shutdown_drains_in_flight_and_refuses_new(start_server) -> None:  # type: ignore[no-untyped-def]
    app = await start_server(sim_time_scale=0.05)
    async with AsyncClient(app.address) as c:
        stream = c.generate("drain me", max_tokens=200)
        first = await stream.__anext__()
        assert isinstance(first, Delta)
        stop = asyncio.create_task(app.stop(grace_s=10))
        await eventually(lambda: app.health._gracefully_shutting_down, what="NOT_SERVING")
        # The stream in flight finishes normally...
        rest = [ev async for ev in stream]
        assert rest[-1].finish_reason == "length"  # type: ignore[union-attr]
        await stop
        # ...and new calls are refused.
        with pytest.raises(FairgateError) as err:
            await c.complete("too late", max_tokens=2, timeout_s=2)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert sim(app).active_requests == 0


async def test_shutdown_grace_expiry_cuts_streams_without_leaks(start_server) -> None:  # type: ignore[no-untyped-def]
    app = await start_server(sim_time_scale=1.0)
    async with AsyncClient(app.address) as c:
        stream = c.generate("long", max_tokens=5000)
        await stream.__anext__()
        await app.stop(grace_s=0.2)
        # Cut at the end of the grace: a final result, not an error (test_shutdown.py).
        events = [ev async for ev in stream]
        assert events[-1].finish_reason == "cancelled"  # type: ignore[union-attr]
    await assert_no_leaks(app)


async def test_a_tenants_file_is_logged_as_loaded(
    start_server: StartServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  - id: a\n  - id: b\n    weight: 2\n")
    with caplog.at_level(logging.INFO, logger="service.tenant_directory"):
        await start_server(tenants_file=str(path))
    assert f"tenants file {path} loaded: 2 tenants" in caplog.messages
