"""Per-key limits across replicas: two fairgate processes on one real Redis.

A key over its own limit is refused on either replica (gRPC: RESOURCE_EXHAUSTED
with QuotaFailure on `key:<id>` and RetryInfo; HTTP: 429 with Retry-After) while
another key of the same tenant is served; a key's open requests count on every
replica; its priorities are restricted; bad limits are refused with every problem
listed; `fairgate admin keys list` shows the limits, and `keys update` changes
them on both replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from fairgate import AsyncClient, FairgateError
from fairgate.admin.client import AdminClient
from fairgate.cli.main import app as cli_app
from fairgate.types import Delta
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import inference_pb2 as pb
from typer.testing import CliRunner

from tests.integration.serve_process import redis_env, serve_replicas

ADMIN_TOKEN = "key-limits-admin-token-0123"
TENANTS = """
tenants:
  - id: t
    over_quota: reject
    quotas: {requests_per_s: 100, requests_burst: 100, max_concurrent: 10}
  - id: u
    priorities: [batch]
"""
Replica = tuple[str, str]  # gRPC address, OpenAI base URL


@pytest.fixture
async def replicas(redis_url: str, tmp_path: Path) -> AsyncIterator[list[Replica]]:
    async with key_replicas(redis_url, tmp_path, TENANTS) as addresses:
        yield addresses


@contextlib.asynccontextmanager
async def key_replicas(
    redis_url: str, tmp_path: Path, tenants_yaml: str
) -> AsyncIterator[list[Replica]]:
    """Two replicas on `redis_url` that authenticate API keys and sync tenants fast."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(tenants_yaml)
    env = redis_env(
        redis_url,
        str(tenants),
        FAIRGATE_ADMIN_TOKEN=ADMIN_TOKEN,
        FAIRGATE_API_KEY_PEPPER="key-limits-pepper-0123456789",
        FAIRGATE_AUTH_MODE="api-key",
        FAIRGATE_TENANT_SYNC_INTERVAL_S="0.1",
    )
    async with serve_replicas(env) as addresses:
        yield addresses


async def cli(address: str, *args: str) -> Any:
    env = {"FAIRGATE_ADDRESS": address, "FAIRGATE_ADMIN_TOKEN": ADMIN_TOKEN}
    return await asyncio.to_thread(CliRunner().invoke, cli_app, ["admin", *args], env=env)


async def issue(address: str, tenant: str, *flags: str) -> tuple[str, str]:
    """(key id, secret) of a key issued with `flags`."""
    r = await cli(address, "keys", "issue", tenant, "-o", "json", *flags)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    return out["key"]["key_id"], out["secret"]


async def generate(address: str, secret: str, **options: Any) -> None:
    async with AsyncClient(address, api_key=secret) as c:
        await c.complete("hi", max_tokens=options.pop("max_tokens", 4), **options)


async def refusal(address: str, secret: str, **options: Any) -> FairgateError:
    with pytest.raises(FairgateError) as refused:
        await generate(address, secret, **options)
    return refused.value


async def within(seconds: float, check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Polls `check` (a change made on one replica reaches the other by polling)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


async def served(address: str, secret: str) -> bool:
    try:
        await generate(address, secret)
    except FairgateError:
        return False
    return True


async def test_a_key_over_its_limit_is_refused_on_either_replica_while_its_sibling_goes_on(
    replicas: list[Replica],
) -> None:
    (grpc_a, http_a), (grpc_b, http_b) = replicas
    key_a, secret_a = await issue(
        grpc_a, "t", "--name", "a", "-q", "requests_per_s=0.001", "-q", "requests_burst=2"
    )
    _, secret_b = await issue(grpc_a, "t", "--name", "b")
    # The other replica learns of the keys by polling the tenant store.
    await within(5, lambda: served(grpc_b, secret_b), "replica B never accepted key b")

    # Key a's two requests, one through each replica, spend its fleet-wide bucket.
    await generate(grpc_a, secret_a)
    await generate(grpc_b, secret_a)
    for address in (grpc_a, grpc_b):
        exc = await refusal(address, secret_a)
        assert exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert exc.reason == "QUOTA_EXCEEDED"
        assert exc.metadata["key_id"] == key_a and exc.metadata["limit"] == "requests_per_s"
        [(subject, description)] = exc.quota_violations
        assert subject == f"key:{key_a}" and description.startswith("requests_per_s:")
        assert exc.retry_after_s is not None and 900 < exc.retry_after_s <= 1000
    async with openai.AsyncOpenAI(base_url=http_b, api_key=secret_a, max_retries=0) as oai:
        with pytest.raises(openai.RateLimitError) as limited:
            await oai.chat.completions.create(
                model="", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
    headers = limited.value.response.headers
    assert float(headers["retry-after"]) > 900
    # The key's bucket is the tighter one: its headers say so.
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"

    # Its sibling of the same tenant goes on, on both replicas.
    for address in (grpc_a, grpc_b, grpc_a, grpc_b):
        await generate(address, secret_b)
    async with openai.AsyncOpenAI(base_url=http_a, api_key=secret_b, max_retries=0) as oai:
        raw = await oai.chat.completions.with_raw_response.create(
            model="", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert raw.headers["x-ratelimit-limit-requests"] == "100"  # the tenant's alone

    # `keys update` lifts the request limit; both replicas follow.
    r = await cli(grpc_b, "keys", "update", key_a, "-q", "requests_per_s=none", "-q",
                  "requests_burst=none")  # fmt: skip
    assert r.exit_code == 0, r.output
    for address in (grpc_a, grpc_b):
        await within(5, lambda a=address: served(a, secret_a), "key a still refused")


async def test_open_requests_count_on_every_replica(replicas: list[Replica]) -> None:
    (grpc_a, _), (grpc_b, _) = replicas
    _, secret = await issue(grpc_a, "t", "-q", "max_concurrent=1")
    _, other = await issue(grpc_a, "t")
    await within(5, lambda: served(grpc_b, other), "replica B never accepted the keys")
    async with AsyncClient(grpc_a, api_key=secret) as c:
        stream = c.generate("hi", max_tokens=4000)  # long: real-time simulator
        first = await anext(stream)
        assert isinstance(first, Delta)
        exc = await refusal(grpc_b, secret)
        assert exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert exc.metadata["limit"] == "max_concurrent"
        assert exc.retry_after_s is None  # it passes when the open one ends
        await generate(grpc_b, other)  # the tenant's other key is not held
        await stream.aclose()
    # The slot is freed at settlement (written in the background): served again.
    await within(5, lambda: served(grpc_b, secret), "the key's slot was never freed")


async def test_priorities_bad_input_and_the_listing(replicas: list[Replica]) -> None:
    (grpc_a, _), (grpc_b, _) = replicas
    key_id, secret = await issue(
        grpc_a, "t", "--name", "nightly", "--priority", "batch", "-q", "tokens_per_min=6000"
    )
    await within(5, lambda: _ok_batch(grpc_b, secret), "replica B never accepted the key")
    exc = await refusal(grpc_b, secret, priority="interactive")
    assert exc.code == grpc.StatusCode.PERMISSION_DENIED
    assert exc.reason == "PRIORITY_NOT_ALLOWED" and exc.metadata["key_id"] == key_id

    # Above its tenant's, a field keys cannot set, a class the tenant refuses, a bad
    # range: every problem listed at once, and nothing issued.
    with AdminClient(grpc_a, token=ADMIN_TOKEN) as admin:
        bad = apb.ApiKeyLimits(
            quotas=apb.TenantQuotas(
                requests_per_s=500, max_queued=3, max_concurrent=11, tokens_burst=-5
            ),
            priorities=[pb.PRIORITY_CLASS_INTERACTIVE],
        )
        with pytest.raises(FairgateError) as refused:
            admin.issue_key("u", "x", bad)
        with pytest.raises(FairgateError) as refused_t:
            admin.issue_key("t", "x", bad)
        keys_before = len(admin.list_keys())
    u_fields = {f for f, _ in refused.value.field_violations}
    assert u_fields == {
        "limits.quotas.max_queued",
        "limits.quotas.tokens_burst",
        "limits.priorities",
    }
    t_fields = {f for f, _ in refused_t.value.field_violations}
    assert t_fields == {
        "limits.quotas.requests_per_s",
        "limits.quotas.max_queued",
        "limits.quotas.max_concurrent",
        "limits.quotas.tokens_burst",
    }
    assert refused_t.value.code == grpc.StatusCode.INVALID_ARGUMENT
    # The CLI prints the server's list, one line each, exit code 2.
    r = await cli(grpc_a, "keys", "issue", "t", "-q", "requests_per_s=500", "-q",
                  "max_queued=3", "-q", "max_concurrent=11")  # fmt: skip
    assert r.exit_code == 2, r.output
    for field in ("requests_per_s", "max_queued", "max_concurrent"):
        assert f"limits.quotas.{field}" in r.stderr, r.stderr
    r = await cli(grpc_a, "keys", "update", key_id, "--priority", "urgent")
    assert r.exit_code == 2 and "'urgent'" in r.stderr

    # The listing shows each key's limits (JSON, and the table).
    r = await cli(grpc_b, "keys", "list", "--tenant", "t", "-o", "json")
    assert r.exit_code == 0, r.output
    listed = {k["key_id"]: k for k in json.loads(r.stdout)}
    assert len(listed) == keys_before
    assert listed[key_id]["limits"] == {
        "quotas": {"tokens_per_min": 6000.0},
        "priorities": ["PRIORITY_CLASS_BATCH"],
        "budgets": [],
    }
    r = await cli(grpc_b, "keys", "list", "--tenant", "t")
    row = next(line for line in r.stdout.splitlines() if line.startswith(key_id))
    assert "batch" in row


async def _ok_batch(address: str, secret: str) -> bool:
    try:
        await generate(address, secret, priority="batch")
    except FairgateError:
        return False
    return True
