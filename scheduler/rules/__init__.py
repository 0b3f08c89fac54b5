"""The admission rules, each stated once, as pure functions.

Everything that decides whether a queued request may enter the engine lives
in this package, one concept a module: the engine's room (`room`), token
buckets and what a request's end gives back (`buckets`), the VTC charges,
lift and order (`fairness`), locality and fleet order (`locality`), the
fair-share reserve and lent room (`reserve`), the order in which the checks
apply (`verdicts`), the engine priority (`priority`) and the queue timeout
(`expiry`). Callers import the names from `scheduler.rules`. The in-process
path (`Dispatcher`, `TokenBucket`, `QuotaLedger`) and the shared path
(`MemoryStore.step`) call these functions; the Redis STEP script
(`redis_scripts.py`) is their Lua twin, held to them by the store contract
and differential tests.

Fairness (VTC, "Fairness in Serving Large Language Models", OSDI 2024):
admissions happen strictly in counter order — the head of the tenant with the
smallest counter, ties to the tenant admitted least recently — and nothing
here reorders them. A rule may only *delay* the head (its own limits pause
its tenant without touching its counter; a full engine or the reserve stops
the round), which is why the published bound holds for any mix of request
shapes: two tenants continuously backlogged (and not held by their own
limits) receive weighted service within `vtc_bound(...)` of each other.
"""

from __future__ import annotations

from scheduler.rules.buckets import (
    EPSILON,
    binding_limit,
    bucket_added,
    bucket_level,
    bucket_wait_s,
    own_limit_wait_s,
    refill_s,
    refund,
)
from scheduler.rules.expiry import deadline_binds, queue_expired, queue_expiry_s
from scheduler.rules.fairness import (
    LIGHT_QUEUE,
    W_IN,
    W_OUT,
    Rank,
    admission_charge,
    cached_shortfall,
    cached_weight,
    lift_floor,
    lifted,
    light,
    order_key,
    output_charge,
    served_floor,
    vtc_bound,
    vtc_rank,
)
from scheduler.rules.locality import (
    LOCALITY_MIN_GAIN,
    behind,
    locality_may_pass,
    locality_pick,
)
from scheduler.rules.priority import (
    COST_TIERS_TOKENS,
    LIGHT_PREFILL_TOKENS,
    engine_priority,
    lent_slot_priority,
    light_request,
)
from scheduler.rules.reserve import (
    Isolation,
    TenantLoad,
    active_until,
    below_share,
    fits_lent,
    fits_slot_lent,
    in_reserve,
    still_active,
    waiting_below_share,
)
from scheduler.rules.room import AdmissionLimits, fits, fraction_of_room, kv_tokens
from scheduler.rules.verdicts import Verdict, needs_load, verdict

__all__ = [
    "COST_TIERS_TOKENS",
    "EPSILON",
    "LIGHT_PREFILL_TOKENS",
    "LIGHT_QUEUE",
    "LOCALITY_MIN_GAIN",
    "W_IN",
    "W_OUT",
    "AdmissionLimits",
    "Isolation",
    "Rank",
    "TenantLoad",
    "Verdict",
    "active_until",
    "admission_charge",
    "behind",
    "below_share",
    "binding_limit",
    "bucket_added",
    "bucket_level",
    "bucket_wait_s",
    "cached_shortfall",
    "cached_weight",
    "deadline_binds",
    "engine_priority",
    "fits",
    "fits_lent",
    "fits_slot_lent",
    "fraction_of_room",
    "in_reserve",
    "kv_tokens",
    "lent_slot_priority",
    "lift_floor",
    "lifted",
    "light",
    "light_request",
    "locality_may_pass",
    "locality_pick",
    "needs_load",
    "order_key",
    "output_charge",
    "own_limit_wait_s",
    "queue_expired",
    "queue_expiry_s",
    "refill_s",
    "refund",
    "served_floor",
    "still_active",
    "verdict",
    "vtc_bound",
    "vtc_rank",
    "waiting_below_share",
]
