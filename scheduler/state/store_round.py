"""One step's admission round against `MemoryStore`'s state, as a `decision.Round`.

I/O only: the rules and their order are `decision.admit_round`'s, the fair
order one rank per tenant (`rules.vtc_rank`), the window and the fleet's turn
`decision`'s. What is the store's own is where it reads the fleet: queue
lengths summed over the replicas a tenant is backlogged on (one unknown counts
as heavy), so that a tenant is light or heavy by what it has queued across the
fleet wherever it is judged (its own candidates' order too), the tenants
backlogged elsewhere, the lease a retried decision
already opened. The Redis STEP round (lua_step_round.py) is its Lua twin.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from scheduler import decision, rules
from scheduler.rules import AdmissionLimits, Verdict
from scheduler.state.store import Candidate, Step, StepOutcome

if TYPE_CHECKING:
    from scheduler.state.memory_store import MemoryStore


def decide(store: MemoryStore, replica_id: str, step: Step, now_s: float, out: StepOutcome) -> None:
    """The step's decision: its candidates' counters and weights, then the round."""
    for c in step.candidates:
        out.counters[c.tenant_id] = store.vtc.get(c.tenant_id)
        store.weights[c.tenant_id] = c.weight
    r = StoreRound(store, replica_id, step, now_s, out)
    decision.admit_round(r, step.reserve_fraction, step.isolation)
    out.light = [i for i in out.admitted if rules.light(r.queued(step.candidates[i]))]


class StoreRound:
    """Each tenant's candidates come in its queue's order (the next one first); the
    tenants in VTC order (`rules.vtc_rank`). A candidate whose lease exists was
    admitted by an earlier try of this decision (its answer was lost): it counts
    as admitted again, changing nothing.
    """

    def __init__(
        self, store: MemoryStore, replica_id: str, step: Step, now_s: float, out: StepOutcome
    ) -> None:
        self.s, self.step, self.now_s, self.out = store, step, now_s, out
        self.replica_id = replica_id
        self.elsewhere: dict[str, int] | None = None
        self.queued_elsewhere: dict[str, int] | None = None
        self.pending: dict[str, deque[int]] = {}
        for i, c in enumerate(step.candidates):
            self.pending.setdefault(c.tenant_id, deque()).append(i)
        self.index = {id(c): i for i, c in enumerate(step.candidates)}

    @property
    def limits(self) -> AdmissionLimits:
        return self.step.limits

    @property
    def in_flight(self) -> int:
        return self.s.engine.requests

    @property
    def in_flight_kv(self) -> int:
        return self.s.engine.kv_tokens

    @property
    def unsent(self) -> int:
        return self.step.unsent

    def _rank(self, t: str) -> tuple[float, int, int, int]:
        """Tenant `t`'s place in fair order (`rules.vtc_rank`, then the offer's order)."""
        i = self.pending[t][0]
        c = self.step.candidates[i]
        counter, credit = self.out.counters[t], self.step.light_credit
        return (
            *rules.vtc_rank(counter, self.queued(c), credit, self.s.vtc.last_admitted(t), c.seq),
            i,
        )

    @property
    def local(self) -> bool:
        return not math.isinf(self.step.allowance)

    @property
    def allowance(self) -> float:
        return self.step.allowance

    def queued(self, c: Candidate) -> int:
        """`c`'s tenant's queue across the fleet: `c.queued` here (the offer's count
        from `c` on), plus its lengths on the other replicas it is backlogged on. By
        its length here alone, a tenant with a few queued on each of N replicas would
        be ordered `light_credit` ahead on every one of them, while the tenants it
        passes are judged by their fleet-wide sums (`_elsewhere`)."""
        if self.queued_elsewhere is None:  # only this replica's lengths change in a round
            heavy, lengths, here = rules.LIGHT_QUEUE + 1, self.s.backlog_queued, self.replica_id
            self.queued_elsewhere = {}
            for key in self.s.backlog:
                if key[0] != here:
                    q = abs(lengths.get(key, heavy))
                    self.queued_elsewhere[key[1]] = self.queued_elsewhere.get(key[1], 0) + q
        return c.queued + self.queued_elsewhere.get(c.tenant_id, 0)

    def order_key(self, c: Candidate) -> float:
        return self._rank(c.tenant_id)[0]

    def heads_upto(self, c: Candidate, end: float) -> list[Candidate]:
        """The other tenants' next candidates (not one admitted by an earlier try:
        that one counts when it is the head)."""
        cands, leases = self.step.candidates, self.s.leases
        ranked = [
            (self._rank(t), cands[q[0]])
            for t, q in self.pending.items()
            if t != c.tenant_id and cands[q[0]].lease_id not in leases
        ]
        return decision.in_fair_order(ranked, end)

    def cached(self, c: Candidate) -> int:
        return c.cached

    def head(self) -> Candidate | None:
        cands, pending = self.step.candidates, self.pending
        while pending:
            t = min(pending, key=self._rank)
            c = cands[pending[t][0]]
            if c.lease_id not in self.s.leases:
                return c
            if not self._taken(c):  # a retried decision that already admitted it
                return None
        return None

    def _taken(self, c: Candidate) -> bool:
        """`c` is admitted: the next of its tenant comes up; False: the round ends
        (its tenant's last offered one, while it has more queued: its next one,
        not offered, may come first)."""
        i = self.index[id(c)]
        self.out.admitted.append(i)
        q = self.pending[c.tenant_id]
        q.popleft()
        if q:
            return True
        del self.pending[c.tenant_id]
        return c.queued <= 1

    def own_wait_s(self, c: Candidate) -> float:
        s, bucket_wait = self.s, None
        if c.take_buckets:
            bucket_wait = s.buckets.wait(c.tenant_id, c.sent_tokens, c.buckets, self.now_s)[1]
        return rules.own_limit_wait_s(
            s.engine.requests_of(c.tenant_id), c.max_concurrent, bucket_wait
        )

    def _fleet_queued(self) -> dict[str, int]:
        """Each backlogged tenant's queue length summed over the replicas it is
        backlogged on (held ones count their length; one unknown counts as heavy)."""
        heavy, lengths = rules.LIGHT_QUEUE + 1, self.s.backlog_queued
        queued: dict[str, int] = {}
        for key in self.s.backlog:
            queued[key[1]] = queued.get(key[1], 0) + abs(lengths.get(key, heavy))
        return queued

    def load(self, c: Candidate) -> rules.TenantLoad:
        """The candidate's load among the tenants active anywhere (backlogged on a
        replica, in flight, offered in this step, or seen within the window).
        Queue lengths are summed over the replicas a tenant is backlogged on (one
        whose length is unknown counts as heavy); a candidate's own if in none."""
        s, queued = self.s, self._fleet_queued()
        for other in self.step.candidates:
            queued.setdefault(other.tenant_id, other.queued)
        return decision.tenant_load(
            c.tenant_id,
            [*queued, *s.engine.tenants(), *s.recent.active(self.now_s)],
            self.step.limits,
            lambda t: s.weights.get(t, 1.0),
            lambda t: queued.get(t, 0),
            s.engine.of,
        )

    def _elsewhere(self) -> dict[str, int]:
        """The tenants backlogged and eligible (not held: a length >= 0, or unknown)
        on a replica other than this one, with their queue lengths summed over
        every replica (unknown: heavy). Empty with one replica."""
        backlog, lengths, here = self.s.backlog, self.s.backlog_queued, self.replica_id
        if all(r == here for r, _ in backlog):
            return {}
        queued = self._fleet_queued()
        return {t: queued[t] for r, t in backlog if r != here and lengths.get((r, t), 0) >= 0}

    def first_elsewhere(self, c: Candidate) -> float | None:
        if math.isinf(self.step.allowance):
            return None
        if self.elsewhere is None:  # the backlog does not change during a round
            self.elsewhere = self._elsewhere()
        # Their counters may: a tenant backlogged here too is charged as admitted.
        credit, counters = self.step.light_credit, self.s.vtc.values
        return min(
            (
                rules.order_key(counters.get(t, 0.0), q, credit)
                for t, q in self.elsewhere.items()
                if t != c.tenant_id
            ),
            default=None,
        )

    def hold(self, c: Candidate, wait_s: float) -> None:
        self.out.blocked[self.index[id(c)]] = wait_s
        del self.pending[c.tenant_id]

    def stopped(self, c: Candidate, v: Verdict) -> None:
        if v is Verdict.FULL:
            self.out.full = True
        elif v is Verdict.TURN:
            self.out.turn = True
        else:
            self.out.held.append(self.index[id(c)])

    def held_over(self, c: Candidate) -> None:
        """Nothing to arm: the pump polls while a round stops (FULL, HOLD, TURN),
        and a round that goes on past a HOLD meets it again as its head."""

    def admit(self, c: Candidate, lent: bool) -> bool:
        """Charge and open `c`: its buckets (wait mode), the VTC admission charge,
        its lease; its tenant has one fewer queued on this replica (exactly
        `c.queued - 1`: light or heavy for the rest of the round, as a dispatcher
        counts it)."""
        s, step, now_s = self.s, self.step, self.now_s
        if lent:
            self.out.lent.append(self.index[id(c)])
        if c.take_buckets:
            s.buckets.add(c.tenant_id, -1.0, -float(c.sent_tokens), c.buckets, now_s)
        self.out.counters[c.tenant_id] = s.vtc.admitted(
            c.tenant_id, c.charge(step.w_in, step.w_cached)
        )
        s.open_lease(c.lease_id, c.tenant_id, c.kv_tokens, now_s)
        key = (self.replica_id, c.tenant_id)
        if key in s.backlog:
            s.backlog_queued[key] = min(c.queued - 1, rules.LIGHT_QUEUE + 1)
        return self._taken(c)
