"""The per-key gate: an API key's own limits, checked in front of its tenant's.

Fair sharing stays per tenant (the dispatcher's VTC counters); a key's limits
are an extra gate a request passes at arrival, before it joins its tenant's
queue, and leaves once at settlement:

- `open`: the key's priorities, then (one atomic step of its `KeyState`) a
  slot under its `max_concurrent` (requests open at once: queued or streaming)
  and 1 request + prompt + max_tokens tokens from its buckets; all or nothing.
  A key over a limit is refused at once, whatever its tenant's `over_quota`
  mode (KeyQuotaExceeded, with the real retry delay of a bucket), while the
  tenant's other keys go on.
- `settle`: the unused part given back to the buckets by `rules.refund` (all of
  it when the request never started), and the slot freed.

Where the buckets and slots live is the `KeyState`: this process
(`MemoryKeyState`), or Redis (scheduler/state/redis_key_state.py), exact across
replicas. Only issued keys reach the gate (the key id comes from a verified
key), so nothing unauthenticated grows its state; a memory key's state goes
once its buckets are full and nothing is open.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from scheduler import rules
from scheduler.clock import Clock
from scheduler.errors import (
    KeyPriorityNotAllowed,
    KeyQuotaExceeded,
    RequestTooLarge,
    StoreUnavailable,
)
from scheduler.gate_stats import BucketStats, TenantBuckets
from scheduler.quotas import BucketLimits
from scheduler.request import Priority, QueuedRequest
from scheduler.tenancy.key_limits import KeyLimits
from scheduler.tenancy.tenants import TenantConfig
from scheduler.token_bucket import TokenBucket, reconfigured

log = logging.getLogger(__name__)
MAX_CONCURRENT = "max_concurrent"


@dataclass(frozen=True, slots=True)
class EffectiveKeyLimits:
    """A key's limits as enforced now (`effective_limits`)."""

    buckets: BucketLimits
    max_concurrent: int | None
    priorities: frozenset[Priority]


def _lower(a: float | None, b: float | None) -> float | None:
    """The tighter of two limits (None: no limit)."""
    if a is None:
        return b
    return a if b is None else min(a, b)


def effective_limits(key: KeyLimits, tenant: TenantConfig) -> EffectiveKeyLimits:
    """What is enforced now: the tighter of the key's and its tenant's."""
    mine, theirs = BucketLimits.of(key.quotas), BucketLimits.of(tenant.quotas)
    buckets = BucketLimits()
    if mine.requests_per_s is not None:
        buckets = dataclasses.replace(
            buckets,
            requests_per_s=_lower(mine.requests_per_s, theirs.requests_per_s),
            requests_burst=_lower(mine.requests_burst, theirs.requests_burst),
        )
    if mine.tokens_per_s is not None:
        buckets = dataclasses.replace(
            buckets,
            tokens_per_s=_lower(mine.tokens_per_s, theirs.tokens_per_s),
            tokens_burst=_lower(mine.tokens_burst, theirs.tokens_burst),
        )
    concurrent = None
    if key.quotas.max_concurrent is not None:
        concurrent = int(_lower(key.quotas.max_concurrent, tenant.quotas.max_concurrent) or 0)
    priorities = tenant.priorities
    if key.priorities is not None:
        priorities = key.priorities & tenant.priorities
    return EffectiveKeyLimits(buckets, concurrent, priorities)


@dataclass(frozen=True, slots=True)
class Take:
    """One arrival's ask of a key's state."""

    key_id: str
    request_id: str
    tokens: int
    buckets: BucketLimits
    # None: the key has no concurrency limit (no slot is taken).
    max_concurrent: int | None


@dataclass(slots=True, eq=False)
class KeyHold:
    """What a request took from its key; settled once."""

    take: Take
    max_tokens: int
    requests_taken: float
    tokens_taken: float
    settled: bool = False


class KeyState(Protocol):
    async def take(self, t: Take) -> tuple[str, float]:
        """Atomically: a slot (if limited) and 1 request + `t.tokens` tokens, or
        nothing. ("", 0.0) when taken, else (binding limit, wait s; inf: no known
        time, e.g. max_concurrent)."""
        ...

    def release(self, t: Take, requests: float, tokens: float) -> None:
        """Give back `requests`/`tokens` (negative: debt) and free the slot; never
        blocks (the Redis state sends it in the background)."""
        ...

    async def levels(self, key_id: str, buckets: BucketLimits) -> TenantBuckets:
        """The key's (request, token) buckets now."""
        ...

    async def aclose(self) -> None:
        """Write what is pending and close."""
        ...


class KeyGate:
    def __init__(self, state: KeyState, *, fail_open: bool = True) -> None:
        self.state = state
        # With the state unreachable (Redis down): skip the key's limits (its
        # tenant's still apply), or refuse (StoreUnavailable).
        self.fail_open = fail_open
        self.refused_total = 0

    async def open(
        self, key_id: str, limits: EffectiveKeyLimits, req: QueuedRequest
    ) -> KeyHold | None:
        """Pass `req` through its key's limits or raise; None: nothing was taken."""
        tid = req.tenant_id
        if req.priority not in limits.priorities:
            allowed = sorted(p.name.lower() for p in limits.priorities)
            raise KeyPriorityNotAllowed(
                tid,
                key_id,
                f"API key {key_id!r} may not send {req.priority.name.lower()} requests "
                f"(allowed: {allowed or 'none'})",
            )
        b = limits.buckets
        if not b.any and limits.max_concurrent is None:
            return None
        if b.tokens_burst is not None and req.kv_tokens > b.tokens_burst:
            raise RequestTooLarge(
                tid,
                "sampling.max_tokens",
                "tokens_burst",
                f"prompt + max_tokens = {req.kv_tokens} tokens exceeds API key {key_id!r}'s "
                f"token burst of {b.tokens_burst:g}; lower max_tokens or shorten the prompt",
            )
        take = Take(key_id, req.request_id, req.kv_tokens, b, limits.max_concurrent)
        try:
            limit, wait_s = await self.state.take(take)
        except StoreUnavailable:
            if not self.fail_open:
                raise
            log.warning("key limits skipped for %s: the key state is unreachable", key_id)
            return None
        if limit:
            self.refused_total += 1
            raise _refusal(tid, key_id, limit, wait_s, limits)
        return KeyHold(
            take,
            req.max_tokens,
            1.0 if b.requests_per_s is not None else 0.0,
            float(req.kv_tokens) if b.tokens_per_s is not None else 0.0,
        )

    def settle(self, hold: KeyHold | None, started: bool, output_tokens: int) -> None:
        """Give back what `rules.refund` says and free the slot; a second call is a no-op."""
        if hold is None or hold.settled:
            return
        hold.settled = True
        requests, tokens = rules.refund(
            started, hold.requests_taken, hold.tokens_taken, hold.max_tokens, output_tokens
        )
        self.state.release(hold.take, requests, tokens)

    async def buckets(self, key_id: str, limits: EffectiveKeyLimits) -> TenantBuckets:
        if not limits.buckets.any:
            return None, None
        return await self.state.levels(key_id, limits.buckets)


def _refusal(
    tenant_id: str, key_id: str, limit: str, wait_s: float, limits: EffectiveKeyLimits
) -> KeyQuotaExceeded:
    if limit == MAX_CONCURRENT:
        what = f"{limits.max_concurrent} requests open at once"
        retry = ""
    else:
        b = limits.buckets
        if limit == "requests_per_s":
            what = f"{b.requests_per_s:g} requests/s"
        else:
            what = f"{(b.tokens_per_s or 0.0) * 60:g} tokens/min"
        retry = "" if math.isinf(wait_s) else f"; retry in {wait_s:.3f} s"
    return KeyQuotaExceeded(
        tenant_id,
        key_id,
        limit,
        f"API key {key_id!r} is over its own {limit} limit ({what}){retry}",
        retry_after_s=None if math.isinf(wait_s) else wait_s,
    )


@dataclass(slots=True)
class _KeyEntry:
    requests: TokenBucket | None = None
    tokens: TokenBucket | None = None
    open: set[str] = field(default_factory=set)


class MemoryKeyState:
    """One replica's key state (store=memory): token buckets and open requests."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._keys: dict[str, _KeyEntry] = {}

    def _entry(self, key_id: str, b: BucketLimits) -> _KeyEntry:
        e = self._keys.setdefault(key_id, _KeyEntry())
        e.requests = reconfigured(e.requests, b.requests_per_s, b.requests_burst, self.clock)
        e.tokens = reconfigured(e.tokens, b.tokens_per_s, b.tokens_burst, self.clock)
        return e

    async def take(self, t: Take) -> tuple[str, float]:
        e = self._entry(t.key_id, t.buckets)
        if t.max_concurrent is not None and len(e.open) >= t.max_concurrent:
            return MAX_CONCURRENT, math.inf
        limit, wait_s = rules.binding_limit(
            e.requests.wait_s(1) if e.requests is not None else None,
            e.tokens.wait_s(t.tokens) if e.tokens is not None else None,
        )
        if limit:
            return limit, wait_s
        if e.requests is not None:
            e.requests.take(1)
        if e.tokens is not None:
            e.tokens.take(t.tokens)
        if t.max_concurrent is not None:
            e.open.add(t.request_id)
        return "", 0.0

    def release(self, t: Take, requests: float, tokens: float) -> None:
        e = self._entry(t.key_id, t.buckets)
        if e.requests is not None and requests:
            e.requests.refund(requests)
        if e.tokens is not None and tokens:
            e.tokens.refund(tokens)
        e.open.discard(t.request_id)
        self._forget_full(t.key_id, e)

    def _forget_full(self, key_id: str, e: _KeyEntry) -> None:
        # A full bucket is the same as none: forgetting it bounds the state by
        # the keys in use, not the keys ever used.
        if e.open:
            return
        for b in (e.requests, e.tokens):
            if b is not None and not b.full:
                return
        del self._keys[key_id]

    async def levels(self, key_id: str, buckets: BucketLimits) -> TenantBuckets:
        e = self._entry(key_id, buckets)
        out = (BucketStats.of(e.requests), BucketStats.of(e.tokens))
        self._forget_full(key_id, e)
        return out

    async def aclose(self) -> None:
        return None

    def tracked(self) -> Iterable[str]:
        """Keys with state now (the tests' view of what is kept)."""
        return list(self._keys)
