"""Isolation: the fair-share reserve (RESERVE) or the room lent beyond the
engine's (PREEMPT), a tenant's share of the engine, and how long a tenant that
left still counts as active (the bookkeeping: reserve.py, admission_state.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from scheduler.rules.buckets import EPSILON
from scheduler.rules.room import AdmissionLimits, fraction_of_room


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
    # RESERVE, and a light tenant below its share may also take up to `fraction`
    # of the request slots beyond the room, never KV beyond it: its engine retracts
    # a running request for the slot (fair_light_takes_slot). Traced live, the
    # light tenant's slowest first tokens waited in admission with every slot
    # counted and the KV a third used (docs/benchmarks.md, session 24). The slots of
    # requests admitted but not yet at an engine (`unsent`: paced, held cold, waiting
    # for a worker's staged-prefill lane) may be lent as well: no engine runs them.
    RESERVE_SLOTS = "reserve+slots"


def fits_lent(
    fraction: float, limits: AdmissionLimits, in_flight: int, in_flight_kv: int, kv_tokens: int
) -> bool:
    """Does `kv_tokens` more fit the room plus the `fraction` lent beyond it (PREEMPT)?"""
    lent_requests, lent_kv = fraction_of_room(fraction, limits)
    return (
        in_flight + 1 <= limits.max_requests + lent_requests
        and in_flight_kv + kv_tokens <= limits.max_kv_tokens + lent_kv
    )


def fits_slot_lent(
    fraction: float,
    limits: AdmissionLimits,
    in_flight: int,
    in_flight_kv: int,
    kv_tokens: int,
    unsent: int = 0,
) -> bool:
    """Does `kv_tokens` more fit the room's KV, and one more request its slots plus
    the `fraction` lent beyond them and the `unsent` (RESERVE_SLOTS)? `unsent`:
    requests counted in flight that no engine has yet (their KV still counts: it
    will be at an engine soon)."""
    lent_requests, _ = fraction_of_room(fraction, limits)
    at_engines = in_flight - min(max(0, unsent), in_flight)
    return at_engines + 1 <= limits.max_requests + lent_requests and (
        in_flight == 0 or in_flight_kv + kv_tokens <= limits.max_kv_tokens
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


def waiting_below_share(
    share: float, limits: AdmissionLimits, tenant_in_flight: int, tenant_kv: int
) -> bool:
    """An active tenant with nothing queued, for whom the reserve is kept: below
    its share as it stands (its next request's size is not known yet)."""
    return below_share(share, limits, tenant_in_flight, tenant_kv, 0)


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
