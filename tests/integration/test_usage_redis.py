"""Admin GetUsage with store=redis: real counters, in-flight requests and bucket
levels (they used to come back empty), read on the replica that served the
requests and on another replica sharing the same Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from fairgate import AsyncClient
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import admin_pb2_grpc as apb_grpc

from scheduler.gate import Admission
from scheduler.request import QueuedRequest
from service.app import App
from service.settings import Settings
from service.telemetry.telemetry import Telemetry
from tests.conftest import StartServer
from tests.helpers import eventually
from tests.telemetry_helpers import Captured, captured

__all__ = ["captured"]

ADMIN_TOKEN = "usage-admin-token-0123456789"
# Slow refills (0.1 token/s, 0.01 request/s): levels barely move during the test.
TENANTS = """
default_tenant: metered
tenants:
  - id: metered
    weight: 2
    quotas: {tokens_per_min: 6, tokens_burst: 1000, requests_per_s: 0.01, requests_burst: 5}
  - id: idle
    quotas: {tokens_per_min: 600, tokens_burst: 600}
  - id: single
    quotas: {max_concurrent: 1}
"""


@pytest.fixture
async def start_server(redis_url: str, tmp_path: Path) -> AsyncIterator[StartServer]:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    apps: list[App] = []

    async def _start(telemetry: Telemetry | None = None, **overrides: Any) -> App:
        base = Settings(
            listen="127.0.0.1:0",
            http_listen="",
            sim_time_scale=0.0,
            shutdown_grace_s=1.0,
            store="redis",
            redis_url=redis_url,
            tenants_file=str(path),
            admin_token=ADMIN_TOKEN,
        )
        settings = base.replace(**overrides)
        app = await App.start(settings, telemetry or Telemetry.disabled())
        apps.append(app)
        return app

    yield _start
    for app in apps:
        await app.stop(grace_s=0.5)


async def usage(app: App, *tenant_ids: str) -> dict[str, apb.TenantUsage]:
    async with grpc.aio.insecure_channel(app.address) as channel:
        resp = await apb_grpc.AdminServiceStub(channel).GetUsage(
            apb.GetUsageRequest(tenant_ids=list(tenant_ids)),
            metadata=(("authorization", f"Bearer {ADMIN_TOKEN}"),),
        )
    return {u.tenant_id: u for u in resp.usage}


async def test_get_usage_reads_real_state_from_redis(start_server: StartServer) -> None:
    served = await start_server()
    other = await start_server()
    kept = 0
    async with AsyncClient(served.address, tenant="metered") as c:
        for _ in range(2):
            done = await c.complete("hello there", max_tokens=4)
            kept += done.result.usage.prompt_tokens + done.result.usage.completion_tokens
    # One more, held in flight through the server's own front door.
    model = served.models.resolve("")
    assert model is not None
    admission = model.dispatcher.admitted(QueuedRequest("held", "metered", 10, 20))
    await admission.__aenter__()
    try:
        u = (await usage(served, "metered"))["metered"]
        assert (u.in_flight, u.queued, u.finished_total) == (1, 0, 2)
        assert u.charged_requests_total == 3
        assert u.charged_tokens_total == kept + 30
        # Weighted counter: (prompt + 2 x output) / weight 2, over the three admissions.
        assert u.virtual_counter > 0
        assert u.request_bucket.burst == 5 and u.request_bucket.rate_per_s == pytest.approx(0.01)
        assert u.request_bucket.level == pytest.approx(5 - 3, abs=0.05)
        assert u.token_bucket.level == pytest.approx(1000 - kept - 30, abs=0.5)
        assert u.tokens_used_in_window == pytest.approx(kept + 30, abs=0.5)

        # Another replica: the same fleet-wide buckets and counter, and the served
        # replica's requests and totals, published with its heartbeat.
        o = await usage_when(other, "metered", lambda o: o.in_flight == 1)
        assert (o.in_flight, o.queued, o.finished_total) == (1, 0, 2)
        assert o.charged_tokens_total == u.charged_tokens_total
        assert o.charged_requests_total == u.charged_requests_total
        assert o.token_bucket.level == pytest.approx(u.token_bucket.level, abs=0.5)
        assert o.request_bucket.level == pytest.approx(u.request_bucket.level, abs=0.05)
        assert o.virtual_counter == pytest.approx(u.virtual_counter)
    finally:
        await admission.__aexit__(None, None, None)
    u = (await usage(served, "metered"))["metered"]
    assert (u.in_flight, u.finished_total) == (0, 3)
    o = await usage_when(other, "metered", lambda o: o.finished_total == 3)
    assert o.in_flight == 0 and o.charged_tokens_total == kept + 10
    assert u.charged_tokens_total == kept + 10  # the held one kept its prompt only
    assert u.token_bucket.level == pytest.approx(1000 - kept - 10, abs=0.5)

    # A tenant that has sent nothing: its buckets read full, on either replica.
    everyone = await usage(other)
    assert set(everyone) == {"metered", "idle", "single"}
    assert everyone["idle"].token_bucket.level == 600
    assert everyone["idle"].finished_total == 0


async def usage_when(
    app: App, tenant_id: str, cond: Callable[[apb.TenantUsage], bool], timeout_s: float = 10.0
) -> apb.TenantUsage:
    """The tenant's usage read on `app` once `cond` holds (other replicas' numbers
    arrive with their next heartbeat)."""
    deadline = time.monotonic() + timeout_s
    while not cond(u := (await usage(app, tenant_id))[tenant_id]):
        if time.monotonic() > deadline:
            raise AssertionError(f"usage never matched: {u}")
        await asyncio.sleep(0.05)
    return u


async def test_usage_sums_the_live_replicas_and_forgets_a_stopped_one(
    start_server: StartServer,
) -> None:
    # Each replica queues and runs requests of its own; GetUsage on any of them
    # counts all of them, and the replicas it summed.
    apps = [await start_server(redis_heartbeat_s=0.2) for _ in range(3)]
    held: list[Admission] = []
    for i, app in enumerate(apps):
        model = app.models.resolve("")
        assert model is not None
        for j in range(i + 1):  # 1, 2 and 3 requests in flight
            a = model.dispatcher.admitted(QueuedRequest(f"r{i}-{j}", "idle", 10, 20))
            await a.__aenter__()
            held.append(a)
    for app in apps:
        u = await usage_when(app, "idle", lambda u: u.in_flight == 6)
        assert u.charged_tokens_total == 6 * 30 and u.queued == 0
    async with grpc.aio.insecure_channel(apps[0].address) as channel:
        resp = await apb_grpc.AdminServiceStub(channel).GetUsage(
            apb.GetUsageRequest(), metadata=(("authorization", f"Bearer {ADMIN_TOKEN}"),)
        )
    assert resp.replicas == 3
    # The third replica goes (its requests end with it): the others stop counting it.
    for a in held[3:]:
        await a.__aexit__(None, None, None)
    await apps[2].stop(grace_s=0.5)
    u = await usage_when(apps[0], "idle", lambda u: u.in_flight == 3)
    assert u.finished_total == 0  # the stopped replica took its totals with it
    for a in held[:3]:
        await a.__aexit__(None, None, None)


async def test_gauges_report_queues_and_in_flight_with_redis(
    start_server: StartServer, captured: Captured
) -> None:
    app = await start_server(telemetry=captured.telemetry)
    model = app.models.resolve("")
    assert model is not None
    gate = model.dispatcher
    first = gate.admitted(QueuedRequest("first", "single", 10, 20))
    await first.__aenter__()
    second = asyncio.create_task(_hold(gate.admitted(QueuedRequest("second", "single", 10, 20))))
    tenant = {"fairgate.tenant": "single"}
    await eventually(lambda: captured.value("fairgate.queue.depth", tenant) == 1, what="queued")
    assert captured.value("fairgate.tenant.in_flight", tenant) == 1
    assert captured.value("fairgate.engine.in_flight", {"fairgate.kind": "used"}) == 1
    assert captured.value("fairgate.engine.kv_tokens", {"fairgate.kind": "used"}) == 30
    await first.__aexit__(None, None, None)
    await second  # max_concurrent 1: admitted once the first left
    assert captured.value("fairgate.queue.depth", tenant) == 0
    assert captured.value("fairgate.tenant.in_flight", tenant) == 0
    assert captured.value("fairgate.engine.in_flight", {"fairgate.kind": "used"}) == 0


async def _hold(admission: Admission) -> None:
    async with admission as ticket:
        ticket.charge(1)
