"""OpenAI's rate-limit headers from a tenant's buckets (service/ratelimit_headers.py)."""

from __future__ import annotations

import pytest

from scheduler.gate_stats import BucketStats
from service.ratelimit_headers import duration_text, ratelimit_headers


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0ms"), (0.0201, "21ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"), (3725, "1h2m5s")],
)
def test_durations_read_as_openai_writes_them(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


def test_the_three_headers_per_bucket_and_none_without_one() -> None:
    requests = BucketStats(level=7.6, burst=10, rate_per_s=0.5)
    tokens = BucketStats(level=-40, burst=6000, rate_per_s=100)  # in debt
    assert ratelimit_headers((requests, tokens)) == [
        ("x-ratelimit-limit-requests", "10"),
        ("x-ratelimit-remaining-requests", "7"),
        ("x-ratelimit-reset-requests", "4.8s"),  # (10 - 7.6) / 0.5
        ("x-ratelimit-limit-tokens", "6000"),
        ("x-ratelimit-remaining-tokens", "0"),
        ("x-ratelimit-reset-tokens", "1m0s"),  # refilled from 0: debt is not reported
    ]
    assert ratelimit_headers((None, None)) == []
    assert next(k for k, _ in ratelimit_headers((None, tokens))) == "x-ratelimit-limit-tokens"
