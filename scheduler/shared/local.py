"""A replica's local side of shared scheduling: its queued and in-flight requests.

`SharedAdmission` keeps, per replica, the requests it holds (queues per
tenant, FIFO per class with the batch anti-starvation rule of `TenantQueue`),
which tenants are eligible (queued and not paused), a mirror of the fleet's
counters (to pick which tenants to offer a decision), and what settlement
needs of each request (`Entry`, by lease id in `Entries`). No I/O here.

An entry's life is `Dispatcher`'s (`AdmissionEntry`: its `RequestState`).
Where its lease and its bucket charges live is a
`Place` each: SHARED (the store: its settlement goes there) or LOCAL (the
fail-open fallback, or nothing taken yet).
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass

from scheduler import rules
from scheduler.admission_port import AdmissionEntry
from scheduler.ordering.tenant_queue import TenantQueue
from scheduler.quotas import BucketLimits
from scheduler.request import QueuedRequest
from scheduler.state.store import Candidate, Lease, Settlement
from scheduler.tenancy.tenants import TenantConfig


class Place(enum.Enum):
    SHARED = "shared"  # in the shared store
    LOCAL = "local"  # in the fail-open fallback (or not taken at all)


@dataclass(slots=True, eq=False, kw_only=True)
class Entry(AdmissionEntry):
    cfg: TenantConfig
    lease_id: str
    buckets: BucketLimits
    requests_taken: float = 0.0
    tokens_taken: float = 0.0
    # Its lease: in the store (or maybe there: offered in a step whose answer was
    # lost), or admitted by the fail-open fallback and not adopted yet.
    lease_at: Place = Place.SHARED
    # Its bucket charges: made in the store (refunds go there), or locally / none.
    buckets_at: Place = Place.LOCAL

    def taken(self, kv_tokens: float) -> tuple[float, float]:
        """What admitting it takes from its buckets: (requests, tokens)."""
        requests = 1.0 if self.buckets.requests_per_s is not None else 0.0
        return requests, (kv_tokens if self.buckets.tokens_per_s else 0.0)

    def lease(self) -> Lease:
        return Lease(self.lease_id, self.req.tenant_id, self.req.kv_tokens)

    def candidate(self, buckets: BucketLimits, queued: int = 1) -> Candidate:
        return Candidate(
            lease_id=self.lease_id,
            tenant_id=self.req.tenant_id,
            weight=self.cfg.weight,
            prompt_tokens=self.req.prompt_tokens,
            kv_tokens=self.req.kv_tokens,
            take_buckets=self.cfg.over_quota == "wait" and buckets.any,
            buckets=buckets,
            max_concurrent=self.cfg.quotas.max_concurrent,
            queued=queued,
            seq=self.req.seq,
            cached=self.req.cached_estimate,
            held_anywhere=self.req.held_anywhere,
        )

    def settlement(self) -> Settlement:
        """What ending now gives back (`rules.refund`)."""
        requests, tokens = rules.refund(
            self.started,
            self.requests_taken,
            self.tokens_taken,
            self.req.max_tokens,
            self.output_tokens,
        )
        return Settlement(self.lease_id, self.req.tenant_id, requests, tokens, self.buckets)


class Entries:
    """This replica's entries by lease id (the store's name for them): queued, in
    flight, or withdrawn while a step that offered them was away."""

    def __init__(self) -> None:
        self._by_lease: dict[str, Entry] = {}

    def add(self, entry: Entry) -> None:
        self._by_lease[entry.lease_id] = entry

    def get(self, lease_id: str) -> Entry | None:
        return self._by_lease.get(lease_id)

    def remove(self, entry: Entry) -> bool:
        """Forget `entry`; False if it was gone already."""
        return self._by_lease.pop(entry.lease_id, None) is not None

    def in_flight(self) -> list[Entry]:
        return [e for e in self._by_lease.values() if e.started]

    def leases(self) -> list[Lease]:
        """The leases of the requests in flight here (renewals, re-registration)."""
        return [e.lease() for e in self.in_flight()]

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._by_lease.values()))


class LocalQueues:
    def __init__(self, batch_every_n: int | None, light_credit: float = 0.0) -> None:
        self._batch_every_n = batch_every_n
        self._light_credit = light_credit
        self._queues: dict[str, TenantQueue] = {}
        self.paused_until: dict[str, float] = {}
        self.mirror: dict[str, float] = {}
        # Tenants whose queue here emptied while paused for their own limits: a
        # request of theirs while still paused rejoins the backlog without a lift.
        self.held_back: set[str] = set()
        # Tenants held at max_concurrent: held (not idle, no floor for lifts) until
        # one of their requests ends here or is admitted, though re-offered every
        # poll (a finish on another replica frees them unseen).
        self.at_cap: set[str] = set()
        self._len = 0

    def push(self, req: QueuedRequest) -> None:
        q = self._queues.get(req.tenant_id)
        if q is None:
            q = self._queues[req.tenant_id] = TenantQueue(self._batch_every_n)
        q.push(req)
        self._len += 1

    def remove(self, req: QueuedRequest, admitted: bool = False) -> bool:
        """Take `req` out of its queue: `admitted` (it counts in its tenant's
        anti-starvation streak, `TenantQueue.pop`) or withdrawn (it does not)."""
        q = self._queues.get(req.tenant_id)
        if q is None:
            return False
        if admitted and q.head() is req:
            q.pop()
            self.at_cap.discard(req.tenant_id)
        elif not q.remove(req):
            return False
        self._len -= 1
        if not len(q):
            del self._queues[req.tenant_id]
        return True

    def queued(self, tenant_id: str) -> int:
        q = self._queues.get(tenant_id)
        return len(q) if q is not None else 0

    def eligible(self) -> list[str]:
        return [t for t in self._queues if t not in self.paused_until]

    def backlogged(self) -> list[str]:
        return list(self._queues)

    def heads(self, limit: int, per_tenant: int) -> list[QueuedRequest]:
        """The next `per_tenant` requests of each of the first `limit` eligible
        tenants in mirrored fair order (`rules.vtc_rank`), each tenant's in its
        queue's order."""

        def key(t: str) -> rules.Rank:
            # The fair order as far as this replica knows it: the store alone
            # knows the tenants' last admissions (0 here: ties to the earlier head).
            q = self._queues[t]
            head = q.head()
            assert head is not None
            return rules.vtc_rank(
                self.mirror.get(t, -math.inf), len(q), self._light_credit, 0, head.seq
            )

        tenants = heapq.nsmallest(limit, self.eligible(), key=key)
        return [r for t in tenants for r in self._queues[t].upcoming(per_tenant)]

    def forget(self, tenant_id: str) -> None:
        """Drop what is kept of a tenant with nothing queued here (scheduler/idle.py)."""
        assert tenant_id not in self._queues, tenant_id
        self.mirror.pop(tenant_id, None)
        self.held_back.discard(tenant_id)
        self.at_cap.discard(tenant_id)
        self.paused_until.pop(tenant_id, None)

    def pause(self, tenant_id: str, until_s: float, at_cap: bool = False) -> None:
        self.paused_until[tenant_id] = until_s
        if at_cap:
            self.at_cap.add(tenant_id)

    def held(self, tenant_id: str) -> bool:
        """Held by its own limits: paused, or at max_concurrent (see `at_cap`)."""
        return tenant_id in self.paused_until or tenant_id in self.at_cap

    def resume_due(self, now_s: float) -> None:
        for t in [t for t, until in self.paused_until.items() if until <= now_s]:
            del self.paused_until[t]

    def resume(self, tenant_id: str) -> None:
        self.paused_until.pop(tenant_id, None)
        self.at_cap.discard(tenant_id)

    def resume_all(self) -> None:
        self.paused_until.clear()
        self.at_cap.clear()

    def next_resume_s(self) -> float:
        return min(self.paused_until.values(), default=math.inf)

    def __len__(self) -> int:
        return self._len
