"""Refusals at admission are counted per period and recorded in the usage log,
once each, with their reason: a rate quota, a full queue, a queue timeout and a
budget (one server, store=memory; the Redis path is tests/integration/admin/
test_budgets.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from fairgate import AsyncClient, FairgateError
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import admin_pb2_grpc as apb_grpc

from scheduler.gate import Admission
from scheduler.request import QueuedRequest
from tests.conftest import StartServer
from tests.helpers import eventually
from tests.telemetry_helpers import Captured, captured

__all__ = ["captured"]

ADMIN = "refusals-admin-token-0123456789"
TENANTS = """
tenants:
  - id: rated
    quotas: {requests_per_s: 0.001, requests_burst: 1}
  - id: narrow
    quotas: {max_concurrent: 1, max_queued: 1, max_queue_wait_s: 0.2}
  - id: capped
    budgets:
      - {period: month, tokens: 1}
"""


async def _refusal(address: str, tenant: str) -> str:
    try:
        async with AsyncClient(address, tenant=tenant) as c:
            await c.complete("hello", max_tokens=2)
    except FairgateError as exc:
        return exc.reason
    return ""


async def test_each_refusal_is_counted_and_recorded_once(
    start_server: StartServer, tmp_path: Path, captured: Captured
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    app = await start_server(captured.telemetry, tenants_file=str(path), admin_token=ADMIN)
    addr = app.address
    assert await _refusal(addr, "rated") == ""
    assert await _refusal(addr, "rated") == "QUOTA_EXCEEDED"

    # One in flight (held at the front door), one queued: the next finds the queue full,
    # and the queued one times out.
    model = app.models.resolve("")
    assert model is not None
    held: Admission = model.dispatcher.admitted(QueuedRequest("held", "narrow", 5, 5))
    await held.__aenter__()
    try:
        queued = asyncio.create_task(_refusal(addr, "narrow"))

        def one_queued() -> bool:
            stats = model.dispatcher.stats(include=["narrow"]).tenant("narrow")
            return stats is not None and stats.queued == 1

        await eventually(one_queued, what="a narrow request queued")
        assert await _refusal(addr, "narrow") == "QUOTA_EXCEEDED"  # max_queued
        assert await queued == "QUEUE_TIMEOUT"
    finally:
        await held.__aexit__(None, None, None)

    budget = {"fairgate.tenant": "capped", "fairgate.budget.period": "month"}
    assert await _refusal(addr, "capped") == ""  # spends its one token and more
    assert captured.value("fairgate.budget.warning", budget) == 0  # checked before it spent
    assert await _refusal(addr, "capped") == "BUDGET_EXHAUSTED"
    assert captured.value("fairgate.budget.warning", budget) == 1
    assert captured.value("fairgate.budget.spent", budget) > 1  # the overshoot of one request
    assert (
        captured.value("fairgate.rejections", {"fairgate.rejection.reason": "BUDGET_EXHAUSTED"})
        == 1
    )

    meta = (("authorization", f"Bearer {ADMIN}"),)
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = apb_grpc.AdminServiceStub(channel)
        resp = await stub.GetPeriodUsage(apb.GetPeriodUsageRequest(period="day"), metadata=meta)
        exported = await stub.ExportUsage(apb.ExportUsageRequest(), metadata=meta)
    rows = {u.tenant_id: u for u in resp.usage}
    assert (rows["rated"].requests, dict(rows["rated"].refusals_by_reason)) == (
        1,
        {"QUOTA_EXCEEDED": 1},
    )
    assert (rows["narrow"].requests, dict(rows["narrow"].refusals_by_reason)) == (
        0,
        {"QUOTA_EXCEEDED": 1, "QUEUE_TIMEOUT": 1},
    )
    assert rows["narrow"].refusals == 2
    assert (rows["capped"].requests, dict(rows["capped"].refusals_by_reason)) == (
        1,
        {"BUDGET_EXHAUSTED": 1},
    )
    assert not resp.durable
    refused = sorted((r.tenant_id, r.refusal) for r in exported.records if r.refusal)
    assert refused == [
        ("capped", "BUDGET_EXHAUSTED"),
        ("narrow", "QUEUE_TIMEOUT"),
        ("narrow", "QUOTA_EXCEEDED"),
        ("rated", "QUOTA_EXCEEDED"),
    ]
    assert all(r.finish_reason == "refused" for r in exported.records if r.refusal)
