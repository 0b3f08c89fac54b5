"""Options and small state types of `SharedAdmission` (admission.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from scheduler import rules
from scheduler.budget import AdmissionLimits
from scheduler.ordering.vtc import DEFAULT_BATCH_EVERY_N
from scheduler.request import Locality, Unsent
from scheduler.state.store import Step
from scheduler.tenancy.tenants import TenantRegistry

FailureMode = Literal["open", "closed"]


@dataclass(frozen=True, slots=True)
class SharedOptions:
    replica_id: str
    failure_mode: FailureMode = "open"
    # The fleet's minimum size: the fail-open divisor is the replicas alive at the last
    # look (FleetSeen), never fewer than this.
    replicas: int = 1
    # Fair-share reserve (reserve.py), applied fleet-wide by the store, and how
    # long a tenant stays one to keep it for after its last request left.
    reserve_fraction: float = 0.0
    reserve_window_s: float = 10.0
    isolation: rules.Isolation = rules.Isolation.RESERVE
    # VTC order: a light tenant goes this far ahead (rules.order_key).
    light_credit: float = 0.0
    # Fleet order (rules.behind): how far (weighted tokens) a candidate may be
    # behind a tenant backlogged on another replica and still be admitted here.
    allowance: float = 4096.0
    w_in: float = rules.W_IN
    w_out: float = rules.W_OUT
    # A cached prompt token's cost (None: as a computed one: w_in).
    w_cached: float | None = None
    # The engine pool's prefix index: how much of a request's prompt the worker
    # it would be placed on holds, offered with each candidate (locality; None: none).
    locality: Locality | None = None
    # The engine pool's admitted requests held unsent, sent with every step
    # (RESERVE_SLOTS lends their slots; None: none).
    unsent: Unsent | None = None
    flush_s: float = 0.005
    poll_s: float = 0.02
    heartbeat_s: float = 1.0
    retry_s: float = 0.5
    # Hysteresis: fail over after this many store calls failed in a row, or once
    # calls have kept failing this long; a single slow call retries (after a
    # short backoff) instead.
    failover_after_failures: int = 3
    failover_after_s: float = 2.0
    # A step offers the next requests of up to `max_candidates` tenants, up to
    # `per_tenant` of each: one Redis round trip admits several (a wave of
    # finishes at a full engine no longer waits a round trip per request).
    max_candidates: int = 16
    per_tenant: int = 8
    batch_every_n: int | None = DEFAULT_BATCH_EVERY_N
    # A tenant the registry does not configure is forgotten after this long idle
    # here, and in the store once idle fleet-wide (scheduler/idle.py).
    idle_ttl_s: float = 600.0

    def step(self, limits: AdmissionLimits) -> Step:
        """An empty step with this fleet's weights and reserve."""
        return Step(
            limits,
            w_in=self.w_in,
            w_cached=rules.cached_weight(self.w_in, self.w_cached),
            reserve_fraction=self.reserve_fraction,
            reserve_window_s=self.reserve_window_s,
            isolation=self.isolation,
            light_credit=self.light_credit,
            unsent=0 if self.unsent is None else self.unsent(),
            allowance=self.allowance,
        )


@dataclass(slots=True)
class StoreHealth:
    """The store's state as this replica sees it (exported by the observability work)."""

    mode: Literal["ok", "open", "closed"] = "ok"
    transitions_total: int = 0
    last_error: str = ""
    reconciled_settlements: int = 0
    reconciled_leases: int = 0

    @property
    def degraded(self) -> bool:
        return self.mode != "ok"


@dataclass(slots=True)
class QuotaView:
    """What the service reads from `dispatcher.quotas`: the registry in force
    (per-tenant usage is `stats().tenants`, in both modes)."""

    tenants: TenantRegistry
    open_reservations: int = 0
