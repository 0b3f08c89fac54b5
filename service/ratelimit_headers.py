"""OpenAI-style rate-limit headers from a tenant's token buckets.

`x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, as the OpenAI API sends
them (and its SDKs, LiteLLM and many agents read them to back off before a 429):
the limit is the bucket's burst (what a tenant may spend at once), remaining is
its level now (0 while it is in debt), and reset is the time until it is full
again, in Go's duration format ("1s", "6m0s", "20ms"). A tenant without a bucket
of that kind gets none of its three headers. The levels come from
`AdmissionGate.tenant_buckets`: with a shared store, read from it for this
response, so every replica reports the fleet-wide buckets.

A request made with an API key that has limits of its own gets, per kind, the
tighter of its key's bucket and its tenant's: the one with less remaining (on
a tie, the smaller limit), all three headers of a kind from that one bucket.
"""

from __future__ import annotations

import math

from scheduler.gate import AdmissionGate
from scheduler.gate_stats import BucketStats, TenantBuckets
from service.key_limiter import KeyCheck

Headers = list[tuple[str, str]]


def duration_text(seconds: float) -> str:
    """Go's time.Duration text, as OpenAI writes its reset headers: 20ms, 1.5s, 6m0s."""
    ms = math.ceil(max(0.0, seconds) * 1000 - 1e-6)  # up to the ms, float noise aside
    if ms < 1000:
        return f"{ms}ms"
    hours, rest_ms = divmod(ms, 3_600_000)
    minutes, rest_ms = divmod(rest_ms, 60_000)
    secs = f"{rest_ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs


def _three(kind: str, bucket: BucketStats | None) -> Headers:
    if bucket is None:
        return []
    level = max(0.0, bucket.level)
    reset_s = (bucket.burst - level) / bucket.rate_per_s if bucket.rate_per_s > 0 else 0.0
    return [
        (f"x-ratelimit-limit-{kind}", str(math.floor(bucket.burst))),
        (f"x-ratelimit-remaining-{kind}", str(math.floor(level))),
        (f"x-ratelimit-reset-{kind}", duration_text(reset_s)),
    ]


def ratelimit_headers(buckets: TenantBuckets) -> Headers:
    requests, tokens = buckets
    return _three("requests", requests) + _three("tokens", tokens)


def _tighter(a: BucketStats | None, b: BucketStats | None) -> BucketStats | None:
    if a is None or b is None:
        return a or b
    return min(a, b, key=lambda x: (max(0.0, x.level), x.burst))


def tighter(tenant: TenantBuckets, key: TenantBuckets) -> TenantBuckets:
    """Per kind, the bucket that binds first (see the module's docstring)."""
    return _tighter(tenant[0], key[0]), _tighter(tenant[1], key[1])


async def tenant_headers(
    gate: AdmissionGate, tenant_id: str, key: KeyCheck | None = None
) -> Headers:
    """The headers for `tenant_id` (and the calling key) as the buckets stand now."""
    buckets = await gate.tenant_buckets(tenant_id)
    if key is not None:
        buckets = tighter(buckets, await key.buckets())
    return ratelimit_headers(buckets)
