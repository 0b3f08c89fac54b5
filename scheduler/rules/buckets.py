"""Token buckets: a level refilled over time, the wait until `n` can be taken,
an add that never passes the burst, which of a tenant's buckets binds, how
long its own limits hold its head, and what a request's end gives back
(`refund`). `TokenBucket`/`StoredLevel` (token_bucket.py) and the stores keep
the state; these say what it means."""

from __future__ import annotations

import math

# Relative slack so that waiting exactly `bucket_wait_s(...)` always passes
# despite floating-point rounding of rate * elapsed.
EPSILON = 1e-9


def bucket_level(level: float, updated_s: float, now_s: float, rate: float, burst: float) -> float:
    """The level of a bucket last set to `level` at `updated_s` (debt refills too)."""
    if now_s > updated_s:
        level = min(burst, level + (now_s - updated_s) * rate)
    return min(level, burst)


def bucket_wait_s(level: float, n: float, rate: float, burst: float) -> float:
    """Seconds until `n` can be taken from a bucket at `level` (inf: never)."""
    slack = EPSILON * max(1.0, n)
    if n > burst + slack:
        return math.inf
    missing = n - level
    if missing <= slack:
        return 0.0
    return missing / rate


def refill_s(level: float, rate: float, burst: float) -> float:
    """Seconds until a bucket at `level` is full again (0.0: full). A full bucket
    reads as an absent one, so an idle tenant's or key's may be forgotten then,
    and not before: forgetting a drained bucket would refill it."""
    return bucket_wait_s(level, burst, rate, burst)


def bucket_added(level: float, n: float, burst: float) -> float:
    """A bucket's level after adding `n` (negative: taking, debt allowed): never
    above the burst."""
    return min(burst, level + n)


def binding_limit(request_wait_s: float | None, token_wait_s: float | None) -> tuple[str, float]:
    """Which bucket binds a request: ("", 0.0) when neither, else the longer wait."""
    limit, wait_s = "", 0.0
    if request_wait_s is not None and request_wait_s > wait_s:
        limit, wait_s = "requests_per_s", request_wait_s
    if token_wait_s is not None and token_wait_s > wait_s:
        limit, wait_s = "tokens_per_min", token_wait_s
    return limit, wait_s


def own_limit_wait_s(
    concurrent: int, max_concurrent: int | None, bucket_wait: float | None
) -> float:
    """How long the tenant's own limits hold its head: inf until one of its requests
    ends (max_concurrent), else the buckets' wait (wait mode), else 0."""
    if max_concurrent is not None and concurrent >= max_concurrent:
        return math.inf
    return bucket_wait or 0.0


def refund(
    started: bool, requests_taken: float, tokens_taken: float, max_tokens: int, output_tokens: int
) -> tuple[float, float]:
    """What a request's end gives back to its buckets, (requests, tokens): all it
    took if it never started (cancelled or expired while queued: nothing charged),
    else the unused part of max_tokens (negative: more output than reserved, taken
    as debt rather than cutting a stream)."""
    if not started:
        return requests_taken, tokens_taken
    return 0.0, float(max_tokens - output_tokens) if tokens_taken else 0.0
