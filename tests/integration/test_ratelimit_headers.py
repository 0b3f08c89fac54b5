"""Rate-limit headers across replicas: two fairgate processes on one real Redis.

The official `openai` SDK reads `x-ratelimit-*` (with_raw_response) and
"remaining" falls with use whichever replica serves the call, the 429 that ends
the burst carries them too, and gRPC calls carry the same in trailing metadata.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import openai
import pytest
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc

from tests.integration.serve_process import redis_env, serve_replicas

BURST = 6  # requests; the rate is slow enough that nothing refills within the test
TENANTS = f"""
tenants:
  - id: t
    over_quota: reject
    quotas:
      {{requests_per_s: 0.001, requests_burst: {BURST}, tokens_per_min: 6, tokens_burst: 5000}}
"""
HEADER = {"x-fairgate-tenant": "t"}


@pytest.fixture
async def replicas(redis_url: str, tmp_path: Path) -> AsyncIterator[list[tuple[str, str]]]:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    async with serve_replicas(redis_env(redis_url, str(tenants))) as addresses:
        yield addresses


def _oai(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=base_url, api_key="EMPTY", max_retries=0, default_headers=HEADER
    )


async def _chat(base_url: str) -> dict[str, str]:
    async with _oai(base_url) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        raw.parse()
        return {k: v for k, v in raw.headers.items() if k.startswith("x-ratelimit-")}


async def test_remaining_falls_on_either_replica_and_the_429_says_so(
    replicas: list[tuple[str, str]],
) -> None:
    (_, http_a), (grpc_b, http_b) = replicas
    seen = [await _chat(http) for http in (http_a, http_b, http_a)]
    for headers in seen:
        assert headers["x-ratelimit-limit-requests"] == str(BURST)
        assert headers["x-ratelimit-limit-tokens"] == "5000"
        assert re.fullmatch(
            r"\d+(\.\d+)?(ms|s)|\d+m[\d.]+s|\d+h\d+m[\d.]+s", headers["x-ratelimit-reset-requests"]
        )
    # Each request takes one from the fleet-wide bucket, whichever replica served it.
    assert [int(h["x-ratelimit-remaining-requests"]) for h in seen] == [
        BURST - 1,
        BURST - 2,
        BURST - 3,
    ]
    tokens = [int(h["x-ratelimit-remaining-tokens"]) for h in seen]
    assert tokens[0] > tokens[1] > tokens[2]

    # gRPC: the same, in trailing metadata, through replica B.
    async with grpc.aio.insecure_channel(grpc_b) as channel:
        call = pb_grpc.InferenceServiceStub(channel).Generate(
            pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(max_tokens=4)),
            metadata=tuple(HEADER.items()),
        )
        async for _ in call:
            pass
        trailing = {
            k: v for k, v in (await call.trailing_metadata()) if k.startswith("x-ratelimit-")
        }
    assert trailing["x-ratelimit-remaining-requests"] == str(BURST - 4)
    assert trailing["x-ratelimit-limit-requests"] == str(BURST)

    # Spend the rest, then the refusal carries the headers and Retry-After.
    for _ in range(2):
        await _chat(http_a)
    with pytest.raises(openai.RateLimitError) as refused:
        await _chat(http_b)
    headers = refused.value.response.headers
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-limit-requests"] == str(BURST)
    assert float(headers["retry-after"]) > 0
