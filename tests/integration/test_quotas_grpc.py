"""Tenant quotas over gRPC: RetryInfo, QuotaFailure, wait mode, caps, refusals."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from fairgate import AsyncClient, FairgateError

from service.app import App
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, eventually, sim

TENANTS = """
default_tenant: free
tenants:
  - id: free
    weight: 1
    priorities: [interactive]
    quotas: {requests_per_s: 1, requests_burst: 1}
  - id: patient
    weight: 1
    over_quota: wait
    quotas: {requests_per_s: 5, requests_burst: 1}
  - id: capped
    weight: 1
    quotas: {max_prompt_tokens: 8, max_output_tokens: 16, max_output_tokens_interactive: 8}
  - id: tokens
    weight: 1
    quotas: {tokens_per_min: 600, tokens_burst: 100}
  - id: narrow
    weight: 1
    quotas: {max_queued: 1, max_queue_wait_s: 0.3}
  - id: retired
    enabled: false
"""


@pytest.fixture
async def quota_server(start_server: StartServer, tmp_path: Path) -> App:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    return await start_server(tenants_file=str(path), sim_time_scale=0.2)


def _ledger_clean(app: App) -> bool:
    model = app.models.resolve("")
    assert model is not None
    return model.dispatcher.quotas.open_reservations == 0


async def test_request_rate_rejection_carries_retry_info_and_quota_failure(
    quota_server: App,
) -> None:
    async with AsyncClient(quota_server.address, tenant="free") as c:
        await c.complete("first", max_tokens=2)
        with pytest.raises(FairgateError) as err:
            await c.complete("second", max_tokens=2)
    exc = err.value
    assert exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert exc.reason == "QUOTA_EXCEEDED"
    assert exc.metadata == {"tenant": "free", "limit": "requests_per_s"}
    # The bucket refills at 1 request/s: the retry delay is the real remaining time.
    assert exc.retry_after_s is not None and 0.3 < exc.retry_after_s <= 1.0
    ((subject, description),) = exc.quota_violations
    assert subject == "tenant:free" and description.startswith("requests_per_s")
    await asyncio.sleep(exc.retry_after_s)
    async with AsyncClient(quota_server.address, tenant="free") as c:
        assert (await c.complete("after the delay", max_tokens=2)).result.finish_reason == "length"
    await assert_no_leaks(quota_server)
    assert _ledger_clean(quota_server)


async def test_default_tenant_applies_without_a_header(quota_server: App) -> None:
    async with AsyncClient(quota_server.address) as c:
        await c.complete("one", max_tokens=2)
        with pytest.raises(FairgateError) as err:
            await c.complete("two", max_tokens=2)
    assert err.value.metadata.get("tenant") == "free"


async def test_token_bucket_limits_reserved_tokens(quota_server: App) -> None:
    async with AsyncClient(quota_server.address, tenant="tokens") as c:
        # prompt + max_tokens above the 100-token burst can never pass: no retry.
        with pytest.raises(FairgateError) as err:
            await c.complete([17] * 5, max_tokens=96)
        assert err.value.metadata["limit"] == "tokens_burst"
        assert err.value.retry_after_s is None
        # Two requests of 45 reserved tokens fit the burst; the third must wait
        # for 35 tokens at 10 tokens/s.
        start_s = time.monotonic()
        await c.complete([17] * 5, max_tokens=40)
        await c.complete([17] * 5, max_tokens=40)
        with pytest.raises(FairgateError) as err2:
            await c.complete([17] * 5, max_tokens=40)
        elapsed_s = time.monotonic() - start_s
    assert err2.value.metadata["limit"] == "tokens_per_min"
    # 35 missing tokens at 10/s, less what refilled while the requests ran (a
    # loaded machine runs them slower; the retry delay must say so exactly).
    retry_s = err2.value.retry_after_s
    assert retry_s is not None and 3.5 - elapsed_s - 0.01 <= retry_s <= 3.5 + 0.01
    assert _ledger_clean(quota_server)


async def test_wait_mode_queues_until_the_bucket_refills(quota_server: App) -> None:
    async with AsyncClient(quota_server.address, tenant="patient") as c:
        results = await asyncio.gather(*(c.complete(f"p{i}", max_tokens=2) for i in range(3)))
    waits = sorted(r.result.timings.queue_wait_s for r in results)
    # 5 requests/s, burst 1: admissions ~0.2 s apart.
    assert waits[0] < 0.1
    assert waits[2] >= 0.3
    assert _ledger_clean(quota_server)


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "priority", "field"),
    [
        ([17] * 9, 4, "batch", "token_ids"),
        ("one two three four five six seven eight nine ten", 4, "batch", "text"),
        ([17], 17, "batch", "sampling.max_tokens"),
        ([17], 9, "interactive", "sampling.max_tokens"),
    ],
)
async def test_tenant_caps_are_invalid_argument(
    quota_server: App, prompt: object, max_tokens: int, priority: str, field: str
) -> None:
    async with AsyncClient(quota_server.address, tenant="capped") as c:
        with pytest.raises(FairgateError) as err:
            await c.complete(prompt, max_tokens=max_tokens, priority=priority)  # type: ignore[arg-type]
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.field_violations[0][0] == field
        ok = await c.complete([17] * 8, max_tokens=8, priority="interactive")
        assert ok.result.usage.completion_tokens == 8
    assert sim(quota_server).stats.started == 1
    assert _ledger_clean(quota_server)


async def test_default_max_tokens_respects_the_tenant_cap(quota_server: App) -> None:
    async with AsyncClient(quota_server.address, tenant="capped") as c:
        comp = await c.complete([17] * 4)  # no max_tokens: server default 256, cap 8
    assert comp.result.usage.completion_tokens == 8


@pytest.mark.parametrize(
    ("tenant", "priority", "reason"),
    [
        ("nobody", "interactive", "TENANT_UNKNOWN"),
        ("retired", "interactive", "TENANT_DISABLED"),
        ("free", "batch", "PRIORITY_NOT_ALLOWED"),
    ],
)
async def test_refused_tenants_get_permission_denied(
    quota_server: App, tenant: str, priority: str, reason: str
) -> None:
    async with AsyncClient(quota_server.address, tenant=tenant) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete("hi", max_tokens=2, priority=priority)
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert err.value.reason == reason
    assert sim(quota_server).stats.started == 0


async def test_no_tenant_and_no_default_is_refused(
    start_server: StartServer, tmp_path: Path
) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("tenants:\n  - id: only\n")
    app = await start_server(tenants_file=str(path))
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete("hi", max_tokens=2)
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert err.value.reason == "TENANT_REQUIRED"


async def test_queue_cap_and_queue_timeout(start_server: StartServer, tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    app = await start_server(tenants_file=str(path), sim_time_scale=1.0, sim_max_running_requests=1)
    async with AsyncClient(app.address, tenant="narrow") as c:
        hog = asyncio.create_task(c.complete("hog", max_tokens=3000))
        await eventually(lambda: sim(app).stats.started == 1, what="hog admitted")
        waiting = asyncio.create_task(c.complete("waits", max_tokens=2))
        model = app.models.resolve("")
        assert model is not None
        await eventually(lambda: model.dispatcher.queued == 1, what="one queued")
        with pytest.raises(FairgateError) as full:
            await c.complete("no room", max_tokens=2)
        assert full.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert full.value.metadata["limit"] == "max_queued"
        with pytest.raises(FairgateError) as timeout:
            await waiting
        assert timeout.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert timeout.value.reason == "QUEUE_TIMEOUT"
        hog.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hog
    await assert_no_leaks(app)
    assert _ledger_clean(app)
