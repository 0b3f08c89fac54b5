"""The admission decision, composed once.

`scheduler.rules` states each rule as a pure function; this module is the one place
that combines them into a decision: which queued request enters the engine
now. Both the single-process dispatcher (`Dispatcher`, over its policy's
queues) and the shared path's stores (`MemoryStore`, over the candidates a
replica offers) run `admit_round`; they differ only in where the state lives
(the `Round` they pass: I/O, no rule). The Redis STEP script is the Lua twin of
this composition, held to it by the differential test
(tests/unit/scheduler/test_store_differential.py).

One round, in the order the VTC guarantee needs (see scheduler/rules):
- the head of the tenant first in fair order (`Round.head`), or, with
  locality, the head within its window whose prefix a worker holds
  (`prefer`, `window_end`) when that one may go now (else the fair head is
  judged);
- its tenant's own limits (max_concurrent, wait-mode buckets) hold that tenant
  only, and the next tenant is considered (`Round.hold`);
- with replicas, a tenant backlogged on another replica that comes first by
  more than the allowance stops the round (`rules.behind`: its replica's turn);
- then the engine's room, and the fair-share reserve or the lent room
  (`rules.verdict`, with `tenant_load` only when `rules.needs_load` says it
  applies): FULL or HOLD stop the round, nobody but a light tenant's request
  jumps the head: the reserve the head is held out of, or (reserve or lent room
  on) room the head does not fit and a request that leaves its tenant within its
  share does, goes to the first light head behind it that may go (`handover`);
- ADMIT charges and opens the request (`Round.admit`), and the round goes on.

`tenant_load` is the reserve's view of the candidate's tenant, stated once for
the dispatcher's per-process counts and the store's fleet-wide ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from scheduler import rules
from scheduler.rules import AdmissionLimits, TenantLoad, Verdict


class Sized(Protocol):
    """A request or a candidate: whose it is and what it may occupy."""

    @property
    def tenant_id(self) -> str: ...

    @property
    def kv_tokens(self) -> int: ...


C = TypeVar("C", bound=Sized)


class Round(Protocol[C]):
    """The state one round reads and writes (a dispatcher's or a store's)."""

    @property
    def limits(self) -> AdmissionLimits: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def in_flight_kv(self) -> int: ...

    @property
    def unsent(self) -> int:
        """Requests in flight that this replica holds unsent (paced, held cold,
        waiting for a staged-prefill lane): a lent slot may be theirs
        (Isolation.RESERVE_SLOTS; 0 where they are not lent)."""
        ...

    def head(self) -> C | None:
        """The next request in fair order among the tenants not held (None: none)."""
        ...

    @property
    def local(self) -> bool:
        """Does a prefix index say what workers hold (locality applies)?"""
        ...

    def queued(self, c: C) -> int:
        """How many requests `c`'s tenant has queued, `c` included (light or heavy)."""
        ...

    @property
    def allowance(self) -> float:
        """How far (weighted tokens, `rules.order_key`) behind the fair head a head
        may be and still go first for locality (`window_end`), and behind the
        first tenant elsewhere and still go here (`rules.behind`)."""
        ...

    def order_key(self, c: C) -> float:
        """The order key of `c`'s tenant (`rules.order_key`: its rank's first part)."""
        ...

    def heads_upto(self, c: C, end: float) -> list[C]:
        """The other tenants' heads (not `c`'s) whose order key is at most `end`,
        in fair order (`in_fair_order`): locality's window, and the reserve's
        `handover` (`end` inf)."""
        ...

    def cached(self, c: C) -> int:
        """Prompt tokens of `c` the worker it would be placed on holds (one with room
        while any has; asked after `heads_upto`)."""
        ...

    def own_wait_s(self, c: C) -> float:
        """How long its tenant's own limits hold `c` (`rules.own_limit_wait_s`)."""
        ...

    def load(self, c: C) -> TenantLoad:
        """Its tenant's part of the engine (`tenant_load`)."""
        ...

    def first_elsewhere(self, c: C) -> float | None:
        """With replicas: the smallest order key among the other tenants backlogged
        and eligible on another replica (None: none; `rules.behind`)."""
        ...

    def hold(self, c: C, wait_s: float) -> None:
        """Its tenant's own limits hold it for `wait_s` (inf: until a finish):
        skip the tenant for the rest of the round; it keeps its counter."""
        ...

    def stopped(self, c: C, v: Verdict) -> None:
        """The round stops at `c`: FULL, HOLD or TURN."""
        ...

    def held_over(self, c: C) -> None:
        """`c` was held out of the reserve (HOLD) and the round went on past it (a
        locality pick judged before the fair head, or a held head whose reserve
        went to a light tenant behind it): like a stop at HOLD, the verdict may
        change when the reserve's activity window ends, with no event to say so."""
        ...

    def admit(self, c: C, lent: bool) -> bool:
        """Charge and open `c` (`lent`: beyond the room, Isolation.PREEMPT);
        False ends the round after it."""
        ...


def window_end(first_key: float, allowance: float) -> float:
    """The locality window: a head whose order key (`rules.order_key`) is at
    most this may go before the fair head at `first_key` (the bound between two
    backlogged tenants grows by `allowance`)."""
    return first_key + allowance


def in_fair_order(ranked: Iterable[tuple[tuple[float, ...], C]], upto: float) -> list[C]:
    """The items whose order key (their rank's first part: `rules.vtc_rank`) is
    at most `upto`, in fair order (smallest rank first): the locality window
    over a round's heads, whatever keeps them (a policy's heaps, a step's offer)."""
    within = [x for x in ranked if x[0][0] <= upto]
    within.sort(key=_rank_of)
    return [c for _, c in within]


def _rank_of(x: tuple[tuple[float, ...], object]) -> tuple[float, ...]:
    return x[0]


def prefer(r: Round[C], c: C) -> C:
    """Locality within the fair order: among the fair head `c` and the heads in
    its window (`window_end`, `Round.heads_upto`), the one whose prefix the
    worker it would be placed on holds most of (`rules.locality_pick`) — never past a light
    tenant's head (`rules.locality_may_pass`)."""
    if not r.local or not rules.locality_may_pass(r.queued(c)):
        return c
    others = r.heads_upto(c, window_end(r.order_key(c), r.allowance))
    if not others:
        return c
    within = [c, *others]
    return within[rules.locality_pick([r.cached(h) for h in within])]


def handover(
    r: Round[C], c: C, v: Verdict, reserve_fraction: float, isolation: rules.Isolation
) -> C | None:
    """The head `c` cannot go (`v`), and a light tenant's request behind it may take
    the room instead (`hands_over`):
    - HOLD: the reserve is kept for a light tenant below its share, so when such a
      tenant's request is queued behind `c` in fair order it is the one to take it,
      not to wait with `c` until `c`'s counter passes its own (every tenant with a
      short queue has the light credit, so a held flood can stay first);
    - FULL: `c` does not fit the room left (nor the lent room, PREEMPT), and a
      light tenant's request that does, and leaves its tenant within its share of
      the engine, goes now rather than wait for `c`'s room (a long prompt ahead
      of a chat request on a KV-full fleet). Within their shares the tenants that
      pass `c` leave it its own: it is not starved.
    The first such light head after `c` in fair order whose verdict is ADMIT; a head
    its own limits hold is held (`Round.hold`), any other skipped. None: nobody, the
    round stops at `c`."""
    for h in r.heads_upto(c, math.inf):
        if not rules.light(r.queued(h)):
            continue
        if v is Verdict.FULL:
            load = r.load(h)
            if not rules.below_share(
                load.share, r.limits, load.in_flight, load.kv_tokens, h.kv_tokens
            ):
                continue
        w, own_wait_s = judge(r, h, reserve_fraction, isolation)
        if w is Verdict.OWN_LIMIT:
            r.hold(h, own_wait_s)
        elif w is Verdict.ADMIT:
            return h
    return None


def hands_over(v: Verdict, reserve_fraction: float) -> bool:
    """Does a round stopped by `v` look for a light request to take the room
    (`handover`)? HOLD always; FULL while the reserve, or the lent room, is on (it
    is the isolation lever; with PREEMPT the light request may be lent room, as
    the head would be)."""
    return v is Verdict.HOLD or (v is Verdict.FULL and reserve_fraction > 0)


def behind(r: Round[C], c: C) -> bool:
    """Is a tenant backlogged on another replica first, by more than the
    allowance (`rules.behind`: that replica's turn)?"""
    first = r.first_elsewhere(c)
    return first is not None and rules.behind(r.order_key(c), first, r.allowance)


def judge(
    r: Round[C], c: C, reserve_fraction: float, isolation: rules.Isolation
) -> tuple[Verdict, float]:
    """The verdict on `c` now, and its tenant's own wait (`rules.verdict`)."""
    own_wait_s = r.own_wait_s(c)
    if own_wait_s > 0:
        return Verdict.OWN_LIMIT, own_wait_s
    room = (r.limits, r.in_flight, r.in_flight_kv, c.kv_tokens)
    unsent = r.unsent  # a pool asked once: it sums its workers' lanes
    load = None
    if rules.needs_load(reserve_fraction, *room, isolation, unsent):
        load = r.load(c)
    v = rules.verdict(own_wait_s, *room, reserve_fraction, load, isolation, behind(r, c), unsent)
    return v, own_wait_s


def admit_round(r: Round[C], reserve_fraction: float, isolation: rules.Isolation) -> Verdict | None:
    """Admit heads in fair order until a verdict other than ADMIT or OWN_LIMIT
    stops the round (returned), `admit` ends it (ADMIT), or nobody is left (None)."""
    while (c := r.head()) is not None:
        # Its own limits first: a head that may not go for them is no anchor for
        # locality's window (else where it is judged, at a poll or not, would decide
        # whether the heads behind it may pass the next one).
        if (own_wait_s := r.own_wait_s(c)) > 0:
            r.hold(c, own_wait_s)
            continue
        # (Locality is asked only while the engine has a slot: it costs a lookup.)
        pick = prefer(r, c) if r.in_flight < r.limits.max_requests else c
        if pick is not c:
            # Locality goes first only when it may: else the fair head is judged,
            # so that the engine's room never idles for the sake of a cache hit.
            v, own_wait_s = judge(r, pick, reserve_fraction, isolation)
            if v is Verdict.OWN_LIMIT:
                r.hold(pick, own_wait_s)
                continue
            if v is Verdict.HOLD:
                r.held_over(pick)
            if v is Verdict.ADMIT:
                lent = not rules.fits(r.limits, r.in_flight, r.in_flight_kv, pick.kv_tokens)
                if not r.admit(pick, lent):
                    return v
                continue
        v, own_wait_s = judge(r, c, reserve_fraction, isolation)
        if v is Verdict.OWN_LIMIT:
            r.hold(c, own_wait_s)
            continue
        if (
            hands_over(v, reserve_fraction)
            and (h := handover(r, c, v, reserve_fraction, isolation)) is not None
        ):
            if v is Verdict.HOLD:
                r.held_over(c)
            lent = not rules.fits(r.limits, r.in_flight, r.in_flight_kv, h.kv_tokens)
            if not r.admit(h, lent):
                return Verdict.ADMIT
            continue
        if v is not Verdict.ADMIT:
            r.stopped(c, v)
            return v
        lent = not rules.fits(r.limits, r.in_flight, r.in_flight_kv, c.kv_tokens)
        if not r.admit(c, lent):
            return v
    return None


def tenant_load(
    tenant_id: str,
    active: Iterable[str],
    limits: AdmissionLimits,
    weight_of: Callable[[str], float],
    queued_of: Callable[[str], int],
    in_flight_of: Callable[[str], tuple[int, int]],
) -> TenantLoad:
    """The candidate's share of the engine among the `active` tenants (queued or
    in flight anywhere, or seen within the reserve's window), its part in flight,
    whether another active *light* tenant is below its own share (someone to keep
    the reserve for: heavy tenants are served in counter order anyway), and
    whether the candidate is light itself. Weights are summed in name order, as
    the Redis script does, so that both round alike. `in_flight_of`: (requests,
    KV tokens)."""
    names = sorted({tenant_id, *active})
    total = 0.0
    for t in names:
        total += weight_of(t)
    protects = False
    for t in names:
        if t == tenant_id or not rules.light(queued_of(t)):
            continue
        n, kv = in_flight_of(t)
        if rules.waiting_below_share(weight_of(t) / total, limits, n, kv):
            protects = True
            break
    n, kv = in_flight_of(tenant_id)
    return TenantLoad(
        weight_of(tenant_id) / total, n, kv, protects, rules.light(queued_of(tenant_id))
    )
