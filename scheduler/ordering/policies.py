"""Policy registry: config names to policy factories.

"vtc" (weighted fair) is the default; "fcfs" and "rate-limit" are the
baselines the benchmark compares it with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler import rules
from scheduler.clock import Clock, MonotonicClock
from scheduler.ordering.fcfs import FcfsPolicy
from scheduler.ordering.policy import QueuePolicy
from scheduler.ordering.rate_limit import RateLimitPolicy
from scheduler.ordering.vtc import DEFAULT_BATCH_EVERY_N, VtcPolicy
from scheduler.tenancy.tenants import TenantRegistry

DEFAULT_POLICY = "vtc"


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    clock: Clock = field(default_factory=MonotonicClock)
    # Weights for VTC; None: every tenant weighs 1.
    tenants: TenantRegistry | None = None
    # Or a live weight lookup (wins over `tenants`): follows reconfiguration.
    weight_of: Callable[[str], float] | None = None
    vtc_w_in: float = rules.W_IN
    vtc_w_out: float = rules.W_OUT
    vtc_w_cached: float | None = None
    batch_every_n: int | None = DEFAULT_BATCH_EVERY_N
    # VTC: how far ahead a light tenant is ordered (`rules.order_key`).
    light_credit: float = 0.0
    # The rate-limit baseline's per-tenant limit.
    rate_limit_per_s: float = 10.0
    rate_limit_burst: float | None = None


def _vtc(o: PolicyOptions) -> QueuePolicy:
    weight_of = o.weight_of or (o.tenants.weight_of if o.tenants is not None else None)
    return VtcPolicy(
        weight_of,
        w_in=o.vtc_w_in,
        w_out=o.vtc_w_out,
        w_cached=o.vtc_w_cached,
        batch_every_n=o.batch_every_n,
        light_credit=o.light_credit,
    )


POLICIES: dict[str, Callable[[PolicyOptions], QueuePolicy]] = {
    "vtc": _vtc,
    "fcfs": lambda _o: FcfsPolicy(),
    "rate-limit": lambda o: RateLimitPolicy(o.clock, o.rate_limit_per_s, o.rate_limit_burst),
}


def make_policy(name: str = DEFAULT_POLICY, options: PolicyOptions | None = None) -> QueuePolicy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; available: {', '.join(sorted(POLICIES))}"
        ) from None
    return factory(options or PolicyOptions())
