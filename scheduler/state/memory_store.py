"""The in-memory `Store`: one replica's shared state, in plain Python.

Same rules as the Redis scripts (`redis_store.py`), on an injected clock, and
the same state model as the in-process dispatcher: its counters, in-flight
counts and reserve window are `admission_state.py`'s classes; what is its own
is the fleet (each replica's backlog, lease and done-set expiry, buckets as
stored levels, the Lua's keys). Used by the contract tests, by benchmarks as
the no-network baseline, and by `SharedAdmission` as the fail-open fallback
while Redis is unreachable (then with this replica's share of the limits).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from scheduler import decision, rules
from scheduler.admission_state import ActiveWindow, FairCounters, InFlight
from scheduler.budget import AdmissionLimits
from scheduler.clock import Clock
from scheduler.quotas import BucketLimits
from scheduler.rules import Verdict, bucket_wait_s
from scheduler.state.store import (
    Candidate,
    Lease,
    SeenLevel,
    Settlement,
    Step,
    StepOutcome,
    StoreSnapshot,
    tenant_fields,
)
from scheduler.tenancy.tenants import TenantConfig
from scheduler.token_bucket import StoredLevel


@dataclass(slots=True)
class _Lease:
    tenant_id: str
    kv_tokens: int
    expires_s: float


class MemoryStore:
    kind = "memory"

    def __init__(
        self,
        clock: Clock,
        *,
        lease_ttl_s: float = 10.0,
        backlog_ttl_s: float = 3.0,
        done_ttl_s: float = 600.0,
    ) -> None:
        self.clock = clock
        self.lease_ttl_s = lease_ttl_s
        self.backlog_ttl_s = backlog_ttl_s
        self.done_ttl_s = done_ttl_s
        self.round_trips = 0
        # The counters, in-flight counts and activity window: the same model as
        # the in-process dispatcher's (admission_state.py), over the fleet.
        self.vtc = FairCounters()
        # (replica, tenant) -> expiry
        self.backlog: dict[tuple[str, str], float] = {}
        # (replica, tenant) -> its queue length there, capped (Step.queued)
        self.backlog_queued: dict[tuple[str, str], int] = {}
        self.leases: dict[str, _Lease] = {}
        self.engine = InFlight()
        # tenant -> weight (for the reserve's shares; unknown: 1)
        self.weights: dict[str, float] = {}
        self.done: dict[str, float] = {}
        # (tenant, "r" | "t") -> bucket
        self.buckets: dict[tuple[str, str], StoredLevel] = {}
        self.tenants: dict[str, dict[str, str]] = {}
        # Tenants active for the reserve a while after one of their requests
        # ended or they stopped being backlogged on a replica.
        self.recent = ActiveWindow()

    @property
    def counters(self) -> dict[str, float]:
        return self.vtc.values

    # -- buckets ------------------------------------------------------------
    def _level(self, tenant: str, kind: str, rate: float, burst: float, now_s: float) -> float:
        b = self.buckets.get((tenant, kind))
        return burst if b is None else b.at(now_s, rate, burst)

    async def bucket_levels(self, tenant_id: str) -> dict[str, SeenLevel]:
        now_s = self.clock.now_s()
        return {
            kind: SeenLevel(b.level, max(0.0, now_s - b.updated_s))
            for kind in ("r", "t")
            if (b := self.buckets.get((tenant_id, kind))) is not None
        }

    def _add_to(
        self, tenant: str, kind: str, n: float, rate: float, burst: float, now_s: float
    ) -> None:
        b = self.buckets.get((tenant, kind))
        if b is None:  # absent: full
            b = self.buckets[(tenant, kind)] = StoredLevel(burst, now_s)
        b.add(n, now_s, rate, burst)

    def _bucket_wait(
        self, tenant: str, tokens: int, lim: BucketLimits, now_s: float
    ) -> tuple[str, float]:
        rw = tw = None
        if lim.requests_per_s is not None and lim.requests_burst is not None:
            lvl = self._level(tenant, "r", lim.requests_per_s, lim.requests_burst, now_s)
            rw = bucket_wait_s(lvl, 1.0, lim.requests_per_s, lim.requests_burst)
        if lim.tokens_per_s is not None and lim.tokens_burst is not None:
            lvl = self._level(tenant, "t", lim.tokens_per_s, lim.tokens_burst, now_s)
            tw = bucket_wait_s(lvl, float(tokens), lim.tokens_per_s, lim.tokens_burst)
        return rules.binding_limit(rw, tw)

    def _add(self, tenant: str, req: float, tok: float, lim: BucketLimits, now_s: float) -> None:
        """Add to the buckets (negative: take, debt allowed; never above the burst)."""
        if req and lim.requests_per_s is not None and lim.requests_burst is not None:
            self._add_to(tenant, "r", req, lim.requests_per_s, lim.requests_burst, now_s)
        if tok and lim.tokens_per_s is not None and lim.tokens_burst is not None:
            self._add_to(tenant, "t", tok, lim.tokens_per_s, lim.tokens_burst, now_s)

    # -- leases ---------------------------------------------------------------
    def _open(self, lease_id: str, tenant: str, kv: int, now_s: float) -> None:
        self.leases[lease_id] = _Lease(tenant, kv, now_s + self.lease_ttl_s)
        self.engine.open(tenant, kv)

    def _release(self, lease_id: str) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is not None:
            self.engine.release(lease.tenant_id, lease.kv_tokens)

    def _expire(self, now_s: float) -> None:
        for lid in [lid for lid, lease in self.leases.items() if lease.expires_s <= now_s]:
            self._release(lid)
        for key in [k for k, exp in self.backlog.items() if exp <= now_s]:
            del self.backlog[key]
            self.backlog_queued.pop(key, None)
        for lid in [lid for lid, exp in self.done.items() if exp <= now_s]:
            del self.done[lid]
        self.recent.prune(now_s)
        for key in [k for k, b in self.buckets.items() if b.expires_s <= now_s]:
            del self.buckets[key]

    def _settle(self, s: Settlement, now_s: float) -> bool:
        if s.lease_id in self.done:
            return False
        self._release(s.lease_id)
        self._add(s.tenant_id, s.refund_requests, s.refund_tokens, s.buckets, now_s)
        self.done[s.lease_id] = now_s + self.done_ttl_s
        return True

    def _renew(self, lease: Lease, now_s: float) -> None:
        current = self.leases.get(lease.lease_id)
        if current is not None:
            current.expires_s = now_s + self.lease_ttl_s
        elif lease.lease_id not in self.done:
            self._open(lease.lease_id, lease.tenant_id, lease.kv_tokens, now_s)

    def _lift(self, replica: str, tenant: str) -> None:
        # The floor: the smallest counter among the other tenants backlogged and
        # eligible somewhere (one held by its own limits has a negative length).
        others = {
            t for (r, t) in self.backlog if t != tenant and self.backlog_queued.get((r, t), 0) >= 0
        }
        if any(t == tenant and r != replica for (r, t) in self.backlog):
            return  # already backlogged on another replica
        self.vtc.lift(tenant, (self.vtc.get(t) for t in others))

    def _forget(self, tenant: str, lim: BucketLimits, now_s: float) -> None:
        """Forget a tenant idle fleet-wide (Step.forget); else nothing."""
        if tenant in self.engine or any(t == tenant for (_, t) in self.backlog):
            return
        self.vtc.forget(tenant)
        self.weights.pop(tenant, None)
        self.recent.back(tenant)
        # Full buckets (or no longer limited ones) go now, the others once full: the
        # wait for a whole burst.
        for kind, rate, burst in (
            ("r", lim.requests_per_s, lim.requests_burst),
            ("t", lim.tokens_per_s, lim.tokens_burst),
        ):
            b = self.buckets.get((tenant, kind))
            if b is None:
                continue
            left_s = 0.0
            if rate is not None and burst is not None:
                left_s = bucket_wait_s(
                    self._level(tenant, kind, rate, burst, now_s), burst, rate, burst
                )
            if left_s > 0:
                b.expires_s = now_s + left_s
            else:
                del self.buckets[(tenant, kind)]

    # -- the Store protocol -----------------------------------------------------
    async def step(self, replica_id: str, step: Step) -> StepOutcome:
        return self.step_now(replica_id, step)

    def step_now(self, replica_id: str, step: Step) -> StepOutcome:
        now_s = self.clock.now_s()
        out = StepOutcome()
        self._expire(now_s)
        out.settled = sum(self._settle(s, now_s) for s in step.settlements)
        for tenant, delta in step.charges.items():
            self.vtc.charge(tenant, delta)
        for tenant, limits in step.forget.items():
            self._forget(tenant, limits, now_s)
        for tenant in step.withdraw:
            self.backlog.pop((replica_id, tenant), None)
            self.backlog_queued.pop((replica_id, tenant), None)
        # Still active for the reserve a while after its last request left.
        for tenant in [*step.withdraw, *(x.tenant_id for x in step.settlements)]:
            self.recent.left(tenant, now_s, step.reserve_window_s)
        if step.backlogged is not None:
            for tenant in step.backlogged:
                self.backlog[(replica_id, tenant)] = now_s + self.backlog_ttl_s
        for tenant, n in step.queued.items():
            self.backlog_queued[(replica_id, tenant)] = n
        for tenant in step.announce:
            self._lift(replica_id, tenant)
            self.backlog[(replica_id, tenant)] = now_s + self.backlog_ttl_s
            out.counters[tenant] = self.vtc.get(tenant)
        for lease in step.renew or ():
            self._renew(lease, now_s)
        self.weights.update(step.weights)
        self._decide(replica_id, step, now_s, out)
        out.in_flight = self.engine.requests
        return out

    def _decide(self, replica_id: str, step: Step, now_s: float, out: StepOutcome) -> None:
        for c in step.candidates:
            out.counters[c.tenant_id] = self.vtc.get(c.tenant_id)
            self.weights[c.tenant_id] = c.weight
        r = _StoreRound(self, replica_id, step, now_s, out)
        decision.admit_round(r, step.reserve_fraction, step.isolation)

    def _own_wait_s(self, c: Candidate, now_s: float) -> float:
        bucket_wait = None
        if c.take_buckets:
            bucket_wait = self._bucket_wait(c.tenant_id, c.sent_tokens, c.buckets, now_s)[1]
        return rules.own_limit_wait_s(
            self.engine.requests_of(c.tenant_id), c.max_concurrent, bucket_wait
        )

    def _fleet_queued(self) -> dict[str, int]:
        """Each backlogged tenant's queue length summed over the replicas it is
        backlogged on (held ones count their length; one unknown counts as heavy)."""
        heavy = rules.LIGHT_QUEUE + 1
        queued: dict[str, int] = {}
        for key in self.backlog:
            queued[key[1]] = queued.get(key[1], 0) + abs(self.backlog_queued.get(key, heavy))
        return queued

    def _reserve_load(self, step: Step, tenant: str, now_s: float) -> rules.TenantLoad:
        """The candidate's load among the tenants active anywhere (backlogged on a
        replica, in flight, offered in this step, or seen within the window).
        Queue lengths are summed over the replicas a tenant is backlogged on (one
        whose length is unknown counts as heavy); a candidate's own if in none."""
        queued = self._fleet_queued()
        for c in step.candidates:
            queued.setdefault(c.tenant_id, c.queued)
        return decision.tenant_load(
            tenant,
            [*queued, *self.engine.tenants(), *self.recent.active(now_s)],
            step.limits,
            lambda t: self.weights.get(t, 1.0),
            lambda t: queued.get(t, 0),
            self.engine.of,
        )

    def _elsewhere(self, replica_id: str) -> dict[str, int]:
        """The tenants backlogged and eligible (not held: a length >= 0, or unknown)
        on a replica other than `replica_id`, with their queue lengths summed over
        every replica (unknown: heavy), for `rules.behind`. Empty with one replica."""
        if all(r == replica_id for r, _ in self.backlog):
            return {}
        queued = self._fleet_queued()
        return {
            t: queued[t]
            for r, t in self.backlog
            if r != replica_id and self.backlog_queued.get((r, t), 0) >= 0
        }

    def _admit(
        self, replica_id: str, step: Step, c: Candidate, now_s: float, out: StepOutcome
    ) -> None:
        """Charge and open candidate `c`: its buckets (wait mode), the VTC admission
        charge, its lease; its tenant has one fewer queued on `replica_id` (exactly
        `c.queued - 1`: light or heavy for the rest of the round, as a dispatcher
        counts it)."""
        if c.take_buckets:
            self._add(c.tenant_id, -1.0, -float(c.sent_tokens), c.buckets, now_s)
        charge = rules.admission_charge(
            step.w_in, c.prompt_tokens, c.weight, c.cached, step.w_cached
        )
        out.counters[c.tenant_id] = self.vtc.admitted(c.tenant_id, charge)
        self._open(c.lease_id, c.tenant_id, c.kv_tokens, now_s)
        key = (replica_id, c.tenant_id)
        if key in self.backlog:
            self.backlog_queued[key] = min(c.queued - 1, rules.LIGHT_QUEUE + 1)

    async def reserve(
        self, lease_id: str, tenant_id: str, tokens: int, buckets: BucketLimits
    ) -> tuple[str, float]:
        now_s = self.clock.now_s()
        limit, wait_s = self._bucket_wait(tenant_id, tokens, buckets, now_s)
        if wait_s > 0:
            return limit, wait_s
        self._add(tenant_id, -1.0, -float(tokens), buckets, now_s)
        return "", 0.0

    def seed_levels(self, levels: dict[tuple[str, str], float]) -> None:
        """Start buckets at these levels, (tenant, "r" | "t") -> level (a fail-open
        fallback starts from the last levels seen in the shared store, not full)."""
        now_s = self.clock.now_s()
        for (tenant, kind), level in levels.items():
            self.buckets[(tenant, kind)] = StoredLevel(level, now_s)

    def seed_counters(self, counters: dict[str, float]) -> None:
        """Start from known counters (the fail-open fallback takes Redis's last values)."""
        self.vtc.seed(counters)

    async def put_tenant(self, cfg: TenantConfig) -> None:
        self.tenants[cfg.tenant_id] = tenant_fields(cfg)

    async def snapshot(self) -> StoreSnapshot:
        now_s = self.clock.now_s()
        self._expire(now_s)
        backlog: dict[str, set[str]] = {}
        for replica, tenant in self.backlog:
            backlog.setdefault(tenant, set()).add(replica)
        levels: dict[str, tuple[float | None, float | None]] = {}
        ages: dict[str, tuple[float | None, float | None]] = {}
        for (tenant, kind), b in self.buckets.items():
            r, t = levels.get(tenant, (None, None))
            levels[tenant] = (b.level, t) if kind == "r" else (r, b.level)
            ra, ta = ages.get(tenant, (None, None))
            age_s = now_s - b.updated_s
            ages[tenant] = (age_s, ta) if kind == "r" else (ra, age_s)
        return StoreSnapshot(
            in_flight=self.engine.requests,
            in_flight_kv_tokens=self.engine.kv_tokens,
            concurrency={t: self.engine.requests_of(t) for t in self.engine.tenants()},
            counters=dict(self.vtc.values),
            leases=set(self.leases),
            backlog=backlog,
            bucket_levels=levels,
            bucket_ages_s=ages,
        )

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class _StoreRound:
    """One step's candidates against the store's state, as a `decision.Round`.

    Each tenant's candidates come in its queue's order (the next one first); the
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

    def _rank(self, t: str) -> tuple[float, int, int, int]:
        """Tenant `t`'s place in fair order (`rules.vtc_rank`, then the offer's order)."""
        i = self.pending[t][0]
        c = self.step.candidates[i]
        counter, credit = self.out.counters[t], self.step.light_credit
        return (
            *rules.vtc_rank(counter, c.queued, credit, self.s.vtc.last_admitted(t), c.seq),
            i,
        )

    @property
    def local(self) -> bool:
        return not math.isinf(self.step.allowance)

    @property
    def allowance(self) -> float:
        return self.step.allowance

    def queued(self, c: Candidate) -> int:
        return c.queued

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
        return self.s._own_wait_s(c, self.now_s)

    def load(self, c: Candidate) -> rules.TenantLoad:
        return self.s._reserve_load(self.step, c.tenant_id, self.now_s)

    def first_elsewhere(self, c: Candidate) -> float | None:
        if math.isinf(self.step.allowance):
            return None
        if self.elsewhere is None:  # the backlog does not change during a round
            self.elsewhere = self.s._elsewhere(self.replica_id)
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

    def admit(self, c: Candidate, lent: bool) -> bool:
        if lent:
            self.out.lent.append(self.index[id(c)])
        self.s._admit(self.replica_id, self.step, c, self.now_s, self.out)
        return self._taken(c)
