"""Per-key limits on one replica (store=memory): the gate in front of the tenant's queue,
its refunds, the headers it reports, a tenant lowered after the key was issued, and a
key's own budget (refused alone, named by the budget gauges)."""

from __future__ import annotations

from pathlib import Path

import grpc
import openai
import pytest
from fairgate import AsyncClient, FairgateError
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import admin_pb2_grpc as apb_grpc

from service.app import App
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks
from tests.telemetry_helpers import Captured, captured

__all__ = ["captured"]

ADMIN_TOKEN = "key-limits-admin-token-0123"
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
TENANTS = """
tenants:
  - id: t
    quotas: {tokens_per_min: 6000, tokens_burst: 6000}
"""


async def admin(app: App, method: str, request: object) -> object:
    async with grpc.aio.insecure_channel(app.address) as ch:
        return await getattr(apb_grpc.AdminServiceStub(ch), method)(request, metadata=ADMIN)


async def issue(app: App, **quotas: float) -> tuple[str, str]:
    limits = apb.ApiKeyLimits(quotas=apb.TenantQuotas(**quotas))
    resp = await admin(app, "IssueApiKey", apb.IssueApiKeyRequest(tenant_id="t", limits=limits))
    return resp.key.key_id, resp.secret  # type: ignore[attr-defined]


@pytest.fixture
async def app(start_server: StartServer, tmp_path: Path) -> App:
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    return await start_server(
        http_listen="127.0.0.1:0",
        tenants_file=str(tmp_path / "tenants.yaml"),
        admin_token=ADMIN_TOKEN,
        auth_mode="api-key",
    )


async def test_a_key_over_its_bucket_is_refused_and_its_sibling_is_untouched(app: App) -> None:
    key_id, secret = await issue(app, tokens_per_min=6, tokens_burst=300)
    _, sibling = await issue(app)
    async with AsyncClient(app.address, api_key=secret) as c:
        # prompt + max_tokens taken at arrival: 100 and 150 fit in 300, 100 more do not.
        await c.complete("hi", max_tokens=98)
        await c.complete("hi", max_tokens=148)
        with pytest.raises(FairgateError) as refused:
            await c.complete("hi", max_tokens=98)
        with pytest.raises(FairgateError) as too_large:
            await c.complete("hi", max_tokens=400)  # above the key's burst: never passes
    exc = refused.value
    assert exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert exc.quota_violations[0][0] == f"key:{key_id}"
    assert exc.retry_after_s is not None and exc.retry_after_s > 100  # 6 tokens/min
    assert too_large.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert key_id in too_large.value.message
    async with AsyncClient(app.address, api_key=sibling) as c:
        for _ in range(3):
            await c.complete("hi", max_tokens=400)  # the tenant's burst is 6000
    await assert_no_leaks(app)


async def test_headers_report_the_tighter_bucket_and_a_lowered_tenant_binds(app: App) -> None:
    _, secret = await issue(app, tokens_per_min=3000, tokens_burst=1000)
    base = f"http://127.0.0.1:{app.http.port}/v1"  # type: ignore[union-attr]
    async with openai.AsyncOpenAI(base_url=base, api_key=secret, max_retries=0) as oai:
        raw = await oai.completions.with_raw_response.create(model="", prompt="hi", max_tokens=8)
        assert raw.headers["x-ratelimit-limit-tokens"] == "1000"  # the key's, not 6000
        # The tenant is lowered below the key: its bucket now binds the key too.
        tenant = apb.Tenant(id="t", quotas=apb.TenantQuotas(tokens_per_min=600, tokens_burst=500))
        update = apb.UpdateTenantRequest(tenant=tenant)
        update.update_mask.paths.extend(["quotas.tokens_per_min", "quotas.tokens_burst"])
        await admin(app, "UpdateTenant", update)
        raw = await oai.completions.with_raw_response.create(model="", prompt="hi", max_tokens=8)
        assert raw.headers["x-ratelimit-limit-tokens"] == "500"
        with pytest.raises(openai.BadRequestError):
            await oai.completions.create(model="", prompt="hi", max_tokens=600)


async def test_a_key_raised_above_its_tenant_by_update_is_refused(app: App) -> None:
    key_id, _ = await issue(app, tokens_per_min=600)
    request = apb.UpdateApiKeyRequest(
        key_id=key_id,
        limits=apb.ApiKeyLimits(quotas=apb.TenantQuotas(tokens_per_min=7000, max_concurrent=0)),
    )
    request.update_mask.paths.extend(["quotas.tokens_per_min", "quotas.max_concurrent"])
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await admin(app, "UpdateApiKey", request)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert "tokens_per_min" in details and "max_concurrent" in details
    bad_path = apb.UpdateApiKeyRequest(key_id=key_id)
    bad_path.update_mask.paths.append("quotas.max_queued")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await admin(app, "UpdateApiKey", bad_path)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await admin(app, "UpdateApiKey", apb.UpdateApiKeyRequest(key_id="0" * 16))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_key_budget_refuses_the_key_alone_and_its_gauges_name_the_key(
    start_server: StartServer, tmp_path: Path, captured: Captured
) -> None:
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    app = await start_server(
        captured.telemetry,
        tenants_file=str(tmp_path / "tenants.yaml"),
        admin_token=ADMIN_TOKEN,
        auth_mode="api-key",
    )
    own = apb.ApiKeyLimits(budgets=[apb.Budget(period="month", tokens=1, warn_at=0.5)])
    resp = await admin(app, "IssueApiKey", apb.IssueApiKeyRequest(tenant_id="t", limits=own))
    key_id, secret = resp.key.key_id, resp.secret  # type: ignore[attr-defined]
    _, sibling = await issue(app)
    gauge = {
        "fairgate.tenant": "t",
        "fairgate.budget.period": "month",
        "fairgate.api_key.id": key_id,
    }
    async with AsyncClient(app.address, api_key=secret) as c:
        await c.complete("hi", max_tokens=2)  # under budget at the check; spends past it
        assert captured.value("fairgate.budget.warning", gauge) == 0
        with pytest.raises(FairgateError) as refused:
            await c.complete("hi", max_tokens=2)
    assert refused.value.reason == "BUDGET_EXHAUSTED"
    assert refused.value.quota_violations[0][0] == f"tenant:t/key:{key_id}"
    assert captured.value("fairgate.budget.warning", gauge) == 1
    assert captured.value("fairgate.budget.spent", gauge) > 1  # the overshoot of one request
    async with AsyncClient(app.address, api_key=sibling) as c:
        await c.complete("hi", max_tokens=2)  # the tenant has no budget: its keys go on
    await assert_no_leaks(app)
