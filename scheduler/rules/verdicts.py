"""The verdict on the next head: the one order in which the tenant's own
limits, the fleet's order, the engine's room and the reserve (or the lent
room) are checked (`decision.judge` applies it)."""

from __future__ import annotations

import enum

from scheduler.rules.buckets import EPSILON
from scheduler.rules.reserve import (
    Isolation,
    TenantLoad,
    below_share,
    fits_lent,
    fits_slot_lent,
    in_reserve,
)
from scheduler.rules.room import AdmissionLimits, fits


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
    unsent: int = 0,
) -> Verdict:
    """The one order of the checks on the head of the next tenant in line.

    `load` is needed only when the reserve (or the lent room, or a lent slot)
    applies; callers that compute it lazily pass None and ask `needs_load` first.
    `behind_elsewhere`: `behind` says another replica's tenant comes first.
    `unsent`: requests in flight that no engine has yet (a lent slot may be theirs).
    """
    if own_wait_s > 0:
        return Verdict.OWN_LIMIT
    if behind_elsewhere:
        return Verdict.TURN
    room = fits(limits, in_flight, in_flight_kv, kv_tokens)
    if not room:
        # Beyond the room: the lent room (PREEMPT) or a lent slot (RESERVE_SLOTS).
        if not needs_load(
            reserve_fraction, limits, in_flight, in_flight_kv, kv_tokens, isolation, unsent
        ):
            return Verdict.FULL
        if load is None:
            raise ValueError("the lent room applies: pass the tenant's load")
        return Verdict.ADMIT if _lent_to(load, limits, kv_tokens) else Verdict.FULL
    if isolation is Isolation.PREEMPT:
        return Verdict.ADMIT
    if needs_load(reserve_fraction, limits, in_flight, in_flight_kv, kv_tokens, isolation):
        if load is None:
            raise ValueError("the reserve applies: pass the tenant's load")
        below = below_share(load.share, limits, load.in_flight, load.kv_tokens, kv_tokens)
        if not below and load.protects:
            return Verdict.HOLD
    return Verdict.ADMIT


def _lent_to(load: TenantLoad, limits: AdmissionLimits, kv_tokens: int) -> bool:
    """Lent room (PREEMPT) or a lent slot (RESERVE_SLOTS) goes only to a light tenant
    that takes it from others (a tenant alone would only queue in the engine
    behind itself) and only while below its share."""
    shared = load.share < 1.0 - EPSILON
    return (
        load.light
        and shared
        and below_share(load.share, limits, load.in_flight, load.kv_tokens, kv_tokens)
    )


def needs_load(
    reserve_fraction: float,
    limits: AdmissionLimits,
    in_flight: int,
    in_flight_kv: int,
    kv: int,
    isolation: Isolation = Isolation.RESERVE,
    unsent: int = 0,
) -> bool:
    """Does the reserve (RESERVE), the lent room (PREEMPT) or a lent slot
    (RESERVE_SLOTS, beyond the room, `unsent` slots included) apply to this
    admission, so that `verdict` needs the tenant's load?"""
    if reserve_fraction <= 0:
        return False
    room = fits(limits, in_flight, in_flight_kv, kv)
    if isolation is Isolation.PREEMPT:
        return not room and fits_lent(reserve_fraction, limits, in_flight, in_flight_kv, kv)
    if not room:
        return isolation is Isolation.RESERVE_SLOTS and fits_slot_lent(
            reserve_fraction, limits, in_flight, in_flight_kv, kv, unsent
        )
    return in_reserve(reserve_fraction, limits, in_flight, in_flight_kv, kv)
