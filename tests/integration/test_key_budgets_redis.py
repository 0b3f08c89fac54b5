"""A key's own budget across replicas (#32): two fairgate processes on one real Redis.

A key whose day budget is spent is refused on either replica (gRPC:
RESOURCE_EXHAUSTED, BUDGET_EXHAUSTED, QuotaFailure on `tenant:<id>/key:<id>`,
RetryInfo to the day's end; HTTP: 429 with Retry-After) while its tenant's
other key goes on; `admin usage --period --by-key` shows the key's budget, %
spent and the flags; `keys list` shows it; `keys update --budget none` lifts it
on both replicas. A key budget above its tenant's (and every other bad value)
is refused with every problem listed, by the admin API and by the CLI.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import openai
import pytest
from fairgate import FairgateError
from fairgate.admin.client import AdminClient
from fairgate.v1 import admin_pb2 as apb

from scheduler.tenancy.budgets import window
from tests.integration.test_key_limits_redis import (
    ADMIN_TOKEN,
    Replica,
    cli,
    generate,
    issue,
    key_replicas,
    refusal,
    served,
    within,
)

TENANTS = """
tenants:
  - id: t
    budgets:
      - {period: day, requests: 50}
"""


@pytest.fixture
async def replicas(redis_url: str, tmp_path: Path) -> AsyncIterator[list[Replica]]:
    async with key_replicas(redis_url, tmp_path, TENANTS) as addresses:
        yield addresses


def _key_row(address: str, key_id: str) -> apb.PeriodUsage | None:
    with AdminClient(address, token=ADMIN_TOKEN) as admin:
        resp = admin.period_usage("day", by_key=True)
    return next((u for u in resp.usage if u.key_id == key_id), None)


async def _spent(address: str, key_id: str, requests: int, refusals: int = 0) -> apb.PeriodUsage:
    """The key's day row once the usage log (50 ms batches) has its records."""
    found: list[apb.PeriodUsage] = []

    async def check() -> bool:
        row = _key_row(address, key_id)
        found[:] = [row] if row is not None else []
        return row is not None and (row.requests, row.refusals) == (requests, refusals)

    await within(10, check, f"key {key_id} never reached {requests} requests, {refusals} refused")
    return found[0]


async def test_a_key_over_its_budget_is_refused_on_either_replica_while_its_sibling_goes_on(
    replicas: list[Replica],
) -> None:
    (grpc_a, _), (grpc_b, http_b) = replicas
    key_a, secret_a = await issue(grpc_a, "t", "--name", "a", "--budget", "day:requests=2")
    key_b, secret_b = await issue(grpc_a, "t", "--name", "b")
    # Replica B learns of both keys (and a's budget) by polling the tenant store.
    await within(5, lambda: served(grpc_b, secret_b), "replica B never accepted key b")

    # Key a's two requests, one through each replica, spend its day budget.
    await generate(grpc_a, secret_a)
    await generate(grpc_b, secret_a)
    await _spent(grpc_a, key_a, 2)
    for address in (grpc_a, grpc_b):
        before_s = time.time()
        exc = await refusal(address, secret_a)
        assert exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert exc.reason == "BUDGET_EXHAUSTED"
        assert exc.metadata == {"tenant": "t", "limit": "budget.day.requests", "key": key_a}
        [(subject, description)] = exc.quota_violations
        assert subject == f"tenant:t/key:{key_a}"
        assert description.startswith(
            f"budget.day.requests: key '{key_a}' has spent 2 of its day budget of 2 requests"
        )
        end_s = window("day", before_s).end_s
        assert exc.retry_after_s is not None
        assert end_s - time.time() - 1 <= exc.retry_after_s <= end_s - before_s + 1
    async with openai.AsyncOpenAI(base_url=http_b, api_key=secret_a, max_retries=0) as oai:
        with pytest.raises(openai.RateLimitError) as limited:
            await oai.chat.completions.create(
                model="", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
    assert limited.value.code == "budget_exhausted"
    assert int(limited.value.response.headers["retry-after"]) > 0

    # Its sibling of the same tenant goes on, on both replicas (the tenant's 50 hold).
    for address in (grpc_a, grpc_b):
        await generate(address, secret_b)

    # Period usage by key: the key's budget, all of it spent, its refusals.
    row = await _spent(grpc_b, key_a, 2, refusals=3)
    assert (row.budget.requests, row.budget_spent, row.warning, row.exhausted) == (
        2,
        1.0,
        True,
        True,
    )
    r = await cli(grpc_b, "usage", "--period", "day", "--by-key", "--format", "json")
    assert r.exit_code == 0, r.output
    rows = {(u["tenant_id"], u["key_id"]): u for u in json.loads(r.stdout)}
    assert rows[("t", key_a)]["budget"] == "2 req"
    assert rows[("t", key_a)]["budget_spent_pct"] == 100.0
    assert rows[("t", key_a)]["refusals_by_reason"] == {"BUDGET_EXHAUSTED": 3}
    assert rows[("t", key_b)]["budget"] == ""  # no budget of its own
    assert rows[("t", "")]["budget"] == "50 req"  # the tenant's, its own spend

    # `keys list` shows the key's budget; `keys update --budget none` lifts it.
    r = await cli(grpc_a, "keys", "list", "--tenant", "t", "-o", "json")
    listed = {k["key_id"]: k for k in json.loads(r.stdout)}
    assert listed[key_a]["limits"]["budgets"] == [
        {"period": "day", "requests": 2, "counts": [], "warn_at": 0.8}
    ]
    assert "limits" not in listed[key_b]
    r = await cli(grpc_a, "keys", "list", "--tenant", "t")
    assert "day: 2 req" in r.stdout, r.stdout
    r = await cli(grpc_b, "keys", "update", key_a, "--budget", "none")
    assert r.exit_code == 0, r.output
    for address in (grpc_a, grpc_b):
        await within(5, lambda a=address: served(a, secret_a), "key a still refused")


async def test_key_budgets_above_the_tenants_are_refused_with_every_problem(
    replicas: list[Replica],
) -> None:
    (grpc_a, _), _ = replicas
    bad = apb.ApiKeyLimits(
        budgets=[
            apb.Budget(period="day", requests=51),  # above the tenant's 50
            apb.Budget(period="week", tokens=-5),  # no such period; negative
            apb.Budget(period="day", tokens=10),  # a second day budget
        ],
        quotas=apb.TenantQuotas(max_queued=3),  # not a key limit
    )
    with AdminClient(grpc_a, token=ADMIN_TOKEN) as admin:
        with pytest.raises(FairgateError) as refused:
            admin.issue_key("t", "x", bad)
        key = admin.issue_key("t", "ok").key
        with pytest.raises(FairgateError) as refused_update:
            admin.update_key(key.key_id, apb.ApiKeyLimits(budgets=[bad.budgets[0]]), ["budgets"])
        keys = admin.list_keys("t")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    fields = dict(refused.value.field_violations)
    assert set(fields) == {
        "limits.budgets[0].requests",
        "limits.budgets[1].period",
        "limits.budgets[1].tokens",
        "limits.budgets",
        "limits.quotas.max_queued",
    }
    assert (
        "above the day budget of tenant 't' (50 requests)" in fields["limits.budgets[0].requests"]
    )
    assert [f for f, _ in refused_update.value.field_violations] == ["limits.budgets[0].requests"]
    assert [k.key_id for k in keys] == [key.key_id]  # nothing issued, nothing changed
    assert not keys[0].HasField("limits")

    # The CLI: its own checks first (the tenant flag's), then the server's list.
    r = await cli(grpc_a, "keys", "issue", "t", "--budget", "week:tokens=-5,warn_at=2")
    assert r.exit_code == 2
    for part in ("[0].period", "[0].tokens", "[0].warn_at"):
        assert f"--budget {part}" in r.stderr, r.stderr
    r = await cli(grpc_a, "keys", "issue", "t", "--budget", "day:requests=51")
    assert r.exit_code == 2 and "limits.budgets[0].requests" in r.stderr, r.stderr
