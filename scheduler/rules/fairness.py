"""VTC ("Fairness in Serving Large Language Models", OSDI 2024): the charges
(prompt at admission, cached prefix at `w_cached`, output as it streams), the
lift and its floor (idling earns no credit), the bound two backlogged tenants
stay within, light tenants, and the fair order itself (`order_key`, the
tie-break of `vtc_rank`)."""

from __future__ import annotations

from collections.abc import Iterable

# The charges' default weights, the VTC paper's: a prompt token costs 1, an
# output token 2 (stated once for the policy, the shared options and the step).
W_IN = 1.0
W_OUT = 2.0


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
    `QueuedRequest.charged_cached`; 0 without locality). The engine reports what
    it really had cached at the first token: `cached_shortfall` charges the
    difference when it had less. Never a credit: counters only grow, which is
    what lets the shared path tell a wiped store from its own bookkeeping."""
    hit = min(max(0, cached), prompt_tokens)
    return (w_in * (prompt_tokens - hit) + w_cached * hit) / weight


def cached_shortfall(
    w_in: float, w_cached: float, estimated: int, reported: int, weight: float
) -> float:
    """What admission under-charged: the engine had `reported` prompt tokens
    cached, fewer than the `estimated` charged at `w_cached` (never negative: a
    better hit than estimated is not refunded, so an engine pool's estimate errs
    high where it can, `Placement.cached_prefix`, and this makes it exact)."""
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
