"""Locality within the fair order (D²LPM-style) and fleet order across
replicas: which head may go before the fair one, and when it is another
replica's turn. The window itself is `decision.window_end`."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.rules.fairness import light


def locality_may_pass(head_queued: int) -> bool:
    """May locality put another tenant's request before the fair head, whose
    tenant has `head_queued` requests queued? Not a light tenant's: its short
    request is what isolation is for (measured on the virtual fleet: letting
    cached heads pass it took a light tenant's TTFT p99 from 3.5x to 23x its
    solo run)."""
    return not light(head_queued)


# How many more prompt tokens a head's worker must hold than the fair head's for
# the head to go first. Two blocks of the prefix index: one matched block counts
# as up to 31 cached tokens (its tail, `Placement._counted`), so a smaller gain
# is the estimate's own slack; and it saves under 6 ms of prefill (the RTX 4090
# cost model) for up to the whole allowance of the fair order. With any gain at
# all, a tenant whose short prompt was cold (never served yet) waited while every
# cached head went ahead until the allowance ran out: 1.4-4.8 s in
# test_replicas.py, which cost a wait-mode quota tenant that much of its bucket
# (session 33).
LOCALITY_MIN_GAIN = 32


def locality_pick(cached: Sequence[int]) -> int:
    """Locality within the fair order (D²LPM-style, "Locality-aware Fair
    Scheduling in LLM Serving", 2025): `cached` holds, for the requests that may
    go next in fair order (the first tenant's head, then the heads of tenants
    within the allowance of it), how many prompt tokens the worker each
    would be placed on holds (one with room while any has). The one with the
    most goes first, its prefill mostly skipped, if it holds at least
    `LOCALITY_MIN_GAIN` tokens more than the fair head (the first). Ties go to
    the earlier in fair order, so with nothing cached anywhere the fair head
    goes. The bound between two backlogged tenants grows by the allowance: a
    tenant is passed over only while it is within it."""
    best = 0
    for i, c in enumerate(cached):
        if c > cached[best] and c >= cached[0] + LOCALITY_MIN_GAIN:
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
