"""Budgets across replicas (#32): two fairgate processes on one real Redis.

A day budget spent through replica A refuses on replica B at its next request:
RESOURCE_EXHAUSTED with reason BUDGET_EXHAUSTED, a QuotaFailure naming the
budget and RetryInfo until the window ends (gRPC), 429 with Retry-After and the
same reason (the OpenAI API). Refusals are counted and recorded in the usage log
once each; `fairgate admin usage --period` shows the spend, the budget and the
warning as a table, JSON and CSV (per key with --by-key). Bad budgets are
refused with every problem listed, by the CLI and by the admin API.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import openai
import pytest
from fairgate.admin import AdminClient
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from scheduler.tenancy.budgets import window
from tests.integration.admin.conftest import ADMIN_TOKEN
from tests.integration.serve_process import start_serve

TENANTS = """
tenants:
  - id: capped
    budgets:
      - {period: day, requests: 3, warn_at: 0.5}
  - id: metered
    budgets:
      - {period: month, tokens: 100, counts: [completion], warn_at: 0.05}
"""
Replica = tuple[str, str]  # gRPC address, OpenAI base URL


@pytest.fixture
async def replicas(redis_url: str, tmp_path: Path) -> AsyncIterator[list[Replica]]:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FAIRGATE_", "OTEL_"))},
        "FAIRGATE_LISTEN": "127.0.0.1:0",
        "FAIRGATE_HTTP_LISTEN": "127.0.0.1:0",
        "FAIRGATE_STORE": "redis",
        "FAIRGATE_REDIS_URL": redis_url,
        "FAIRGATE_REDIS_PREFIX": f"b{uuid.uuid4().hex[:8]}",
        "FAIRGATE_TENANTS_FILE": str(tenants),
        "FAIRGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        "FAIRGATE_API_KEY_PEPPER": "budget-test-pepper-0123456789abcdef",
        "FAIRGATE_LOG_LEVEL": "WARNING",
    }
    procs = []
    try:
        for _ in range(2):
            procs.append(await start_serve(env))
        yield [(g, h) for _, g, h in procs]
    finally:
        for proc, _, _ in procs:
            proc.terminate()
        for proc, _, _ in procs:
            await proc.wait()


async def _generate(address: str, metadata: tuple[tuple[str, str], ...]) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        req = pb.GenerateRequest(text="hello", sampling=pb.SamplingParams(max_tokens=4))
        async for _ in stub.Generate(req, metadata=metadata):
            pass


def _period(
    address: str, period: str, by_key: bool = False
) -> dict[tuple[str, str], apb.PeriodUsage]:
    with AdminClient(address, token=ADMIN_TOKEN) as admin:
        resp = admin.period_usage(period, by_key=by_key)
    return {(u.tenant_id, u.key_id): u for u in resp.usage}


async def _period_when(
    address: str, period: str, who: tuple[str, str], cond: Callable[[apb.PeriodUsage], bool]
) -> apb.PeriodUsage:
    """The row once `cond` holds (the usage log writes in 50 ms batches)."""
    deadline = time.monotonic() + 10
    while True:
        row = (await asyncio.to_thread(_period, address, period, True)).get(who)
        if row is not None and cond(row):
            return row
        assert time.monotonic() < deadline, f"never matched: {row}"
        await asyncio.sleep(0.05)


def _cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairgate.cli.main", "admin", *args, "-a", address],
        env={**os.environ, "FAIRGATE_ADMIN_TOKEN": ADMIN_TOKEN},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def test_a_budget_spent_on_one_replica_refuses_on_the_other(
    replicas: list[Replica],
) -> None:
    (grpc_a, _), (grpc_b, http_b) = replicas
    capped = (("x-fairgate-tenant", "capped"),)
    for _ in range(3):
        await _generate(grpc_a, capped)
    await _period_when(grpc_b, "day", ("capped", ""), lambda u: u.requests == 3)

    # gRPC on the other replica: refused before it is queued, until the day ends.
    before_s = time.time()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _generate(grpc_b, capped)
    after_s = time.time()
    err = info.value
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    found: dict[str, object] = {}
    for detail in status.details:
        for kind in (
            error_details_pb2.QuotaFailure,
            error_details_pb2.RetryInfo,
            error_details_pb2.ErrorInfo,
        ):
            if detail.Is(kind.DESCRIPTOR):
                msg = kind()
                detail.Unpack(msg)
                found[kind.__name__] = msg
    info_ = found["ErrorInfo"]
    assert isinstance(info_, error_details_pb2.ErrorInfo)
    assert info_.reason == "BUDGET_EXHAUSTED" and info_.metadata["tenant"] == "capped"
    failure = found["QuotaFailure"]
    assert isinstance(failure, error_details_pb2.QuotaFailure)
    (violation,) = failure.violations
    assert violation.subject == "tenant:capped"
    assert violation.description.startswith("budget.day.requests: ")
    assert "3 of its day budget of 3 requests" in violation.description
    retry = found["RetryInfo"]
    assert isinstance(retry, error_details_pb2.RetryInfo)
    delay_s = retry.retry_delay.ToNanoseconds() / 1e9
    day_end_s = window("day", before_s).end_s
    assert day_end_s - after_s - 1 <= delay_s <= day_end_s - before_s + 1

    # The OpenAI API on the same replica: 429, Retry-After, the same reason.
    async with openai.AsyncOpenAI(
        base_url=http_b, api_key="EMPTY", max_retries=0, default_headers=dict(capped)
    ) as client:
        with pytest.raises(openai.RateLimitError) as http_info:
            await client.completions.create(model="", prompt="hi", max_tokens=2)
    http_err = http_info.value
    assert http_err.status_code == 429
    assert http_err.code == "budget_exhausted"
    retry_after_s = int(http_err.response.headers["retry-after"])
    assert day_end_s - time.time() - 1 <= retry_after_s <= day_end_s - before_s + 2

    # Both refusals counted once, on either replica; the budget shows spent.
    row = await _period_when(grpc_a, "day", ("capped", ""), lambda u: u.refusals == 2)
    assert (row.requests, dict(row.refusals_by_reason)) == (3, {"BUDGET_EXHAUSTED": 2})
    assert (row.budget.requests, row.budget_spent, row.warning, row.exhausted) == (
        3,
        1.0,
        True,
        True,
    )
    # ... and each once in the usage log billing reads.
    done = await asyncio.to_thread(_cli, grpc_b, "usage-export")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    mine = [r for r in records if r["tenant_id"] == "capped"]
    assert sorted(r["finish_reason"] for r in mine) == ["length"] * 3 + ["refused"] * 2
    assert {r["refusal"] for r in mine if r["finish_reason"] == "refused"} == {"BUDGET_EXHAUSTED"}
    assert len({r["cursor"] for r in mine}) == 5

    # A token budget counting completion tokens only, through an API key.
    with AdminClient(grpc_a, token=ADMIN_TOKEN) as admin:
        issued = admin.issue_key("metered", "svc")
    keyed = (("authorization", f"Bearer {issued.secret}"),)
    for _ in range(2):  # on the replica that issued it (the other learns it within 1 s)
        await _generate(grpc_a, keyed)
    key_row = await _period_when(
        grpc_a, "month", ("metered", issued.key.key_id), lambda u: u.requests == 2
    )
    assert key_row.completion_tokens == 8
    total = _period(grpc_a, "month")[("metered", "")]
    assert (total.completion_tokens, total.budget.tokens) == (8, 100)
    assert (total.budget_spent, total.warning, total.exhausted) == (0.08, True, False)
    assert ("metered", issued.key.key_id) not in _period(grpc_a, "month")  # no --by-key

    # `fairgate admin usage --period`: JSON, CSV and the table say the same.
    as_json = await asyncio.to_thread(
        _cli, grpc_b, "usage", "--period", "month", "--by-key", "--format", "json"
    )
    assert as_json.returncode == 0, as_json.stderr
    rows = {(r["tenant_id"], r["key_id"]): r for r in json.loads(as_json.stdout)}
    assert rows[("metered", "")]["budget_spent_pct"] == 8.0
    assert rows[("metered", "")]["warning"] is True
    assert rows[("metered", issued.key.key_id)]["completion_tokens"] == 8
    assert rows[("capped", "")]["requests"] == 3  # no month budget, but spend
    assert rows[("capped", "")]["refusals_by_reason"] == {"BUDGET_EXHAUSTED": 2}
    as_csv = await asyncio.to_thread(
        _cli, grpc_b, "usage", "--period", "day", "--tenant", "capped", "--format", "csv"
    )
    assert as_csv.returncode == 0, as_csv.stderr
    (line,) = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert (line["tenant_id"], line["requests"], line["refusals"]) == ("capped", "3", "2")
    assert (line["budget"], line["budget_spent_pct"], line["exhausted"]) == (
        "3 req",
        "100.0",
        "True",
    )
    table = await asyncio.to_thread(_cli, grpc_b, "usage", "--period", "day")
    assert table.returncode == 0, table.stderr
    (capped_line,) = [ln for ln in table.stdout.splitlines() if ln.strip().startswith("capped")]
    assert capped_line.split()[-3:] == ["3", "req", "100%x"]
    assert capped_line.split()[4:6] == ["3", "2"]  # requests, refused


async def test_bad_budgets_are_refused_with_every_problem(replicas: list[Replica]) -> None:
    (grpc_a, _), _ = replicas
    done = await asyncio.to_thread(
        _cli,
        grpc_a,
        "tenants",
        "create",
        "bad",
        "--budget",
        "week:tokens=-5,warn_at=2",
        "--budget",
        "day:counts=prompt+images",
    )
    assert done.returncode == 2
    for part in ("[0].period", "[0].tokens", "[0].warn_at", "[1].counts", "[1].tokens"):
        assert f"--budget {part}" in done.stderr, done.stderr
    # The admin API judges the same, whoever calls it.
    bad = apb.Tenant(
        id="bad",
        budgets=[
            apb.Budget(period="year", tokens=-1, warn_at=0),
            apb.Budget(period="day", requests=0),
        ],
    )
    with AdminClient(grpc_a, token=ADMIN_TOKEN) as admin, pytest.raises(Exception) as info:
        admin.create_tenant(bad)
    text = str(info.value)
    for field in (
        "tenant.budgets[0].period",
        "tenant.budgets[0].tokens",
        "tenant.budgets[0].warn_at",
        "tenant.budgets[1].requests",
    ):
        assert field in text, text
