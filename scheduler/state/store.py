"""The shared-state `Store`: fleet-wide buckets, fair counters, backlog, leases.

A store holds, for one engine domain (the engines every replica admits into),
everything replicas must agree on: the tenants' token buckets, their VTC
counters, which tenants are backlogged where (with heartbeats), the in-flight
leases on the engine (with expiry), and which requests were settled.

The interface is one call per pump iteration, `step`: it applies this
replica's pending settlements and batched output charges, refreshes its
backlog and leases, then makes at most one admission decision among the
candidates (the heads of this replica's eligible tenants): the candidate
whose tenant has the smallest counter and whose quotas allow it gets a lease
if the engine has room fleet-wide (and, in the engine's last
`reserve_fraction`, only if its tenant is below its weighted share: the
fair-share reserve of `reserve.py`, with shares split among the tenants
active anywhere — backlogged on a replica, in flight, or offered).
`reserve` takes a reject-mode request's buckets at arrival. Both are atomic:
one Lua script in Redis, plain code in memory.

Implementations: `memory_store.MemoryStore` (one replica; also the fail-open
fallback) and `redis_store.RedisStore`. The embedded single-replica server
keeps using the synchronous `Dispatcher`, which decides with the same
`decision.admit_round` over the same in-memory state classes
(`admission_state.py`); `SharedAdmission` drives a `Store`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from scheduler import rules
from scheduler.budget import AdmissionLimits
from scheduler.quotas import NO_BUCKETS, BucketLimits
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas

NO_LIMIT = -1.0


@dataclass(frozen=True, slots=True)
class Candidate:
    """One of the next requests of an eligible tenant, offered to a decision; a
    tenant's candidates come in its queue's order (the next one first)."""

    lease_id: str
    tenant_id: str
    weight: float
    prompt_tokens: int
    kv_tokens: int
    # Wait mode: the buckets are taken at admission (reject mode took them at arrival).
    take_buckets: bool = False
    buckets: BucketLimits = NO_BUCKETS
    max_concurrent: int | None = None
    # Requests its tenant has queued on the offering replica from this one on (light
    # tenants get the fair-share reserve kept for them: rules.light).
    queued: int = 1
    # Its arrival order on the offering replica: a tie in VTC order goes to the
    # earlier head (rules.vtc_rank), whatever the order of the offer.
    seq: int = 0
    # Prompt tokens the worker it would be placed on holds (one with room while
    # any has), as the offering replica's engine pool thinks (locality:
    # rules.locality_pick; not in `kv_tokens`, what it adds to the engine's KV).
    cached: int = 0
    # The longest prefix of its prompt any worker holds, as that pool thinks: what
    # is charged at w_cached is the larger of the two (QueuedRequest.charged_cached).
    held_anywhere: int = 0

    @property
    def sent_tokens(self) -> int:
        """Prompt + max_tokens as sent: what the token buckets count."""
        return self.kv_tokens + min(max(0, self.cached), self.prompt_tokens)

    @property
    def charged_cached(self) -> int:
        """The prompt tokens charged at w_cached (rules.admission_charge)."""
        return max(self.cached, self.held_anywhere)

    def charge(self, w_in: float, w_cached: float) -> float:
        """Its tenant's VTC charge when admitted (the store's, and the pump's mirror)."""
        return rules.admission_charge(
            w_in, self.prompt_tokens, self.weight, self.charged_cached, w_cached
        )


@dataclass(frozen=True, slots=True)
class Lease:
    """An in-flight request, for renewal (heartbeat) and adoption (after an outage)."""

    lease_id: str
    tenant_id: str
    kv_tokens: int


@dataclass(frozen=True, slots=True)
class Settlement:
    """The end of a request (or of a queued reservation). Applied once per lease_id."""

    lease_id: str
    tenant_id: str
    # Refunds to the buckets (negative: debt, e.g. more output than reserved).
    refund_requests: float = 0.0
    refund_tokens: float = 0.0
    buckets: BucketLimits = NO_BUCKETS


@dataclass(slots=True)
class Step:
    limits: AdmissionLimits
    w_in: float = rules.W_IN
    # A cached prompt token's cost (rules.admission_charge; rules.cached_weight:
    # as a computed one unless set).
    w_cached: float = rules.W_IN
    # Fair-share reserve (see reserve.py): the last `reserve_fraction` of the
    # room goes only to tenants below their weighted share of it.
    reserve_fraction: float = 0.0
    # How long a tenant counts as active (one to keep the reserve for) after its
    # last request left or it stopped being backlogged on a replica.
    reserve_window_s: float = 0.0
    # RESERVE keeps that fraction; PREEMPT lends it beyond the room to light
    # tenants below their share (the engine retracts a flood's request).
    isolation: rules.Isolation = rules.Isolation.RESERVE
    # Counter order: a light candidate goes this far ahead (rules.order_key).
    light_credit: float = 0.0
    # Requests this replica admitted and holds unsent (RESERVE_SLOTS lends their
    # slots: rules.fits_slot_lent; 0: none lent).
    unsent: int = 0
    # Fleet order (rules.behind): a candidate more than this many weighted tokens
    # behind a tenant backlogged on another replica waits for that replica
    # (inf: off, each replica's candidates are compared among themselves only).
    allowance: float = math.inf
    settlements: list[Settlement] = field(default_factory=list)
    # Weighted counter increments (w_out * tokens / weight), batched per tenant.
    charges: dict[str, float] = field(default_factory=dict)
    # Tenants newly backlogged here: lifted to the smallest counter among the
    # tenants backlogged and eligible (not held) anywhere.
    announce: list[str] = field(default_factory=list)
    # Tenants no longer backlogged here (nothing queued here).
    withdraw: list[str] = field(default_factory=list)
    # Heartbeat: every tenant backlogged here (refreshes their expiry); None: no refresh.
    backlogged: list[str] | None = None
    # How many requests tenants backlogged here have queued here (capped at
    # rules.LIGHT_QUEUE + 1), sent when it changed: the reserve tells light
    # tenants from heavy ones fleet-wide by their sum (a tenant whose length
    # the store does not know counts as heavy). Negative while the tenant is held
    # by its own limits here: still backlogged (holding is not idling), but not
    # eligible, so not a floor for the lifts (applied before `announce`).
    queued: dict[str, int] = field(default_factory=dict)
    # Heartbeat: every lease this replica holds (renewed, or re-created if missing).
    renew: list[Lease] | None = None
    # Tenant weights the store remembers for the reserve's shares (candidates
    # carry their own): send those of announced, backlogged and renewed tenants.
    weights: dict[str, float] = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=list)
    # Tenants idle here for the idle TTL that the registry does not configure
    # (scheduler/idle.py), with their buckets' limits: the store forgets each
    # that is idle fleet-wide too (backlogged nowhere, nothing in flight): its
    # counter, weight and tie order now (it is lifted when it returns), its
    # buckets once they are full again (a full bucket is an absent one).
    forget: dict[str, BucketLimits] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not (
            self.settlements
            or self.charges
            or self.announce
            or self.withdraw
            or self.backlogged is not None
            or self.queued
            or self.renew is not None
            or self.weights
            or self.candidates
            or self.forget
        )


@dataclass(slots=True)
class StepOutcome:
    # Indices of the admitted candidates in the order admitted (their leases now
    # exist): one step admits as the single-replica loop would, one request after
    # another, until a verdict other than ADMIT or OWN_LIMIT stops it, the
    # candidates run out, or a tenant's last offered request is admitted while it
    # has more queued (its next one, unoffered, may come first).
    admitted: list[int] = field(default_factory=list)
    # A candidate its own quotas allowed did not fit the engine's room.
    full: bool = False
    # Candidate index -> seconds until its quotas may allow it (inf: a request of
    # its tenant must finish first, max_concurrent).
    blocked: dict[int, float] = field(default_factory=dict)
    # Candidate indices held out of the reserve: the decision would have taken
    # the engine into its last `reserve_fraction` while their tenant is at or
    # above its weighted share of it (fleet-wide) and other tenants are active.
    held: list[int] = field(default_factory=list)
    # Counters of the candidates' and announced tenants (after the step).
    counters: dict[str, float] = field(default_factory=dict)
    # Settlements applied now (duplicates are skipped).
    settled: int = 0
    # The store's state was lost (e.g. Redis restarted empty): re-send every lease.
    state_lost: bool = False
    # Fleet-wide in-flight requests after the step.
    in_flight: int = 0
    # Admitted candidates that went beyond the room, into what PREEMPT lends.
    lent: list[int] = field(default_factory=list)
    # Admitted candidates whose tenant was light across the fleet (its queue here
    # and on the other replicas): what the engine priority's `light` follows.
    light: list[int] = field(default_factory=list)
    # The round stopped for a tenant backlogged on another replica (rules.behind).
    turn: bool = False


@dataclass(slots=True)
class StoreSnapshot:
    """Read-only view for tests, benchmarks and leak checks."""

    in_flight: int
    in_flight_kv_tokens: int
    concurrency: dict[str, int]
    counters: dict[str, float]
    leases: set[str]
    backlog: dict[str, set[str]]  # tenant -> replicas that have it backlogged
    bucket_levels: dict[str, tuple[float | None, float | None]]
    # Seconds since each level above was written, on the store's clock: the
    # level now is that one refilled over its age (gate_stats.stored_buckets).
    bucket_ages_s: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)


class Store(Protocol):
    kind: str

    @property
    def round_trips(self) -> int:
        """Network round trips made so far (0 for the memory store)."""
        ...

    async def step(self, replica_id: str, step: Step) -> StepOutcome: ...

    async def reserve(
        self, lease_id: str, tenant_id: str, tokens: int, buckets: BucketLimits
    ) -> tuple[str, float]:
        """Take 1 request and `tokens`: ("", 0.0); else (binding limit, wait_s), taking nothing."""
        ...

    async def put_tenant(self, cfg: TenantConfig) -> None:
        """Publish a tenant's configuration (operators and other replicas can read it)."""
        ...

    async def snapshot(self) -> StoreSnapshot: ...

    async def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers."""
        ...

    async def aclose(self) -> None: ...


def tenant_fields(cfg: TenantConfig) -> dict[str, str]:
    q = cfg.quotas
    out = {
        "weight": repr(cfg.weight),
        "enabled": "1" if cfg.enabled else "0",
        "over_quota": cfg.over_quota,
        "priorities": ",".join(sorted(p.name.lower() for p in cfg.priorities)),
    }
    for name in TenantQuotas.__dataclass_fields__:
        value = getattr(q, name)
        if value is not None:
            out[f"quotas.{name}"] = repr(value)
    return out


@dataclass(frozen=True, slots=True)
class SeenLevel:
    """A token bucket's level as the store last showed it, `age_s` before it was read."""

    level: float
    age_s: float


@dataclass(frozen=True, slots=True)
class FleetSeen:
    """What a replica last saw of the fleet in the store (for failing open)."""

    # Replicas with a live heartbeat in the store (this one included).
    replicas: int
    # (tenant, "r" | "t") -> the bucket's level (requests, tokens)
    levels: dict[tuple[str, str], SeenLevel] = field(default_factory=dict)


@runtime_checkable
class BucketReader(Protocol):
    """A store that reads one tenant's buckets on demand (the rate-limit headers)."""

    async def bucket_levels(self, tenant_id: str) -> dict[str, SeenLevel]:
        """The tenant's stored bucket levels by kind ("r" requests, "t" tokens), read
        now; a kind never written (a full bucket) is absent. Raises StoreUnavailable."""
        ...


@runtime_checkable
class FleetObserver(Protocol):
    """A store that can tell which replicas are alive and where buckets stand (Redis)."""

    async def observe(
        self, replica_id: str, ttl_s: float, tenants: Iterable[str], usage: bytes = b""
    ) -> FleetSeen:
        """Renew this replica's heartbeat (for `ttl_s`); count the live replicas; read
        the buckets of `tenants`; publish this replica's `usage` (fleet_usage.py) for
        as long as the heartbeat lives. Raises StoreUnavailable."""
        ...

    async def fleet_usage(self) -> dict[str, bytes]:
        """Every live replica's last published usage, by replica id. Raises
        StoreUnavailable."""
        ...
