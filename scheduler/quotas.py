"""Per-tenant quota accounting: caps, queue slots, concurrency and token buckets.

Life of one request's `Reservation`:
- `open` at arrival: resolve the tenant, check caps and max_queued; a tenant in
  "reject" mode reserves 1 request and prompt + max_tokens tokens right away
  (or gets QuotaExceeded with the exact retry delay).
- `wait_s` while queued: 0 when it may enter the engine now, else how long
  until it may (inf: until one of the tenant's requests finishes).
- `start` when admitted to the engine: a tenant in "wait" mode reserves its
  buckets now (they allowed it, per `wait_s`). Its concurrency slot is the
  engine's `InFlight` (admission_state.py), the one count of what is in flight.
- `settle` exactly once at the end: refunds the unused part of max_tokens, or
  everything if it never started (cancel/deadline while queued charges
  nothing). A second settle is a no-op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scheduler.admission_state import InFlight
from scheduler.clock import Clock
from scheduler.errors import QuotaExceeded, RequestTooLarge
from scheduler.request import QueuedRequest
from scheduler.rules import binding_limit, kv_tokens, own_limit_wait_s, refund
from scheduler.tenancy.tenants import OverQuotaMode, TenantConfig, TenantQuotas, TenantRegistry
from scheduler.token_bucket import TokenBucket, reconfigured


@dataclass(slots=True, eq=False)
class Reservation:
    request_id: str
    tenant_id: str
    prompt_tokens: int
    max_tokens: int
    mode: OverQuotaMode
    requests_taken: float = 0.0
    tokens_taken: float = 0.0
    started: bool = False
    settled: bool = False

    @property
    def tokens(self) -> int:
        return kv_tokens(self.prompt_tokens, self.max_tokens)


@dataclass(slots=True)
class UsageTotals:
    """A tenant's totals on this replica: refusals at arrival by limit, requests
    that ended, what the buckets were charged net of refunds (ignores the burst
    cap). The ledger keeps them with its live counts (`TenantUsage`); the shared
    path's `TenantTally` (shared/stats.py) keeps them alone."""

    rejected_total: int = 0
    rejections: dict[str, int] = field(default_factory=dict)
    finished_total: int = 0
    charged_requests: float = 0.0
    charged_tokens: float = 0.0

    def refused(self, limit: str) -> None:
        self.rejected_total += 1
        self.rejections[limit] = self.rejections.get(limit, 0) + 1

    def charged(self, requests: float, tokens: float) -> None:
        """Taken from the buckets (negative: refunded)."""
        self.charged_requests += requests
        self.charged_tokens += tokens

    def copy(self) -> UsageTotals:
        return UsageTotals(
            self.rejected_total,
            dict(self.rejections),
            self.finished_total,
            self.charged_requests,
            self.charged_tokens,
        )


@dataclass(slots=True, kw_only=True)
class TenantUsage(UsageTotals):
    """Live counts and totals of one tenant (read them, don't write them); what it
    has in flight is the ledger's `in_flight` (the budget's, not kept twice)."""

    config: TenantConfig
    request_bucket: TokenBucket | None = None
    token_bucket: TokenBucket | None = None
    queued: int = 0
    open_reservations: int = 0


@dataclass(frozen=True, slots=True)
class BucketLimits:
    """A tenant's two token buckets (None: no such bucket)."""

    requests_per_s: float | None = None
    requests_burst: float | None = None
    tokens_per_s: float | None = None
    tokens_burst: float | None = None

    @classmethod
    def of(cls, quotas: TenantQuotas) -> BucketLimits:
        tokens_per_s = quotas.tokens_per_min / 60.0 if quotas.tokens_per_min is not None else None
        return cls(quotas.requests_per_s, quotas.request_burst, tokens_per_s, quotas.token_burst)

    @property
    def any(self) -> bool:
        return self.requests_per_s is not None or self.tokens_per_s is not None

    def share(self, replicas: int) -> BucketLimits:
        """This replica's part when it must enforce the limit alone (fail-open)."""
        if replicas <= 1:
            return self

        def div(x: float | None, floor: float = 0.0) -> float | None:
            return None if x is None else max(floor, x / replicas)

        return BucketLimits(
            div(self.requests_per_s),
            div(self.requests_burst, 1.0),
            div(self.tokens_per_s),
            div(self.tokens_burst),
        )


NO_BUCKETS = BucketLimits()


def check_arrival(cfg: TenantConfig, req: QueuedRequest, queued: int, where: str = "") -> None:
    """The checks at arrival, both dispatchers' (before any bucket): the tenant's
    caps, then a queue slot (`queued`: its requests queued already; `where`: on
    what, e.g. " on this replica")."""
    _check_caps(cfg, req, cfg.quotas.token_burst)
    _check_queue_slot(cfg, queued, where)


def _check_caps(cfg: TenantConfig, req: QueuedRequest, burst: float | None) -> None:
    """Raise RequestTooLarge when `req` exceeds a cap of its tenant (stateless checks)."""
    q: TenantQuotas = cfg.quotas
    tid = cfg.tenant_id
    if q.max_prompt_tokens is not None and req.prompt_tokens > q.max_prompt_tokens:
        raise RequestTooLarge(
            tid,
            "prompt",
            "max_prompt_tokens",
            f"the prompt has {req.prompt_tokens} tokens; the limit is {q.max_prompt_tokens}",
        )
    cap = q.output_cap_tokens(req.priority)
    if cap is not None and req.max_tokens > cap:
        interactive = q.max_output_tokens_interactive
        limit = "max_output_tokens_interactive" if cap == interactive else "max_output_tokens"
        cls = req.priority.name.lower()
        raise RequestTooLarge(
            tid,
            "sampling.max_tokens",
            limit,
            f"max_tokens is {req.max_tokens}; the limit for {cls} requests is {cap}",
        )
    if burst is not None and req.kv_tokens > burst:
        raise RequestTooLarge(
            tid,
            "sampling.max_tokens",
            "tokens_burst",
            f"prompt + max_tokens = {req.kv_tokens} tokens exceeds the tenant's token "
            f"burst of {burst:g}; lower max_tokens or shorten the prompt",
        )


def _check_queue_slot(cfg: TenantConfig, queued: int, where: str) -> None:
    """Raise QuotaExceeded when the tenant has `max_queued` requests queued already."""
    limit = cfg.quotas.max_queued
    if limit is not None and queued >= limit:
        raise QuotaExceeded(
            cfg.tenant_id,
            "max_queued",
            f"{queued} requests already queued{where}; the limit is {limit}",
        )


def bucket_exceeded(
    tenant_id: str, quotas: TenantQuotas, limit: str, wait_s: float, scope: str = ""
) -> QuotaExceeded:
    """The refusal for a request over a rate bucket; `wait_s` is the real retry delay."""
    rate = (
        f"{quotas.requests_per_s:g} requests/s"
        if limit == "requests_per_s"
        else f"{quotas.tokens_per_min:g} tokens/min"
    )
    return QuotaExceeded(
        tenant_id,
        limit,
        f"over its {limit} quota ({rate}{scope}); retry in {wait_s:.3f} s",
        retry_after_s=None if math.isinf(wait_s) else wait_s,
    )


class QuotaLedger:
    def __init__(
        self, tenants: TenantRegistry, clock: Clock, in_flight: InFlight | None = None
    ) -> None:
        """`in_flight`: what is on the engine, opened and released by its owner (the
        dispatcher's budget, before `start` and before `settle`); max_concurrent reads it."""
        self.tenants = tenants
        self.clock = clock
        self.in_flight = InFlight() if in_flight is None else in_flight
        self._usage: dict[str, TenantUsage] = {}

    # -- configuration ------------------------------------------------------
    def set_tenants(self, tenants: TenantRegistry) -> None:
        """Apply a new registry; bucket levels and live counts carry over."""
        self.tenants = tenants
        for tid, usage in self._usage.items():
            cfg = tenants.get(tid)
            if cfg is not None:
                self._configure(usage, cfg)

    def _configure(self, usage: TenantUsage, cfg: TenantConfig) -> None:
        b = BucketLimits.of(cfg.quotas)
        usage.config = cfg
        usage.request_bucket = reconfigured(
            usage.request_bucket, b.requests_per_s, b.requests_burst, self.clock
        )
        usage.token_bucket = reconfigured(
            usage.token_bucket, b.tokens_per_s, b.tokens_burst, self.clock
        )

    def usage(self, tenant_id: str) -> TenantUsage | None:
        return self._usage.get(tenant_id)

    def tenants_seen(self) -> list[str]:
        """Tenants with usage records (every tenant that ever sent a request)."""
        return list(self._usage)

    def usages(self) -> list[TenantUsage]:
        """Every tenant seen so far (a snapshot list; for metrics readers)."""
        return list(self._usage.values())

    def idle(self, tenant_id: str) -> bool:
        """Nothing queued, in flight or reserved."""
        u = self._usage.get(tenant_id)
        return u is None or (
            u.queued == 0 and tenant_id not in self.in_flight and u.open_reservations == 0
        )

    def forget(self, tenant_id: str) -> bool:
        """Drop an idle tenant's record once its buckets are full again (forgetting
        a drained bucket would refill it); False if it cannot go yet."""
        u = self._usage.get(tenant_id)
        if u is None:
            return True
        if not self.idle(tenant_id):
            return False
        for b in (u.request_bucket, u.token_bucket):
            if b is not None and not b.full:
                return False
        del self._usage[tenant_id]
        return True

    def _usage_of(self, cfg: TenantConfig) -> TenantUsage:
        usage = self._usage.get(cfg.tenant_id)
        if usage is None:
            usage = TenantUsage(config=cfg)
            self._configure(usage, cfg)
            self._usage[cfg.tenant_id] = usage
        return usage

    @property
    def open_reservations(self) -> int:
        return sum(u.open_reservations for u in self._usage.values())

    # -- arrival ------------------------------------------------------------
    def open(self, req: QueuedRequest) -> Reservation:
        """Admit `req` into its tenant's queue, or raise. Sets `req.tenant_id`."""
        cfg = self.tenants.resolve(req.tenant_id, req.priority)
        req.tenant_id = cfg.tenant_id
        usage = self._usage_of(cfg)
        try:
            check_arrival(cfg, req, usage.queued)
            res = Reservation(
                request_id=req.request_id,
                tenant_id=cfg.tenant_id,
                prompt_tokens=req.prompt_tokens,
                max_tokens=req.max_tokens,
                mode=cfg.over_quota,
            )
            if res.mode == "reject":
                self._reserve_or_reject(usage, res)
        except (QuotaExceeded, RequestTooLarge) as exc:
            usage.refused(exc.limit)
            raise
        usage.queued += 1
        usage.open_reservations += 1
        return res

    def _bucket_waits(self, usage: TenantUsage, res: Reservation) -> tuple[str, float]:
        """(binding limit, seconds until both buckets allow this reservation)."""
        rb, tb = usage.request_bucket, usage.token_bucket
        return binding_limit(
            rb.wait_s(1) if rb is not None else None,
            tb.wait_s(res.tokens) if tb is not None else None,
        )

    def _take(self, usage: TenantUsage, res: Reservation) -> None:
        # Debt allowed: callers checked `_bucket_waits` first, or must not cut a stream.
        if usage.request_bucket is not None:
            usage.request_bucket.take(1)
            res.requests_taken = 1.0
        if usage.token_bucket is not None:
            usage.token_bucket.take(res.tokens)
            res.tokens_taken = float(res.tokens)
        usage.charged(res.requests_taken, res.tokens_taken)

    def _reserve_or_reject(self, usage: TenantUsage, res: Reservation) -> None:
        limit, wait_s = self._bucket_waits(usage, res)
        if wait_s > 0:
            raise bucket_exceeded(res.tenant_id, usage.config.quotas, limit, wait_s)
        self._take(usage, res)

    # -- queued → engine ----------------------------------------------------
    def wait_s(self, res: Reservation) -> float:
        """0.0 if `res` may enter the engine now; inf: wait for a finish of its tenant."""
        usage = self._usage[res.tenant_id]
        wait_mode = res.mode == "wait" and not res.started
        return own_limit_wait_s(
            self.in_flight.requests_of(res.tenant_id),
            usage.config.quotas.max_concurrent,
            self._bucket_waits(usage, res)[1] if wait_mode else None,
        )

    def start(self, res: Reservation) -> None:
        if res.started or res.settled:
            raise AssertionError(f"reservation {res.request_id} started twice or after settle")
        usage = self._usage[res.tenant_id]
        if res.mode == "wait":
            self._take(usage, res)
        res.started = True
        usage.queued -= 1

    def max_queue_wait_s(self, tenant_id: str) -> float | None:
        usage = self._usage.get(tenant_id)
        return usage.config.quotas.max_queue_wait_s if usage else None

    # -- end ----------------------------------------------------------------
    def settle(self, res: Reservation, output_tokens: int = 0) -> bool:
        """Close `res`; True the first time, a no-op (False) afterwards."""
        if res.settled:
            return False
        res.settled = True
        usage = self._usage[res.tenant_id]
        usage.open_reservations -= 1
        usage.finished_total += 1
        if not res.started:
            usage.queued -= 1
        requests, tokens = refund(
            res.started, res.requests_taken, res.tokens_taken, res.max_tokens, output_tokens
        )
        # A negative refund (more output than reserved) is debt: TokenBucket.refund.
        if usage.request_bucket is not None and requests:
            usage.request_bucket.refund(requests)
        if usage.token_bucket is not None and tokens:
            usage.token_bucket.refund(tokens)
        usage.charged(-requests, -tokens)
        return True
