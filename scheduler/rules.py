"""The admission rules, each stated once, as pure functions.

Everything that decides whether a queued request may enter the engine lives
here: token-bucket levels and waits, which limit binds, the VTC lift and
charges, the engine's room, the fair-share reserve and the order in which
they are applied (`verdict`), and the queue timeout. The in-process path
(`Dispatcher`, `TokenBucket`, `QuotaLedger`) and the shared path
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

import bisect
import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.errors import DeadlineExpired, QueueTimeout, SchedulingError

# Relative slack so that waiting exactly `bucket_wait_s(...)` always passes
# despite floating-point rounding of rate * elapsed.
EPSILON = 1e-9


# -- engine limits ---------------------------------------------------------------
def kv_tokens(prompt_tokens: int, max_tokens: int) -> int:
    """KV-cache tokens a request may occupy at most: what admission, the token
    quotas and the pool's routing count it as."""
    return prompt_tokens + max_tokens


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    max_requests: int
    max_kv_tokens: int

    def __post_init__(self) -> None:
        if self.max_requests < 1 or self.max_kv_tokens < 1:
            raise ValueError(f"admission limits must be >= 1: {self}")


# -- token buckets -------------------------------------------------------------
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


# -- VTC ---------------------------------------------------------------------------
def lifted(counter: float, floor: float) -> float:
    """A tenant that becomes backlogged starts no lower than `floor` (idling earns
    no credit). `floor`: the smallest counter among the eligible backlogged
    tenants, or the counter of the last tenant served when none is. A tenant that
    was only held by its own limits is not lifted: holding is not idling."""
    return max(counter, floor)


def lift_floor(eligible: Iterable[float], last_served: float) -> float:
    """The floor `lifted` takes: the smallest counter among the eligible
    backlogged tenants, or, when none is, the counter of the last tenant served
    (`served_floor`)."""
    return min(eligible, default=last_served)


def served_floor(floor: float, counter: float) -> float:
    """The last-served floor after admitting a tenant whose counter was `counter`."""
    return max(floor, counter)


def cached_weight(w_in: float, w_cached: float | None) -> float:
    """A cached prompt token's cost: `w_cached`, or a computed one's when None."""
    return w_in if w_cached is None else w_cached


def admission_charge(
    w_in: float, prompt_tokens: int, weight: float, cached: int = 0, w_cached: float = 0.0
) -> float:
    """The prompt's charge at admission: `w_in` per token the engine computes,
    `w_cached` per token of its prefix a worker is thought to hold (`cached`,
    the locality estimate; 0 without locality). The engine reports what it really
    had cached at the first token: `cached_shortfall` charges the difference when
    it had less. Never a credit: counters only grow, which is what lets the
    shared path tell a wiped store from its own bookkeeping."""
    hit = min(max(0, cached), prompt_tokens)
    return (w_in * (prompt_tokens - hit) + w_cached * hit) / weight


def cached_shortfall(
    w_in: float, w_cached: float, estimated: int, reported: int, weight: float
) -> float:
    """What admission under-charged: the engine had `reported` prompt tokens
    cached, fewer than the `estimated` charged at `w_cached` (never negative: a
    better hit than estimated is not refunded)."""
    return (w_in - w_cached) * max(0, estimated - max(0, reported)) / weight


def output_charge(w_out: float, tokens: int, weight: float) -> float:
    return w_out * tokens / weight


def vtc_bound(
    w_in: float,
    w_out: float,
    max_prompt_tokens: int,
    max_kv_tokens: int,
    light_credit: float = 0.0,
) -> float:
    """The weighted service gap allowed between two backlogged tenants, per unit
    weight: 2 * max(w_in * L_in, w_out * M), plus `light_credit` when either may
    be light (`order_key`). With replicas, add the fleet allowance (`behind`) and
    the counter lag (`SharedAdmission.max_charge_lag`)."""
    return 2 * max(w_in * max_prompt_tokens, w_out * max_kv_tokens) + light_credit


# -- engine room and the fair-share reserve -------------------------------------------
def fits(limits: AdmissionLimits, in_flight: int, in_flight_kv: int, kv_tokens: int) -> bool:
    """Does one more request of `kv_tokens` fit the engine's room? An idle engine
    always takes the next request, however large, so it cannot starve."""
    if in_flight >= limits.max_requests:
        return False
    return in_flight == 0 or in_flight_kv + kv_tokens <= limits.max_kv_tokens


class Isolation(enum.Enum):
    """How a light tenant gets engine room beside a flood that fills it (`verdict`)."""

    # The last `fraction` of the room is kept, idle if need be, for tenants
    # below their share: for engines that cannot preempt.
    RESERVE = "reserve"
    # The room is filled; a light tenant below its share may go up to `fraction`
    # beyond it, and the engine retracts a heavy tenant's running request to make
    # room (SGLang's priority preemption: the lent request's `engine_priority`).
    # Nothing idles; the retracted request's prefix and output are recomputed.
    PREEMPT = "preempt"


def fraction_of_room(fraction: float, limits: AdmissionLimits) -> tuple[int, float]:
    """`fraction` of the engine's room, kept (RESERVE) or lent (PREEMPT): requests
    (rounded up: at least one) and KV tokens."""
    return math.ceil(limits.max_requests * fraction), limits.max_kv_tokens * fraction


def fits_lent(
    fraction: float, limits: AdmissionLimits, in_flight: int, in_flight_kv: int, kv_tokens: int
) -> bool:
    """Does `kv_tokens` more fit the room plus the `fraction` lent beyond it (PREEMPT)?"""
    lent_requests, lent_kv = fraction_of_room(fraction, limits)
    return (
        in_flight + 1 <= limits.max_requests + lent_requests
        and in_flight_kv + kv_tokens <= limits.max_kv_tokens + lent_kv
    )


def in_reserve(
    fraction: float, limits: AdmissionLimits, in_flight: int, in_flight_kv: int, kv_tokens: int
) -> bool:
    """Would admitting `kv_tokens` more take the engine into its last `fraction`?"""
    reserve_requests, reserve_kv = fraction_of_room(fraction, limits)
    return (
        in_flight + 1 > limits.max_requests - reserve_requests
        or in_flight_kv + kv_tokens > limits.max_kv_tokens - reserve_kv
    )


def below_share(
    share: float, limits: AdmissionLimits, tenant_in_flight: int, tenant_kv: int, kv_tokens: int
) -> bool:
    """Is a tenant with weighted `share` of the engine below it with one more request?

    Alone (share 1) always; a tenant with nothing in flight always (a request
    larger than its share of the KV must not wait for the others to go idle).
    """
    if share >= 1.0 - EPSILON or tenant_in_flight == 0:
        return True
    return (
        tenant_in_flight < share * limits.max_requests
        and tenant_kv + kv_tokens <= share * limits.max_kv_tokens
    )


def active_until(left_s: float, window_s: float) -> float:
    """A tenant that left the queue and the engine at `left_s` still counts as
    active for the reserve until then (one to keep room for between requests)."""
    return left_s + window_s


def still_active(until_s: float, now_s: float) -> bool:
    return until_s > now_s


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """The candidate tenant's part of the engine, for the reserve."""

    share: float  # weight / sum of the weights of the active tenants
    in_flight: int
    kv_tokens: int
    # Is there someone to keep the reserve for: another active tenant that is
    # light (at most LIGHT_QUEUE requests queued: in flight, just arrived, or seen
    # within the activity window) and below its share? Heavy tenants, with queues
    # of their own, are served in counter order anyway: holding room for them
    # would only idle it.
    protects: bool = True
    # Is the candidate itself light (PREEMPT lends room beyond the engine's only
    # to light tenants: a flood below its share must not retract its peers)?
    light: bool = True


# A tenant with at most this many requests queued is light: the reserve is kept
# for it (a light tenant's request should find room, not wait for a flood's),
# it is ordered `light_credit` ahead, and the engine prefills it first. A few,
# not one: a light tenant's requests arrive in bursts too (Poisson), and one
# extra queued request must not cost it its protection.
LIGHT_QUEUE = 4


def light(queued: int) -> bool:
    return queued <= LIGHT_QUEUE


def order_key(counter: float, queued: int, light_credit: float) -> float:
    """What VTC orders backlogged tenants by: the counter, less `light_credit` for
    a light tenant. A light tenant's own last request (its prompt charged at once,
    its output as it streams) puts its counter ahead of tenants that have been
    queued all along; without the credit its next request would wait for them to
    catch up, although it uses far less than its share. The credit bends the
    order by a bounded amount: a light tenant can be at most `light_credit`
    further ahead, so the gap bound between it and another tenant grows by
    `light_credit` (`vtc_bound`); between heavy tenants nothing changes."""
    return counter - light_credit if light(queued) else counter


# A backlogged tenant's place in fair order (smallest first): see `vtc_rank`.
Rank = tuple[float, int, int]


def vtc_rank(
    counter: float, queued: int, light_credit: float, last_admitted: int, head_seq: int
) -> Rank:
    """Where a backlogged tenant stands in VTC order (smallest first): its
    `order_key`, then ties to the tenant admitted least recently (`last_admitted`:
    its admission number, 0 when newly backlogged, so a lifted newcomer goes
    before the tenant it ties with), then the earlier head."""
    # (`order_key` is the counter itself without a credit: skip the call on the hot path.)
    key = order_key(counter, queued, light_credit) if light_credit else counter
    return (key, last_admitted, head_seq)


def locality_may_pass(head_queued: int) -> bool:
    """May locality put another tenant's request before the fair head, whose
    tenant has `head_queued` requests queued? Not a light tenant's: its short
    request is what isolation is for (measured on the virtual fleet: letting
    cached heads pass it took a light tenant's TTFT p99 from 3.5x to 23x its
    solo run)."""
    return not light(head_queued)


def locality_pick(cached: Sequence[int]) -> int:
    """Locality within the fair order (D²LPM-style, "Locality-aware Fair
    Scheduling in LLM Serving", 2025): `cached` holds, for the requests that may
    go next in fair order (the first tenant's head, then the heads of tenants
    within the allowance of it), how many prompt tokens a worker with room
    holds. The one with the most goes first: its prefill is mostly skipped.
    Ties go to the earlier in fair order, so with nothing cached anywhere the
    fair head goes. The bound between two backlogged tenants grows by the
    allowance: a tenant is passed over only while it is within it."""
    best = 0
    for i, c in enumerate(cached):
        if c > cached[best]:
            best = i
    return best


def behind(key: float, first_elsewhere: float | None, allowance: float) -> bool:
    """With replicas, each offers its own tenants: is a candidate (at `key`,
    `order_key`) more than `allowance` weighted tokens behind the first tenant
    backlogged, and eligible, on another replica (`first_elsewhere`; None: none)?
    Then it is that replica's turn: admitting here would serve a tenant out of
    counter order across the fleet (what a replica that sees only its own
    tenants did: a service calling one replica got ahead of one calling another
    by far more than the bound). The allowance lets a replica admit within that
    slack rather than idle the room until the other one steps; it adds to the
    bound (`vtc_bound`)."""
    return first_elsewhere is not None and key > first_elsewhere + allowance


# Prompt lengths (tokens) that split heavy requests into tiers of recompute
# cost, for an engine that preempts (`engine_priority`).
COST_TIERS_TOKENS = (128, 512, 2048)


def engine_priority(
    batch: bool,
    light_tenant: bool,
    threshold: int | None = None,
    lent: bool = False,
    prompt_tokens: int | None = None,
) -> int:
    """The priority sent to an engine that schedules by priority (SGLang: larger
    first). A light tenant's request is prefilled before the heavy tenants' queued
    prompts (admitted at once, it would otherwise wait in the engine behind them);
    interactive before batch within each.

    `threshold`: the engine retracts a running request for a newcomer whose
    priority exceeds it by more than this (SGLang's
    --priority-scheduling-preemption-threshold; None: it never preempts). Those
    priorities stay within it, so nothing running is retracted — except for a
    request admitted `lent` room beyond the engine's (Isolation.PREEMPT): its
    priority clears every other by more than the threshold.

    `prompt_tokens` (given under Isolation.PREEMPT): heavy requests also rise
    with their prompt's tier (`COST_TIERS_TOKENS`), because the engine retracts
    the lowest priority first (then the latest arrival) and a retracted request's
    prompt is prefilled again: a short prompt is the cheapest to give up
    (bench (f) in the simulator: ~0.96x FCFS throughput without the tiers, ~1.0x
    with them)."""
    step = 0 if batch else 1
    if prompt_tokens is None:
        p, top = step + (2 if light_tenant else 0), 3
    else:
        tiers = len(COST_TIERS_TOKENS) + 1
        top = 2 * tiers + 1
        if light_tenant:
            p = 2 * tiers + step
        else:
            p = tiers * step + bisect.bisect_right(COST_TIERS_TOKENS, prompt_tokens)
    if threshold is None:
        return p
    if not lent:
        return min(p, threshold)
    if threshold < 1:
        return 1  # over every other (all 0); a gap of 1 would preempt among lent ones
    return threshold + 1 + min(top, threshold) + step  # lent batch - the top = threshold + 1


def lent_slot_priority(
    batch: bool, light_tenant: bool, threshold: int | None, prompt_tokens: int | None
) -> int | None:
    """A light request's priority where a pool routes it to a worker with no free
    slot (`Placement.priority_on`): a lent request's, which the engine retracts a
    running request for. None where there is no such slot to take: not a light
    tenant's, or an engine that does not preempt (`threshold` None; the caller
    passes None outside Isolation.PREEMPT too)."""
    if not light_tenant or threshold is None:
        return None
    return engine_priority(batch, True, threshold, True, prompt_tokens)


def waiting_below_share(
    share: float, limits: AdmissionLimits, tenant_in_flight: int, tenant_kv: int
) -> bool:
    """An active tenant with nothing queued, for whom the reserve is kept: below
    its share as it stands (its next request's size is not known yet)."""
    return below_share(share, limits, tenant_in_flight, tenant_kv, 0)


class Verdict(enum.Enum):
    ADMIT = "admit"
    # Held by its own limits (max_concurrent, wait-mode buckets): its tenant is
    # paused, keeps its counter, and the next tenant is considered.
    OWN_LIMIT = "own_limit"
    # The engine has no room for it: the round stops (no smaller request jumps it).
    FULL = "full"
    # In the reserve while at or above its share, and another active tenant with
    # nothing queued is below its own: the round stops and the reserve stays free
    # for that tenant's next request (never reorders VTC).
    HOLD = "hold"
    # A tenant backlogged on another replica comes first (`behind`): the round
    # stops; that replica admits it.
    TURN = "turn"


def verdict(
    own_wait_s: float,
    limits: AdmissionLimits,
    in_flight: int,
    in_flight_kv: int,
    kv_tokens: int,
    reserve_fraction: float,
    load: TenantLoad | None,
    isolation: Isolation = Isolation.RESERVE,
    behind_elsewhere: bool = False,
) -> Verdict:
    """The one order of the checks on the head of the next tenant in line.

    `load` is needed only when the reserve (or the lent room) applies; callers
    that compute it lazily pass None and ask `needs_load` first.
    `behind_elsewhere`: `behind` says another replica's tenant comes first.
    """
    if own_wait_s > 0:
        return Verdict.OWN_LIMIT
    if behind_elsewhere:
        return Verdict.TURN
    room = fits(limits, in_flight, in_flight_kv, kv_tokens)
    if isolation is Isolation.PREEMPT:
        if room:
            return Verdict.ADMIT
        if not needs_load(reserve_fraction, limits, in_flight, in_flight_kv, kv_tokens, isolation):
            return Verdict.FULL
        if load is None:
            raise ValueError("the lent room applies: pass the tenant's load")
        # Lent only to take room from others (a tenant alone would only queue in
        # the engine behind itself) and only while below its share.
        shared = load.share < 1.0 - EPSILON
        if (
            load.light
            and shared
            and below_share(load.share, limits, load.in_flight, load.kv_tokens, kv_tokens)
        ):
            return Verdict.ADMIT
        return Verdict.FULL
    if not room:
        return Verdict.FULL
    if needs_load(reserve_fraction, limits, in_flight, in_flight_kv, kv_tokens, isolation):
        if load is None:
            raise ValueError("the reserve applies: pass the tenant's load")
        below = below_share(load.share, limits, load.in_flight, load.kv_tokens, kv_tokens)
        if not below and load.protects:
            return Verdict.HOLD
    return Verdict.ADMIT


def needs_load(
    reserve_fraction: float,
    limits: AdmissionLimits,
    in_flight: int,
    in_flight_kv: int,
    kv: int,
    isolation: Isolation = Isolation.RESERVE,
) -> bool:
    """Does the reserve (RESERVE) or the lent room (PREEMPT) apply to this
    admission, so that `verdict` needs the tenant's load?"""
    if reserve_fraction <= 0:
        return False
    if isolation is Isolation.PREEMPT:
        return not fits(limits, in_flight, in_flight_kv, kv) and fits_lent(
            reserve_fraction, limits, in_flight, in_flight_kv, kv
        )
    return in_reserve(reserve_fraction, limits, in_flight, in_flight_kv, kv)


# -- settlement ----------------------------------------------------------------------
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


# -- queue timeout -------------------------------------------------------------------
def queue_expiry_s(
    arrival_s: float, max_queue_wait_s: float | None, deadline_s: float | None
) -> float | None:
    """When a queued request must leave the queue (None: never)."""
    limits = [t for t in (deadline_s,) if t is not None]
    if max_queue_wait_s is not None:
        limits.append(arrival_s + max_queue_wait_s)
    return min(limits) if limits else None


def deadline_binds(
    arrival_s: float, max_queue_wait_s: float | None, deadline_s: float | None
) -> bool:
    """At expiry, is it the request's own deadline (else the tenant's max_queue_wait_s)?"""
    if deadline_s is None:
        return False
    return max_queue_wait_s is None or deadline_s <= arrival_s + max_queue_wait_s


def queue_expired(
    request_id: str,
    tenant_id: str,
    arrival_s: float,
    now_s: float,
    max_queue_wait_s: float | None,
    deadline_s: float | None,
) -> SchedulingError:
    """The error a request leaves the queue with when `queue_expiry_s` passes."""
    waited_s = now_s - arrival_s
    if deadline_binds(arrival_s, max_queue_wait_s, deadline_s):
        return DeadlineExpired(
            f"request {request_id!r}: the deadline passed after {waited_s:.3f} s in the queue"
        )
    return QueueTimeout(
        tenant_id,
        "max_queue_wait_s",
        f"request {request_id!r} waited {waited_s:.3f} s in the queue; "
        f"the limit is {max_queue_wait_s:g} s",
    )
